"""pytest fixtures for tests marked `kube`: one real API server per session, a scope per test.

Register once, from the top-level `tests/conftest.py`::

    pytest_plugins = ["tests.harness.kube_fixtures"]

(`tests.harness` must be importable: run `python -m pytest`, or set pytest's
`pythonpath = ["."]`; pytest accepts `pytest_plugins` only in a conftest it loads at start-up,
which the top-level one is when `testpaths = ["tests"]`.) Loading this module as a plugin also
registers the `kube` marker, marks every test that uses these fixtures with it (so
`-m "not kube"` deselects them all), and adds the server's start-up time to the summary.

A missing kube-apiserver binary makes every test using `kube_apiserver` fail, with the command
that builds it: never a skip, which would count as a pass.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .kube import BinaryNotFoundError, KubeApiServer
from .kube_scope import KubeScope

KUBE_MARKER = "kube"
_SERVER_FIXTURES = frozenset({"kube_apiserver", "kube_scope"})
_STARTUP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{KUBE_MARKER}: needs the real kube-apiserver + etcd started by tests/harness"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(KUBE_MARKER)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    line = terminalreporter.config.stash.get(_STARTUP, None)
    if line:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def kube_apiserver(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[KubeApiServer]:
    """One kube-apiserver + etcd for the whole session, stopped when it ends.

    With pytest-xdist every worker is its own session and gets its own server (free ports make
    that safe). Tests must not break the server for others: use `kube_scope` for what they create.
    """
    workdir = tmp_path_factory.mktemp("kube-apiserver")
    try:
        server = KubeApiServer.start(workdir=workdir)
    except BinaryNotFoundError as error:
        pytest.fail(str(error), pytrace=False)
    with server:
        pytestconfig.stash[_STARTUP] = (
            f"kube-apiserver: ready in {server.startup_s:.1f} s at {server.host} (logs: {workdir})"
        )
        yield server


@pytest.fixture
def kube_scope(
    kube_apiserver: KubeApiServer, request: pytest.FixtureRequest
) -> Iterator[KubeScope]:
    """A unique name prefix and namespace for one test, and deletion of what it created.

    Teardown fails the test (as an error) when its objects cannot all be deleted.
    """
    scope = KubeScope(kube_apiserver, test_name=request.node.name)
    scope.setup()
    try:
        yield scope
    finally:
        scope.cleanup()
