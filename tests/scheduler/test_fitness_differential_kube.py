"""gputopo's node fitness against a real kube-scheduler 1.20.2, on the same objects.

Seeded random scenarios (`fitness_scenarios.py`) are written to the test API server: Nodes with
labels, taints, cordons and allocatable resources, pods bound to them, and pending pods for a
kube-scheduler whose only extender is an HTTP server in this test. kube-scheduler calls the
extender's `filter` with exactly the nodes that passed its own filters (percentageOfNodesToScore
100, so every node is tried); the extender records that list and answers "no node", so nothing
binds and every pod is judged on the same cluster. A pod no node fits never reaches the
extender: kube-scheduler sets `PodScheduled=False` with its "0/N nodes are available: ..."
message instead, which is read as the empty set. A pod that did reach it gets the same kind of
message once the extender said "none", counting the reasons of the nodes kube-scheduler's
filters rejected: for every pod, that text is compared word for word with gputopo's.

gputopo's side reads the objects as the API server stored them (defaults and admission applied,
e.g. RuntimeClass overhead and the default NoExecute tolerations), every Node and bound pod of
the cluster included, exactly as kube-scheduler's cache holds them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gputopo.fitness import FitnessView
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope
from tests.scheduler.extender import Extender, recorded_scheduler
from tests.scheduler.fitness_scenarios import RUNTIME_CLASSES, SCENARIO_LABEL, Scenario, scenario

pytestmark = [pytest.mark.slow]

SEEDS = range(12)
NODES = 8
PODS = 175  # 12 x 175 = 2,100 pod x scenario cases
_DECIDED_TIMEOUT_S = 90.0  # generous: 175 pods take about 2 s on an idle 2-core machine
_THREADS = 6
# A folder to write each disagreement to (the cluster and the pod as the API server stored
# them), to turn it into a table case of tests/test_fitness.py.
_DUMP = os.environ.get("GPUTOPO_FITNESS_DUMP", "")


def _ok(response: Any, what: str) -> Any:
    assert response.ok, f"{what}: {response.status} {response.body}"
    return response.body


class Api:
    """Blocking JSON calls to the test API server from a few threads (one session each)."""

    def __init__(self, kube: KubeApiServer) -> None:
        self.kube = kube
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(_THREADS)
        self._sessions: list[Any] = []

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = self.kube.json_session()
            self._sessions.append(session)
        return _ok(session.request(method, path, body=body, **kw), f"{method} {path}")

    def many(self, method: str, items: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[Any]:
        return list(self._pool.map(lambda item: self.call(method, item[0], item[1]), items))

    def close(self) -> None:
        self._pool.shutdown()
        for session in self._sessions:
            session.close()


def _condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return dict(c)
    return None


@dataclass
class Tally:
    """What the comparison found over all scenarios."""

    cases: int = 0
    disagreements: int = 0
    message_mismatches: int = 0
    fit_somewhere: int = 0
    with_overhead: int = 0
    found: list[str] = field(default_factory=list)


def _setup(api: Api, s: Scenario, pods_path: str) -> tuple[FitnessView, list[Any], list[Any]]:
    """Write the scenario's Nodes and bound pods; the view of the whole cluster as stored."""
    api.many("POST", [("/api/v1/nodes", n) for n in s.nodes])
    for node in s.nodes:  # the API server adds a not-ready taint on create: replace the taints
        api.call(
            "PATCH",
            f"/api/v1/nodes/{node['metadata']['name']}",
            {"spec": node["spec"]},
            content_type="application/merge-patch+json",
        )
    api.many("POST", [(pods_path, p) for p in s.bound])
    for pod_name in sorted(s.finished):
        api.call(
            "PATCH",
            f"{pods_path}/{pod_name}/status",
            {"status": {"phase": "Succeeded"}},
            content_type="application/merge-patch+json",
        )
    nodes = api.call("GET", "/api/v1/nodes")["items"]
    bound = api.call("GET", "/api/v1/pods?fieldSelector=" + quote("spec.nodeName!="))["items"]
    return FitnessView(nodes, bound), nodes, bound


def _decided(api: Api, path: str, seed: int) -> dict[str, Mapping[str, Any] | None]:
    """pod uid -> its PodScheduled=False condition, once kube-scheduler judged every pod."""
    deadline = time.monotonic() + _DECIDED_TIMEOUT_S
    while True:
        listed = api.call("GET", path)["items"]
        waiting = [p for p in listed if not p["spec"].get("nodeName")]
        decided = {p["metadata"]["uid"]: _condition(p) for p in waiting}
        if all(decided.values()):
            return decided
        assert time.monotonic() < deadline, (
            f"seed {seed}: kube-scheduler decided only "
            f"{sum(1 for c in decided.values() if c)} of {len(waiting)} pods"
        )
        time.sleep(0.3)


def _compare(
    tally: Tally,
    seed: int,
    *,
    cluster: tuple[FitnessView, list[Any], list[Any]],
    created: list[dict[str, Any]],
    decided: Mapping[str, Mapping[str, Any] | None],
    calls: Mapping[str, list[str]],
) -> None:
    view, nodes, bound = cluster
    for pod in created:
        uid = pod["metadata"]["uid"]
        fit = view.check(pod)
        theirs = sorted(calls.get(uid, []))
        tally.cases += 1
        tally.fit_somewhere += bool(theirs)
        if list(fit.feasible) != theirs:
            tally.disagreements += 1
            if _DUMP:
                (Path(_DUMP) / f"{pod['metadata']['name']}.json").write_text(
                    json.dumps({"nodes": nodes, "bound": bound, "pod": pod}),
                    encoding="utf-8",
                )
            tally.found.append(
                f"seed {seed} pod {pod['metadata']['name']}: gputopo {list(fit.feasible)} "
                f"kube-scheduler {theirs} ({fit.message()} | {decided[uid]})"
            )
        # Either way kube-scheduler's condition counts the reasons of the nodes its filters
        # rejected (the extender's "none" adds no reason): the same text as gputopo's.
        said = str((decided[uid] or {}).get("message", ""))
        if said != fit.message():
            tally.message_mismatches += 1
            tally.found.append(f"seed {seed}: message {fit.message()!r} != {said!r}")


def test_fitness_agrees_with_kube_scheduler_on_2100_random_cases(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    ns = kube_scope.namespace
    name = kube_scope.name("fitness")
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    api = Api(kube_apiserver)
    started = time.monotonic()
    tally = Tally()
    classes = {key: kube_scope.name(f"rc-{key}") for key in RUNTIME_CLASSES}
    try:
        for key, overhead in RUNTIME_CLASSES.items():
            api.call(
                "POST",
                "/apis/node.k8s.io/v1/runtimeclasses",
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": classes[key]},
                    "handler": "runc",
                    "overhead": {"podFixed": overhead},
                },
            )
        with (
            Extender() as extender,
            recorded_scheduler(kube_apiserver, tmp_path, name, extender.url),
        ):
            for seed in SEEDS:
                s = scenario(
                    seed,
                    prefix=kube_scope.name(f"s{seed}-"),
                    namespace=ns,
                    scheduler=name,
                    nodes=NODES,
                    pods=PODS,
                )
                for pod in [*s.bound, *s.pending]:
                    if "runtimeClassName" in pod["spec"]:
                        pod["spec"]["runtimeClassName"] = classes[pod["spec"]["runtimeClassName"]]
                cluster = _setup(api, s, pods_path)
                created = api.many("POST", [(pods_path, p) for p in s.pending])
                tally.with_overhead += sum(1 for p in created if p["spec"].get("overhead"))
                selector = quote(f"{SCENARIO_LABEL}=s{seed}")
                decided = _decided(api, f"{pods_path}?labelSelector={selector}", seed)
                _compare(
                    tally,
                    seed,
                    cluster=cluster,
                    created=created,
                    decided=decided,
                    calls=extender.calls,
                )
                # Scenarios do not share nodes or pods: the next starts on a clean cluster.
                api.call("DELETE", f"{pods_path}?labelSelector={selector}&gracePeriodSeconds=0")
                api.call("DELETE", f"/api/v1/nodes?labelSelector={selector}")
    finally:
        api.close()
    took = time.monotonic() - started
    print(
        f"\nfitness differential: {tally.cases} cases, {tally.disagreements} disagreements, "
        f"{tally.message_mismatches} message mismatches ({tally.fit_somewhere} pods fit some "
        f"node, {tally.cases - tally.fit_somewhere} none), {tally.with_overhead} pods with "
        f"overhead, {took:.1f} s"
    )
    for line in tally.found[:20]:
        print(line)
    assert tally.cases >= 2000
    # Both outcomes must be well represented, or the comparison proves little.
    assert min(tally.fit_somewhere, tally.cases - tally.fit_somewhere) > tally.cases // 10
    assert tally.with_overhead > 0, "RuntimeClass admission set no overhead: overhead untested"
    assert (tally.disagreements, tally.message_mismatches) == (0, 0), "\n".join(tally.found[:20])
