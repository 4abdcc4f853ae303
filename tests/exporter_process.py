"""The real `gputopo exporter --simulate` command as a test's subprocess, one way everywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gputopo.runtime.tls import TlsFiles

__all__ = ["start_exporter"]


def start_exporter(
    node: str,
    aggregator: str,
    log: Path,
    *,
    tls: TlsFiles | None = None,
    profile: str = "dgx-h100",
    extra: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """`gputopo exporter` simulating `profile` as `node`, reporting to `aggregator` (host:port)
    over mutual TLS with `tls` (else `--insecure`), no peer probes, output to `log`."""
    flags = (
        [f"--tls-cert={tls.cert}", f"--tls-key={tls.key}", f"--tls-ca={tls.ca}"]
        if tls is not None
        else ["--insecure"]
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "gputopo", "exporter", f"--simulate={profile}"),
                *(f"--node-name={node}", f"--aggregator={aggregator}"),
                *("--probe-port=0", "--no-peer-probes", *flags, *extra),
                *(() if any(a.startswith("--http-port") for a in extra) else ("--http-port=0",)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
