"""Table tests for the kueue-bestfit port.

Most rows re-express cases of Kueue's ``TestFindTopologyAssignments`` that the JSON file does not
carry (facts only: inputs and expected outputs, computed by Kueue's own test suite); the rest pin
down edge cases and quirks of this port. Each row's id tells the story.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from gputopo.placement.kueue_tas import (
    HOSTNAME_LABEL,
    TasAssignment,
    TasDomain,
    TasFailure,
    TasNode,
    TasRequest,
    TasTopology,
    find_topology_assignment,
)

BLOCK = "cloud.com/topology-block"
SUBBLOCK = "cloud.com/topology-subblock"
RACK = "cloud.com/topology-rack"
HOST = HOSTNAME_LABEL
GPU = "example.com/gpu"
THREE = (BLOCK, RACK, HOST)
TWO = (BLOCK, RACK)
FOUR = (BLOCK, SUBBLOCK, RACK, HOST)


def nodes(levels: tuple[str, ...], spec: str) -> tuple[TasNode, ...]:
    """One node per line: ``<label per level> : res=qty ...``; the name joins the labels."""
    built = []
    for line in spec.strip().splitlines():
        path, _, resources = line.partition(":")
        values = path.split()
        assert len(values) == len(levels), line
        allocatable = {k: float(v) for k, v in (kv.split("=") for kv in resources.split())}
        built.append(
            TasNode(
                name="-".join(values),
                labels=dict(zip(levels, values, strict=True)),
                allocatable=allocatable,
            )
        )
    return tuple(built)


# Kueue's fixtures (tas_cache_test.go), in the notation above.
DEFAULT_HOSTS = """
b1 r1 x3 : cpu=1 memory=1073741824 pods=10
b1 r2 x5 : cpu=1 memory=1073741824 pods=10
b1 r2 x1 : cpu=1 memory=1073741824 pods=10
b1 r2 x6 : cpu=1 memory=1073741824 pods=10
b2 r1 x2 : cpu=1 memory=1073741824 pods=10
b2 r2 x4 : cpu=2 memory=4294967296 pods=40
"""
DEFAULT_RACKS = "\n".join(
    " ".join(line.split()[:2] + line.split()[3:]) for line in DEFAULT_HOSTS.strip().splitlines()
)
SCATTERED_HOSTS = """
b1 r1 x3 : cpu=4 pods=10
b1 r1 x5 : cpu=1 pods=10
b1 r1 x1 : cpu=1 pods=10
b2 r1 x6 : cpu=2 pods=10
b2 r1 x2 : cpu=1 pods=10
"""


def req(
    pods: int,
    mode: str,
    level: str | None = None,
    *,
    slice_level: str | None = None,
    slice_size: int | None = None,
    **per_pod: float,
) -> TasRequest:
    per_pod = {GPU if k == "gpu" else k: v for k, v in per_pod.items()}
    return TasRequest(
        pods=pods,
        per_pod=per_pod,
        mode=mode,  # type: ignore[arg-type]
        level=level,
        slice_level=slice_level,
        slice_size=slice_size,
    )


@dataclass(frozen=True)
class Case:
    id: str
    levels: tuple[str, ...]
    nodes: tuple[TasNode, ...]
    request: TasRequest
    balanced: bool = False
    profile_mixed: bool = True
    usage: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    want: Mapping[tuple[str, ...], int] | None = None
    want_failure: str | None = None


def h(**counts: int) -> dict[tuple[str, ...], int]:
    """Wanted pods per host."""
    return {(host,): n for host, n in counts.items()}


CASES = [
    # --- Kueue cases the JSON does not carry -------------------------------------------------
    Case(
        "unconstrained; a single pod lands on the least free host, ties by path",
        THREE,
        nodes(THREE, DEFAULT_HOSTS),
        req(1, "unconstrained", cpu=1),
        want=h(x3=1),
    ),
    Case(
        "block required; 4 pods fit into one host each",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x3 : cpu=1 pods=10
            b1 r1 x5 : cpu=1 pods=10
            b1 r2 x1 : cpu=1 pods=10
            b1 r2 x6 : cpu=1 pods=10
            b2 r1 x2 : cpu=1 pods=10
            b2 r1 x4 : cpu=1 pods=10
            b2 r2 x7 : cpu=1 pods=10
            b2 r2 x8 : cpu=1 pods=10
        """,
        ),
        req(4, "required", BLOCK, cpu=1),
        want=h(x3=1, x5=1, x1=1, x6=1),
    ),
    Case(
        "rack required; multiple pods fit in a rack",
        TWO,
        nodes(TWO, DEFAULT_RACKS),
        req(3, "required", RACK, cpu=1),
        want={("b1", "r2"): 3},
    ),
    Case(
        "block preferred; pods fit in 2 blocks, the last one best-fitted",
        (BLOCK,),
        nodes((BLOCK,), "b1 : cpu=2 pods=20\nb2 : cpu=1 pods=10\nb3 : cpu=4 pods=40"),
        req(5, "preferred", BLOCK, cpu=1),
        want={("b2",): 1, ("b3",): 4},
    ),
    Case(
        "block required; single pod spread across two racks",
        TWO,
        nodes(TWO, DEFAULT_RACKS),
        req(4, "required", BLOCK, cpu=1),
        want={("b1", "r1"): 1, ("b1", "r2"): 3},
    ),
    Case(
        "block required; too many pods to fit",
        TWO,
        nodes(TWO, DEFAULT_RACKS),
        req(5, "required", BLOCK, cpu=1),
        want_failure='topology "default" allows to fit only 4 out of 5 pod(s)',
    ),
    Case(
        "rack preferred; only multiple blocks can hold the workload",
        TWO,
        nodes(TWO, DEFAULT_RACKS),
        req(6, "preferred", RACK, cpu=1),
        want={("b1", "r1"): 1, ("b1", "r2"): 3, ("b2", "r2"): 2},
    ),
    Case(
        "block preferred; not even the whole topology holds the workload",
        TWO,
        nodes(TWO, DEFAULT_RACKS),
        req(10, "preferred", BLOCK, cpu=1),
        want_failure='topology "default" allows to fit only 7 out of 10 pod(s)',
    ),
    Case(
        "nodes lacking the hostname label are left out, so the level has no domain",
        THREE,
        (TasNode(name="x3", labels={BLOCK: "b1", RACK: "r1"}, allocatable={"cpu": 1, "pods": 10}),),
        req(1, "required", RACK, cpu=1),
        want_failure="no topology domains at level: cloud.com/topology-rack",
    ),
    Case(
        "usage of other pods counts against the pods allocatable too",
        (HOST,),
        nodes((HOST,), "x3 : pods=10"),
        req(9, "required", HOST, cpu=0),
        usage={"x3": {"pods": 2}},
        want_failure='topology "default" allows to fit only 8 out of 9 pod(s)',
    ),
    Case(
        "usage of other pods blocks the only node, and the message says which resource",
        (HOST,),
        nodes((HOST,), "x3 : cpu=1 pods=10"),
        req(1, "required", HOST, cpu=0.6),
        usage={"x3": {"cpu": 0.6, "pods": 1}},
        want_failure=(
            'topology "default" doesn\'t allow to fit any of 1 pod(s). '
            'Total nodes: 1; excluded: resource "cpu": 1'
        ),
    ),
    Case(
        "usage of other pods on one node sends the pod to the free one",
        (HOST,),
        nodes((HOST,), "x3 : cpu=1 pods=10\nx5 : cpu=1 pods=10"),
        req(1, "required", HOST, cpu=0.6),
        usage={"x3": {"cpu": 0.6, "pods": 1}},
        want=h(x5=1),
    ),
    Case(
        "a node with no pod slot left is excluded for 'pods'",
        (HOST,),
        nodes((HOST,), "x3 : cpu=1 pods=1"),
        req(1, "required", HOST, cpu=0.3),
        usage={"x3": {"cpu": 0.3, "pods": 1}},
        want_failure=(
            'topology "default" doesn\'t allow to fit any of 1 pod(s). '
            'Total nodes: 1; excluded: resource "pods": 1'
        ),
    ),
    Case(
        "when two resources both fit no pod, the exclusion names the first by name",
        (HOST,),
        nodes((HOST,), "dual-shortage : cpu=0.5 pods=10 example.com/gpu=0"),
        req(1, "required", HOST, cpu=1, gpu=1),
        want_failure=(
            'topology "default" doesn\'t allow to fit any of 1 pod(s). '
            'Total nodes: 1; excluded: resource "cpu": 1'
        ),
    ),
    Case(
        "host slices; three equal hosts take one slice each",
        THREE,
        nodes(
            THREE, "b1 r1 x3 : cpu=3 pods=10\nb1 r1 x5 : cpu=3 pods=10\nb1 r1 x1 : cpu=3 pods=10"
        ),
        req(6, "required", BLOCK, slice_level=HOST, slice_size=2, cpu=1),
        want=h(x1=2, x3=2, x5=2),
    ),
    Case(
        "host slices; the tightest hosts that hold a slice win",
        THREE,
        nodes(
            THREE, "b1 r1 x3 : cpu=3 pods=10\nb1 r1 x5 : cpu=2 pods=10\nb1 r1 x1 : cpu=2 pods=10"
        ),
        req(4, "required", BLOCK, slice_level=HOST, slice_size=2, cpu=1),
        want=h(x1=2, x5=2),
    ),
    Case(
        "host slices; the last domain is best-fitted",
        THREE,
        nodes(
            THREE, "b1 r1 x3 : cpu=4 pods=10\nb1 r1 x5 : cpu=3 pods=10\nb1 r1 x1 : cpu=2 pods=10"
        ),
        req(6, "required", BLOCK, slice_level=HOST, slice_size=2, cpu=1),
        want=h(x1=2, x3=4),
    ),
    Case(
        "rack slices inside a required block",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x3 : cpu=1 pods=10
            b1 r1 x5 : cpu=1 pods=10
            b1 r2 x1 : cpu=1 pods=10
            b1 r2 x6 : cpu=1 pods=10
            b1 r2 x2 : cpu=1 pods=10
            b2 r1 x4 : cpu=1 pods=10
            b2 r1 x7 : cpu=1 pods=10
        """,
        ),
        req(4, "required", BLOCK, slice_level=RACK, slice_size=2, cpu=1),
        want=h(x3=1, x5=1, x1=1, x2=1),
    ),
    Case(
        "rack slices with a preferred block spill over two blocks",
        THREE,
        nodes(THREE, DEFAULT_HOSTS),
        req(4, "preferred", BLOCK, slice_level=RACK, slice_size=2, cpu=1),
        want=h(x1=1, x5=1, x4=2),
    ),
    Case(
        "preferred block with host slices; unbalanced blocks",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x3 : cpu=3 pods=10
            b1 r1 x5 : cpu=3 pods=10
            b1 r1 x1 : cpu=3 pods=10
            b2 r1 x6 : cpu=6 pods=10
        """,
        ),
        req(12, "preferred", BLOCK, slice_level=HOST, slice_size=3, cpu=1),
        want=h(x1=3, x3=3, x6=6),
    ),
    Case(
        "the block holds the pods but no rack holds a slice",
        THREE,
        nodes(
            THREE, "b1 r1 x3 : cpu=2 pods=10\nb1 r2 x5 : cpu=2 pods=10\nb1 r3 x1 : cpu=2 pods=10"
        ),
        req(6, "required", BLOCK, slice_level=RACK, slice_size=3, cpu=1),
        want_failure='topology "default" doesn\'t allow to fit any of 2 slice(s)',
    ),
    Case(
        "only 1 of 2 rack slices fits",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x3 : cpu=3 pods=10
            b1 r2 x5 : cpu=1 pods=10
            b1 r3 x1 : cpu=1 pods=10
            b1 r4 x6 : cpu=1 pods=10
        """,
        ),
        req(6, "required", BLOCK, slice_level=RACK, slice_size=3, cpu=1),
        want_failure='topology "default" allows to fit only 1 out of 2 slice(s)',
    ),
    Case(
        "both blocks hold the pods but only one holds the slices",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x3 : cpu=2 pods=10
            b1 r2 x5 : cpu=2 pods=10
            b1 r3 x1 : cpu=2 pods=10
            b2 r4 x6 : cpu=3 pods=10
            b2 r5 x2 : cpu=3 pods=10
        """,
        ),
        req(6, "required", BLOCK, slice_level=RACK, slice_size=3, cpu=1),
        want=h(x6=3, x2=3),
    ),
    Case(
        "slice level above the podset level is refused",
        THREE,
        nodes(THREE, DEFAULT_HOSTS),
        req(1, "required", HOST, slice_level=BLOCK, slice_size=1, cpu=1),
        want_failure=(
            "podset slice topology cloud.com/topology-block is above "
            "the podset topology kubernetes.io/hostname"
        ),
    ),
    Case(
        "slice level without a slice size is refused",
        THREE,
        nodes(THREE, DEFAULT_HOSTS),
        req(1, "required", BLOCK, slice_level=HOST, cpu=1),
        want_failure="slice topology requested, but slice size not provided",
    ),
    Case(
        "unknown slice level is refused",
        THREE,
        nodes(THREE, DEFAULT_HOSTS),
        req(1, "required", BLOCK, slice_level="not-existing-topology-level", slice_size=1, cpu=1),
        want_failure="no requested topology level for slices: not-existing-topology-level",
    ),
    Case(
        "unknown podset level is refused",
        THREE,
        nodes(THREE, DEFAULT_HOSTS),
        req(1, "required", "zone", cpu=1),
        want_failure="no requested topology level: zone",
    ),
    Case(
        "slice-only request; hosts filled from the least free",
        THREE,
        nodes(
            THREE, "b1 r1 x3 : cpu=3 pods=10\nb1 r1 x5 : cpu=3 pods=10\nb1 r1 x1 : cpu=3 pods=10"
        ),
        req(6, "unconstrained", slice_level=HOST, slice_size=2, cpu=1),
        want=h(x1=2, x3=2, x5=2),
    ),
    Case(
        "slice-only request over several blocks skips hosts that hold no slice",
        THREE,
        nodes(THREE, SCATTERED_HOSTS),
        req(6, "unconstrained", slice_level=HOST, slice_size=2, cpu=1),
        want=h(x3=4, x6=2),
    ),
    Case(
        "slice-only rack request over several blocks",
        THREE,
        nodes(THREE, DEFAULT_HOSTS),
        req(4, "unconstrained", slice_level=RACK, slice_size=2, cpu=1),
        want=h(x1=1, x5=1, x4=2),
    ),
    # --- balanced placement (TASBalancedPlacement) ------------------------------------------
    Case(
        "balanced; the smallest set of hosts that holds 23 pods, 12 and 11",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=15 pods=23
            b1 r1 x2 : example.com/gpu=13 pods=23
            b1 r1 x3 : example.com/gpu=10 pods=23
            """,
        ),
        req(23, "preferred", RACK, gpu=1),
        balanced=True,
        want=h(x1=12, x2=11),
    ),
    Case(
        "balanced with slices; the set with the least spare room",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=20 pods=25
            b1 r1 x2 : example.com/gpu=15 pods=25
            b1 r1 x3 : example.com/gpu=10 pods=25
            """,
        ),
        req(25, "preferred", RACK, slice_level=HOST, slice_size=5, gpu=1),
        balanced=True,
        want=h(x2=15, x3=10),
    ),
    Case(
        "balanced; the block allowing the higher minimum wins",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=20 pods=22
            b1 r1 x2 : example.com/gpu=10 pods=22
            b2 r2 x3 : example.com/gpu=15 pods=22
            b2 r2 x4 : example.com/gpu=15 pods=22
        """,
        ),
        req(22, "preferred", RACK, gpu=1),
        balanced=True,
        want=h(x3=11, x4=11),
    ),
    Case(
        "balanced; never mixes domains of two blocks",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=14 pods=25
            b1 r1 x2 : example.com/gpu=11 pods=25
            b2 r2 x3 : example.com/gpu=15 pods=25
            b2 r2 x4 : example.com/gpu=10 pods=25
        """,
        ),
        req(25, "preferred", RACK, gpu=1),
        balanced=True,
        want=h(x1=14, x2=11),
    ),
    Case(
        "balanced with slices; a single rack beats two racks",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=15 pods=25
            b1 r2 x2 : example.com/gpu=15 pods=25
            b1 r3 x3 : example.com/gpu=15 pods=25
            b1 r3 x4 : example.com/gpu=15 pods=25
        """,
        ),
        req(25, "preferred", RACK, slice_level=HOST, slice_size=5, gpu=1),
        balanced=True,
        want=h(x3=15, x4=10),
    ),
    Case(
        "balanced on four levels; slices two levels below the balanced level",
        FOUR,
        nodes(
            FOUR,
            """
            b1 sb1 r1 x1 : example.com/gpu=18 pods=20
            b1 sb1 r2 x2 : example.com/gpu=8 pods=20
            b1 sb2 r3 x3 : example.com/gpu=15 pods=20
            b1 sb2 r4 x4 : example.com/gpu=9 pods=20
            b1 sb2 r4 x5 : example.com/gpu=7 pods=20
        """,
        ),
        req(20, "preferred", SUBBLOCK, slice_level=HOST, slice_size=2, gpu=1),
        balanced=True,
        want=h(x3=10, x4=8, x5=2),
    ),
    Case(
        "balanced on four levels; slices one level below the balanced level",
        FOUR,
        nodes(
            FOUR,
            """
            b1 sb1 r1 x1 : example.com/gpu=18 pods=20
            b1 sb1 r2 x2 : example.com/gpu=8 pods=20
            b1 sb2 r3 x3 : example.com/gpu=15 pods=20
            b1 sb2 r4 x4 : example.com/gpu=9 pods=20
            b1 sb2 r4 x5 : example.com/gpu=7 pods=20
        """,
        ),
        req(20, "preferred", SUBBLOCK, slice_level=RACK, slice_size=2, gpu=1),
        balanced=True,
        want=h(x3=10, x4=3, x5=7),
    ),
    Case(
        "balanced on racks as leaves; slices at the leaf level",
        (BLOCK, SUBBLOCK, RACK),
        nodes(
            (BLOCK, SUBBLOCK, RACK),
            """
            b1 sb1 r1 : example.com/gpu=18 pods=20
            b1 sb1 r2 : example.com/gpu=8 pods=20
            b1 sb2 r3 : example.com/gpu=15 pods=20
            b1 sb2 r4 : example.com/gpu=15 pods=20
        """,
        ),
        req(20, "preferred", SUBBLOCK, slice_level=RACK, slice_size=2, gpu=1),
        balanced=True,
        want={("b1", "sb2", "r3"): 10, ("b1", "sb2", "r4"): 10},
    ),
    Case(
        "balanced on the slice level itself",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=15 pods=22
            b1 r1 x2 : example.com/gpu=13 pods=22
            b1 r1 x3 : example.com/gpu=10 pods=22
            b1 r2 x4 : example.com/gpu=20 pods=22
            b1 r2 x5 : example.com/gpu=8 pods=22
        """,
        ),
        req(22, "preferred", HOST, slice_level=HOST, slice_size=2, gpu=1),
        balanced=True,
        want=h(x2=12, x3=10),
    ),
    Case(
        "balanced on the lowest level",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=20 pods=22
            b1 r1 x2 : example.com/gpu=8 pods=22
            b1 r2 x3 : example.com/gpu=15 pods=22
            b1 r2 x4 : example.com/gpu=13 pods=22
            b1 r2 x5 : example.com/gpu=10 pods=22
        """,
        ),
        req(22, "preferred", HOST, gpu=1),
        balanced=True,
        want=h(x3=11, x4=11),
    ),
    Case(
        "balanced; the rack whose hosts are more even wins (entropy), second rack",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=10 pods=20
            b1 r1 x2 : example.com/gpu=5 pods=20
            b1 r2 x3 : example.com/gpu=5 pods=20
            b1 r2 x4 : example.com/gpu=5 pods=20
            b1 r2 x5 : example.com/gpu=5 pods=20
        """,
        ),
        req(15, "preferred", RACK, gpu=1),
        balanced=True,
        want=h(x3=5, x4=5, x5=5),
    ),
    Case(
        "balanced; the rack whose hosts are more even wins (entropy), first rack",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=8 pods=24
            b1 r1 x2 : example.com/gpu=8 pods=24
            b1 r1 x3 : example.com/gpu=8 pods=24
            b1 r2 x4 : example.com/gpu=16 pods=24
            b1 r2 x5 : example.com/gpu=8 pods=24
        """,
        ),
        req(24, "preferred", RACK, gpu=1),
        balanced=True,
        want=h(x1=8, x2=8, x3=8),
    ),
    Case(
        "balanced on the top level of a two-level topology",
        (RACK, HOST),
        nodes(
            (RACK, HOST),
            """
            r1 x1 : example.com/gpu=21 pods=22
            r1 x2 : example.com/gpu=9 pods=22
            r2 x3 : example.com/gpu=11 pods=22
            r2 x4 : example.com/gpu=10 pods=22
            r2 x5 : example.com/gpu=10 pods=22
        """,
        ),
        req(23, "preferred", RACK, gpu=1),
        balanced=True,
        want=h(x1=12, x3=11),
    ),
    Case(
        "balanced; pruning decides the block",
        THREE,
        nodes(
            THREE,
            """
            b1 r1 x1 : example.com/gpu=5 pods=20
            b1 r1 x2 : example.com/gpu=5 pods=20
            b1 r2 x3 : example.com/gpu=5 pods=20
            b1 r2 x4 : example.com/gpu=5 pods=20
            b2 r3 x5 : example.com/gpu=10 pods=20
            b2 r3 x6 : example.com/gpu=4 pods=20
            b2 r3 x7 : example.com/gpu=4 pods=20
            b2 r3 x8 : example.com/gpu=4 pods=20
            b2 r4 x9 : example.com/gpu=5 pods=20
            b2 r5 x10 : example.com/gpu=5 pods=20
        """,
        ),
        req(20, "preferred", RACK, gpu=1),
        balanced=True,
        want=h(x1=5, x2=5, x3=5, x4=5),
    ),
    # --- this port's own edge cases and kept quirks -----------------------------------------
    Case(
        "preferred rack climbs to the one block that holds all pods instead of mixing blocks",
        THREE,
        nodes(
            THREE, "b1 r1 x1 : cpu=2 pods=10\nb1 r2 x2 : cpu=2 pods=10\nb2 r3 x3 : cpu=3 pods=10"
        ),
        req(4, "preferred", RACK, cpu=1),
        want=h(x1=2, x2=2),
    ),
    Case(
        "above the slice level children of all chosen blocks are re-sorted together (Kueue quirk)",
        THREE,
        # Blocks get 8 + 2 pods, but racks are then taken for all 10 pods at once: b2's rack
        # ends up with 5 pods although its block was given 2.
        nodes(
            THREE, "b1 r1 x1 : cpu=4 pods=100\nb1 r2 x2 : cpu=4 pods=100\nb2 r3 x3 : cpu=5 pods=100"
        ),
        req(10, "preferred", BLOCK, cpu=1),
        want=h(x1=4, x2=1, x3=5),
    ),
    Case(
        "without the hostname level a rack sums its nodes, so a pod fits no single node (quirk)",
        TWO,
        nodes(TWO, "b1 r1 : cpu=1 pods=10\nb1 r1 : cpu=1 pods=10\nb1 r1 : cpu=1 pods=10"),
        req(1, "required", RACK, cpu=3),
        want={("b1", "r1"): 1},
    ),
    Case(
        "two nodes with the same hostname share one leaf",
        THREE,
        (
            TasNode("n1", {BLOCK: "b1", RACK: "r1", HOST: "x1"}, {"cpu": 1, "pods": 10}),
            TasNode("n2", {BLOCK: "b1", RACK: "r1", HOST: "x1"}, {"cpu": 1, "pods": 10}),
        ),
        req(2, "required", HOST, cpu=1),
        want=h(x1=2),
    ),
    Case(
        "a node missing a level label is ignored even when it is the largest",
        THREE,
        (
            TasNode("big", {BLOCK: "b1", HOST: "big"}, {"cpu": 64, "pods": 110}),
            TasNode("x1", {BLOCK: "b1", RACK: "r1", HOST: "x1"}, {"cpu": 2, "pods": 110}),
        ),
        req(3, "preferred", RACK, cpu=1),
        want_failure='topology "default" allows to fit only 2 out of 3 pod(s)',
    ),
    Case(
        "a node without a pods allocatable fits nothing, as in Kueue",
        (HOST,),
        nodes((HOST,), "x1 : cpu=8"),
        req(1, "required", HOST, cpu=1),
        want_failure=(
            'topology "default" doesn\'t allow to fit any of 1 pod(s). '
            'Total nodes: 1; excluded: resource "pods": 1'
        ),
    ),
    Case(
        "usage above allocatable leaves no room rather than a negative count",
        (HOST,),
        nodes((HOST,), "x1 : cpu=2 pods=10\nx2 : cpu=1 pods=10"),
        req(1, "unconstrained", cpu=1),
        usage={"x1": {"cpu": 5}},
        want=h(x2=1),
    ),
    Case(
        "usage of a node the topology does not hold is ignored",
        (HOST,),
        nodes((HOST,), "x1 : cpu=1 pods=10"),
        req(1, "required", HOST, cpu=1),
        usage={"elsewhere": {"cpu": 1}},
        want=h(x1=1),
    ),
    Case(
        "fractional CPU requests are counted exactly (3 x 0.1 in 0.3)",
        (HOST,),
        nodes((HOST,), "x1 : cpu=0.3 pods=10"),
        req(3, "required", HOST, cpu=0.1),
        want=h(x1=3),
    ),
    Case(
        "a zero-pod PodSet gets an empty assignment",
        THREE,
        nodes(THREE, DEFAULT_HOSTS),
        req(0, "required", BLOCK, cpu=1),
        want={},
    ),
    Case(
        "TASProfileMixed off: unconstrained uses BestFit and packs the largest hosts",
        THREE,
        nodes(THREE, SCATTERED_HOSTS),
        req(6, "unconstrained", cpu=1),
        profile_mixed=False,
        want=h(x3=4, x6=2),
    ),
    Case(
        "balanced placement does not apply to required requests",
        THREE,
        nodes(
            THREE, "b1 r1 x1 : example.com/gpu=15 pods=25\nb1 r2 x2 : example.com/gpu=15 pods=25"
        ),
        req(25, "required", BLOCK, gpu=1),
        balanced=True,
        want=h(x1=15, x2=10),
    ),
    Case(
        "balanced placement falls back to BestFit when no balanced plan exists",
        THREE,
        nodes(
            THREE, "b1 r1 x1 : example.com/gpu=15 pods=25\nb2 r2 x2 : example.com/gpu=15 pods=25"
        ),
        req(25, "preferred", RACK, gpu=1),
        balanced=True,
        want=h(x1=15, x2=10),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_assignment(case: Case) -> None:
    topology = TasTopology(levels=case.levels, nodes=case.nodes)
    got = topology.assign(
        case.request,
        usage=case.usage,
        balanced_placement=case.balanced,
        profile_mixed=case.profile_mixed,
    )
    if case.want_failure is not None:
        assert got == TasFailure(case.want_failure)
        return
    assert isinstance(got, TasAssignment), got
    assert dict(got.domains) == case.want
    assert len(got.domains) == len(case.want), "a domain appears twice"
    paths = [full_path(case, d.values) for d in got.domains]
    assert paths == sorted(paths), "domains are not in path order"


def full_path(case: Case, values: tuple[str, ...]) -> tuple[str, ...]:
    """The whole label path of an assignment domain (hostname-only values included)."""
    for node in case.nodes:
        path = tuple(node.labels[level] for level in case.levels)
        if path[-len(values) :] == values:
            return path
    raise AssertionError(f"no node behind {values}")


def test_assignment_levels_are_the_hostname_alone_when_it_is_the_lowest_level() -> None:
    got = find_topology_assignment(
        levels=THREE, nodes=nodes(THREE, DEFAULT_HOSTS), request=req(1, "required", RACK, cpu=1)
    )
    assert isinstance(got, TasAssignment)
    assert got.levels == (HOST,)


def test_failure_names_the_topology() -> None:
    got = find_topology_assignment(
        levels=TWO,
        nodes=nodes(TWO, DEFAULT_RACKS),
        request=req(4, "required", RACK, cpu=1),
        topology_name="gb200",
    )
    assert got == TasFailure('topology "gb200" allows to fit only 3 out of 4 pod(s)')


def test_second_podset_sees_the_first_through_usage_of() -> None:
    """Kueue's "block required for one, unconstrained for another" PodSet pair."""
    topology = TasTopology(
        levels=THREE,
        nodes=nodes(
            THREE,
            """
            b1 r1 x3 : cpu=10 pods=10
            b1 r2 x5 : cpu=10 pods=10
            b1 r2 x1 : cpu=10 pods=10
            b1 r2 x6 : cpu=10 pods=10
            b2 r1 x2 : cpu=10 pods=10
            b2 r2 x4 : cpu=20 pods=40
        """,
        ),
    )
    first = topology.assign(req(8, "required", BLOCK, cpu=1))
    assert isinstance(first, TasAssignment)
    assert first.domains == (TasDomain(("x2",), 8),)
    usage = topology.usage_of(first, {"cpu": 1})
    assert usage == {"b2-r1-x2": {"cpu": 8, "pods": 8}}
    second = topology.assign(req(2, "unconstrained", cpu=1), usage=usage)
    assert second == TasAssignment((HOST,), (TasDomain(("x2",), 2),))


def test_usage_of_charges_an_aggregated_leaf_to_its_first_node() -> None:
    """Kueue's "two PodSets with overlapping domain": the second sees the first's usage."""
    topology = TasTopology(
        levels=(BLOCK,),
        nodes=nodes((BLOCK,), "b1 : cpu=2 pods=10\nb2 : cpu=2 pods=10\nb3 : cpu=2 pods=10"),
    )
    first = topology.assign(req(3, "preferred", BLOCK, cpu=1))
    assert first == TasAssignment((BLOCK,), (TasDomain(("b1",), 2), TasDomain(("b2",), 1)))
    assert topology.nodes_of(("b2",)) == ("b2",)
    second = topology.assign(
        req(3, "preferred", BLOCK, cpu=1), usage=topology.usage_of(first, {"cpu": 1})
    )
    assert second == TasAssignment((BLOCK,), (TasDomain(("b2",), 1), TasDomain(("b3",), 2)))


def test_a_topology_can_be_reused_without_state_leaking_between_calls() -> None:
    """Kueue resets per-domain state per PodSet; a stale count would turn this failure into a
    bogus assignment."""
    topology = TasTopology(
        levels=(HOST,), nodes=nodes((HOST,), "x1 : cpu=4 pods=10\nx2 : cpu=4 pods=10")
    )
    assert isinstance(topology.assign(req(1, "unconstrained", cpu=1)), TasAssignment)
    assert topology.assign(
        req(1, "unconstrained", cpu=1), usage={"x1": {"cpu": 4}, "x2": {"cpu": 4}}
    ) == TasFailure(
        'topology "default" doesn\'t allow to fit any of 1 pod(s). '
        'Total nodes: 2; excluded: resource "cpu": 2'
    )
    again = topology.assign(req(8, "required", HOST, cpu=1))
    assert again == TasFailure('topology "default" allows to fit only 4 out of 8 pod(s)')


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"pods": -1, "per_pod": {}, "mode": "required", "level": BLOCK}, "pods"),
        ({"pods": 1, "per_pod": {}, "mode": "nearby", "level": BLOCK}, "mode"),
        ({"pods": 1, "per_pod": {}, "mode": "required"}, "level"),
        ({"pods": 1, "per_pod": {}, "mode": "unconstrained", "level": BLOCK}, "level"),
        (
            {"pods": 1, "per_pod": {}, "mode": "required", "level": BLOCK, "slice_size": 2},
            "slice_size",
        ),
        (
            {
                "pods": 1,
                "per_pod": {},
                "mode": "required",
                "level": BLOCK,
                "slice_level": HOST,
                "slice_size": 0,
            },
            "slice_size",
        ),
        ({"pods": 1, "per_pod": {"cpu": -1}, "mode": "required", "level": BLOCK}, "per_pod"),
        (
            {
                "pods": 5,
                "per_pod": {},
                "mode": "required",
                "level": BLOCK,
                "slice_level": HOST,
                "slice_size": 2,
            },
            "pods",
        ),
    ],
    ids=[
        "negative pods",
        "unknown mode",
        "required without a level",
        "unconstrained with a level",
        "slice size without a slice level",
        "slice size of zero",
        "negative request",
        "pods not a multiple of the slice size",
    ],
)
def test_invalid_request_names_the_field(kwargs: dict[str, object], field_name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field_name}"):
        TasRequest(**kwargs)  # type: ignore[arg-type]


def test_topology_needs_distinct_levels() -> None:
    with pytest.raises(ValueError, match=r"^levels"):
        TasTopology(levels=(RACK, RACK), nodes=())
    with pytest.raises(ValueError, match=r"^levels"):
        TasTopology(levels=(), nodes=())
