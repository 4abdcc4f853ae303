"""Random small placement instances that `sim.exhaustive` can solve: the yardstick's input.

Each instance is drawn from one `random.Random` (so a seed gives the same instances everywhere:
`gputopo bench placement --seed`, the tests) and mixes what makes placement hard:

- a cluster of 2-6 recorded machines (`KINDS`: DGX H100, HGX A100 with RoCE NICs, p4d A100
  with EFA, PCIe H100 servers with NVLink-bridged pairs, plain PCIe A10G boxes, 4-GPU H100
  servers, DGX-1 V100, NDv4 A100, GB200 trays) under 1-3 leaves of one spine; trays share one
  NVL72 domain (a multi-node NVLink domain) unless two are drawn;
- busy GPUs drawn per node at a rate drawn from `BUSY_RATES`, so nodes of one kind hold
  different free counts and gangs split unevenly;
- a request (`REQUESTS`): TP-2/TP-4 replicas, gangs of 2-3 pods of 1-4 GPUs (3 x 4 on 8-GPU
  nodes lands 8 + 4), all-reduce, all-to-all or pipeline; and prefill/decode pairs with a
  KV-cache deadline (TP-2 to TP-2, TP-4 to TP-2), whose ends may sit on different node kinds.

Instances whose exhaustive search would be too large are the caller's to skip (the optimum
raises `TooLargeError`), as are those with no valid placement.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.machines import load_machine, with_gpu_fabric
from gputopo.request import PlacementRequest, request_from_mapping
from gputopo.topology import FabricPosition

__all__ = ["BUSY_RATES", "KINDS", "REQUESTS", "small_instance"]

KINDS = (
    "dgx-h100",
    "hgx-a100-roce",
    "p4d-a100",
    "pcie-h100-nvlbridge-8x",
    "g5-a10g-8x",
    "h100-nv6-4x",
    "dgx1-v100",
    "ndv4-a100",
    "gb200-tray",
)
BUSY_RATES = (0.25, 0.5, 0.65, 0.8)
REQUESTS = (
    "tp2",
    "tp4",
    "2xtp2",
    "gang2x2",
    "gang3x1",
    "gang2x4",
    "gang3x2",
    "gang3x4",
    "pd2-2",
    "pd4-2",
)


def _cluster(rng: random.Random) -> ClusterSnapshot:
    count = rng.randint(2, 6)
    leaves = rng.randint(1, 3)
    racks = rng.choice((1, 1, 2))
    nodes = []
    for i in range(count):
        kind = rng.choice(KINDS)
        topo = load_machine(kind, node_name=f"n{i}-{kind}")
        domain = ""
        if kind == "gb200-tray":
            domain = f"nvl72-{rng.randrange(racks)}"
            topo = with_gpu_fabric(topo, cluster_uuid=domain, clique_id=0)
        topo = replace(
            topo,
            fabric=FabricPosition(
                tiers=(f"leaf-{rng.randrange(leaves)}", "spine"), accelerator_domain=domain
            ),
        )
        rate = rng.choice(BUSY_RATES)
        busy = {g for g in range(topo.gpu_count) if rng.random() < rate}
        nodes.append(NodeState(topo, frozenset(range(topo.gpu_count)) - busy))
    return ClusterSnapshot(nodes)


def _request(kind: str, pattern: str) -> PlacementRequest:
    data: dict[str, Any]
    if kind in ("tp2", "tp4"):
        data = {"groups": [{"name": "tp", "gpus_per_pod": int(kind[2]), "pattern": pattern}]}
    elif kind == "2xtp2":
        data = {"groups": [{"name": "tp", "replicas": 2, "gpus_per_pod": 2, "pattern": pattern}]}
    elif kind.startswith("gang"):
        pods, per = int(kind[4]), int(kind[-1])
        data = {"groups": [{"name": "g", "pods": pods, "gpus_per_pod": per, "pattern": pattern}]}
    else:
        prefill, decode = int(kind[2]), int(kind[-1])
        data = {
            "groups": [
                {"name": "prefill", "gpus_per_pod": prefill, "pattern": pattern},
                {"name": "decode", "gpus_per_pod": decode, "pattern": pattern},
            ],
            "edges": [
                {
                    "from": "prefill",
                    "to": "decode",
                    "transfer_bytes": 500_000_000,
                    "max_transfer_seconds": 0.01,
                }
            ],
        }
    return request_from_mapping(data)


def small_instance(rng: random.Random) -> tuple[ClusterSnapshot, PlacementRequest, str]:
    """One instance (see the module docstring) and a label naming its request and nodes."""
    snapshot = _cluster(rng)
    pattern = rng.choice(["all_reduce", "all_reduce", "all_to_all", "pipeline"])
    kind = rng.choice(REQUESTS)
    nodes = ",".join(
        f"{s.topology.name}:{len(s.free)}/{s.topology.gpu_count}" for s in snapshot.nodes.values()
    )
    return snapshot, _request(kind, pattern), f"{kind}/{pattern} on {nodes}"
