"""The committed gputopo.v1 code must be exactly what scripts/gen-proto.sh generates."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run(
        [str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)],
        check=True,
        env=env,
        capture_output=True,
    )
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "gputopo" / "v1").iterdir()}
    committed = {
        p.name: p.read_bytes()
        for p in (ROOT / "gputopo" / "v1").iterdir()
        if p.is_file() and p.suffix in {".py", ".pyi"}
    }
    assert sorted(fresh) == sorted(committed), "generated file set differs: run `make proto`"
    stale = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not stale, f"stale generated code {stale}: run `make proto` and commit the result"


def test_generated_package_is_importable_and_not_named_proto() -> None:
    from gputopo.v1 import placement_pb2, reporter_pb2, topology_pb2

    assert placement_pb2.DESCRIPTOR.package == "gputopo.v1"
    assert reporter_pb2.DESCRIPTOR.services_by_name["Reporter"]
    assert topology_pb2.LinkKind.Name(1) == "LINK_KIND_NVLINK"
