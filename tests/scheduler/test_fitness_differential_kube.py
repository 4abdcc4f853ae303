"""gputopo's node fitness against a real kube-scheduler 1.20.2, on the same objects.

Seeded random scenarios (`fitness_scenarios.py`) are written to the test API server: Nodes with
labels, taints, cordons and allocatable resources, pods bound to them, and pending pods for a
kube-scheduler whose only extender is an HTTP server in this test. kube-scheduler calls the
extender's `filter` with exactly the nodes that passed its own filters (percentageOfNodesToScore
100, so every node is tried); the extender records that list and answers "no node", so nothing
binds and every pod is judged on the same cluster. A pod no node fits never reaches the
extender: kube-scheduler sets `PodScheduled=False` with its "0/N nodes are available: ..."
message instead, which is read as the empty set and compared word for word with gputopo's.

gputopo's side reads the objects as the API server stored them (defaults and admission applied,
e.g. RuntimeClass overhead and the default NoExecute tolerations), every Node and bound pod of
the cluster included, exactly as kube-scheduler's cache holds them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gputopo.app.benchmarks._binder_kube import (
    scheduler_config,
    start_kube_scheduler,
    stop_process,
)
from gputopo.fitness import FitnessView
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scheduler import find_scheduler
from tests.harness.kube_scope import KubeScope
from tests.scheduler.fitness_scenarios import RUNTIME_CLASSES, SCENARIO_LABEL, scenario

SEEDS = range(12)
NODES = 8
PODS = 175  # 12 x 175 = 2,100 pod x scenario cases
_DECIDED_TIMEOUT_S = 90.0  # generous: 175 pods take about 2 s on an idle 2-core machine
_THREADS = 6
# A folder to write each disagreement to (the cluster and the pod as the API server stored
# them), to turn it into a table case of tests/test_fitness.py.
_DUMP = os.environ.get("GPUTOPO_FITNESS_DUMP", "")


class Extender:
    """kube-scheduler's extender on loopback: records the first `filter` call per pod uid."""

    def __init__(self) -> None:
        self.calls: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                uid = str(((body.get("Pod") or {}).get("metadata") or {}).get("uid", ""))
                with recorder._lock:
                    recorder.calls.setdefault(uid, list(body.get("NodeNames") or []))
                answer = json.dumps({"NodeNames": [], "FailedNodes": {}, "Error": ""}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Extender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


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


def _scheduler(kube: KubeApiServer, workdir: Path, name: str, url: str) -> Iterator[None]:
    config = scheduler_config(str(kube.kubeconfig_path), name=name, qps=500)
    config["percentageOfNodesToScore"] = 100
    # Interested in every pod (no managedResources), filter only, node names only.
    config["extenders"] = [
        {"urlPrefix": url, "filterVerb": "filter", "nodeCacheCapable": True, "weight": 1}
    ]
    proc, _ = start_kube_scheduler(find_scheduler(), config, workdir, name=name)
    try:
        yield
    finally:
        stop_process(proc)


def _condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return dict(c)
    return None


def test_fitness_agrees_with_kube_scheduler_on_2100_random_cases(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    ns = kube_scope.namespace
    name = kube_scope.name("fitness")
    api = Api(kube_apiserver)
    started = time.monotonic()
    classes = {key: kube_scope.name(f"rc-{key}") for key in RUNTIME_CLASSES}
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
    cases = disagreements = message_mismatches = with_overhead = fit_somewhere = 0
    found: list[str] = []
    with Extender() as extender:
        runner = _scheduler(kube_apiserver, tmp_path, name, extender.url)
        next(runner)
        try:
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
                api.many("POST", [("/api/v1/nodes", n) for n in s.nodes])
                for node in s.nodes:  # the API server adds a not-ready taint on create
                    api.call(
                        "PATCH",
                        f"/api/v1/nodes/{node['metadata']['name']}",
                        {"spec": node["spec"]},
                        content_type="application/merge-patch+json",
                    )
                pods_path = f"/api/v1/namespaces/{ns}/pods"
                api.many("POST", [(pods_path, p) for p in s.bound])
                for pod_name in sorted(s.finished):
                    api.call(
                        "PATCH",
                        f"{pods_path}/{pod_name}/status",
                        {"status": {"phase": "Succeeded"}},
                        content_type="application/merge-patch+json",
                    )
                nodes = api.call("GET", "/api/v1/nodes")["items"]
                bound = api.call("GET", "/api/v1/pods?fieldSelector=" + quote("spec.nodeName!="))[
                    "items"
                ]
                view = FitnessView(nodes, bound)
                created = api.many("POST", [(pods_path, p) for p in s.pending])
                with_overhead += sum(1 for p in created if p["spec"].get("overhead"))
                selector = quote(f"{SCENARIO_LABEL}=s{seed}")
                deadline = time.monotonic() + _DECIDED_TIMEOUT_S
                while True:
                    listed = api.call("GET", f"{pods_path}?labelSelector={selector}")["items"]
                    waiting = [p for p in listed if not p["spec"].get("nodeName")]
                    decided = {p["metadata"]["uid"]: _condition(p) for p in waiting}
                    if all(decided.values()):
                        break
                    assert time.monotonic() < deadline, (
                        f"seed {seed}: kube-scheduler decided only "
                        f"{sum(1 for c in decided.values() if c)} of {len(waiting)} pods"
                    )
                    time.sleep(0.3)
                for pod in created:
                    uid = pod["metadata"]["uid"]
                    fit = view.check(pod)
                    theirs = sorted(extender.calls.get(uid, []))
                    cases += 1
                    fit_somewhere += bool(theirs)
                    if list(fit.feasible) != theirs:
                        disagreements += 1
                        if _DUMP:
                            (Path(_DUMP) / f"{pod['metadata']['name']}.json").write_text(
                                json.dumps({"nodes": nodes, "bound": bound, "pod": pod}),
                                encoding="utf-8",
                            )
                        found.append(
                            f"seed {seed} pod {pod['metadata']['name']}: gputopo "
                            f"{list(fit.feasible)} kube-scheduler {theirs} "
                            f"({fit.message()} | {decided[uid]})"
                        )
                    elif not theirs:
                        said = str((decided[uid] or {}).get("message", ""))
                        if said != fit.message():
                            message_mismatches += 1
                            found.append(f"seed {seed}: message {fit.message()!r} != {said!r}")
                api.call(
                    "DELETE",
                    f"{pods_path}?labelSelector={selector}&gracePeriodSeconds=0",
                )
                api.call("DELETE", f"/api/v1/nodes?labelSelector={selector}")
        finally:
            next(runner, None)
            api.close()
    took = time.monotonic() - started
    print(
        f"\nfitness differential: {cases} cases, {disagreements} disagreements, "
        f"{message_mismatches} message mismatches ({fit_somewhere} pods fit some node, "
        f"{cases - fit_somewhere} none), {with_overhead} pods with overhead, "
        f"{took:.1f} s"
    )
    for line in found[:20]:
        print(line)
    assert cases >= 2000
    # Both outcomes must be well represented, or the comparison proves little.
    assert min(fit_somewhere, cases - fit_somewhere) > cases // 10
    assert with_overhead > 0, "RuntimeClass admission set no overhead: overhead untested"
    assert (disagreements, message_mismatches) == (0, 0), "\n".join(found[:20])
