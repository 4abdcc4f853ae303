"""Mutual TLS over real loopback sockets: gRPC and HTTP refuse plain text and strangers, accept
a peer whose certificate the CA signed, and pick up rotated files without a restart.

Certificates are generated here, at test time, with `cryptography`; none is committed.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
from pathlib import Path

import aiohttp
import grpc
import pytest
from prometheus_client import CollectorRegistry

from gputopo.runtime import grpcio
from gputopo.runtime.http import HttpServer
from gputopo.runtime.tls import (
    TlsUsageError,
    add_tls_flags,
    ssl_client_context,
    ssl_server_context,
    tls_from_args,
)
from tests.harness.certs import TestCA

_METHOD = "/gputopo.test.Echo/Echo"


def _echo_server() -> grpc.aio.Server:
    srv = grpcio.server()

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    handler = grpc.unary_unary_rpc_method_handler(echo)
    srv.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("gputopo.test.Echo", {"Echo": handler})]
    )
    return srv


async def _call(channel: grpc.aio.Channel) -> bytes:
    stub = channel.unary_unary(_METHOD)
    out: bytes = await stub(b"ping", timeout=5)
    return out


def test_grpc_mutual_tls_refuses_plain_text_and_strangers(tmp_path: Path) -> None:
    asyncio.run(_grpc_mutual_tls_refuses_plain_text_and_strangers(tmp_path))


async def _grpc_mutual_tls_refuses_plain_text_and_strangers(tmp_path: Path) -> None:
    ca = TestCA("gputopo-ca")
    server_files = ca.issue(tmp_path / "server", "gputopo-aggregator.gputopo-system.svc")
    client_files = ca.issue(tmp_path / "client", "exporter")
    stranger = TestCA("other-ca").issue(tmp_path / "stranger", "exporter")
    srv = _echo_server()
    port = grpcio.bind(srv, "127.0.0.1", 0, tls=server_files)
    await srv.start()
    target = f"localhost:{port}"
    try:
        async with grpcio.channel(target, tls=client_files) as ch:
            assert await _call(ch) == b"ping"
        # Plain text never reaches the servicer.
        async with grpcio.channel(target) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(ch)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # A certificate from another CA is refused at the handshake.
        async with grpcio.channel(target, tls=stranger) as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await _call(ch)
        # TLS without a client certificate is refused too (mutual, not one-way).
        creds = grpc.ssl_channel_credentials(root_certificates=server_files.ca.read_bytes())
        async with grpc.aio.secure_channel(target, creds) as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await _call(ch)
    finally:
        await srv.stop(None)


def test_grpc_server_follows_rotated_files(tmp_path: Path) -> None:
    asyncio.run(_grpc_server_follows_rotated_files(tmp_path))


async def _grpc_server_follows_rotated_files(tmp_path: Path) -> None:
    old_ca, new_ca = TestCA("ca-1"), TestCA("ca-2")
    server_files = old_ca.issue(tmp_path / "server", "aggregator")
    old_client = old_ca.issue(tmp_path / "old-client", "exporter")
    new_client = new_ca.issue(tmp_path / "new-client", "exporter")
    srv = _echo_server()
    port = grpcio.bind(srv, "127.0.0.1", 0, tls=server_files)
    await srv.start()
    target = f"localhost:{port}"
    try:
        async with grpcio.channel(target, tls=new_client) as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await _call(ch)
        # cert-manager rewrites the Secret's files in place: the next handshake uses them.
        await asyncio.sleep(0.05)  # a distinct mtime even on coarse filesystems
        new_ca.issue(tmp_path / "server", "aggregator")
        async with grpcio.channel(target, tls=new_client) as ch:
            assert await _call(ch) == b"ping"
        async with grpcio.channel(target, tls=old_client) as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await _call(ch)
    finally:
        await srv.stop(None)


def test_http_mutual_tls_refuses_plain_text_and_follows_rotation(tmp_path: Path) -> None:
    asyncio.run(_http_mutual_tls_refuses_plain_text_and_follows_rotation(tmp_path))


async def _http_mutual_tls_refuses_plain_text_and_follows_rotation(tmp_path: Path) -> None:
    old_ca, new_ca = TestCA("ca-1"), TestCA("ca-2")
    server_files = old_ca.issue(tmp_path / "server", "aggregator")
    client = old_ca.issue(tmp_path / "client", "scheduler")
    new_client = new_ca.issue(tmp_path / "new-client", "scheduler")
    http = HttpServer(registry=CollectorRegistry(), ssl_context=ssl_server_context(server_files))
    port = await http.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            url = f"https://localhost:{port}/healthz"
            async with session.get(url, ssl=ssl_client_context(client)) as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"http://localhost:{port}/healthz") as resp:
                    await resp.read()
            # One-way TLS (no client certificate) fails the handshake.
            one_way = ssl.create_default_context(cafile=str(client.ca))
            with pytest.raises(aiohttp.ClientError):
                async with session.get(url, ssl=one_way) as resp:
                    await resp.read()
            await asyncio.sleep(0.05)
            new_ca.issue(tmp_path / "server", "aggregator")
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, ssl=ssl_client_context(new_client)) as resp,
        ):
            assert resp.status == 200
    finally:
        await http.stop()


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_tls_flags(parser)
    return parser.parse_args(argv)


def test_flags_demand_tls_or_an_explicit_insecure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(TlsUsageError, match="--insecure for plain text"):
        tls_from_args(_parse([]), component="aggregator")
    with pytest.raises(TlsUsageError, match=r"^--tls-key is required with --tls-cert$"):
        tls_from_args(_parse(["--tls-cert", "a"]), component="aggregator")
    with pytest.raises(TlsUsageError, match=r"^--insecure contradicts --tls-ca"):
        tls_from_args(_parse(["--insecure", "--tls-ca", "a"]), component="aggregator")
    missing = str(tmp_path / "nope.crt")
    with pytest.raises(TlsUsageError, match=f"^--tls-cert {missing}: No such file"):
        tls_from_args(
            _parse(["--tls-cert", missing, "--tls-key", missing, "--tls-ca", missing]),
            component="aggregator",
        )
    with caplog.at_level("WARNING"):
        assert tls_from_args(_parse(["--insecure"]), component="aggregator") is None
    assert "WITHOUT transport security" in caplog.text
    files = TestCA("ca").issue(tmp_path / "x", "aggregator")
    argv = ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]
    assert tls_from_args(_parse(argv), component="aggregator") == files
