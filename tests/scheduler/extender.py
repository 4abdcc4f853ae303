"""An extender for a real kube-scheduler that records what its filters let through.

kube-scheduler (v1.20) calls an extender's `filter` with the nodes that passed its own
filters, after them; with `nodeCacheCapable` the call carries node names only. This one
records the first call per pod and answers "no node", so nothing binds and a test can hold
gputopo's node fitness to kube-scheduler's on the very same objects.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gputopo.app.benchmarks._binder_kube import (
    scheduler_config,
    start_kube_scheduler,
    stop_process,
)
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scheduler import find_scheduler

__all__ = ["Extender", "recorded_scheduler"]


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


@contextlib.contextmanager
def recorded_scheduler(kube: KubeApiServer, workdir: Path, name: str, url: str) -> Iterator[None]:
    """A kube-scheduler whose only extender is `url`: asked about every pod, filter only."""
    config = scheduler_config(str(kube.kubeconfig_path), name=name, qps=500)
    config["percentageOfNodesToScore"] = 100
    # Interested in every pod (no managedResources), filter only, node names only. The call
    # waits up to 60 s, not kube-scheduler's 5 s default: on a starved machine (make test at
    # nice 19 beside busy work) this Python extender answered after more than 5 s, and
    # kube-scheduler then reports the timeout instead of its filters' message.
    config["extenders"] = [
        {
            "urlPrefix": url,
            "filterVerb": "filter",
            "nodeCacheCapable": True,
            "weight": 1,
            "httpTimeout": "60s",
        }
    ]
    proc, _ = start_kube_scheduler(find_scheduler(), config, workdir, name=name)
    try:
        yield
    finally:
        stop_process(proc)
