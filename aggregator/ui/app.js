// gputopo's topology page: the fabric tree with each node's free and held GPUs, a node's GPU
// link matrix coloured by bandwidth (degraded links outlined), and a placement's GPUs
// highlighted (?reservation=ID). Data: /api/v1/topology, /api/v1/nodes/NAME and
// /api/v1/placement/explain, all relative to this page.
"use strict";

const params = new URLSearchParams(location.search);

async function getJSON(url, init) {
  const resp = await fetch(url, init);
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status}`);
  return resp.json();
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else if (k === "onclick") node.addEventListener("click", v);
    else if (k === "onkeydown") node.addEventListener("keydown", v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

// The GPUs to highlight, by node: a held reservation (?reservation=ID), or where Explain would
// put one pod of N GPUs now (?place=N; nothing is reserved, so looking costs nothing).
async function placementGPUs() {
  const rid = params.get("reservation");
  const want = Number.parseInt(params.get("place") || "", 10);
  let subject, title;
  if (rid) {
    subject = { reservation_id: rid };
    title = `placement ${rid.slice(0, 8)}…`;
  } else if (want > 0) {
    subject = { request: { job: "ui", groups: [{ name: "ui", pods: 1, gpus_per_pod: want }] } };
    title = `where ${want} GPUs would go`;
  } else {
    return {};
  }
  const label = document.getElementById("placement");
  try {
    const resp = await getJSON("../api/v1/placement/explain", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(subject),
    });
    if (!resp.placed) {
      label.textContent = `${title}: not placed (${resp.reason || "no reason given"})`;
      return {};
    }
    const out = {};
    for (const a of resp.assignments || []) {
      out[a.node] = new Set([...(out[a.node] || []), ...(a.gpus || [])]);
    }
    const count = Object.values(out).reduce((s, g) => s + g.size, 0);
    const where = Object.keys(out).sort();
    const shown = where.length > 3 ? `${where.slice(0, 3).join(", ")} +${where.length - 3}` : where.join(", ");
    label.textContent = `${title} · ${count} GPUs on ${shown}`;
    label.setAttribute("data-placed-gpus", String(count));
    return out;
  } catch (err) {
    label.textContent = `${title}: ${err.message}`;
    return {};
  }
}

function gpuSquares(state, placed) {
  const box = el("div", { class: "gpus" });
  const free = new Set(state.free_gpus || []);
  const reserved = new Set(state.reserved_gpus || []);
  const count = (state.topology.gpus || []).length;
  for (let i = 0; i < count; i++) {
    let kind = free.has(i) ? "free" : reserved.has(i) ? "reserved" : "allocated";
    if (placed && placed.has(i)) kind = "placed";
    box.append(el("span", { class: `gpu ${kind}`, title: `GPU ${i}: ${kind}`, "data-gpu": String(i) }));
  }
  return box;
}

function nodeCard(state, placed) {
  const name = state.topology.name;
  const free = (state.free_gpus || []).length;
  const total = (state.topology.gpus || []).length;
  const card = el(
    "div",
    {
      class: `node${state.stale ? " stale" : ""}`,
      "data-node": name,
      "data-free": String(free),
      "data-total": String(total),
      tabindex: "0",
      role: "button",
      "aria-label": `${name}: ${free} of ${total} GPUs free`,
      onclick: () => { location.hash = `node=${encodeURIComponent(name)}`; },
      onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") location.hash = `node=${encodeURIComponent(name)}`; },
    },
    el("span", { class: "name" }, name),
    el("span", { class: "free" }, `${free}/${total} free${state.stale ? " · stale" : ""}`),
    gpuSquares(state, placed),
  );
  return card;
}

// A thin bar: the share of a domain's GPUs that is free (green) or held (grey).
function freeBar(free, total) {
  const bar = el("span", { class: "bar", title: `${free}/${total} GPUs free` });
  const fill = el("span", { class: "fill" });
  fill.style.width = `${total ? (100 * free) / total : 0}%`;
  bar.append(fill);
  return bar;
}

function buildTree(topology, placed) {
  const states = new Map(topology.nodes.map((n) => [n.topology.name, n]));
  const domains = topology.domains || [];
  const tiers = domains.filter((d) => d.level.startsWith("tier-"));
  const nvlinkOf = new Map();
  for (const d of domains.filter((d) => d.level === "nvlink")) {
    for (const n of d.nodes) nvlinkOf.set(n, d);
  }
  const children = new Map();
  for (const d of tiers) {
    const key = d.parent || "";
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(d);
  }
  const placedNodes = new Set();
  const render = (d) => {
    const box = el(
      "div",
      { class: `domain ${d.level}`, "data-domain": d.id, "data-level": d.level },
      el("div", { class: "title" }, d.id.split("/").pop(),
        el("span", { class: "count" }, `${d.level} · ${d.free_gpus}/${d.total_gpus} GPUs free`),
        freeBar(d.free_gpus, d.total_gpus)),
    );
    const kids = (children.get(d.id) || []).sort((a, b) => a.id.localeCompare(b.id));
    if (kids.length) {
      for (const k of kids) box.append(render(k));
    } else {
      const groups = new Map();
      for (const n of d.nodes) {
        const nv = nvlinkOf.get(n);
        const key = nv ? nv.id : "";
        if (!groups.has(key)) groups.set(key, []);
        groups.get(key).push(n);
      }
      for (const [key, names] of groups) {
        const holder = key
          ? el("div", { class: "nvgroup", "data-nvlink": key },
              el("span", { class: "nvlink" }, `NVLink domain ${key.slice(0, 8)}… · ${nvlinkOf.get(names[0]).free_gpus}/${nvlinkOf.get(names[0]).total_gpus} free`))
          : el("div", {});
        for (const n of names.sort()) {
          if (states.has(n)) { holder.append(nodeCard(states.get(n), placed[n])); placedNodes.add(n); }
        }
        box.append(holder);
      }
    }
    return box;
  };
  const tree = document.getElementById("tree");
  tree.replaceChildren();
  for (const top of (children.get("") || []).sort((a, b) => a.id.localeCompare(b.id))) {
    tree.append(render(top));
  }
  const loose = [...states.keys()].filter((n) => !placedNodes.has(n)).sort();
  if (loose.length) {
    const box = el("div", { class: "domain", "data-domain": "" }, el("div", { class: "title" }, "no fabric position"));
    for (const n of loose) box.append(nodeCard(states.get(n), placed[n]));
    tree.append(box);
  }
}

function colour(gbps, best) {
  if (gbps <= 0) return "#c9ced8";
  // Square root of the share of the node's fastest link: a halved NVLink stands out from its
  // neighbours, and PCIe beside NVLink still reads as slow rather than as the same colour.
  const t = Math.max(0, Math.min(1, Math.sqrt(gbps / Math.max(best, 1))));
  const hue = 10 + t * 120; // red (slow) to green (fast)
  return `hsl(${hue}, 60%, 42%)`;
}

// The matrix's key: the colour scale from slow to the node's fastest link, and the
// degraded-link mark with how many links carry it.
function matrixLegend(best, degraded) {
  const scale = el("span", { class: "scale" });
  for (const share of [0.05, 0.25, 0.5, 0.75, 1]) {
    const g = best * share;
    const sw = el("span", { class: "swatch" }, String(Math.round(g)));
    sw.style.backgroundColor = colour(g, best);
    scale.append(sw);
  }
  const mark = el("span", { class: "swatch degraded-sample" }, "⚠");
  return el("p", { class: "matrix-legend" }, "GB/s, coloured by share of this node's fastest link ", scale, " ", mark,
    ` degraded (${degraded} link${degraded === 1 ? "" : "s"})`);
}

async function showNode(name, placed) {
  const detail = document.getElementById("detail");
  for (const c of document.querySelectorAll(".node.selected")) c.classList.remove("selected");
  const card = document.querySelector(`.node[data-node="${CSS.escape(name)}"]`);
  if (card) card.classList.add("selected");
  let state;
  try {
    state = await getJSON(`../api/v1/nodes/${encodeURIComponent(name)}`);
  } catch (err) {
    detail.replaceChildren(el("p", { class: "error" }, err.message));
    return;
  }
  const topo = state.topology;
  const gpus = topo.gpus || [];
  const cells = new Map();
  let best = 1;
  for (const lk of topo.links || []) {
    if (lk.a.kind !== "DEVICE_KIND_GPU" || lk.b.kind !== "DEVICE_KIND_GPU") continue;
    const gbps = lk.measured && lk.measured.gbps > 0 ? lk.measured.gbps : lk.nominal_gbps || 0;
    best = Math.max(best, gbps);
    for (const [x, y] of [[lk.a.index, lk.b.index], [lk.b.index, lk.a.index]]) cells.set(`${x},${y}`, { lk, gbps });
  }
  const mine = placed[name] || new Set();
  const head = el("tr", {}, el("th", {}, ""));
  for (const g of gpus) head.append(el("th", { class: mine.has(g.index) ? "placed" : "" }, `GPU${g.index}`));
  const table = el("table", { class: "matrix", "data-node": name }, head);
  for (const row of gpus) {
    const tr = el("tr", {}, el("th", { class: mine.has(row.index) ? "placed" : "" }, `GPU${row.index}`));
    for (const col of gpus) {
      if (row.index === col.index) { tr.append(el("td", { class: "cell self" }, "–")); continue; }
      const hit = cells.get(`${row.index},${col.index}`);
      const degraded = hit && hit.lk.health && hit.lk.health !== "LINK_HEALTH_OK";
      const kind = hit ? hit.lk.kind.replace("LINK_KIND_", "") : "?";
      const both = mine.has(row.index) && mine.has(col.index); // a link the placement uses
      const td = el("td", {
        class: `cell${degraded ? " degraded" : ""}${both ? " in-placement" : ""}`,
        "data-gbps": hit ? String(hit.gbps) : "0",
        title: hit ? `${kind} ${hit.gbps.toFixed(0)} GB/s${degraded ? ` — ${hit.lk.health_reason || "degraded"}` : ""}` : "no link",
      }, hit ? `${kind === "NVLINK" ? "NV" : kind} ${hit.gbps.toFixed(0)}${degraded ? "⚠" : ""}` : "");
      td.style.backgroundColor = colour(hit ? hit.gbps : 0, best);
      tr.append(td);
    }
    table.append(tr);
  }
  const degradedCount = table.querySelectorAll("td.degraded").length / 2;
  detail.replaceChildren(
    el("h2", {}, name, el("span", { class: "count" }, `${gpus[0] ? gpus[0].name : ""} · GB/s per direction`)),
    table,
    matrixLegend(best, degradedCount),
  );
}

function showSummary(topology) {
  const free = topology.nodes.reduce((s, n) => s + (n.free_gpus || []).length, 0);
  const total = topology.nodes.reduce((s, n) => s + (n.topology.gpus || []).length, 0);
  document.getElementById("summary").textContent =
    `${topology.nodes.length} nodes · ${free}/${total} GPUs free`;
}

function selectedNode() {
  const m = location.hash.match(/node=([^&]+)/);
  return m ? decodeURIComponent(m[1]) : "";
}

// ?refresh=S re-reads the topology every S seconds (at least 2) and redraws the tree, keeping
// the chosen node; the aggregator caches the dump, so many open pages cost it one build.
function startRefresh(placed) {
  const every = Number.parseFloat(params.get("refresh") || "0");
  if (!(every > 0)) return;
  let count = 0;
  setInterval(async () => {
    try {
      const topology = await getJSON("../api/v1/topology?links=false");
      showSummary(topology);
      buildTree(topology, placed);
      const name = selectedNode();
      const card = name && document.querySelector(`.node[data-node="${CSS.escape(name)}"]`);
      if (card) card.classList.add("selected");
      document.body.setAttribute("data-refreshes", String(++count));
    } catch (err) {
      document.getElementById("summary").textContent = `refresh failed: ${err.message}`;
    }
  }, Math.max(every, 2) * 1000);
}

async function main() {
  try {
    const [topology, placed] = await Promise.all([getJSON("../api/v1/topology?links=false"), placementGPUs()]);
    showSummary(topology);
    buildTree(topology, placed);
    const route = async () => {
      const name = selectedNode();
      if (name) await showNode(name, placed);
    };
    window.addEventListener("hashchange", route);
    await route();
    document.body.setAttribute("data-ready", "true");
    startRefresh(placed);
  } catch (err) {
    document.getElementById("summary").textContent = "";
    document.getElementById("tree").replaceChildren(el("p", { class: "error" }, err.message));
    document.body.setAttribute("data-ready", "error");
  }
}

main();
