"""Every manifest names the one image this checkout builds, and `gputopo --version` says which.

Two manifests once named different images (`gputopo:0.1.0` and `ghcr.io/gputopo/gputopo:0.1.0`),
so one of the two components could never start from the image a user built. The tag is the
project's version in `pyproject.toml`; a kustomization may not rename it either.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "ghcr.io/gputopo/gputopo"


def _version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _images(node: Any) -> Iterator[str]:
    """Every `image:` value anywhere in a manifest (containers, initContainers, ephemeral)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                yield value
            else:
                yield from _images(value)
    elif isinstance(node, list):
        for item in node:
            yield from _images(item)


def _manifests() -> list[Path]:
    return sorted((ROOT / "deploy").rglob("*.yaml"))


def test_every_manifest_names_the_one_image_tag() -> None:
    want = f"{REPOSITORY}:{_version()}"
    found: dict[str, list[str]] = {}
    for path in _manifests():
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            for image in _images(doc):
                found.setdefault(image, []).append(str(path.relative_to(ROOT)))
            if isinstance(doc, dict) and doc.get("kind") == "Kustomization":
                assert "images" not in doc, f"{path.relative_to(ROOT)} renames the image"
    assert found, "no manifest names an image"
    assert set(found) == {want}, found
    # The three workloads are all there: one tag checked across all of them, not one of them.
    named = {Path(p).parts[1] for paths in found.values() for p in paths}
    assert {"aggregator", "exporter", "scheduler"} <= named, named


def test_the_check_catches_another_tag() -> None:
    doc = {"spec": {"template": {"spec": {"initContainers": [{"image": "gputopo:0.1.0"}]}}}}
    assert list(_images(doc)) == ["gputopo:0.1.0"]


def test_version_is_the_projects() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gputopo", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == f"gputopo {_version()}"
