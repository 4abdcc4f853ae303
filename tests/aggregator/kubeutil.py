"""Helpers for aggregator tests against the real test API server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO, TypeVar

import yaml

from aggregator.publisher import PublisherConfig
from aggregator.server import Aggregator, AggregatorConfig, KubeOptions
from exporter.simulate import SimulatedExporters
from gputopo.runtime.kube import KubeClient, NodeObject, ThrottledError
from gputopo.runtime.tls import TlsFiles
from gputopo.topology import NodeTopology
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope

T = TypeVar("T")
CRDS = Path(__file__).parent.parent / "data" / "crds"


def run(coro: Awaitable[T], *, timeout_s: float = 120) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=timeout_s))


def fast_publisher(**overrides: Any) -> PublisherConfig:
    """A publisher tuned for tests: no rate limit to speak of, short settling."""
    base: dict[str, Any] = {"qps": 500.0, "burst": 500, "settle_s": 0.1, "workers": 4}
    return PublisherConfig(**(base | overrides))


@contextlib.asynccontextmanager
async def aggregator(
    kube: KubeApiServer,
    *,
    options: KubeOptions | None = None,
    stale_after_s: float = 30.0,
    token: str | None = None,
    impersonate: str | None = None,
    inventory_path: str | None = None,
    out: TextIO | None = None,
    http_port: int | None = None,
    tls: TlsFiles | None = None,
    exporter_accounts: tuple[str, ...] = (),
) -> AsyncIterator[Aggregator]:
    """An aggregator with a Kubernetes client of its own, stopped (gracefully) on exit; with
    `tls`, over mutual TLS and taking reports only from node certificates."""
    client = KubeClient(kube.api_client(token, impersonate=impersonate))
    agg = Aggregator(
        AggregatorConfig(
            stale_after_s=stale_after_s,
            heartbeat_interval_s=0.2,
            housekeeping_interval_s=0.1,
            inventory_path=inventory_path,
            http_port=http_port,
            kube=options or KubeOptions(publisher=fast_publisher()),
            tls=tls,
            require_node_identity=tls is not None,
            exporter_accounts=exporter_accounts,
        ),
        kube=client,
        out=out,
    )
    await agg.start()
    try:
        yield agg
    finally:
        await agg.stop(grace_s=0.1)
        client.close()


@contextlib.asynccontextmanager
async def exporters(
    agg: Aggregator, nodes: Iterable[NodeTopology]
) -> AsyncIterator[SimulatedExporters]:
    """Simulated exporters streaming to an aggregator over loopback gRPC, all acknowledged."""
    async with SimulatedExporters(
        list(nodes), target=agg.grpc_target, heartbeat_interval_s=0.2
    ) as sim:
        await sim.wait_acked(timeout_s=60)
        yield sim


async def create_nodes(
    kube: KubeApiServer, names: Iterable[str], *, labels: Mapping[str, str] | None = None
) -> None:
    client = KubeClient(kube.api_client(), workers=8)

    async def create(name: str) -> None:
        for _ in range(20):
            try:
                await client.create_node(
                    name, labels={"kubernetes.io/hostname": name, **(labels or {})}
                )
                return
            except ThrottledError as err:
                await asyncio.sleep(err.retry_after_s or 0.2)
        raise AssertionError(f"could not create node {name}")

    try:
        await asyncio.gather(*(create(n) for n in names))
    finally:
        client.close()


async def read_nodes(kube: KubeApiServer, prefix: str) -> dict[str, NodeObject]:
    client = KubeClient(kube.api_client())
    try:
        nodes, _ = await client.list_nodes()
    finally:
        client.close()
    return {n.name: n for n in nodes if n.name.startswith(prefix)}


async def resource_versions(kube: KubeApiServer, prefix: str) -> dict[str, str]:
    """Node name -> resource version, for the nodes whose names start with `prefix`."""
    return {n: o.resource_version for n, o in (await read_nodes(kube, prefix)).items()}


def create_pods(kube: KubeApiServer, scope: KubeScope, names: Iterable[str]) -> None:
    """Pod objects standing for aggregator replicas (no kubelet runs them)."""
    with kube.json_session() as session:
        for name in names:
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": scope.namespace},
                "spec": {"containers": [{"name": "aggregator", "image": "gputopo"}]},
            }
            path = f"/api/v1/namespaces/{scope.namespace}/pods"
            assert session.request("POST", path, body=body).ok


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout_s: float, what: str) -> float:
    """Poll until `check` holds; returns the seconds it took."""
    began = time.monotonic()
    while not await check():
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - began


def install_crds(scope: KubeScope, *files: str) -> None:
    """Install CRDs from tests/data/crds (labelled for the scope's cleanup) and wait for them."""
    with scope.kube.json_session() as session:
        paths = []
        for name in files:
            crd = yaml.safe_load((CRDS / name).read_text(encoding="utf-8"))
            crd["metadata"].setdefault("labels", {}).update(scope.labels)
            deadline = time.monotonic() + 60
            while True:
                response = session.request(
                    "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd
                )
                # 409: the previous test's copy is still being deleted (its objects first).
                if response.status != 409 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert response.ok, response.body
            spec = crd["spec"]
            paths.append(
                f"/apis/{spec['group']}/{spec['versions'][0]['name']}/{spec['names']['plural']}"
            )
        deadline = time.monotonic() + 30
        for path in paths:
            while session.request("GET", path).status != 200:
                assert time.monotonic() < deadline, f"CRD behind {path} never became served"
                time.sleep(0.1)


_RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


def install_rbac(
    scope: KubeScope, kube: KubeApiServer, docs: Iterable[Mapping[str, Any]], name: str
) -> str:
    """A component's ServiceAccount and RBAC objects from its manifests, into the scope's
    namespace (cluster-wide ones renamed for the scope's cleanup); returns the account's user."""
    namespace = scope.namespace
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    paths = {
        "ServiceAccount": f"/api/v1/namespaces/{namespace}/serviceaccounts",
        "Role": f"{rbac}/namespaces/{namespace}/roles",
        "RoleBinding": f"{rbac}/namespaces/{namespace}/rolebindings",
        "ClusterRole": f"{rbac}/clusterroles",
        "ClusterRoleBinding": f"{rbac}/clusterrolebindings",
    }
    with kube.json_session() as session:
        for original in docs:
            kind = original["kind"]
            if kind not in _RBAC_KINDS:
                continue
            doc: dict[str, Any] = {**original, "metadata": {**original["metadata"]}}
            if kind.startswith("Cluster"):
                doc["metadata"]["name"] = scope.name(name)
                if kind == "ClusterRoleBinding":
                    doc["roleRef"] = {**doc["roleRef"], "name": scope.name(name)}
            doc["subjects"] = [
                {**subject, "namespace": namespace} for subject in doc.get("subjects", [])
            ]
            if not doc["subjects"]:
                del doc["subjects"]
            response = session.request("POST", paths[kind], body=doc)
            assert response.ok, (kind, response.body)
    return f"system:serviceaccount:{namespace}:{name}"
