"""`gputopo demo`: a local cluster of simulated GPU nodes, real gRPC, real placement.

What runs:
1. an aggregator (grpc.aio on a free loopback port);
2. one simulated exporter per node, each streaming its node's topology (machines built from real
   recordings: DGX H100, HGX A100 with RoCE NICs, a PCIe server with NVLink-bridged H100 NVL
   pairs, and GB200 trays in one NVL72 domain) laid out in leaves under two spines;
3. three requests through the Placement gRPC service: a TP-8 group in one NVLink domain, a gang
   of 4 nodes x 8 GPUs under one leaf, and a prefill/decode pipeline whose KV path needs
   300 GB/s. Each is first dry-run with the baseline policies, on the same state, so the table
   shows what Kueue and the default scheduler would have done.

With `--kubeconfig PATH` the demo also works on a real cluster: it creates a Node object for
each simulated node that has none (labelled `gputopo.io/demo=true`; a cloud's node controller
may delete Nodes without a machine behind them) and runs the aggregator's label publisher
against it, so `kubectl get nodes -L fabric.topograph.run/tier-0` shows the labels appear. It
touches no label it does not own, and a second run patches nothing.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TextIO

from google.protobuf import json_format

from aggregator.publisher import PublisherConfig
from aggregator.server import Aggregator, AggregatorConfig, KubeOptions
from exporter.simulate import SimulatedExporters
from gputopo.codec import request_to_proto
from gputopo.machines import load_machine, with_gpu_fabric
from gputopo.request import PlacementRequest, request_from_mapping
from gputopo.reservations import Reservation
from gputopo.runtime import grpcio
from gputopo.runtime.kube import KubeClient, NodeObject
from gputopo.topology import FabricPosition, NodeTopology
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import placement_pb2_grpc as pgrpc

__all__ = ["DEMO_REQUESTS", "demo_nodes", "main", "run_demo"]

BASELINES = ("kueue-bestfit", "default", "first-fit")


@dataclass(frozen=True, slots=True)
class _Rack:
    prefix: str
    profile: str
    count: int
    leaf: str
    spine: str
    nvl_domain: str = ""


# A small cluster, two spines, four leaves. The NVL72 rack is 18 GB200 trays of 4 GPUs.
_RACKS = (
    _Rack("h100", "dgx-h100", 6, "leaf-1", "spine-1"),
    _Rack("a100", "hgx-a100-roce", 5, "leaf-2", "spine-1"),
    _Rack("pcie", "pcie-h100-nvlbridge-8x", 2, "leaf-3", "spine-2"),
    _Rack(
        "gb200",
        "gb200-tray",
        18,
        "leaf-4",
        "spine-2",
        nvl_domain="9277d399-0674-44a9-b64e-d85bb19ce2b0",
    ),
)
_CORE = "core-1"

# Work already running when the demo starts (GPU indices per node): a 36-GPU job fills half of
# the NVL72 rack, and two smaller jobs hold half of an A100 node and of a PCIe server. A real
# cluster is never empty, and these leftovers are where count-only policies go wrong.
EXISTING_WORK: dict[str, dict[str, tuple[int, ...]]] = {
    "nvl-train": {f"gb200-{i:02}": (0, 1, 2, 3) for i in range(1, 10)},
    "notebook-a": {"a100-02": (0, 1, 2, 3)},
    "notebook-b": {"pcie-02": (4, 5, 6, 7)},
}

DEMO_REQUESTS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "TP-8 group in one NVLink domain",
        {
            "job": "tp8",
            "groups": [
                {
                    "name": "tp",
                    "pods": 1,
                    "gpus_per_pod": 8,
                    "pattern": "all_reduce",
                    "scope": {"required": "nvlink"},
                }
            ],
        },
    ),
    (
        "4 nodes x 8 GPUs under one leaf",
        {
            "job": "train-32",
            "scope": {"required": "leaf"},
            "groups": [{"name": "train", "pods": 4, "gpus_per_pod": 8, "pattern": "all_reduce"}],
        },
    ),
    (
        "prefill/decode: 2 x TP4 prefill, 2 x TP4 decode, KV path >= 300 GB/s",
        {
            "job": "serve-pd",
            "groups": [
                {
                    "name": "prefill",
                    "replicas": 2,
                    "pods": 1,
                    "gpus_per_pod": 4,
                    "scope": {"required": "nvlink"},
                },
                {
                    "name": "decode",
                    "replicas": 2,
                    "pods": 1,
                    "gpus_per_pod": 4,
                    "scope": {"required": "nvlink"},
                },
            ],
            "edges": [{"from": "prefill", "to": "decode", "min_gbps": 300}],
        },
    ),
)


def demo_nodes() -> list[NodeTopology]:
    """The demo cluster's nodes, with their place in the fabric."""
    nodes = []
    for rack in _RACKS:
        for i in range(1, rack.count + 1):
            name = f"{rack.prefix}-{i:02}"
            topo = load_machine(rack.profile, node_name=name)
            fabric = FabricPosition(
                tiers=(rack.leaf, rack.spine, _CORE),
                accelerator_domain=rack.nvl_domain,
                source="inventory",
                confidence="high",
            )
            if rack.nvl_domain:
                # What NVML reports on an NVL72 tray once Fabric Manager registered it.
                topo = with_gpu_fabric(topo, cluster_uuid=rack.nvl_domain, clique_id=32766)
            nodes.append(replace(topo, fabric=fabric))
    return nodes


def _request(data: dict[str, Any], *, policy: str = "") -> PlacementRequest:
    req = request_from_mapping(data)
    return replace(req, policy=policy) if policy else req


def _gib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size < 2**30 else f"{size / 2**30:.0f} GiB"


def _compress(names: Sequence[str]) -> str:
    """Short list of names: all of them up to four, else a count and the first and last."""
    if len(names) <= 4:
        return ",".join(names)
    return f"{len(names)} x ({names[0]} .. {names[-1]})"


def _span(names: Sequence[str]) -> str:
    """NIC0,NIC1 or NIC0..NIC7."""
    return ",".join(names) if len(names) <= 2 else f"{names[0]}..{names[-1]}"


def _describe(resp: ppb.PlaceResponse) -> str:
    """One line: where a placement went and its bottleneck."""
    if not resp.placed:
        return f"nothing valid: {resp.reason}"
    nodes = sorted({a.node for a in resp.assignments})
    worst = min((g.bus_gbps for g in resp.predicted.groups if g.bus_gbps > 0), default=0.0)
    edges = "".join(
        f", KV {e.gbps:.0f} GB/s{'' if e.satisfied else ' (NOT met)'}" for e in resp.predicted.edges
    )
    return f"{_compress(nodes)} ({worst:.0f} GB/s{edges})"


def _print_result(
    out: TextIO,
    *,
    index: int,
    title: str,
    req: PlacementRequest,
    resp: ppb.PlaceResponse,
    baselines: dict[str, ppb.PlaceResponse],
) -> None:
    print(f"\n[{index}/{len(DEMO_REQUESTS)}] {title}", file=out)
    if req.scope.required is not None:
        print(f"      whole request: required scope {req.scope.required.name.lower()}", file=out)
    for g in req.groups:
        scope = f", required scope {g.scope.required.name.lower()}" if g.scope.required else ""
        print(
            f"      group {g.name}: {g.replicas} x ({g.pods} pod x {g.gpus_per_pod} GPUs), "
            f"{g.pattern.value} of {_gib(g.message_bytes)}{scope}",
            file=out,
        )
    if not resp.placed:
        print(f"      NOT PLACED: {resp.reason}", file=out)
        for r in resp.rejections[:5]:
            print(f"        {r.domain}: {r.code}: {r.message}", file=out)
        return
    rid = resp.reservation.id[:8] if resp.HasField("reservation") else "-"
    print(
        f"      placed by {resp.policy} in {resp.decision_seconds * 1e3:.1f} ms, reservation {rid}",
        file=out,
    )
    rows: list[tuple[str, ...]] = [("GROUP", "REPLICA", "POD", "NODE", "GPUS", "NICS")]
    for a in resp.assignments:
        rows.append(
            (
                a.group,
                str(a.replica),
                str(a.pod),
                a.node,
                ",".join(str(i) for i in a.gpus),
                _span(list(a.nics)) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "      " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(),
            file=out,
        )
    for gp in resp.predicted.groups:
        span = ppb.Scope.Name(gp.span).removeprefix("SCOPE_").lower()
        print(
            f"      predicted {gp.group}: bus bandwidth {gp.bus_gbps:.0f} GB/s, one all-reduce "
            f"{gp.collective_seconds * 1e3:.2f} ms, bottleneck {gp.bottleneck}, within one "
            f"{span}",
            file=out,
        )
    for e in resp.predicted.edges:
        print(
            f"      predicted KV path {e.source} -> {e.target}: {e.gbps:.0f} GB/s "
            f"({'meets' if e.satisfied else 'MISSES'} the need)",
            file=out,
        )
    for name, other in baselines.items():
        print(f"      {name:>13} would choose: {_describe(other)}", file=out)


DEMO_NODE_LABEL = "gputopo.io/demo"


async def ensure_demo_nodes(kube: KubeClient, nodes: Sequence[NodeTopology]) -> list[str]:
    """Create the Node objects the cluster lacks; returns the names created."""
    existing, _ = await kube.list_nodes()
    have = {n.name for n in existing}
    created = []
    for topo in nodes:
        if topo.name not in have:
            labels = {"kubernetes.io/hostname": topo.name, DEMO_NODE_LABEL: "true"}
            node: NodeObject = await kube.create_node(topo.name, labels=labels)
            created.append(node.name)
    return created


async def run_demo(*, out: TextIO, as_json: bool, kubeconfig: str | None = None) -> int:
    """Run the demo; returns the process exit code (0 when all three requests were placed)."""
    started = time.perf_counter()
    nodes = demo_nodes()
    gpus = sum(n.gpu_count for n in nodes)
    log = sys.stderr if as_json else out
    kube = KubeClient.from_kubeconfig(kubeconfig) if kubeconfig else None
    created = await ensure_demo_nodes(kube, nodes) if kube is not None else []
    agg = Aggregator(
        AggregatorConfig(
            kube=KubeOptions(publisher=PublisherConfig(qps=50.0, burst=100, settle_s=0.5))
        ),
        kube=kube,
    )
    await agg.start()
    report: dict[str, Any] = {
        "aggregator": agg.grpc_target,
        "nodes": len(nodes),
        "gpus": gpus,
        "requests": [],
    }
    try:
        print(
            f"gputopo demo: {len(nodes)} simulated nodes ({gpus} GPUs) streaming to the "
            f"aggregator at {agg.grpc_target}",
            file=log,
        )
        async with SimulatedExporters(nodes, target=agg.grpc_target) as sim:
            await sim.wait_acked(timeout_s=30)
            if agg.publisher is not None:
                await agg.publisher.wait_idle(120)
                stats = agg.publisher.stats
                report["kubernetes"] = {
                    "nodes_created": len(created),
                    "label_patches": stats.patches,
                    "labels_left_alone": sorted(stats.foreign),
                }
                print(
                    f"labelled the cluster's Node objects: {len(created)} created, "
                    f"{stats.patches} label patches (see: kubectl get nodes -l "
                    f"{DEMO_NODE_LABEL}=true -L fabric.topograph.run/tier-0,"
                    "accelerator.topograph.run/domain,gputopo.io/nvlink-domain-size)",
                    file=log,
                )
            agg.state.restore(
                Reservation(
                    id=f"existing-{job}",
                    gpus={n: frozenset(g) for n, g in held.items()},
                    expires_at=None,
                    owner=f"existing/{job}",
                    job=job,
                )
                for job, held in EXISTING_WORK.items()
            )
            snapshot = agg.state.snapshot()
            print(
                f"all {len(snapshot.nodes)} nodes reported in "
                f"{time.perf_counter() - started:.1f} s; {gpus - snapshot.free_gpus} GPUs are "
                f"busy with {len(EXISTING_WORK)} jobs already running",
                file=log,
            )
            async with grpcio.channel(agg.grpc_target) as channel:
                stub = pgrpc.PlacementStub(channel)
                placed_all = True
                for i, (title, data) in enumerate(DEMO_REQUESTS, start=1):
                    req = _request(data)
                    baselines = {}
                    for policy in BASELINES:  # same state, before our reservation lands
                        baselines[policy] = await stub.Place(
                            ppb.PlaceRequest(
                                request=request_to_proto(_request(data, policy=policy)),
                                dry_run=True,
                            )
                        )
                    resp = await stub.Place(ppb.PlaceRequest(request=request_to_proto(req)))
                    placed_all = placed_all and resp.placed
                    if as_json:
                        report["requests"].append(
                            {
                                "title": title,
                                "request": data,
                                "response": _to_dict(resp),
                                "baselines": {k: _to_dict(v) for k, v in baselines.items()},
                            }
                        )
                    else:
                        _print_result(
                            out, index=i, title=title, req=req, resp=resp, baselines=baselines
                        )
    finally:
        await agg.stop(grace_s=0.5)
        if kube is not None:
            kube.close()
    elapsed = time.perf_counter() - started
    if as_json:
        report["seconds"] = round(elapsed, 3)
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        print(
            f"\ndone in {elapsed:.1f} s; all three placed: {'yes' if placed_all else 'NO'}",
            file=out,
        )
    return 0 if placed_all else 1


def _to_dict(message: ppb.PlaceResponse) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def main(*, as_json: bool = False, kubeconfig: str | None = None) -> int:
    """Entry point of `gputopo demo`."""
    return asyncio.run(run_demo(out=sys.stdout, as_json=as_json, kubeconfig=kubeconfig))
