"""`gputopo certs` makes what the manifests mount, and a certificate with the wrong purpose is
refused when it is loaded, naming the extended key usage (EKU) it lacks, on both sides.

Certificates are made at test time; none is committed. The mutual TLS they give is proven over
real sockets (a client with the exporter's certificate calls a server with the aggregator's,
verifying the name the manifests dial).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import stat
from pathlib import Path

import aiohttp
import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from prometheus_client import CollectorRegistry

from gputopo.app.cli import main
from gputopo.runtime.http import HttpServer
from gputopo.runtime.pki import (
    CLIENT_AUTH,
    SERVER_AUTH,
    SecretSpec,
    default_secrets,
    issue_bundle,
    missing_purposes,
)
from gputopo.runtime.tls import (
    TlsFiles,
    TlsUsageError,
    add_tls_flags,
    ssl_client_context,
    ssl_server_context,
    tls_from_args,
)
from tests.deploy.manifests import every_object, overlay

NOW = datetime.datetime(2026, 11, 25, tzinfo=datetime.UTC)
DIALLED = "gputopo-aggregator.gputopo-system.svc"
CLIENTS = ("gputopo-exporter/gputopo-exporter-tls", "gputopo-system/gputopo-prometheus-tls")
MOUNTED = {"gputopo-aggregator-tls", "gputopo-exporter-tls", "gputopo-scheduler-tls"}


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _dns(cert: x509.Certificate) -> list[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(san.get_values_for_type(x509.DNSName))


def _ekus(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_certs_writes_the_secrets_the_manifests_mount(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pki"
    assert main(["certs", "--out", str(out), "--namespace", "ml-infra"]) == 0
    secrets = [d for d in yaml.safe_load_all((out / "secrets.yaml").read_text()) if d]
    where = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in secrets}
    assert where == {
        ("ml-infra", "gputopo-aggregator-tls"),
        ("ml-infra", "gputopo-scheduler-tls"),
        ("ml-infra", "gputopo-prometheus-tls"),
        ("gputopo-exporter", "gputopo-exporter-tls"),
        ("gputopo-exporter", "gputopo-prometheus-tls"),
    }
    mounted = {
        v["secret"]["secretName"]
        for doc in every_object()
        if doc["kind"] in ("Deployment", "DaemonSet")
        for v in doc["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert mounted == MOUNTED, "a manifest mounts a Secret `gputopo certs` does not make"
    for s in secrets:
        assert s["type"] == "kubernetes.io/tls"
        assert set(s["data"]) == {"tls.crt", "tls.key", "ca.crt"}
        assert base64.b64decode(s["data"]["ca.crt"]) == (out / "ca.crt").read_bytes()
    agg = _cert(out / "ml-infra" / "gputopo-aggregator-tls" / "tls.crt")
    assert "gputopo-aggregator.ml-infra.svc" in _dns(agg)
    assert "gputopo-aggregator-metrics.ml-infra.svc.cluster.local" in _dns(agg)
    assert not any("gputopo-system" in n for n in _dns(agg))
    prom = _cert(out / "gputopo-exporter" / "gputopo-prometheus-tls" / "tls.crt")
    assert _ekus(prom) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    exporter = _cert(out / "gputopo-exporter" / "gputopo-exporter-tls" / "tls.crt")
    assert _ekus(exporter) == {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}
    for key in [out / "ca.key", *out.glob("*/*/tls.key"), out / "secrets.yaml"]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert "kubectl apply -f" in capsys.readouterr().out
    # Run twice into the same place: refused, nothing overwritten.
    before = (out / "ca.key").read_bytes()
    assert main(["certs", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    assert (out / "ca.key").read_bytes() == before


def test_certs_signs_with_an_existing_ca(tmp_path: Path) -> None:
    assert main(["certs", "--out", str(tmp_path / "first")]) == 0
    ca_cert, ca_key = tmp_path / "first" / "ca.crt", tmp_path / "first" / "ca.key"
    argv = ["certs", "--out", str(tmp_path / "again"), "--ca-cert", str(ca_cert)]
    assert main([*argv, "--ca-key", str(ca_key)]) == 0
    leaf = _cert(tmp_path / "again" / "gputopo-system" / "gputopo-scheduler-tls" / "tls.crt")
    leaf.verify_directly_issued_by(_cert(ca_cert))  # raises when another CA signed it
    assert not (tmp_path / "again" / "ca.key").exists()
    assert main(argv) == 2  # --ca-cert without --ca-key


def _files(tmp_path: Path, usages: tuple[str, ...]) -> TlsFiles:
    spec = SecretSpec("t", "ns", "gputopo-test", ("localhost",), usages)
    bundle = issue_bundle([spec], days=1, now=datetime.datetime.now(datetime.UTC))
    (issued,) = bundle.issued
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt")
    files.cert.write_bytes(issued.cert)
    files.key.write_bytes(issued.key)
    files.ca.write_bytes(issued.ca)
    return files


def _args(files: TlsFiles) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_tls_flags(parser)
    argv = ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]
    return parser.parse_args(argv)


def test_a_server_certificate_without_server_auth_is_refused_naming_the_eku(
    tmp_path: Path,
) -> None:
    files = _files(tmp_path, (CLIENT_AUTH,))
    with pytest.raises(TlsUsageError) as raised:
        tls_from_args(_args(files), component="aggregator")
    message = str(raised.value)
    assert "lacks the extended key usage (EKU) serverAuth" in message
    assert "it allows only" not in message  # the aggregator needs serverAuth alone
    assert str(files.cert) in message


def test_a_client_certificate_without_client_auth_is_refused_naming_the_eku(
    tmp_path: Path,
) -> None:
    files = _files(tmp_path, (SERVER_AUTH,))
    with pytest.raises(TlsUsageError) as raised:
        tls_from_args(_args(files), component="exporter", dials=True)
    message = str(raised.value)
    assert "lacks the extended key usage (EKU) clientAuth" in message
    assert "dials the aggregator" in message
    assert "it allows only serverAuth" in message
    # The same certificate is fine for a process that only serves.
    assert tls_from_args(_args(files), component="aggregator") == files


@pytest.mark.parametrize(
    ("command", "usages", "missing"),
    [
        pytest.param("aggregator", (CLIENT_AUTH,), SERVER_AUTH, id="aggregator, client-only"),
        pytest.param("exporter", (SERVER_AUTH,), CLIENT_AUTH, id="exporter, server-only"),
        pytest.param("scheduler", (SERVER_AUTH,), CLIENT_AUTH, id="scheduler, server-only"),
    ],
)
def test_each_process_exits_with_the_eku_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    usages: tuple[str, ...],
    missing: str,
) -> None:
    files = _files(tmp_path, usages)
    argv = [command, "--tls-cert", str(files.cert), "--tls-key", str(files.key)]
    extra = ["--aggregator", "127.0.0.1:1"] if command == "scheduler" else []
    code = main([*argv, "--tls-ca", str(files.ca), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert f"(EKU) {missing}" in err
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("usages", "needed", "want"),
    [
        pytest.param((SERVER_AUTH, CLIENT_AUTH), (SERVER_AUTH, CLIENT_AUTH), [], id="both"),
        pytest.param((CLIENT_AUTH,), (SERVER_AUTH, CLIENT_AUTH), [SERVER_AUTH], id="no server"),
        pytest.param((SERVER_AUTH,), (SERVER_AUTH, CLIENT_AUTH), [CLIENT_AUTH], id="no client"),
    ],
)
def test_missing_purposes(
    usages: tuple[str, ...], needed: tuple[str, ...], want: list[str]
) -> None:
    spec = SecretSpec("t", "ns", "cn", (), usages)
    (issued,) = issue_bundle([spec], days=1, now=NOW).issued
    assert missing_purposes(issued.cert, needed) == want


def test_the_issued_certificates_give_mutual_tls_under_the_names_dialled(tmp_path: Path) -> None:
    specs = default_secrets(namespace="gputopo-system", exporter_namespace="gputopo-exporter")
    bundle = issue_bundle(specs, days=1, now=datetime.datetime.now(datetime.UTC))
    by_name: dict[str, TlsFiles] = {}
    for issued in bundle.issued:
        d = tmp_path / issued.spec.namespace / issued.spec.name
        d.mkdir(parents=True)
        files = TlsFiles(d / "tls.crt", d / "tls.key", d / "ca.crt")
        files.cert.write_bytes(issued.cert)
        files.key.write_bytes(issued.key)
        files.ca.write_bytes(issued.ca)
        by_name[f"{issued.spec.namespace}/{issued.spec.name}"] = files

    async def body() -> list[int]:
        server = HttpServer(
            registry=CollectorRegistry(),
            ssl_context=ssl_server_context(by_name["gputopo-system/gputopo-aggregator-tls"]),
        )
        await server.start("127.0.0.1", 0)
        statuses = []
        try:
            for client in CLIENTS:
                ctx = ssl_client_context(by_name[client])
                assert ctx.check_hostname
                url = f"https://127.0.0.1:{server.port}/metrics"
                async with (
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session,
                    # The name exporters dial, checked against the certificate's SANs.
                    session.get(url, server_hostname=DIALLED) as response,
                ):
                    statuses.append(response.status)
        finally:
            await server.stop()
        return statuses

    assert asyncio.run(body()) == [200, 200]


_USAGES = {"server auth": SERVER_AUTH, "client auth": CLIENT_AUTH}


def test_cert_manager_asks_for_what_gputopo_certs_makes() -> None:
    """deploy/optional/cert-manager and `gputopo certs`: the same Secrets, names and purposes."""
    docs = overlay("default", components=("optional/cert-manager",))
    certificates = {
        (d["metadata"]["namespace"], d["spec"]["secretName"]): d["spec"]
        for d in docs
        if d["kind"] == "Certificate" and not d["spec"].get("isCA")
    }
    specs = default_secrets(namespace="gputopo-system", exporter_namespace="gputopo-exporter")
    assert set(certificates) == {(s.namespace, s.name) for s in specs}
    for spec in specs:
        cert = certificates[(spec.namespace, spec.name)]
        assert cert["commonName"] == spec.common_name
        assert tuple(cert.get("dnsNames", ())) == spec.dns_names
        usages = {_USAGES[u] for u in cert["usages"] if u in _USAGES}
        assert usages == set(spec.usages), spec.name
        assert cert["issuerRef"]["name"] == "gputopo-ca"
