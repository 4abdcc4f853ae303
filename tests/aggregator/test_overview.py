"""The page's summary rows and the holders of a node's GPUs (`aggregator.overview`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from aggregator.claims import ClaimedDevice
from aggregator.occupancy import PodUse
from aggregator.overview import (
    FLAG_DEGRADED,
    FLAG_STALE,
    FLAG_UNPLACEABLE,
    SummaryCache,
    SummaryEncoder,
    holders,
)
from gputopo.cluster import ClusterSnapshot, NodeState
from gputopo.gpu_use import GpuHolder, GpuUse
from gputopo.links import LinkHealth
from gputopo.reservations import Reservation
from gputopo.topology import NodeTopology
from tests.builders import nvswitch_node, pcie_node

H100 = "NVIDIA H100 80GB HBM3"


def _model(topo: NodeTopology, name: str) -> NodeTopology:
    return replace(topo, gpus=tuple(replace(g, name=name) for g in topo.gpus))


def _degraded(topo: NodeTopology) -> NodeTopology:
    first = replace(topo.links[0], health=LinkHealth.DEGRADED, health_reason="lanes_down")
    return replace(topo, links=(first, *topo.links[1:]))


def _rows(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The summary's rows as dicts, table indices resolved, as the page reads them."""
    tables = {"domain": "domains", "model": "models", "nvlink": "nvlink", "reason": "reasons"}
    out = {}
    for row in body["nodes"]:
        named = dict(zip(body["fields"], row, strict=True))
        for field, table in tables.items():
            named[field] = body[table][named[field]]
        out[named["name"]] = named
    return out


def test_the_summary_is_one_small_row_per_node_with_its_domain_model_and_flags() -> None:
    nodes = [
        NodeState(
            _model(nvswitch_node("a-1", tiers=("leaf-1", "spine-1", "core")), H100),
            frozenset({0, 1, 2}),
        ),
        NodeState(
            _degraded(_model(nvswitch_node("a-2", tiers=("leaf-1", "spine-1", "core")), H100)),
            frozenset(range(8)),
        ),
        NodeState(
            nvswitch_node("nvl-1", gpus=4, tiers=("leaf-2", "spine-1", "core"), domain="rack-a"),
            frozenset(),
            placeable=False,
            reason="stale",
        ),
        NodeState(pcie_node("pcie-1"), frozenset({0}), placeable=False, reason="cordoned"),
    ]
    body = SummaryEncoder().body(
        ClusterSnapshot(nodes, generation=7), reserved={"a-1": {3, 4}}, as_of=1.5
    )
    rows = _rows(body)
    assert rows == {
        "a-1": {
            "name": "a-1",
            "domain": "core/spine-1/leaf-1",
            "model": H100,
            "gpus": 8,
            "free": 3,
            "reserved": 2,
            "flags": 0,
            "nvlink": "",
            "reason": "",
        },
        "a-2": {
            "name": "a-2",
            "domain": "core/spine-1/leaf-1",
            "model": H100,
            "gpus": 8,
            "free": 8,
            "reserved": 0,
            "flags": FLAG_DEGRADED,
            "nvlink": "",
            "reason": "",
        },
        "nvl-1": {
            "name": "nvl-1",
            "domain": "core/spine-1/leaf-2",
            "model": "",
            "gpus": 4,
            "free": 0,
            "reserved": 0,
            "flags": FLAG_STALE,
            "nvlink": "rack-a",
            "reason": "stale",
        },
        "pcie-1": {
            "name": "pcie-1",
            "domain": "",
            "model": "",
            "gpus": 8,
            "free": 1,
            "reserved": 0,
            "flags": FLAG_UNPLACEABLE,
            "nvlink": "",
            "reason": "cordoned",
        },
    }
    assert (body["generation"], body["as_of"]) == (7, 1.5)
    assert body["domains"].count("core/spine-1/leaf-1") == 1, "each string once"


def test_a_thousand_nodes_summarise_in_well_under_100_kb() -> None:
    """The figure behind the page's first paint (the browser test checks the bytes fetched)."""
    nodes = [
        NodeState(
            _model(
                nvswitch_node(
                    f"node-{s}-{leaf}-{i}", tiers=(f"leaf-{s}-{leaf}", f"spine-{s}", "core")
                ),
                H100,
            ),
            frozenset(range(i % 9)),
        )
        for s in range(5)
        for leaf in range(10)
        for i in range(20)
    ]
    body = SummaryEncoder().body(ClusterSnapshot(nodes), reserved={}, as_of=0.0)
    size = len(json.dumps(body, separators=(",", ":")))
    assert len(body["nodes"]) == 1000
    assert size < 100_000, size


def test_facts_are_kept_while_the_topology_object_is_the_same() -> None:
    topo = nvswitch_node("a-1")
    encoder = SummaryEncoder()
    first = encoder.facts(ClusterSnapshot([NodeState(topo, frozenset())]), "a-1")
    again = encoder.facts(ClusterSnapshot([NodeState(topo, frozenset({1}))]), "a-1")
    assert again is first
    changed = encoder.facts(ClusterSnapshot([NodeState(_degraded(topo), frozenset())]), "a-1")
    assert changed.degraded
    assert not first.degraded


def _reservation(rid: str, gpus: dict[str, frozenset[int]], **kw: Any) -> Reservation:
    return Reservation(rid, gpus, expires_at=kw.pop("expires_at", 100.0), **kw)


@pytest.mark.parametrize(
    ("parts", "want"),
    [
        pytest.param(
            {
                "reservations": [
                    _reservation("r1", {"n": frozenset({0, 1}), "m": frozenset({2})}, job="tp")
                ]
            },
            [
                {
                    "kind": "reservation",
                    "id": "r1",
                    "job": "tp",
                    "owner": "",
                    "committed": False,
                    "expires_at": 100.0,
                    "gpus": [0, 1],
                }
            ],
            id="a reservation, with only this node's GPUs",
        ),
        pytest.param(
            {
                "reservations": [
                    _reservation("r2", {"m": frozenset({0})}),
                    _reservation("r3", {"n": frozenset({5})}, owner="ml/train", expires_at=None),
                ]
            },
            [
                {
                    "kind": "reservation",
                    "id": "r3",
                    "job": "",
                    "owner": "ml/train",
                    "committed": True,
                    "expires_at": None,
                    "gpus": [5],
                }
            ],
            id="another node's reservation is not listed; a committed one says who owns it",
        ),
        pytest.param(
            {
                "kubelet": GpuUse(
                    held={
                        3: GpuHolder("ml", "p1", "main", "nvidia.com/gpu"),
                        2: GpuHolder("ml", "p1", "main", "nvidia.com/gpu"),
                    }
                ),
                "pods": [PodUse("ml/p1", "n", 2, reservation="r9")],
            },
            [
                {
                    "kind": "pod",
                    "pod": "ml/p1",
                    "source": "kubelet",
                    "via": "nvidia.com/gpu",
                    "gpus": [2, 3],
                    "reservation": "r9",
                }
            ],
            id="the kubelet locates a pod's GPUs; the pod object adds its reservation",
        ),
        pytest.param(
            {
                "pods": [
                    PodUse("a/counted", "n", 2),
                    PodUse("b/recorded", "n", 1, recorded=frozenset({6})),
                    PodUse("c/gone", "n", 1, reservation="expired"),
                ]
            },
            [
                {
                    "kind": "pod",
                    "pod": "a/counted",
                    "reservation": "",
                    "source": "counted",
                    "gpus": [],
                    "count": 2,
                },
                {
                    "kind": "pod",
                    "pod": "b/recorded",
                    "reservation": "",
                    "source": "recorded",
                    "gpus": [6],
                    "count": 1,
                },
                {
                    "kind": "pod",
                    "pod": "c/gone",
                    "reservation": "",
                    "source": "counted",
                    "gpus": [],
                    "count": 1,
                },
            ],
            id="counted pods have no GPUs, a recorded one has its, a dead reservation is dropped",
        ),
        pytest.param(
            {
                "claims": [
                    ClaimedDevice("n", 4, "gpu-4", "ml/claim"),
                    ClaimedDevice("n", None, "mig-1", "ml/mig", whole=False),
                ]
            },
            [
                {
                    "kind": "claim",
                    "claim": "ml/claim",
                    "device": "gpu-4",
                    "whole": True,
                    "gpus": [4],
                },
                {"kind": "claim", "claim": "ml/mig", "device": "mig-1", "whole": False, "gpus": []},
            ],
            id="DRA claims, a whole GPU and a slice",
        ),
    ],
)
def test_holders_name_who_holds_each_gpu(parts: dict[str, Any], want: list[dict[str, Any]]) -> None:
    got = holders(
        "n",
        reservations=parts.get("reservations", []),
        kubelet=parts.get("kubelet"),
        pods=parts.get("pods", []),
        claims=parts.get("claims", []),
        live=lambda rid: rid == "r9",
    )
    assert got == want


def test_the_summary_cache_shares_a_build_and_rebuilds_on_a_new_generation_or_a_failure() -> None:
    """Many open pages cost one build per state generation; a failed build is its caller's
    error and is not kept."""
    snapshot = ClusterSnapshot([NodeState(nvswitch_node("a-1"), frozenset({0}))])
    now = {"t": 0.0, "generation": 1, "fail": False}
    started = 0

    async def off_loop(work: Callable[[], bytes]) -> bytes:
        nonlocal started
        started += 1
        await asyncio.sleep(0)  # let the other requests arrive while this one builds
        if now["fail"]:
            raise RuntimeError("encoder broke")
        return work()

    cache = SummaryCache(
        generation=lambda: int(now["generation"]),
        inputs=lambda: (snapshot, {}),
        clock=lambda: float(now["t"]),
        off_loop=off_loop,
    )

    async def go() -> None:
        bodies = await asyncio.gather(*(cache.get() for _ in range(5)))
        assert len(set(bodies)) == 1
        assert json.loads(bodies[0])["nodes"][0][:5] == ["a-1", 0, 0, 8, 1]
        assert started == 1, "five concurrent requests, one build"
        await cache.get()
        assert started == 1
        now["generation"] = 2
        await cache.get()
        assert started == 2, "a new generation builds again"
        now["t"] = 10.0
        now["fail"] = True
        with pytest.raises(RuntimeError, match="encoder broke"):
            await cache.get()
        now["fail"] = False
        await cache.get()
        assert started == 4, "the failed build was not kept"

    asyncio.run(go())
