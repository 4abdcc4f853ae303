"""A real kube-apiserver v1.20.2 and etcd on loopback, for tests marked `kube`.

Why a real server and not a fake: what the project must get right against Kubernetes is
exactly what fakes get wrong (optimistic concurrency and 409s, RBAC 403s, label selectors,
the binding subresource, CRD structural-schema validation and 422s).

Usage::

    with KubeApiServer.start(workdir=tmp_path) as kube:
        api = kubernetes.client.CoreV1Api(kube.api_client())

Contract:
- Each server gets free loopback ports chosen at run time, its own etcd data dir, CA, serving
  certificate, service-account key pair and tokens, all under `workdir`; several servers (and
  several test runs) can run at once.
- `start()` returns once `/readyz` answers 200, or raises `KubeStartupError` carrying the tail of
  both processes' logs.
- `stop()` (and leaving the `with` block, also on an exception or Ctrl-C) terminates both
  processes, TERM then KILL. The processes also get SIGKILL from the kernel if the Python process
  dies without cleaning up (PR_SET_PDEATHSIG, set by util-linux's `setpriv`), so a killed test
  run leaves no orphans. That signal follows the *thread* that started them: start servers from
  a thread that outlives them (pytest's main thread does).
- Authorization is RBAC only. The `admin` token is in `system:masters`; the other users (by default
  `alice` and `bob`) are in no group beyond `system:authenticated` and so can do almost nothing
  until a test grants it.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from kubernetes import client as k8s

from .kube_http import JsonSession
from .kube_pki import (
    ADMIN_USER,
    SERVICE_CLUSTER_IP_RANGE,
    Pki,
    StaticUser,
    make_pki,
    make_users,
    write_token_file,
)

KUBE_VERSION = "v1.20.2"
BINARY_ENV = "GPUTOPO_KUBE_APISERVER"
ETCD_ENV = "GPUTOPO_ETCD"
CACHE_DIR_ENV = "GPUTOPO_CACHE_DIR"
BUILD_SCRIPT = "scripts/build-kube-apiserver.sh"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
DEFAULT_USERS: Mapping[str, Sequence[str]] = {"alice": (), "bob": ()}

_LOOPBACK = "127.0.0.1"
_PORT_ATTEMPTS = 3
_POLL_INTERVAL_S = 0.1
_STOP_TIMEOUT_S = 10.0
# A kube-apiserver still waiting for etcd ignores SIGTERM; a failed start has nothing to save.
_ABORT_TIMEOUT_S = 0.5
_LOG_TAIL_LINES = 40


class KubeHarnessError(RuntimeError):
    """The test API server could not be found, started or used."""


class BinaryNotFoundError(KubeHarnessError):
    """kube-apiserver or etcd is not installed where the harness looks."""


class KubeStartupError(KubeHarnessError):
    """A process exited or /readyz did not answer in time; the message has both logs' tails."""

    def __init__(self, message: str, *, port_in_use: bool = False) -> None:
        super().__init__(message)
        self.port_in_use = port_in_use


def cache_dir() -> Path:
    """The cache `scripts/build-kube-apiserver.sh` installs into (same rule as the script)."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "gputopo")


def find_binary() -> Path:
    """Locate kube-apiserver: `$GPUTOPO_KUBE_APISERVER`, else the build script's cache.

    Raises `BinaryNotFoundError` saying how to get one; never returns a path that is not an
    executable file.
    """
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override)
        if not _is_executable(path):
            raise BinaryNotFoundError(
                f"{BINARY_ENV}={override} is not an executable file; unset it to use the "
                f"cached build, or point it at a kube-apiserver {KUBE_VERSION} binary"
            )
        return path
    path = cache_dir() / f"kube-apiserver-{KUBE_VERSION}" / "kube-apiserver"
    if not _is_executable(path):
        raise BinaryNotFoundError(
            f"kube-apiserver {KUBE_VERSION} is not built (looked for {path}). Run "
            f"{BUILD_SCRIPT} once (any Linux with Go >= 1.19 and etcd; about 5 minutes, cached "
            f"afterwards), or set {BINARY_ENV} to a kube-apiserver {KUBE_VERSION} binary."
        )
    return path


def find_etcd() -> Path:
    """Locate etcd: `$GPUTOPO_ETCD`, else `etcd` on PATH, else Debian's /usr/bin/etcd."""
    override = os.environ.get(ETCD_ENV)
    candidates = [override] if override else [shutil.which("etcd"), "/usr/bin/etcd"]
    for candidate in candidates:
        if candidate and _is_executable(Path(candidate)):
            return Path(candidate)
    where = f"{ETCD_ENV}={override}" if override else "PATH and /usr/bin/etcd"
    raise BinaryNotFoundError(
        f"etcd not found ({where}). Install Debian's etcd-server (apt-get install etcd-server; "
        f"{BUILD_SCRIPT} does it) or set {ETCD_ENV} to an etcd 3.4 binary."
    )


@dataclass(frozen=True)
class _Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int


class KubeApiServer:
    """One etcd plus one kube-apiserver, owned by the caller; see the module docstring."""

    def __init__(
        self,
        *,
        workdir: Path,
        binary: Path,
        etcd: Path,
        pki: Pki,
        users: Mapping[str, StaticUser],
        token_file: Path,
        extra_args: Sequence[str],
    ) -> None:
        """Prefer `start()`: this only records where things are and starts nothing."""
        self.workdir = workdir
        self.binary = binary
        self.etcd = etcd
        self.ca_path = pki.ca_cert
        self.kubeconfig_path = workdir / "kubeconfig"
        self.etcd_log = workdir / "etcd.log"
        self.apiserver_log = workdir / "kube-apiserver.log"
        self.host = ""
        self.startup_s = 0.0
        self._pki = pki
        self._users = dict(users)
        self._token_file = token_file
        self._extra_args = tuple(extra_args)
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    @classmethod
    def start(
        cls,
        *,
        workdir: Path,
        binary: Path | None = None,
        etcd: Path | None = None,
        users: Mapping[str, Sequence[str]] = DEFAULT_USERS,
        ready_timeout_s: float = 60.0,
        extra_args: Sequence[str] = (),
    ) -> Self:
        """Start etcd and kube-apiserver and wait until the API server is ready.

        `users` maps extra user names to their groups; each gets a token (`token_for`).
        `extra_args` are appended to kube-apiserver's flags (a later flag wins). Ports taken by
        someone else between choosing and binding are retried with new ones, a few times.
        """
        began = time.monotonic()
        binary = binary or find_binary()
        etcd = etcd or find_etcd()
        workdir.mkdir(parents=True, exist_ok=True)
        static_users = make_users(users)
        token_file = workdir / "tokens.csv"
        write_token_file(token_file, static_users)
        server = cls(
            workdir=workdir,
            binary=binary,
            etcd=etcd,
            pki=make_pki(workdir / "pki"),
            users=static_users,
            token_file=token_file,
            extra_args=extra_args,
        )
        deadline = began + ready_timeout_s
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                server._launch(_free_ports())
                server._wait_ready(deadline)
            except KubeStartupError as error:
                server.stop(timeout_s=_ABORT_TIMEOUT_S)
                if not error.port_in_use or attempt == _PORT_ATTEMPTS:
                    raise
                continue
            except BaseException:
                server.stop(timeout_s=_ABORT_TIMEOUT_S)
                raise
            break
        server.startup_s = time.monotonic() - began
        server._write_kubeconfig()
        return server

    @property
    def admin_token(self) -> str:
        """Bearer token of `admin`, a member of `system:masters` (allowed everything)."""
        return self._users[ADMIN_USER].token

    @property
    def users(self) -> tuple[str, ...]:
        """Names of every user in the token file, `admin` first."""
        return tuple(self._users)

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running `etcd` and `kube-apiserver` (empty once stopped)."""
        return {name: process.pid for name, process in self._processes.items()}

    def token_for(self, user: str) -> str:
        """Bearer token of a user given to `start()` (or `admin`)."""
        try:
            return self._users[user].token
        except KeyError:
            known = ", ".join(self._users)
            raise KeyError(f"no token for user {user!r}; known users: {known}") from None

    def api_client(
        self, token: str | None = None, *, impersonate: str | None = None
    ) -> k8s.ApiClient:
        """A client for this server, authenticated with `token` (default: the admin's).

        `impersonate` sends `Impersonate-User` (the admin may impersonate anyone), which is how
        a test checks what a ServiceAccount (`system:serviceaccount:<ns>:<name>`) is allowed.
        Environment proxies are ignored: the server is on loopback. The caller closes the client
        (`with kube.api_client() as api:`) so its connection pool does not outlive the test.
        """
        config = k8s.Configuration(
            host=self.host,
            api_key={"authorization": token or self.admin_token},
            api_key_prefix={"authorization": "Bearer"},
            ssl_ca_cert=str(self.ca_path),
        )
        config.proxy = None
        api = k8s.ApiClient(configuration=config)
        if impersonate:
            api.default_headers["Impersonate-User"] = impersonate
        return api

    def json_session(self, token: str | None = None) -> JsonSession:
        """A stdlib JSON session (raw status codes, any path), as `token` (default: admin)."""
        return JsonSession(host=self.host, ca_path=self.ca_path, token=token or self.admin_token)

    def stop(self, *, timeout_s: float = _STOP_TIMEOUT_S) -> None:
        """Terminate kube-apiserver, then etcd: SIGTERM, then SIGKILL after `timeout_s`.

        Idempotent; safe to call on a server that failed half-way through starting.
        """
        try:
            for name in ("kube-apiserver", "etcd"):
                process = self._processes.get(name)
                if process is not None:
                    _terminate(process, timeout_s)
        finally:
            for process in self._processes.values():
                _kill_now(process)
            self._processes.clear()
            _RUNNING.discard(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _launch(self, ports: _Ports) -> None:
        """Start both processes at once: kube-apiserver retries etcd until it answers."""
        data_dir = self.workdir / "etcd-data"
        shutil.rmtree(data_dir, ignore_errors=True)
        self.host = f"https://{_LOOPBACK}:{ports.apiserver}"
        _RUNNING.add(self)
        self._processes["etcd"] = _spawn(_etcd_args(self.etcd, data_dir, ports), self.etcd_log)
        self._processes["kube-apiserver"] = _spawn(self._apiserver_args(ports), self.apiserver_log)

    def _apiserver_args(self, ports: _Ports) -> list[str]:
        pki = self._pki
        return [
            str(self.binary),
            f"--etcd-servers=http://{_LOOPBACK}:{ports.etcd_client}",
            f"--bind-address={_LOOPBACK}",
            f"--advertise-address={_LOOPBACK}",
            f"--secure-port={ports.apiserver}",
            "--insecure-port=0",
            f"--cert-dir={self.workdir / 'certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--token-auth-file={self._token_file}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_account_public_key}",
            f"--service-account-signing-key-file={pki.service_account_private_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # No controllers run: nothing would maintain the `kubernetes` Endpoints or fill
            # ServiceAccount token secrets, so both are switched off.
            "--endpoint-reconciler-type=none",
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--profiling=false",
            *self._extra_args,
        ]

    def _wait_ready(self, deadline: float) -> None:
        """Poll /readyz until 200; fail fast when a process exits, and at `deadline`."""
        with self.json_session() as session:
            while True:
                for name, process in self._processes.items():
                    if process.poll() is not None:
                        self._fail(f"{name} exited with status {process.returncode} at start-up")
                if _is_ready(session):
                    return
                if time.monotonic() > deadline:
                    self._fail(f"{self.host}/readyz did not answer 200 in time")
                time.sleep(_POLL_INTERVAL_S)

    def _fail(self, reason: str) -> None:
        etcd_tail = _tail(self.etcd_log)
        apiserver_tail = _tail(self.apiserver_log)
        in_use = "address already in use" in etcd_tail + apiserver_tail
        raise KubeStartupError(
            f"test kube-apiserver failed: {reason}\n"
            f"--- etcd ({self.etcd_log}), last lines:\n{etcd_tail}\n"
            f"--- kube-apiserver ({self.apiserver_log}), last lines:\n{apiserver_tail}",
            port_in_use=in_use,
        )

    def _write_kubeconfig(self) -> None:
        """An admin kubeconfig (JSON, which is YAML) for kubectl or `load_kube_config`."""
        name = "gputopo-test"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {"server": self.host, "certificate-authority": str(self.ca_path)},
                }
            ],
            "users": [{"name": ADMIN_USER, "user": {"token": self.admin_token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": ADMIN_USER}}],
            "current-context": name,
        }
        self.kubeconfig_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        self.kubeconfig_path.chmod(0o600)


def _etcd_args(etcd: Path, data_dir: Path, ports: _Ports) -> list[str]:
    client = f"http://{_LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{_LOOPBACK}:{ports.etcd_peer}"
    return [
        str(etcd),
        "--name=gputopo-test",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=gputopo-test={peer}",
        "--initial-cluster-state=new",
        "--logger=zap",
        "--log-outputs=stderr",
        "--log-level=warn",
    ]


def _free_ports() -> _Ports:
    """Three distinct ports the kernel considers free right now (held open together)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(3)]
        for sock in sockets:
            sock.bind((_LOOPBACK, 0))
        client, peer, apiserver = (sock.getsockname()[1] for sock in sockets)
    return _Ports(etcd_client=client, etcd_peer=peer, apiserver=apiserver)


def _spawn(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start `args` in its own process group, output to `log_path`, dying with this process.

    Its own session keeps Ctrl-C away from it, so that `stop()` shuts it down in order.
    """
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [*_die_with_parent(), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _die_with_parent() -> list[str]:
    """A command prefix making the kernel SIGKILL the child when its parent dies.

    util-linux's `setpriv` sets PR_SET_PDEATHSIG and execs the command (same pid); it is on
    every Debian system. Without it the harness still works but a SIGKILLed test run can orphan
    its servers. (A `preexec_fn` calling prctl would do the same but is unsafe with threads.)
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


def _terminate(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    if process.poll() is not None:
        return
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_now(process)


def _kill_now(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _is_ready(session: JsonSession) -> bool:
    try:
        return session.request("GET", "/readyz").status == 200
    except (OSError, http.client.HTTPException):
        return False


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _stop_all() -> None:
    """Last resort at interpreter exit for servers nobody stopped."""
    for server in list(_RUNNING):
        server.stop()


_RUNNING: set[KubeApiServer] = set()
atexit.register(_stop_all)
