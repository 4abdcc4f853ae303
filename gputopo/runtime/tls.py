"""Transport security of every long-running gputopo process: mutual TLS from files.

The files are what a Secret or cert-manager mounts (`tls.crt`, `tls.key`, `ca.crt`). Both sides
present a certificate and check the peer's against the same CA, so a pod on the network that
holds no certificate signed by it can neither report nor place. cert-manager rotates the files
in place; servers re-read them when their modification times change (checked at each new
handshake, never per message), so a rotation needs no restart. Plain text is only ever chosen
explicitly with `--insecure`, and said in a WARNING, because a silent fallback is exactly the
open door this module exists to close.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc

__all__ = [
    "ROTATION_CHECK_S",
    "TlsFiles",
    "TlsUsageError",
    "add_health_port_flag",
    "add_tls_flags",
    "channel_credentials",
    "check_purposes",
    "follow_rotation",
    "server_credentials",
    "ssl_client_context",
    "ssl_server_context",
    "tls_from_args",
    "warn_plaintext",
]

log = logging.getLogger(__name__)


# How often clients look at their TLS files (a stat of three files: cheap). cert-manager renews
# at two thirds of a certificate's life, so even minutes would do; seconds keep tests short.
ROTATION_CHECK_S = 10.0


class TlsUsageError(ValueError):
    """The TLS flags given cannot be used; the message is one line naming the flag."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Paths of this process's certificate, its key and the CA both sides trust."""

    cert: Path
    key: Path
    ca: Path

    def stamp(self) -> tuple[int, ...]:
        """Modification times and sizes: they change whenever a file is rotated."""
        out: list[int] = []
        for p in (self.cert, self.key, self.ca):
            st = os.stat(p)
            out += [st.st_mtime_ns, st.st_size]
        return tuple(out)

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(cert, key, ca) as PEM bytes."""
        return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()


def add_tls_flags(parser: argparse.ArgumentParser, *, client: bool = False) -> None:
    """The same four flags on exporter, aggregator and scheduler (one spelling everywhere);
    `client` adds how often a client looks for a renewed certificate."""
    group = parser.add_argument_group("transport security")
    if client:
        group.add_argument(
            "--tls-check-interval",
            type=float,
            default=ROTATION_CHECK_S,
            metavar="SECONDS",
            help="look for renewed TLS files this often and reconnect with them"
            " (default %(default)s)",
        )
    group.add_argument("--tls-cert", type=Path, help="PEM certificate of this process")
    group.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    group.add_argument("--tls-ca", type=Path, help="PEM CA that signs every peer's certificate")
    group.add_argument(
        "--insecure",
        action="store_true",
        help="plain text, no peer authentication (a WARNING is logged); required without TLS files",
    )


def add_health_port_flag(parser: argparse.ArgumentParser) -> None:
    """`--health-port`: the probes alone, in plain text, beside the TLS endpoints."""
    parser.add_argument(
        "--health-port",
        type=int,
        default=None,
        metavar="PORT",
        help="also serve /healthz and /readyz alone, in plain text, on this port: the"
        " kubelet's probes cannot present a client certificate (default: not served)",
    )


def warn_plaintext(component: str) -> None:
    """The one WARNING a plain-text process logs, so an operator sees it in the first lines."""
    log.warning(
        "%s runs WITHOUT transport security (--insecure): any process that reaches its "
        "ports can report and place",
        component,
    )


def tls_from_args(
    args: argparse.Namespace,
    *,
    component: str,
    require_choice: bool = True,
    warn: bool = True,
    dials: bool = False,
) -> TlsFiles | None:
    """The TLS files the flags name, or None for plain text (`--insecure`).

    `require_choice=False` lets a command still start in plain text without any TLS flag (with
    the same WARNING) while its callers learn to say `--insecure`; the manifests never rely on it.

    Every process serves HTTPS with its certificate, so it must allow `serverAuth`; `dials`
    (exporter, scheduler: they call the aggregator with it) adds `clientAuth`. A certificate
    without the EKU its process needs is refused here, naming the EKU, instead of failing each
    handshake with a message only the peer logs (`check_purposes`).

    `warn=False` leaves the plain-text WARNING to the caller (`warn_plaintext`), for a command that
    checks the rest of its input first: a bad input file is then its only line.

    Raises TlsUsageError (one line, naming the flag) when the flags are incomplete, contradict
    each other, or name a file that cannot be read.
    """
    given = {
        "--tls-cert": args.tls_cert,
        "--tls-key": args.tls_key,
        "--tls-ca": args.tls_ca,
    }
    present = [name for name, value in given.items() if value is not None]
    if args.insecure and present:
        raise TlsUsageError(f"--insecure contradicts {present[0]}: choose one")
    if args.insecure or (not present and not require_choice):
        if warn:
            warn_plaintext(component)
        return None
    if not present:
        raise TlsUsageError(
            "--tls-cert, --tls-key and --tls-ca are required (or --insecure for plain text)"
        )
    for name, value in given.items():
        if value is None:
            raise TlsUsageError(f"{name} is required with {present[0]}")
    for name, value in given.items():
        try:
            with open(value, "rb"):
                pass
        except OSError as exc:
            raise TlsUsageError(f"{name} {value}: {exc.strerror or exc}") from None
    files = TlsFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
    check_purposes(files, component=component, dials=dials)
    return files


def check_purposes(files: TlsFiles, *, component: str, dials: bool) -> None:
    """Raise TlsUsageError when the certificate lacks an extended key usage `component` needs.

    The message names the missing EKU, what it is for, and how to get a certificate with it:
    the one line an operator needs, where otherwise the server would log `unsupported
    certificate purpose` and the client only `Socket closed`.
    """
    # Here, not at the top: `cryptography` costs ~6 MiB of RSS, which a process that runs
    # without TLS (an exporter with --insecure) need not pay for importing this module.
    from gputopo.runtime.pki import CLIENT_AUTH, SERVER_AUTH, missing_purposes  # noqa: PLC0415

    needed = [SERVER_AUTH, CLIENT_AUTH] if dials else [SERVER_AUTH]
    try:
        missing = missing_purposes(files.cert.read_bytes(), needed)
    except (OSError, ValueError) as exc:
        raise TlsUsageError(f"--tls-cert {files.cert}: not a PEM certificate ({exc})") from None
    if not missing:
        return
    why = {
        SERVER_AUTH: f"the {component} serves TLS (gRPC, /metrics) with it",
        CLIENT_AUTH: f"the {component} dials the aggregator with it",
    }
    first = missing[0]
    has = [p for p in needed if p not in missing]
    raise TlsUsageError(
        f"--tls-cert {files.cert}: the certificate lacks the extended key usage (EKU) {first}"
        f" ({why[first]}){'; it allows only ' + has[0] if has else ''}; reissue it with"
        f" {' and '.join(needed)} (`gputopo certs` does; cert-manager: usages"
        f" [{', '.join(u.replace('Auth', ' auth') for u in needed)}])"
    )


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """gRPC server credentials that require a client certificate and follow file rotation.

    gRPC asks the fetcher at each new handshake; it answers None (keep the current
    configuration) unless the files changed. A rotation caught half-written fails to load and
    keeps the previous configuration, so a reload can never take the server down.
    """
    lock = threading.Lock()
    last = [files.stamp()]

    def config() -> grpc.ServerCertificateConfiguration:
        cert, key, ca = files.read()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        with lock:
            try:
                stamp = files.stamp()
                if stamp == last[0]:
                    return None
                new = config()
            except OSError as exc:
                log.warning("TLS files unreadable, keeping the loaded ones: %s", exc)
                return None
            last[0] = stamp
            log.info("TLS files changed; new handshakes use them (%s)", files.cert)
            return new

    # grpc's stubs say the fetcher returns a configuration; its docs and code accept None
    # ("keep the current one"), which is what makes the per-handshake check cheap.
    fetcher = cast("Callable[[], grpc.ServerCertificateConfiguration]", fetch)
    return grpc.dynamic_ssl_server_credentials(
        config(), fetcher, require_client_authentication=True
    )


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """gRPC client credentials: present our certificate, trust only the CA's.

    Read once, when the channel is made: grpc keeps these credentials for the channel's life
    and its reconnects. So clients follow rotation by making a new channel when the files
    change (`follow_rotation`), which is what the exporter and the scheduler do.
    """
    cert, key, ca = files.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def _context(files: TlsFiles, purpose: ssl.Purpose) -> ssl.SSLContext:
    ctx = ssl.create_default_context(purpose, cafile=str(files.ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(files.cert), str(files.key))
    if purpose is ssl.Purpose.CLIENT_AUTH:
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def ssl_server_context(files: TlsFiles) -> ssl.SSLContext:
    """An SSLContext for aiohttp that requires client certificates and follows rotation.

    The SNI callback runs at every handshake: when the files changed, a fresh context is
    loaded and swapped onto the connection being accepted (and kept for later ones).
    """
    lock = threading.Lock()
    state = {"stamp": files.stamp(), "ctx": _context(files, ssl.Purpose.CLIENT_AUTH)}
    outer: ssl.SSLContext = state["ctx"]  # type: ignore[assignment]

    def on_hello(
        sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext
    ) -> None:
        with lock:
            try:
                stamp = files.stamp()
                if stamp != state["stamp"]:
                    fresh = _context(files, ssl.Purpose.CLIENT_AUTH)
                    fresh.sni_callback = on_hello
                    state["ctx"], state["stamp"] = fresh, stamp
                    log.info("TLS files changed; new HTTPS handshakes use them (%s)", files.cert)
            except (OSError, ssl.SSLError) as exc:
                log.warning("TLS files unreadable, keeping the loaded ones: %s", exc)
            current: ssl.SSLContext = state["ctx"]  # type: ignore[assignment]
        if current is not sock.context:
            sock.context = current

    outer.sni_callback = on_hello
    return outer


def ssl_client_context(files: TlsFiles) -> ssl.SSLContext:
    """An SSLContext for HTTPS clients (aiohttp, the extender's caller): mutual TLS."""
    return _context(files, ssl.Purpose.SERVER_AUTH)


async def follow_rotation(
    files: TlsFiles,
    on_change: Callable[[], Awaitable[None]],
    *,
    interval_s: float = ROTATION_CHECK_S,
) -> None:
    """Call `on_change` each time the files have changed and load as a valid key pair, until
    cancelled. A rotation caught half-written (unreadable, or a key that does not match the
    certificate) is retried at the next check, never half-applied."""
    stamp = files.stamp()
    while True:
        await asyncio.sleep(interval_s)
        try:
            now = files.stamp()
            if now == stamp:
                continue
            _context(files, ssl.Purpose.SERVER_AUTH)  # a mismatched pair fails here
        except (OSError, ssl.SSLError) as exc:
            log.warning("TLS files changed but cannot be loaded yet (%s); retrying", exc)
            continue
        stamp = now
        log.info("TLS files changed: reconnecting with the renewed certificate %s", files.cert)
        await on_change()
