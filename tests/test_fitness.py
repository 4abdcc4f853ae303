"""Node fitness, rule by rule, as kube-scheduler v1.20 decides it (gputopo.fitness).

Each case is a story: a node or two, the pods already on them, one pod, and which nodes it
fits, or kube-scheduler's exact reason. The differential test
(tests/scheduler/test_fitness_differential_kube.py) checks the same function against a real
kube-scheduler on thousands of random cases; what it ever found is kept here as a case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import pytest

from gputopo.fitness import (
    FitnessView,
    QuantityError,
    UsageBook,
    fit_error_message,
    milli_value,
    node_facts,
    parse_quantity,
    pod_request,
    value,
)

_ROOMY = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}


def node(
    name: str = "n",
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[tuple[str, str, str]] = (),
    cordoned: bool = False,
    allocatable: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node as the API serves it."""
    return {
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "unschedulable": cordoned,
            "taints": [{"key": k, "value": v, "effect": e} for k, v, e in taints],
        },
        "status": {"allocatable": dict(_ROOMY if allocatable is None else allocatable)},
    }


def container(requests: Mapping[str, str] | None = None, **ports: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": "c", "resources": {"requests": dict(requests or {})}}
    if ports:
        out["ports"] = [ports]
    return out


def pod(
    *,
    requests: Mapping[str, str] | None = None,
    init: Mapping[str, str] | None = None,
    overhead: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    selector: Mapping[str, str] | None = None,
    terms: Sequence[Mapping[str, Any]] | None = None,
    preferred: Sequence[tuple[int, Mapping[str, Any]]] = (),
    host_port: Mapping[str, Any] | None = None,
    node_name: str = "",
    phase: str = "Pending",
) -> dict[str, Any]:
    """A Pod with what the filters read."""
    spec: dict[str, Any] = {
        "containers": [container(requests, **dict(host_port or {}))],
        "tolerations": [dict(t) for t in tolerations],
        "nodeSelector": dict(selector or {}),
    }
    if init is not None:
        spec["initContainers"] = [container(init)]
    if overhead is not None:
        spec["overhead"] = dict(overhead)
    affinity: dict[str, Any] = {}
    if terms is not None:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [dict(t) for t in terms]
        }
    if preferred:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": w, "preference": dict(t)} for w, t in preferred
        ]
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {"namespace": "ns", "name": "p"},
        "spec": spec,
        "status": {"phase": phase},
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


@dataclass(frozen=True)
class Case:
    """One pod against some nodes: the fit nodes, and the reasons kube-scheduler counts."""

    pod: dict[str, Any]
    nodes: tuple[dict[str, Any], ...] = (node(),)
    bound: tuple[dict[str, Any], ...] = ()
    want_fit: tuple[str, ...] = ("n",)
    want_reasons: Mapping[str, int] = field(default_factory=dict)


_UNSCHED = "node(s) were unschedulable"
_AFFINITY = "node(s) didn't match Pod's node affinity"
_PORTS = "node(s) didn't have free ports for the requested pod ports"
_HOSTNAME = "node(s) didn't match the requested hostname"


def _taint(key: str, value: str = "") -> str:
    return f"node(s) had taint {{{key}: {value}}}, that the pod didn't tolerate"


def _no(reason: str, count: int = 1) -> dict[str, Any]:
    return {"want_fit": (), "want_reasons": {reason: count}}


CASES = [
    # --- NodeUnschedulable ---
    pytest.param(Case(pod(), (node(cordoned=True),), **_no(_UNSCHED)), id="a cordoned node"),
    pytest.param(
        Case(
            pod(
                tolerations=[
                    {
                        "key": "node.kubernetes.io/unschedulable",
                        "operator": "Exists",
                        "effect": "NoSchedule",
                    }
                ]
            ),
            (node(cordoned=True),),
        ),
        id="a cordon is tolerated by the unschedulable taint's toleration",
    ),
    pytest.param(
        Case(
            pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoExecute"}]),
            (node(cordoned=True),),
            **_no(_UNSCHED),
        ),
        id="a toleration of the unschedulable key with the wrong effect does not lift a cordon",
    ),
    pytest.param(
        Case(pod(tolerations=[{"operator": "Exists"}]), (node(cordoned=True),)),
        id="tolerate-everything also lifts a cordon",
    ),
    # --- NodeName ---
    pytest.param(
        Case(
            pod(node_name="m"),
            (node("n"), node("m")),
            want_fit=("m",),
            want_reasons={_HOSTNAME: 1},
        ),
        id="a pod naming a node fits only there",
    ),
    pytest.param(
        Case(pod(node_name="m"), (node("n"),), **_no(_HOSTNAME)),
        id="a pod naming another node: requested hostname",
    ),
    # --- TaintToleration ---
    pytest.param(
        Case(pod(), (node(taints=[("k", "v", "NoSchedule")]),), **_no(_taint("k", "v"))),
        id="an untolerated NoSchedule taint is named with its value",
    ),
    pytest.param(
        Case(pod(), (node(taints=[("k", "", "NoExecute")]),), **_no(_taint("k"))),
        id="an untolerated NoExecute taint rejects too",
    ),
    pytest.param(
        Case(pod(), (node(taints=[("k", "v", "PreferNoSchedule")]),)),
        id="a PreferNoSchedule taint never rejects",
    ),
    pytest.param(
        Case(
            pod(tolerations=[{"key": "k", "operator": "Equal", "value": "v"}]),
            (node(taints=[("k", "v", "NoSchedule"), ("k", "v", "NoExecute")]),),
        ),
        id="Equal with an empty effect tolerates every effect of that key and value",
    ),
    pytest.param(
        Case(
            pod(tolerations=[{"key": "k", "value": "w"}]),
            (node(taints=[("k", "v", "NoSchedule")]),),
            **_no(_taint("k", "v")),
        ),
        id="an empty operator means Equal: another value does not tolerate",
    ),
    pytest.param(
        Case(
            pod(tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]),
            (node(taints=[("k", "a", "NoSchedule"), ("k", "b", "NoExecute")]),),
            **_no(_taint("k", "b")),
        ),
        id="Exists with an effect tolerates only that effect; the first untolerated is named",
    ),
    pytest.param(
        Case(
            pod(tolerations=[{"operator": "Exists"}]),
            (node(taints=[("a", "1", "NoSchedule"), ("b", "", "NoExecute")]),),
        ),
        id="an empty key with Exists tolerates everything",
    ),
    pytest.param(
        Case(
            pod(tolerations=[{"key": "k", "operator": "Exists"}]),
            (node(taints=[("k", "x", "NoSchedule"), ("j", "y", "NoSchedule")]),),
            **_no(_taint("j", "y")),
        ),
        id="Exists on one key leaves the others",
    ),
    # --- NodeAffinity: nodeSelector ---
    pytest.param(
        Case(
            pod(selector={"gpu": "h100", "zone": "b"}),
            (node("a", labels={"gpu": "h100", "zone": "b"}), node("b", labels={"gpu": "h100"})),
            want_fit=("a",),
            want_reasons={_AFFINITY: 1},
        ),
        id="nodeSelector needs every label",
    ),
    # --- NodeAffinity: required terms, every operator ---
    pytest.param(
        Case(
            pod(terms=[expr("gpu", "In", "a100", "h100")]),
            (node("a", labels={"gpu": "h100"}), node("b", labels={"gpu": "l4"}), node("c")),
            want_fit=("a",),
            want_reasons={_AFFINITY: 2},
        ),
        id="In: the label has one of the values",
    ),
    pytest.param(
        Case(
            pod(terms=[expr("gpu", "NotIn", "l4")]),
            (node("a", labels={"gpu": "h100"}), node("b", labels={"gpu": "l4"}), node("c")),
            want_fit=("a", "c"),
            want_reasons={_AFFINITY: 1},
        ),
        id="NotIn: a node without the label matches",
    ),
    pytest.param(
        Case(
            pod(terms=[{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]),
            (node("a", labels={"gpu": ""}), node("b")),
            want_fit=("a",),
            want_reasons={_AFFINITY: 1},
        ),
        id="Exists: an empty label value still exists",
    ),
    pytest.param(
        Case(
            pod(terms=[{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]),
            (node("a", labels={"gpu": "x"}), node("b")),
            want_fit=("b",),
            want_reasons={_AFFINITY: 1},
        ),
        id="DoesNotExist",
    ),
    pytest.param(
        Case(
            pod(terms=[expr("rack", "Gt", "7")]),
            (
                node("a", labels={"rack": "12"}),
                node("b", labels={"rack": "7"}),
                node("c", labels={"rack": "x9"}),
                node("d"),
            ),
            want_fit=("a",),
            want_reasons={_AFFINITY: 3},
        ),
        id="Gt: strictly greater; a non-integer or missing label never matches",
    ),
    pytest.param(
        Case(
            pod(terms=[expr("rack", "Lt", "7")]),
            (node("a", labels={"rack": "-3"}), node("b", labels={"rack": "7"})),
            want_fit=("a",),
            want_reasons={_AFFINITY: 1},
        ),
        id="Lt: strictly less, negative numbers included",
    ),
    pytest.param(
        Case(
            pod(terms=[expr("gpu", "In", "h100"), expr("zone", "In", "b")]),
            (node("a", labels={"gpu": "h100"}), node("b", labels={"zone": "b"}), node("c")),
            want_fit=("a", "b"),
            want_reasons={_AFFINITY: 1},
        ),
        id="terms are ORed",
    ),
    pytest.param(
        Case(
            pod(
                terms=[
                    {
                        "matchExpressions": [
                            {"key": "gpu", "operator": "In", "values": ["h100"]},
                            {"key": "zone", "operator": "In", "values": ["b"]},
                        ]
                    }
                ]
            ),
            (node("a", labels={"gpu": "h100", "zone": "b"}), node("b", labels={"gpu": "h100"})),
            want_fit=("a",),
            want_reasons={_AFFINITY: 1},
        ),
        id="expressions of one term are ANDed",
    ),
    pytest.param(
        Case(
            pod(
                terms=[
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}
                ]
            ),
            (node("a"), node("b")),
            want_fit=("b",),
            want_reasons={_AFFINITY: 1},
        ),
        id="matchFields In on metadata.name",
    ),
    pytest.param(
        Case(
            pod(
                terms=[
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["b"]}
                        ]
                    }
                ]
            ),
            (node("a"), node("b")),
            want_fit=("a",),
            want_reasons={_AFFINITY: 1},
        ),
        id="matchFields NotIn on metadata.name",
    ),
    pytest.param(
        Case(pod(terms=[{}]), **_no(_AFFINITY)),
        id="an empty term matches nothing",
    ),
    pytest.param(
        Case(
            pod(selector={"gpu": "h100"}, terms=[expr("zone", "In", "b")]),
            (
                node("a", labels={"gpu": "h100", "zone": "b"}),
                node("b", labels={"gpu": "h100"}),
                node("c", labels={"zone": "b"}),
            ),
            want_fit=("a",),
            want_reasons={_AFFINITY: 2},
        ),
        id="nodeSelector AND required affinity",
    ),
    # --- NodePorts ---
    pytest.param(
        Case(
            pod(host_port={"hostPort": 8080, "containerPort": 80}),
            bound=(pod(node_name="n", host_port={"hostPort": 8080, "hostIP": "10.0.0.1"}),),
            **_no(_PORTS),
        ),
        id="a wildcard host port conflicts with the same port on any IP",
    ),
    pytest.param(
        Case(
            pod(host_port={"hostPort": 8080, "hostIP": "10.0.0.2"}),
            bound=(pod(node_name="n", host_port={"hostPort": 8080, "hostIP": "10.0.0.1"}),),
        ),
        id="two specific IPs share a port",
    ),
    pytest.param(
        Case(
            pod(host_port={"hostPort": 8080, "hostIP": "10.0.0.2"}),
            bound=(pod(node_name="n", host_port={"hostPort": 8080}),),
            **_no(_PORTS),
        ),
        id="a specific IP conflicts with a port held on 0.0.0.0",
    ),
    pytest.param(
        Case(
            pod(host_port={"hostPort": 8080, "protocol": "UDP"}),
            bound=(pod(node_name="n", host_port={"hostPort": 8080}),),
        ),
        id="UDP and TCP on one port do not conflict",
    ),
    pytest.param(
        Case(
            pod(host_port={"hostPort": 8080}),
            bound=(pod(node_name="n", host_port={"hostPort": 8080}, phase="Succeeded"),),
        ),
        id="a finished pod holds no port",
    ),
    # --- NodeResourcesFit ---
    pytest.param(
        Case(
            pod(requests={"cpu": "8"}),
            bound=(pod(node_name="n", requests={"cpu": "1m"}),),
            **_no("Insufficient cpu"),
        ),
        id="cpu against allocatable minus what bound pods request, to the millicore",
    ),
    pytest.param(
        Case(
            pod(requests={"cpu": "2", "memory": "40Gi", "ephemeral-storage": "200Gi"}),
            want_fit=(),
            want_reasons={"Insufficient memory": 1, "Insufficient ephemeral-storage": 1},
        ),
        id="every short resource is a reason of its own",
    ),
    pytest.param(
        Case(
            pod(requests={"nvidia.com/gpu": "8"}),
            (node(allocatable={**_ROOMY, "nvidia.com/gpu": "6"}),),
            **_no("Insufficient nvidia.com/gpu"),
        ),
        id="8 GPUs do not fit a node advertising 6",
    ),
    pytest.param(
        Case(pod(requests={"nvidia.com/gpu": "1"}), **_no("Insufficient nvidia.com/gpu")),
        id="an extended resource missing from allocatable fails",
    ),
    pytest.param(
        Case(
            pod(requests={"nvidia.com/gpu": "2"}),
            (node(allocatable={**_ROOMY, "nvidia.com/gpu": "8"}),),
            bound=(pod(node_name="n", requests={"nvidia.com/gpu": "6"}),),
        ),
        id="2 GPUs fit beside 6 bound of 8",
    ),
    pytest.param(
        Case(
            pod(),
            (node(allocatable={"cpu": "1", "memory": "1Gi", "pods": "1"}),),
            bound=(pod(node_name="n"),),
            **_no("Too many pods"),
        ),
        id="one pod more than allocatable pods",
    ),
    pytest.param(
        Case(pod(), bound=(pod(node_name="n", requests={"cpu": "9"}),)),
        id="a pod asking nothing fits an overcommitted node",
    ),
    pytest.param(
        Case(
            pod(requests={"memory": "1Gi"}),
            bound=(pod(node_name="n", requests={"cpu": "9"}),),
            **_no("Insufficient cpu"),
        ),
        id="a pod asking anything fails an overcommitted node, even on a resource it skips",
    ),
    pytest.param(
        Case(pod(requests={"example.com/fpga": "0"})),
        id="asking zero of a resource the node lacks fits",
    ),
    pytest.param(
        Case(
            pod(requests={"cpu": "1"}, init={"cpu": "9"}),
            **_no("Insufficient cpu"),
        ),
        id="an init container larger than the containers sets the request",
    ),
    pytest.param(
        Case(
            pod(requests={"cpu": "1"}),
            bound=(pod(node_name="n", requests={"cpu": "1"}, init={"cpu": "7500m"}),),
            **_no("Insufficient cpu"),
        ),
        id="a bound pod's init container counts too (found by the differential test)",
    ),
    pytest.param(
        Case(pod(requests={"cpu": "7"}, overhead={"cpu": "1001m"}), **_no("Insufficient cpu")),
        id="overhead is added to the request",
    ),
    pytest.param(
        Case(
            pod(requests={"cpu": "1"}),
            bound=(pod(node_name="n", requests={"cpu": "6"}, overhead={"cpu": "1500m"}),),
            **_no("Insufficient cpu"),
        ),
        id="a bound pod's overhead counts",
    ),
    pytest.param(
        Case(
            pod(requests={"cpu": "8"}),
            bound=(pod(node_name="n", requests={"cpu": "8"}, phase="Failed"),),
        ),
        id="a failed pod holds nothing",
    ),
    # --- order: the first failing filter is the one counted ---
    pytest.param(
        Case(
            pod(requests={"cpu": "100"}, selector={"x": "y"}),
            (
                node("a", cordoned=True),
                node("b", taints=[("k", "v", "NoSchedule")]),
                node("c"),
                node("d", labels={"x": "y"}),
            ),
            want_fit=(),
            want_reasons={_UNSCHED: 1, _taint("k", "v"): 1, _AFFINITY: 1, "Insufficient cpu": 1},
        ),
        id="each node is counted under its first failing filter, in kube-scheduler's order",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_fitness(case: Case) -> None:
    fit = FitnessView(case.nodes, case.bound).check(case.pod)
    assert fit.feasible == case.want_fit
    assert dict(fit.reasons) == dict(case.want_reasons)
    assert sum(fit.rejected.values()) == len(case.nodes) - len(case.want_fit)


def test_the_message_is_kube_schedulers() -> None:
    nodes = [node(f"g-0{i}", cordoned=True) for i in range(1, 6)]
    nodes.append(node("g-06", taints=[("k", "v", "NoSchedule")]))
    fit = FitnessView(nodes, []).check(pod())
    assert fit.message() == (
        "0/6 nodes are available: 1 node(s) had taint {k: v}, that the pod didn't tolerate,"
        " 5 node(s) were unschedulable."
    )
    assert fit.rejected["NodeUnschedulable"] == 5
    assert fit.rejected["TaintToleration"] == 1
    assert fit.summary() == "0/6 nodes fit (rejected by NodeUnschedulable: 5, TaintToleration: 1)"


def test_message_parts_sort_as_strings_like_kube_scheduler() -> None:
    # FitError sorts "count reason" strings: "10 ..." before "2 ...".
    text = fit_error_message(12, {"b": 2, "a": 10})
    assert text == "0/12 nodes are available: 10 a, 2 b."
    assert fit_error_message(0, {}) == "no nodes available to schedule pods"


def test_preferences_only_break_ties() -> None:
    nodes = [
        node("a", labels={"gpu": "h100"}),
        node("b", taints=[("spot", "true", "PreferNoSchedule")]),
        node("c"),
    ]
    fit = FitnessView(nodes, []).check(pod(preferred=[(5, expr("gpu", "In", "h100"))]))
    assert fit.feasible == ("a", "b", "c")
    assert fit.scores == {"a": (5, 0), "b": (0, -1), "c": (0, 0)}


def test_pod_request_is_max_of_sum_and_init_plus_overhead() -> None:
    p = pod(
        requests={"cpu": "500m", "memory": "1Gi"},
        init={"cpu": "2", "memory": "512Mi", "nvidia.com/gpu": "1"},
        overhead={"cpu": "250m"},
    )
    assert pod_request(p) == {"cpu": 2250, "memory": 1024**3, "nvidia.com/gpu": 1}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("1", Fraction(1), id="plain"),
        pytest.param("500m", Fraction(1, 2), id="m milli"),
        pytest.param("100u", Fraction(1, 10_000), id="u micro"),
        pytest.param("5n", Fraction(5, 10**9), id="n nano"),
        pytest.param("2k", Fraction(2000), id="k kilo"),
        pytest.param("3M", Fraction(3 * 10**6), id="M mega"),
        pytest.param("1G", Fraction(10**9), id="G giga"),
        pytest.param("1T", Fraction(10**12), id="T tera"),
        pytest.param("1P", Fraction(10**15), id="P peta"),
        pytest.param("1E", Fraction(10**18), id="E exa"),
        pytest.param("1Ki", Fraction(1024), id="Ki"),
        pytest.param("1Mi", Fraction(1024**2), id="Mi"),
        pytest.param("1.5Gi", Fraction(3 * 1024**3, 2), id="Gi with a fraction"),
        pytest.param("1Ti", Fraction(1024**4), id="Ti"),
        pytest.param("1Pi", Fraction(1024**5), id="Pi"),
        pytest.param("1Ei", Fraction(1024**6), id="Ei"),
        pytest.param("1e3", Fraction(1000), id="e exponent"),
        pytest.param("25E-1", Fraction(5, 2), id="E with a negative exponent"),
        pytest.param("+.5", Fraction(1, 2), id="sign and bare fraction"),
        pytest.param("-1", Fraction(-1), id="negative"),
        pytest.param(8, Fraction(8), id="a JSON number"),
    ],
)
def test_quantity(text: str | int, want: Fraction) -> None:
    assert parse_quantity(text) == want


@pytest.mark.parametrize(
    "text", ["", "1.2.3", "1mi", "Gi", "1 Gi x", "1e", "1e999", "0x10", True, float("nan")]
)
def test_not_a_quantity(text: Any) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_values_round_up_as_kubernetes_does() -> None:
    assert milli_value("0.0001") == 1  # MilliValue rounds up
    assert milli_value("1.5") == 1500
    assert value("1500m") == 2
    assert value("1Ki") == 1024


def test_the_usage_book_follows_pods_one_at_a_time() -> None:
    book = UsageBook()
    first = pod(node_name="n", requests={"cpu": "1"}, host_port={"hostPort": 80})
    book.put("ns/a", first)
    book.put("ns/b", pod(node_name="n", requests={"cpu": "2"}))
    assert book.usage("n").requested == {"cpu": 3000}
    assert book.usage("n").pods == 2
    book.put("ns/a", pod(node_name="n", requests={"cpu": "1"}, phase="Succeeded"))
    assert book.usage("n").requested == {"cpu": 2000}  # finished: holds nothing
    assert book.usage("n").ports == frozenset()
    book.remove("ns/b")
    book.remove("ns/never")
    assert book.usage("n") == FitnessView([node()], []).usage["n"]
    view = FitnessView([node_facts(node())], usage=book)
    assert view.check(pod(requests={"cpu": "8"})).feasible == ("n",)
