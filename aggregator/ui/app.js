// gputopo's topology page, for clusters of 1,000 to 10,000 nodes.
//
// 1. First paint: /api/v1/summary (one row of small numbers per node) drawn as a heatmap, one
//    square per node, coloured by its share of free GPUs, grouped in tiles per tier-0 domain
//    under their parent domains. Clicking a tile drills down (the list shows that domain).
// 2. Search and filters (name, model, free >= N, degraded, stale) narrow the list and dim the
//    squares that do not match; names sort naturally (leaf-1-2 before leaf-1-10).
// 3. A node (#node=NAME) is fetched whole when opened: its GPUs and NICs as `gputopo topo show`
//    prints them (link kind and NVLink lanes, CPU and NUMA affinity), GB/s, and who holds each
//    GPU (/api/v1/nodes/NAME/holders).
// 4. ?reservation=ID highlights a placement; ?place=N asks Explain where one pod of N GPUs
//    running an all-reduce would go (nothing is reserved) and says so on the page.
"use strict";

const params = new URLSearchParams(location.search);
const natural = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" }).compare;
const PAGE = 200; // rows of the list drawn at a time
const DENSE_AT = Number(params.get("dense_at") || 2500); // nodes; beyond, one cell per domain
const S = { nodes: [], byName: new Map(), models: [], flags: {}, placed: {}, shown: PAGE,
  filter: { q: "", model: "", minFree: 0, degraded: false, stale: false, domain: "" } };

async function getJSON(url, init) {
  const resp = await fetch(url, init);
  if (!resp.ok) {
    let why = "";
    try { why = (await resp.json()).error || ""; } catch (_) { /* not JSON */ }
    throw new Error(`${url}: HTTP ${resp.status}${why ? ` (${why})` : ""}`);
  }
  return resp.json();
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

// Free share 0..1 as a colour: none free is pale grey, a little is pale green, all is deep green.
function heat(free, total) {
  if (!total || free <= 0) return "#d5d9e0";
  const f = Math.min(1, free / total);
  return `hsl(145, 55%, ${Math.round(82 - 48 * f)}%)`;
}

// --- data ------------------------------------------------------------------------------------

function loadSummary(body) {
  const at = Object.fromEntries(body.fields.map((f, i) => [f, i]));
  S.flags = body.flags;
  S.models = body.models.filter((m) => m);
  S.nodes = body.nodes.map((r) => ({
    name: r[at.name], domain: body.domains[r[at.domain]], model: body.models[r[at.model]],
    gpus: r[at.gpus], free: r[at.free], reserved: r[at.reserved], flags: r[at.flags],
    nvlink: body.nvlink[r[at.nvlink]], reason: body.reasons[r[at.reason]],
  })).sort((a, b) => natural(a.name, b.name));
  S.byName = new Map(S.nodes.map((n) => [n.name, n]));
}

const isStale = (n) => (n.flags & (S.flags.stale | S.flags.unplaceable)) !== 0;
const isDegraded = (n) => (n.flags & S.flags.degraded) !== 0;
const leafOf = (path) => path.split("/").pop();

function matches(n) {
  const f = S.filter;
  if (f.q && !n.name.toLowerCase().includes(f.q)) return false;
  if (f.model && n.model !== f.model) return false;
  if (n.free < f.minFree) return false;
  if (f.degraded && !isDegraded(n)) return false;
  if (f.stale && !isStale(n)) return false;
  if (f.domain && n.domain !== f.domain) return false;
  return true;
}

// --- overview: a heatmap of free GPUs, a tile per tier-0 domain --------------------------------

function drawOverview() {
  const box = document.getElementById("overview");
  const tiles = new Map(); // domain path -> nodes (already in natural order)
  for (const n of S.nodes) {
    if (!tiles.has(n.domain)) tiles.set(n.domain, []);
    tiles.get(n.domain).push(n);
  }
  const sections = new Map(); // parent path -> domain paths
  for (const path of [...tiles.keys()].sort(natural)) {
    const parent = path.includes("/") ? path.slice(0, path.lastIndexOf("/")) : "";
    if (!sections.has(parent)) sections.set(parent, []);
    sections.get(parent).push(path);
  }
  // Past DENSE_AT nodes a square per node no longer fits a screen: one cell per domain does
  // (10,000 nodes in 500 leaves fit), and a click on it lists the domain's nodes.
  const dense = S.nodes.length > DENSE_AT;
  box.classList.toggle("dense", dense);
  const out = [];
  for (const [parent, paths] of sections) {
    const title = parent ? parent.split("/").join(" › ") : paths[0] ? "" : "no fabric position";
    const section = el("div", { class: "section" }, el("h3", { title: parent }, dense ? leafOf(parent) : title));
    const holder = dense ? el("div", { class: "tiles" }) : section;
    if (dense) holder.style.gridTemplateColumns = `repeat(${Math.min(12, Math.ceil(Math.sqrt(2 * paths.length)))}, 14px)`;
    for (const path of paths) holder.append((dense ? domainCell : tile)(path, tiles.get(path)));
    if (dense) section.append(holder);
    out.push(section);
  }
  box.replaceChildren(...out);
}

function domainCell(path, nodes) {
  const free = nodes.reduce((s, n) => s + n.free, 0);
  const total = nodes.reduce((s, n) => s + n.gpus, 0);
  const degraded = nodes.filter(isDegraded).length;
  const stale = nodes.filter(isStale).length;
  const cls = ["domain", "cell-domain"];
  if (degraded) cls.push("degraded");
  if (stale) cls.push("stale");
  if (nodes.some((n) => S.placed[n.name])) cls.push("placed");
  const cell = el("div", { class: cls.join(" "), "data-domain": path, "data-level": "tier-0",
    "data-free": String(free), "data-total": String(total), "data-nodes": String(nodes.length),
    title: `${path || "no fabric position"}: ${free}/${total} GPUs free on ${nodes.length} nodes` +
      `${degraded ? `, ${degraded} degraded` : ""}${stale ? `, ${stale} stale` : ""} (click: list them)` });
  cell.style.backgroundColor = heat(free, total);
  return cell;
}

function tile(path, nodes) {
  const free = nodes.reduce((s, n) => s + n.free, 0);
  const total = nodes.reduce((s, n) => s + n.gpus, 0);
  const cells = el("div", { class: "cells" });
  for (const n of nodes) {
    const cls = ["sq"];
    if (isStale(n)) cls.push("stale");
    if (isDegraded(n)) cls.push("degraded");
    if (S.placed[n.name]) cls.push("placed");
    if (n.nvlink) cls.push("nvl");
    const sq = el("span", { class: cls.join(" "), "data-node": n.name, "data-free": String(n.free),
      "data-total": String(n.gpus),
      title: `${n.name}: ${n.free}/${n.gpus} free${n.reserved ? `, ${n.reserved} pending` : ""} · ${n.model}` +
        `${isDegraded(n) ? " · degraded" : ""}${isStale(n) ? ` · ${n.reason || "stale"}` : ""}` });
    sq.style.backgroundColor = heat(n.free, n.gpus);
    cells.append(sq);
  }
  const nvl = new Set(nodes.map((n) => n.nvlink).filter((d) => d)).size;
  const title = el("div", { class: "title", title: `${path || "no fabric position"}: click to list its nodes` },
    el("span", { class: "name" }, path ? leafOf(path) : "no position"),
    el("span", { class: "count" }, `${free}/${total}`),
    nvl ? el("span", { class: "nvlink" }, `${nvl} NVLink domain${nvl === 1 ? "" : "s"}`) : null);
  title.style.borderBottomColor = heat(free, total);
  return el("div", { class: "domain", "data-domain": path, "data-level": "tier-0",
    "data-free": String(free), "data-total": String(total) }, title, cells);
}

// Dim what the filters leave out, without rebuilding thousands of squares.
function dimOverview() {
  for (const sq of document.querySelectorAll("#overview .sq")) {
    const n = S.byName.get(sq.dataset.node);
    sq.classList.toggle("dim", !(n && matches(n)));
  }
  const hits = new Map(); // dense cells: how many of a domain's nodes match
  if (document.querySelector("#overview .cell-domain")) {
    for (const n of S.nodes) if (matches(n)) hits.set(n.domain, (hits.get(n.domain) || 0) + 1);
  }
  for (const t of document.querySelectorAll("#overview .domain")) {
    t.classList.toggle("chosen", S.filter.domain !== "" && t.dataset.domain === S.filter.domain);
    if (t.classList.contains("cell-domain")) {
      t.dataset.matches = String(hits.get(t.dataset.domain) || 0);
      t.classList.toggle("dim", !hits.get(t.dataset.domain));
    }
  }
}

// --- list: the nodes that match, in natural order, a page at a time ---------------------------

function drawList() {
  const hits = S.nodes.filter(matches);
  document.getElementById("matches").textContent = `${hits.length} of ${S.nodes.length} nodes match`;
  const rows = hits.slice(0, S.shown).map((n) => el("button", {
    class: `row${isStale(n) ? " stale" : ""}${S.placed[n.name] ? " placed" : ""}`, type: "button",
    "data-node": n.name, "data-free": String(n.free), onclick: () => openNode(n.name) },
  el("span", { class: "sw" }), el("span", { class: "name" }, n.name),
  el("span", { class: "where" }, n.domain ? leafOf(n.domain) : "—"),
  el("span", { class: "model" }, n.model.replace(/^NVIDIA /, "")),
  el("span", { class: "free" }, `${n.free}/${n.gpus} free`),
  isDegraded(n) ? el("span", { class: "badge bad" }, "degraded") : null,
  isStale(n) ? el("span", { class: "badge" }, n.reason || "stale") : null));
  for (const r of rows) r.firstChild.style.backgroundColor = heat(Number(r.dataset.free), S.byName.get(r.dataset.node).gpus);
  const list = document.getElementById("list");
  list.replaceChildren(...rows);
  if (hits.length > S.shown) {
    list.append(el("button", { class: "more", type: "button", onclick: () => { S.shown += PAGE; drawList(); } },
      `show ${Math.min(PAGE, hits.length - S.shown)} more of ${hits.length - S.shown}`));
  }
  const chosen = selectedNode();
  for (const r of list.querySelectorAll(".row")) r.classList.toggle("selected", r.dataset.node === chosen);
}

function refilter() {
  S.shown = PAGE;
  dimOverview();
  drawList();
  const chip = document.getElementById("domain-chip");
  chip.hidden = !S.filter.domain;
  chip.replaceChildren(...(S.filter.domain ? [`domain ${S.filter.domain} `,
    el("button", { type: "button", title: "show every domain",
      onclick: () => { S.filter.domain = ""; refilter(); } }, "×")] : []));
}

function wireFilters() {
  const model = document.getElementById("model");
  for (const m of [...S.models].sort(natural)) model.append(el("option", { value: m }, m));
  const search = document.getElementById("search");
  search.addEventListener("input", () => { S.filter.q = search.value.trim().toLowerCase(); refilter(); });
  search.addEventListener("keydown", (e) => {
    if (e.key !== "Enter") return;
    const first = S.nodes.find(matches);
    if (first) openNode(first.name);
  });
  model.addEventListener("change", () => { S.filter.model = model.value; refilter(); });
  const minFree = document.getElementById("min-free");
  minFree.addEventListener("input", () => { S.filter.minFree = Number(minFree.value) || 0; refilter(); });
  for (const key of ["degraded", "stale"]) {
    const box = document.getElementById(key);
    box.addEventListener("change", () => { S.filter[key] = box.checked; refilter(); });
  }
  document.getElementById("overview").addEventListener("click", (e) => {
    const sq = e.target.closest(".sq");
    if (sq) { openNode(sq.dataset.node); return; }
    const t = e.target.closest(".domain");
    if (t) { S.filter.domain = S.filter.domain === t.dataset.domain ? "" : t.dataset.domain; refilter(); }
  });
}

// --- a node: GPUs, NICs, links as `gputopo topo show` prints them, and who holds what ---------

const KINDS = { // code, colour, what it is: distinct hues so a PHB never looks like a SYS
  NVLINK: ["NV", null, "NVLink (lanes); green by bandwidth"], C2C: ["C2C", "#138a8a", "chip-to-chip"],
  PIX: ["PIX", "#2f6fd6", "one PCIe switch"], PXB: ["PXB", "#6a92dc", "several PCIe switches"],
  PHB: ["PHB", "#8a4fbf", "through the host bridge"], NODE: ["NODE", "#d9731a", "between host bridges, one NUMA node"],
  SYS: ["SYS", "#b8322a", "across sockets"], NET: ["NET", "#4a5568", "network"],
};

function linkColour(kind, gbps, best) {
  if (kind !== "NVLINK") return (KINDS[kind] || [0, "#8a93a6"])[1];
  const t = Math.max(0, Math.min(1, Math.sqrt(gbps / Math.max(best, 1))));
  return `hsl(140, 55%, ${Math.round(62 - 30 * t)}%)`; // a halved NVLink is visibly lighter
}

function openNode(name) {
  location.hash = `node=${encodeURIComponent(name)}`;
}

function selectedNode() {
  const m = location.hash.match(/node=([^&]+)/);
  return m ? decodeURIComponent(m[1]) : "";
}

function holderText(h) {
  if (h.kind === "reservation") {
    const who = [h.job, h.owner].filter((x) => x).join(" · ");
    return `reservation ${h.id.slice(0, 8)}${who ? ` (${who})` : ""}${h.committed ? ", committed" : ""}`;
  }
  if (h.kind === "claim") return `claim ${h.claim} (${h.device})`;
  const res = h.reservation ? ` · reservation ${h.reservation.slice(0, 8)}` : "";
  return `pod ${h.pod}${h.source === "counted" ? ` (${h.count} GPU${h.count === 1 ? "" : "s"}, which ones unknown)` : ""}${res}`;
}

async function showNode(name) {
  const detail = document.getElementById("detail");
  for (const r of document.querySelectorAll("#list .row")) r.classList.toggle("selected", r.dataset.node === name);
  for (const c of document.querySelectorAll("#overview .sq.selected")) c.classList.remove("selected");
  const sq = document.querySelector(`#overview .sq[data-node="${CSS.escape(name)}"]`);
  if (sq) sq.classList.add("selected");
  let state, held;
  try {
    [state, held] = await Promise.all([
      getJSON(`../api/v1/nodes/${encodeURIComponent(name)}`),
      getJSON(`../api/v1/nodes/${encodeURIComponent(name)}/holders`),
    ]);
  } catch (err) {
    detail.replaceChildren(el("p", { class: "error" }, err.message));
    return;
  }
  if (selectedNode() && selectedNode() !== name) return; // another node was chosen meanwhile
  const topo = state.topology;
  const gpus = topo.gpus || [];
  const nics = topo.nics || [];
  const mine = S.placed[name] || new Set();
  const free = new Set(state.free_gpus || []);
  const pending = new Set(state.reserved_gpus || []);
  const byGpu = new Map();
  for (const h of held.holders) for (const g of h.gpus) byGpu.set(g, [...(byGpu.get(g) || []), h]);
  const counted = held.holders.filter((h) => h.kind === "pod" && !h.gpus.length);

  const devs = [...gpus.map((g) => ({ kind: "GPU", i: g.index, g })), ...nics.map((n) => ({ kind: "NIC", i: n.index, n }))];
  const key = (kind, i) => `${kind}${i}`;
  const cells = new Map();
  let best = 1;
  for (const lk of topo.links || []) {
    const a = key(lk.a.kind.replace("DEVICE_KIND_", ""), lk.a.index);
    const b = key(lk.b.kind.replace("DEVICE_KIND_", ""), lk.b.index);
    const gbps = lk.measured && lk.measured.gbps > 0 ? lk.measured.gbps : lk.nominal_gbps || 0;
    if (lk.kind === "LINK_KIND_NVLINK") best = Math.max(best, gbps);
    cells.set(`${a},${b}`, { lk, gbps });
    cells.set(`${b},${a}`, { lk, gbps });
  }
  const head = el("tr", {}, el("th", {}, ""));
  for (const d of devs) head.append(el("th", { class: d.kind === "GPU" && mine.has(d.i) ? "placed" : "" }, key(d.kind, d.i)));
  head.append(el("th", {}, "CPU Affinity"), el("th", {}, "NUMA Affinity"));
  const table = el("table", { class: "matrix", "data-node": name }, head);
  let degradedLinks = 0;
  for (const r of devs) {
    const rk = key(r.kind, r.i);
    const tr = el("tr", {}, el("th", { class: r.kind === "GPU" && mine.has(r.i) ? "placed" : "" }, rk));
    for (const c of devs) {
      const ck = key(c.kind, c.i);
      if (rk === ck) { tr.append(el("td", { class: "cell self" }, "X")); continue; }
      const hit = cells.get(`${rk},${ck}`);
      if (!hit) { tr.append(el("td", { class: "cell none" }, r.kind === "NIC" && c.kind === "NIC" ? "N/A" : "")); continue; }
      const kind = hit.lk.kind.replace("LINK_KIND_", "");
      const degraded = hit.lk.health && hit.lk.health !== "LINK_HEALTH_OK";
      if (degraded && r.kind === "GPU" && c.kind === "GPU" && r.i < c.i) degradedLinks += 1;
      const code = kind === "NVLINK" ? `NV${hit.lk.lanes || ""}` : (KINDS[kind] || [kind])[0];
      const both = r.kind === "GPU" && c.kind === "GPU" && mine.has(r.i) && mine.has(c.i);
      const lanes = hit.lk.max_lanes ? `, ${hit.lk.lanes}/${hit.lk.max_lanes} lanes` : "";
      const td = el("td", {
        class: `cell${r.kind === "GPU" && c.kind === "GPU" ? " gg" : ""} k-${kind.toLowerCase()}${degraded ? " degraded" : ""}${both ? " in-placement" : ""}`,
        "data-kind": kind, "data-gbps": String(hit.gbps),
        title: `${rk}–${ck}: ${kind}${lanes}${hit.lk.generation ? `, gen ${hit.lk.generation}` : ""}, ${hit.gbps.toFixed(1)} GB/s` +
          `${hit.lk.measured ? " measured" : " nominal"}${degraded ? ` — ${hit.lk.health_reason || "degraded"}` : ""}`,
      }, el("b", {}, `${code}${degraded ? "⚠" : ""}`), el("small", {}, hit.gbps.toFixed(0)));
      td.style.backgroundColor = linkColour(kind, hit.gbps, best);
      tr.append(td);
    }
    const numa = r.kind === "GPU" ? r.g.numa_node : r.n.numa_node;
    tr.append(el("td", { class: "aff" }, r.kind === "GPU" ? r.g.cpu_affinity || "N/A" : ""),
      el("td", { class: "aff" }, numa === undefined || numa === null ? "N/A" : String(numa)));
    table.append(tr);
  }

  const gpuRows = gpus.map((g) => {
    const st = mine.has(g.index) ? "placed" : free.has(g.index) ? "free" : pending.has(g.index) ? "reserved" : "in use";
    const who = (byGpu.get(g.index) || []).map(holderText).join("; ") ||
      (st === "in use" && counted.length ? `one of: ${counted.map(holderText).join("; ")}` : "");
    const nv = g.nvlink_max_lanes ? `gen ${g.nvlink_generation}, ${g.nvlink_lanes}/${g.nvlink_max_lanes}` : "—";
    const pcie = g.pcie_generation ? `gen ${g.pcie_generation} x${g.pcie_width}` +
      (g.pcie_width < g.pcie_max_width || g.pcie_generation < g.pcie_max_generation ? ` (max gen ${g.pcie_max_generation} x${g.pcie_max_width})` : "") : "—";
    return el("tr", { class: `gpu-row ${st.replace(" ", "-")}`, "data-gpu": String(g.index) },
      el("td", {}, el("span", { class: `gpu ${st.replace(" ", "-")}` }), ` GPU${g.index}`), el("td", {}, st),
      el("td", { class: "who" }, who), el("td", {}, g.numa_node ?? "N/A"), el("td", {}, g.cpu_affinity || "N/A"),
      el("td", {}, nv), el("td", {}, pcie));
  });
  const nicRows = nics.map((n) => {
    const near = gpus.filter((g) => { const h = cells.get(`GPU${g.index},NIC${n.index}`); return h && ["PIX", "PXB"].includes(h.lk.kind.replace("LINK_KIND_", "")); })
      .map((g) => `GPU${g.index}`).join(", ");
    return el("tr", { "data-nic": n.name || `NIC${n.index}` },
      el("td", {}, `NIC${n.index}`), el("td", {}, n.name || ""), el("td", {}, (n.kind || "").replace("NIC_KIND_", "").toLowerCase()),
      el("td", {}, n.netdev || ""), el("td", {}, n.speed_mbps ? `${Number(n.speed_mbps) / 1000} Gb/s` : ""),
      el("td", {}, n.up ? "up" : "down"), el("td", {}, n.numa_node ?? "N/A"), el("td", {}, near || "—"));
  });
  const summary = S.byName.get(name);
  const legend = el("p", { class: "matrix-legend" }, "link kinds: ");
  for (const [k, [code, colour, what]] of Object.entries(KINDS)) {
    const sw = el("span", { class: "swatch", title: what }, code);
    sw.style.backgroundColor = colour || linkColour("NVLINK", best, best);
    legend.append(sw, " ");
  }
  legend.append(el("span", { class: "swatch degraded-sample" }, "⚠"), ` degraded (${degradedLinks} link${degradedLinks === 1 ? "" : "s"})`,
    ` · GB/s per direction, measured where probed, else nominal · NVLink shade: share of ${best.toFixed(0)} GB/s`);
  detail.replaceChildren(...[
    el("h2", {}, name, el("span", { class: "count" },
      [topo.machine, gpus[0] && gpus[0].name, summary && summary.domain, state.stale ? "stale" : ""].filter((x) => x).join(" · "))),
    el("table", { class: "gpus-table" }, el("tr", {}, ...["GPU", "state", "held by", "NUMA", "CPU affinity", "NVLink lanes", "PCIe"].map((h) => el("th", {}, h))), ...gpuRows),
    counted.length ? el("p", { class: "muted" }, `Counted, not located: ${counted.map(holderText).join("; ")}`) : null,
    table,
    legend,
    el("h3", {}, `NICs (${nics.length})`),
    nics.length ? el("table", { class: "nics" }, el("tr", {}, ...["NIC", "name", "kind", "netdev", "speed", "link", "NUMA", "nearest GPUs"].map((h) => el("th", {}, h))), ...nicRows)
      : el("p", { class: "muted" }, "no NIC reported"),
  ].filter((c) => c));
  detail.setAttribute("data-node", name);
}

// --- placement shown: a reservation, or where Explain would put N GPUs ------------------------

async function placementGPUs() {
  const rid = params.get("reservation");
  const want = Number.parseInt(params.get("place") || "", 10);
  let subject, title;
  const label = document.getElementById("placement");
  if (rid) {
    subject = { reservation_id: rid };
    title = `placement ${rid.slice(0, 8)}…`;
  } else if (want > 0) {
    // What "Where would N GPUs go?" means, said on the page: the same request a file without a
    // pattern makes (README, "One meaning of a request").
    subject = { request: { job: "ui", groups: [{ name: "ui", pods: 1, gpus_per_pod: want, pattern: "all_reduce" }] } };
    title = `where ${want} GPUs would go (assumed: one pod of ${want} GPUs running an all-reduce; nothing reserved)`;
    label.setAttribute("data-request", JSON.stringify(subject.request));
  } else {
    return {};
  }
  try {
    const resp = await getJSON("../api/v1/placement/explain", {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(subject),
    });
    if (!resp.placed) {
      label.textContent = `${title}: not placed (${resp.reason || "no reason given"})`;
      return {};
    }
    const out = {};
    for (const a of resp.assignments || []) out[a.node] = new Set([...(out[a.node] || []), ...(a.gpus || [])]);
    const count = Object.values(out).reduce((s, g) => s + g.size, 0);
    const where = Object.keys(out).sort(natural);
    const shown = where.length > 3 ? `${where.slice(0, 3).join(", ")} +${where.length - 3}` : where.join(", ");
    const bus = ((resp.predicted || {}).groups || []).map((g) => `${Math.round(g.bus_gbps)} GB/s bus, ${g.bottleneck}`).join("; ");
    label.textContent = `${title} · ${count} GPUs on ${shown}${bus ? ` · ${bus}` : ""}`;
    label.setAttribute("data-placed-gpus", String(count));
    label.setAttribute("data-placed-nodes", where.join(","));
    return out;
  } catch (err) {
    label.textContent = `${title}: ${err.message}`;
    return {};
  }
}

function showSummary() {
  const free = S.nodes.reduce((s, n) => s + n.free, 0);
  const total = S.nodes.reduce((s, n) => s + n.gpus, 0);
  document.getElementById("summary").textContent = `${S.nodes.length} nodes · ${free}/${total} GPUs free`;
}

function drawHeatKey() {
  const key = document.getElementById("heat-key");
  for (const [f, t] of [[0, 8], [1, 8], [4, 8], [8, 8]]) {
    const sw = el("span", { class: "key", title: `${f}/${t} free` });
    sw.style.backgroundColor = heat(f, t);
    key.append(sw);
  }
  key.append(" none → all");
}

// ?refresh=S re-reads the summary every S seconds (at least 2) and redraws, keeping the filters
// and the chosen node; the aggregator caches the summary, so many open pages cost it one build.
function startRefresh() {
  const every = Number.parseFloat(params.get("refresh") || "0");
  if (!(every > 0)) return;
  let count = 0;
  setInterval(async () => {
    try {
      loadSummary(await getJSON("../api/v1/summary"));
      showSummary();
      drawOverview();
      dimOverview();
      drawList();
      const sq = document.querySelector(`#overview .sq[data-node="${CSS.escape(selectedNode())}"]`);
      if (sq) sq.classList.add("selected");
      document.body.setAttribute("data-refreshes", String(++count));
    } catch (err) {
      document.getElementById("summary").textContent = `refresh failed: ${err.message}`;
    }
  }, Math.max(every, 2) * 1000);
}

async function main() {
  drawHeatKey();
  try {
    const [summary, placed] = await Promise.all([getJSON("../api/v1/summary"), placementGPUs()]);
    S.placed = placed;
    loadSummary(summary);
    showSummary();
    drawOverview();
    wireFilters();
    refilter();
    // The overview is on screen after the next frame: the mark the acceptance test reads.
    requestAnimationFrame(() => setTimeout(() => performance.mark("overview-painted"), 0));
    const route = async () => { const name = selectedNode(); if (name) await showNode(name); };
    window.addEventListener("hashchange", route);
    const first = Object.keys(placed).sort(natural)[0];
    if (!selectedNode() && first) history.replaceState(null, "", `#node=${encodeURIComponent(first)}`);
    await route();
    document.body.setAttribute("data-ready", "true");
    startRefresh();
  } catch (err) {
    document.getElementById("summary").textContent = "";
    document.getElementById("overview").replaceChildren(el("p", { class: "error" }, err.message));
    document.body.setAttribute("data-ready", "error");
  }
}

main();
