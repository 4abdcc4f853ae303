"""`scripts/build-kube-apiserver.sh` off Debian 12: what a newcomer's first `make test` runs.

The script runs under a PATH that has no apt, dpkg, sudo, Go or etcd, the way a Fedora, Arch or
bare container would look, with fake `go`, `etcd` and `kube-apiserver` where a test gives them.
Nothing here builds: a test that reached the build would fail on the missing tools within a
second, which is what the script did on such a system before it honoured
`GPUTOPO_KUBE_APISERVER` and stopped requiring Debian 12.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build-kube-apiserver.sh"
# The harness and the script look at /usr/bin/etcd last; a path that is not there hides it.
NO_ETCD = "/nonexistent/etcd"
HIDDEN = {"apt-get", "apt-cache", "dpkg-query", "dpkg-source", "sudo", "go", "etcd"}


def _fake(path: Path, output: str) -> Path:
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def bare_path(tmp_path: Path) -> Path:
    """A bin dir with every tool of this machine except the Debian and build ones."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for system_dir in (Path("/usr/bin"), Path("/bin")):
        for tool in system_dir.iterdir():
            target = bin_dir / tool.name
            if tool.name not in HIDDEN and not target.exists() and os.access(tool, os.X_OK):
                target.symlink_to(tool)
    return bin_dir


def _run(bin_dir: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path / "home"),
        "GPUTOPO_CACHE_DIR": str(tmp_path / "cache"),
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_given_kube_apiserver_is_used_and_nothing_is_built(
    bare_path: Path, tmp_path: Path
) -> None:
    given = _fake(tmp_path / "kube-apiserver", "Kubernetes v1.20.2")
    etcd = _fake(tmp_path / "etcd", "etcd Version: 3.4.23")
    run = _run(bare_path, tmp_path, GPUTOPO_KUBE_APISERVER=str(given), GPUTOPO_ETCD=str(etcd))
    assert (run.returncode, run.stdout) == (0, f"{given}\n"), run.stderr
    assert "building nothing" in run.stderr
    assert not (tmp_path / "cache" / "kube-apiserver-v1.20.2").exists()


def test_a_given_binary_of_another_version_is_refused_with_its_version(
    bare_path: Path, tmp_path: Path
) -> None:
    given = _fake(tmp_path / "kube-apiserver", "Kubernetes v1.31.0")
    etcd = _fake(tmp_path / "etcd", "etcd Version: 3.5.0")
    run = _run(bare_path, tmp_path, GPUTOPO_KUBE_APISERVER=str(given), GPUTOPO_ETCD=str(etcd))
    assert run.returncode == 1
    assert "reports 'Kubernetes v1.31.0'; the tests need v1.20.2" in run.stderr
    assert run.stdout == ""


def test_a_given_binary_without_etcd_says_how_to_give_etcd(bare_path: Path, tmp_path: Path) -> None:
    given = _fake(tmp_path / "kube-apiserver", "Kubernetes v1.20.2")
    run = _run(bare_path, tmp_path, GPUTOPO_KUBE_APISERVER=str(given), GPUTOPO_ETCD=NO_ETCD)
    assert run.returncode == 1
    assert "etcd was not found" in run.stderr
    assert "GPUTOPO_ETCD" in run.stderr


def test_a_system_without_apt_can_build_with_its_own_go_and_etcd(
    bare_path: Path, tmp_path: Path
) -> None:
    _fake(bare_path / "go", "go version go1.22.2 linux/amd64")
    _fake(bare_path / "etcd", "etcd Version: 3.5.13")
    run = _run(bare_path, tmp_path, "--check")
    assert run.returncode == 0, run.stderr
    assert f"go: {bare_path / 'go'} (go1.22)" in run.stderr
    assert "ready to build v1.20.2" in run.stderr
    assert "Debian 12" not in run.stderr


@pytest.mark.parametrize(
    ("go_version", "want"),
    [
        pytest.param(None, "Go >= 1.19 (not found: set GPUTOPO_GO", id="no Go at all"),
        pytest.param("go1.17.13", "is go1.17; set GPUTOPO_GO to a newer one", id="Go too old"),
    ],
)
def test_a_system_without_apt_is_told_what_to_install(
    bare_path: Path, tmp_path: Path, go_version: str | None, want: str
) -> None:
    if go_version:
        _fake(bare_path / "go", f"go version {go_version} linux/amd64")
    run = _run(bare_path, tmp_path, "--check", GPUTOPO_ETCD=NO_ETCD)
    assert run.returncode == 1
    assert want in run.stderr
    assert "etcd >= 3.4 (not found: set GPUTOPO_ETCD" in run.stderr


def test_a_cached_binary_without_etcd_asks_for_etcd_only(bare_path: Path, tmp_path: Path) -> None:
    cached = tmp_path / "cache" / "kube-apiserver-v1.20.2" / "kube-apiserver"
    cached.parent.mkdir(parents=True)
    _fake(cached, "Kubernetes v1.20.2")
    _fake(cached.with_name("kube-scheduler"), "Kubernetes v1.20.2")  # built beside it
    run = _run(bare_path, tmp_path, GPUTOPO_ETCD=NO_ETCD)
    assert run.returncode == 1
    assert "etcd not found; install etcd >= 3.4 or set GPUTOPO_ETCD" in run.stderr
    assert "Go >=" not in run.stderr
    etcd = _fake(tmp_path / "etcd", "etcd Version: 3.4.23")
    run = _run(bare_path, tmp_path, GPUTOPO_ETCD=str(etcd))
    assert (run.returncode, run.stdout) == (0, f"{cached}\n"), run.stderr
