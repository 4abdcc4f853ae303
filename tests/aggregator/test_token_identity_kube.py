"""Exporters prove their node with the pod's projected ServiceAccount token (real API server).

One Secret cannot give each DaemonSet pod a certificate naming its node, so the manifests give
every exporter the same client certificate and a projected token bound to its pod. The
aggregator reviews the token (TokenReview), reads the pod it is bound to, and lets the stream
report only that pod's node: a token of a pod on n1 cannot report n2; no token, a token for
another audience, of another account, or of a pod since deleted reports nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aggregator.server import KubeOptions
from aggregator.tokens import IdentityError, TokenNodes
from gputopo.runtime.kube import KubeClient
from gputopo.runtime.tls import TlsFiles
from tests.aggregator.kubeutil import aggregator, create_nodes, eventually, read_nodes, run
from tests.exporter_process import start_exporter
from tests.harness.certs import TestCA
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

pytestmark = [pytest.mark.kube, pytest.mark.slow]

ACCOUNT = "gputopo-exporter"


def _setup(
    kube: KubeApiServer, ns: str, pods: dict[str, tuple[str, str]]
) -> dict[str, dict[str, Any]]:
    """The exporters' ServiceAccount, another one, and pods bound to nodes: name -> pod."""
    out = {}
    with kube.json_session() as session:
        for sa in (ACCOUNT, "someone-else"):
            body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}
            response = session.request(
                "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body=body
            )
            assert response.ok, response.body
        for name, (node, account) in pods.items():
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": account,
                    "containers": [{"name": "exporter", "image": "ghcr.io/gputopo/gputopo:0.1.0"}],
                },
            }
            response = session.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body)
            assert response.ok, response.body
            out[name] = response.body
    return out


def _token(
    kube: KubeApiServer, ns: str, pod: dict[str, Any], *, audience: str, account: str = ACCOUNT
) -> str:
    """What the kubelet writes into the pod's projected token volume (TokenRequest)."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [audience],
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        },
    }
    with kube.json_session() as session:
        path = f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token"
        response = session.request("POST", path, body=body)
    assert response.ok, response.body
    return str(response.body["status"]["token"])


def _exporter(node: str, port: int, tls: TlsFiles, token: Path | None, log: Path) -> Any:
    extra = (f"--identity-token={token}",) if token is not None else ()
    return start_exporter(node, f"localhost:{port}", log, tls=tls, extra=extra)


def test_a_token_lets_an_exporter_report_its_own_node_and_no_other(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope, tmp_path: Path
) -> None:
    ns = kube_scope.namespace
    n1, n2 = kube_scope.name("n1"), kube_scope.name("n2")
    pods = _setup(
        kube_apiserver,
        ns,
        {"exporter-a": (n1, ACCOUNT), "exporter-b": (n2, ACCOUNT), "other": (n2, "someone-else")},
    )
    audience = "gputopo-aggregator"
    tokens = {
        "own": _token(kube_apiserver, ns, pods["exporter-a"], audience=audience),
        "wrong audience": _token(kube_apiserver, ns, pods["exporter-b"], audience="other"),
        "another account": _token(
            kube_apiserver, ns, pods["other"], audience=audience, account="someone-else"
        ),
    }
    files = {}
    for what, token in tokens.items():
        files[what] = tmp_path / what.replace(" ", "-")
        files[what].write_text(token, encoding="utf-8")
    ca = TestCA("gputopo-ca")
    server = ca.issue(tmp_path / "aggregator", "localhost")
    shared = ca.issue(tmp_path / "exporter", "gputopo-exporter")  # one Secret for every pod
    options = KubeOptions(publish_labels=False)

    async def body() -> None:
        await create_nodes(kube_apiserver, [n1, n2])
        async with aggregator(
            kube_apiserver, options=options, tls=server, exporter_accounts=(f"{ns}:{ACCOUNT}",)
        ) as agg:
            assert agg.reporter._tokens is not None
            assert agg.reporter._tokens.audience == audience
            port = agg.grpc_port
            procs = [
                _exporter(n1, port, shared, files["own"], tmp_path / "own.log"),
                _exporter(n2, port, shared, files["own"], tmp_path / "n1-for-n2.log"),
                _exporter(n2, port, shared, None, tmp_path / "none.log"),
                _exporter(n2, port, shared, files["wrong audience"], tmp_path / "aud.log"),
                _exporter(n2, port, shared, files["another account"], tmp_path / "acct.log"),
            ]
            try:
                denied = agg.reporter.stats.rejected

                async def settled() -> bool:
                    return agg.state.record(n1) is not None and denied["node_identity"] >= 4

                await eventually(settled, timeout_s=120, what="n1 in, four forgers refused")
                assert agg.state.record(n2) is None
                assert all(p.poll() is None for p in procs)
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(timeout=30)
            # A token whose pod is gone proves nothing (checked without the cache).
            with kube_apiserver.json_session() as session:
                path = f"/api/v1/namespaces/{ns}/pods/exporter-a?gracePeriodSeconds=0"
                assert session.request("DELETE", path).ok
            fresh = TokenNodes(
                KubeClient(kube_apiserver.api_client()), accounts=[f"{ns}:{ACCOUNT}"]
            )
            with pytest.raises(IdentityError):
                await fresh.node_of(tokens["own"])
        nodes = await read_nodes(kube_apiserver, kube_scope.prefix)
        assert set(nodes) == {n1, n2}

    run(body(), timeout_s=280)
