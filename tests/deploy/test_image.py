"""The image builds from this checkout with Debian's tools alone, and its gputopo runs.

`scripts/build-image.sh` (`make image`) makes the OCI image every manifest names, without a
container daemon or registry (mmdebstrap, umoci; cached by the inputs' hash, so a second run
takes a second). This runs `gputopo --version` and `gputopo exporter --help` from the image's
root filesystem with chroot, as its non-root user, and checks the OCI layout's tag, user and
entrypoint. chroot needs root: without it the test says so and is skipped; so it is when a
cold build fails because the Debian mirror cannot be reached (a warm cache needs no network).
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _mirror_unreachable() -> str | None:
    """Why the build's Debian mirror cannot be reached, or None when it can.

    Asked only after a build failed, so an offline machine with a warm cache still runs the test,
    and a build that fails for any other reason still fails it.
    """
    mirror = os.environ.get("GPUTOPO_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    url = f"{mirror.rstrip('/')}/dists/bookworm/Release"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10):
            return None
    except (urllib.error.URLError, OSError) as e:
        return f"the Debian mirror is unreachable ({url}: {e})"


@pytest.fixture(scope="module")
def image() -> Path:
    if os.geteuid() != 0:
        pytest.skip("building and chrooting into the image needs root (mmdebstrap, chroot)")
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-image.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0 and (why := _mirror_unreachable()) is not None:
        pytest.skip(f"the image build failed and {why}")
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def _in_image(image: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "chroot",
            "--userspec=65532:65532",
            str(image / "rootfs"),
            "/usr/bin/env",
            "-i",
            "PATH=/opt/gputopo/bin:/usr/bin:/bin",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_gputopo_runs_from_the_images_root_filesystem(image: Path) -> None:
    version = _in_image(image, "gputopo", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"gputopo {_version()}"
    helped = _in_image(image, "gputopo", "exporter", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--identity-token" in helped.stdout
    who = _in_image(image, "/usr/bin/id", "-u")
    assert who.stdout.strip() == "65532"


def test_the_image_carries_cuda_bindings_for_the_copy_probes(image: Path) -> None:
    """The `cuda` extra is in the image: without it no deployment could ever measure a link.
    Here there is no GPU or driver, so the probe worker must say that (CUDA's own error), not
    that cuda-bindings is missing."""
    python = "/opt/gputopo/bin/python"
    imported = _in_image(
        image,
        python,
        "-c",
        "import cuda.bindings, cuda.bindings.runtime; print(cuda.bindings.__version__)",
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().split(".")[0] == "13", imported.stdout
    check = "from exporter.probes.runner import WorkerGpuProbe; print(WorkerGpuProbe().installed())"
    installed = _in_image(image, python, "-c", check)
    assert installed.stdout.strip() == "(True, '')", installed.stderr
    worker = _in_image(image, python, "-m", "exporter.probes.gpu_worker")
    first = json.loads(worker.stdout.splitlines()[0])
    assert first["ready"] is False
    assert "cuda-bindings" not in first["error"], first


def test_the_oci_layout_carries_the_one_tag_user_and_entrypoint(image: Path) -> None:
    layout = image / "oci"
    index = json.loads((layout / "index.json").read_text(encoding="utf-8"))
    (manifest_ref,) = index["manifests"]
    assert manifest_ref["annotations"]["org.opencontainers.image.ref.name"] == _version()

    def blob(digest: str) -> dict[str, object]:
        algo, hexdigest = digest.split(":", 1)
        return dict(json.loads((layout / "blobs" / algo / hexdigest).read_text(encoding="utf-8")))

    manifest = blob(manifest_ref["digest"])
    config = blob(manifest["config"]["digest"])  # type: ignore[index]
    runtime = config["config"]
    assert isinstance(runtime, dict)
    assert runtime["User"] == "65532:65532"
    assert runtime["Entrypoint"] == ["/opt/gputopo/bin/gputopo"]
    assert f"org.opencontainers.image.version={_version()}" in [
        f"{k}={v}" for k, v in runtime["Labels"].items()
    ]
