"""The GPU probe worker: `python -m exporter.probes.gpu_worker`, one per probe round.

CUDA contexts cost hundreds of MiB of GPU memory per device and stay until the process exits,
and a CUDA fault can take the process down. So the agent never initialises CUDA itself: each
probe round starts this worker, sends it one task per line on stdin, reads one JSON result per
line on stdout, and closes stdin when done; the worker exits and the contexts go with it.

    -> {"op": "peer", "src": "0000:18:00.0", "dst": "0000:2a:00.0"}
    -> {"op": "host", "bus": "0000:18:00.0", "cpus": [0, 1, 2]}
    <- {"ready": true} | {"ready": false, "error": "..."}      (first line, once)
    <- {"ok": true, "measurement": {...}} | {"ok": false, "error": "..."}
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, TextIO

from exporter.probes.gpu import CudaCopyProbe, CudaError

__all__ = ["main", "serve"]


def serve(probe: CudaCopyProbe, tasks: TextIO, out: TextIO) -> None:
    """Answer tasks until stdin closes."""
    ok, why = probe.available()
    _send(out, {"ready": ok} | ({} if ok else {"error": why}))
    if not ok:
        return
    for line in tasks:
        if not line.strip():
            continue
        try:
            task = json.loads(line)
            if task["op"] == "peer":
                found = probe.peer(task["src"], task["dst"])
            elif task["op"] == "host":
                found = probe.host(task["bus"], cpus=task["cpus"])
            else:
                raise ValueError(f"unknown op {task['op']!r}")
            _send(out, {"ok": True, "measurement": dataclasses.asdict(found)})
        except (CudaError, KeyError, ValueError, OSError) as error:
            _send(out, {"ok": False, "error": str(error)})


def _send(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def main() -> int:
    """Entry point of the worker process."""
    serve(CudaCopyProbe(), sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
