"""Every gRPC channel and server of gputopo is made here.

One place decides transport security and message sizes: with `tls` (see `gputopo.runtime.tls`)
channels present a client certificate and servers require one (mutual TLS, reloaded when the
files rotate); `tls=None` is plain text, which callers choose only from an explicit `--insecure`.

Channels: keepalive pings find a peer that vanished without closing its connections (its node
died). A caller that retries with its own backoff passes it, and the channel's reconnect
backoff is capped at the same values: gRPC otherwise backs off between connection attempts by
itself (up to 120 s) and fails new calls at once meanwhile, so after an outage of minutes the
caller's retries would all fail fast until the channel's timer ran out.

Servers: thousands of exporters reconnect at once after a restart or a failover; Core cancels
calls beyond its pending-request limit (1,000 by default) before the event loop can take them,
so the limit is raised and they queue instead. And grpc.aio takes new calls from Core one at a
time per server, each a completion-queue round trip through its poller thread: a few event-loop
turns per call, so when the loop is busy (turns of milliseconds) a server accepts only tens of
calls per second. `bind_shared` puts several servers of one process on one port (SO_REUSEPORT:
the kernel spreads connections over their listeners), each taking calls on its own, with one
state behind them; it checks first that no other process listens there.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import grpc

from gputopo.runtime.backoff import Backoff
from gputopo.runtime.grpc_decode import UndecodableRequests
from gputopo.runtime.tls import TlsFiles, channel_credentials, server_credentials

__all__ = ["MAX_MESSAGE_BYTES", "MAX_REQUEST_BYTES", "bind", "bind_shared", "channel", "server"]

# What a client accepts: a GetTopology of a large cluster with every link stays below this.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# What a server accepts: a report of the largest node the bounds allow (gputopo.bounds: 20,000
# links) is a few MB, a placement request less; more is refused with RESOURCE_EXHAUSTED before
# it is decoded, so no stream can make the server hold more than this per message.
MAX_REQUEST_BYTES = 16 * 1024 * 1024

_Option = tuple[str, int | str]


def channel(
    target: str,
    *,
    backoff: Backoff | None = None,
    options: Sequence[_Option] = (),
    tls: TlsFiles | None = None,
) -> grpc.aio.Channel:
    """A client channel to `target` (host:port); `options` are added to the defaults.

    With `tls`, the channel is mutual TLS; the server's certificate must name the host of
    `target` (or override it with ("grpc.ssl_target_name_override", name) in `options`).
    """
    opts: list[_Option] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
    ]
    if backoff is not None:
        base_ms = max(int(backoff.base_s * 1000), 100)
        opts += [
            ("grpc.initial_reconnect_backoff_ms", base_ms),
            ("grpc.min_reconnect_backoff_ms", base_ms),
            ("grpc.max_reconnect_backoff_ms", max(int(backoff.cap_s * 1000), 100)),
        ]
    if tls is not None:
        return grpc.aio.secure_channel(target, channel_credentials(tls), options=[*opts, *options])
    return grpc.aio.insecure_channel(target, options=[*opts, *options])


def server(
    *,
    options: Sequence[_Option] = (),
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    share_port: bool = False,
) -> grpc.aio.Server:
    """A server with the limits above; add servicers, then `bind` it and start it.
    `interceptors` run inside the one that refuses undecodable requests. With `share_port`
    its listener sets SO_REUSEPORT, for `bind_shared` (and only for it: the port's owner is
    checked there)."""
    return grpc.aio.server(
        # bad request bytes: INVALID_ARGUMENT, no traceback
        interceptors=[UndecodableRequests(), *interceptors],
        options=[
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.server.max_pending_requests", 50_000),
            ("grpc.server.max_pending_requests_hard_limit", 100_000),
            # gRPC sets SO_REUSEPORT by default: a second server on a taken port would start,
            # and the kernel would split clients between two states. One owner per port
            # (`bind_shared` checks the owner before its servers share one).
            ("grpc.so_reuseport", int(share_port)),
            *options,
        ],
    )


def bind(srv: grpc.aio.Server, host: str, port: int, *, tls: TlsFiles | None = None) -> int:
    """Listen on host:port (port 0 picks a free one); returns the bound port.

    With `tls`, every client must present a certificate signed by the CA (plain-text
    clients fail their handshake and never reach a servicer).

    Raises OSError when nothing could be bound (gRPC itself only answers 0).
    """
    address = f"{host}:{port}"
    try:
        if tls is not None:
            bound = srv.add_secure_port(address, server_credentials(tls))
        else:
            bound = srv.add_insecure_port(address)
    except RuntimeError:  # newer grpcio raises where older ones answered 0
        bound = 0
    if bound == 0:
        raise OSError(f"cannot listen on {address} for gRPC: the port is in use or not ours")
    return bound


def bind_shared(
    servers: Sequence[grpc.aio.Server], host: str, port: int, *, tls: TlsFiles | None = None
) -> int:
    """Listen on host:port with every one of `servers` (port 0 picks a free one); returns the
    bound port. More than one server must have been made with `share_port=True`.

    The port must be free of other processes' listeners: checked with a plain bind first (the
    listeners set SO_REUSEPORT, which would otherwise let a second aggregator start on the
    first one's port and the kernel split exporters between two states). Raises OSError naming
    the address when the port is taken or nothing could be bound.
    """
    if not servers:
        raise ValueError("bind_shared needs at least one server")
    if len(servers) == 1:
        return bind(servers[0], host, port, tls=tls)
    port = _free_port(host, port)
    for srv in servers:
        bind(srv, host, port, tls=tls)
    return port


def _free_port(host: str, port: int) -> int:
    """`port` (or, for 0, one the kernel picks) after checking that nothing listens on it.

    SO_REUSEADDR as gRPC's own listeners set it: connections of an earlier process still in
    TIME_WAIT do not count, a listener does (Linux refuses the bind then)."""
    address = f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, kind, proto, _, sockaddr = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # "[::]" takes IPv4 too, as gRPC's listener does
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            probe.bind(sockaddr)
            bound: int = probe.getsockname()[1]
            return bound
    except OSError as err:
        raise OSError(
            f"cannot listen on {address} for gRPC: {err.strerror or err}"
            " (the port is in use or not ours)"
        ) from None
