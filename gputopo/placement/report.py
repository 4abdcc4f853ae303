"""A placement result as plain data (JSON-ready) and as text, for the command line.

The JSON form follows the gRPC `PlaceResponse` field names (`placed`, `assignments` with
`{group, replica, pod, rank, node, gpus, gpu_uuids, nics}`, `predicted`, `reason`,
`rejections`), so scripts can read either; unbounded figures (a single GPU's bus bandwidth)
are null rather than Infinity, which JSON cannot carry.
"""

from __future__ import annotations

import math
from typing import Any

from gputopo.cluster import ClusterSnapshot
from gputopo.placement.result import PlacementResult

__all__ = ["result_to_dict", "result_to_text"]


def _num(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def result_to_dict(
    result: PlacementResult, snapshot: ClusterSnapshot, *, seconds: float | None = None
) -> dict[str, Any]:
    """The result as JSON-ready data (see the module docstring)."""
    assignments = []
    for p in result.pods:
        topo = snapshot.node(p.node).topology
        shape = snapshot.shape(p.node)
        nics = sorted(
            {
                shape.nic_names[shape.nics[g][0][0]]
                for g in p.gpus
                if g < len(shape.nics) and shape.nics[g]
            }
        )
        assignments.append(
            {
                "group": p.group,
                "replica": p.replica,
                "pod": p.pod,
                "rank": p.rank,
                "node": p.node,
                "gpus": list(p.gpus),
                "gpu_uuids": [topo.gpus[g].uuid for g in p.gpus if g < topo.gpu_count],
                "nics": nics,
            }
        )
    out: dict[str, Any] = {
        "placed": result.placed,
        "policy": result.policy,
        "assignments": assignments,
        "predicted": None,
        "reason": result.reason,
        "rejections": [
            {"domain": r.domain, "code": r.code, "message": r.message} for r in result.rejections
        ],
    }
    if seconds is not None:
        out["decision_ms"] = round(seconds * 1e3, 3)
    pred = result.prediction
    if pred is not None:
        out["predicted"] = {
            "groups": [
                {
                    "group": g.group,
                    "bus_gbps": _num(g.bus_gbps),
                    "collective_seconds": _num(g.collective_seconds),
                    "bottleneck": g.bottleneck,
                    "span": g.span.name.lower(),
                    "message_bytes": g.message_bytes,
                }
                for g in pred.groups
            ],
            "edges": [
                {
                    "source": e.source,
                    "target": e.target,
                    "gbps": _num(e.gbps),
                    "transfer_seconds": _num(e.transfer_seconds),
                    "satisfied": e.satisfied,
                }
                for e in pred.edges
            ],
            "communication_seconds": _num(pred.communication_seconds),
            "bottleneck_gbps": _num(pred.bottleneck_gbps),
        }
    return out


def result_to_text(data: dict[str, Any]) -> str:
    """A readable summary of `result_to_dict`'s output."""
    lines = []
    if not data["placed"]:
        lines.append(f"NOT PLACED by {data['policy']}: {data['reason']}")
        for r in data["rejections"][:20]:
            lines.append(f"  {r['domain']}: {r['code']}: {r['message']}")
        return "\n".join(lines)
    took = f" in {data['decision_ms']:.1f} ms" if "decision_ms" in data else ""
    lines.append(f"placed by {data['policy']}{took}")
    rows = [("GROUP", "REPLICA", "POD", "RANK", "NODE", "GPUS", "NICS")]
    for a in data["assignments"]:
        rows.append(
            (
                a["group"],
                str(a["replica"]),
                str(a["pod"]),
                str(a["rank"]),
                a["node"],
                ",".join(str(g) for g in a["gpus"]),
                ",".join(a["nics"]) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    pred = data["predicted"]
    for g in pred["groups"]:
        bus = "-" if g["bus_gbps"] is None else f"{g['bus_gbps']:.0f} GB/s"
        lines.append(
            f"  predicted {g['group']}: bus bandwidth {bus}, one collective "
            f"{(g['collective_seconds'] or 0) * 1e3:.2f} ms, bottleneck {g['bottleneck']}, "
            f"within one {g['span']}"
        )
    for e in pred["edges"]:
        gbps = "-" if e["gbps"] is None else f"{e['gbps']:.0f} GB/s"
        verdict = "meets the need" if e["satisfied"] else "MISSES the need"
        lines.append(f"  predicted edge {e['source']} -> {e['target']}: {gbps} ({verdict})")
    return "\n".join(lines)
