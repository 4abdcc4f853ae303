"""Per-test isolation on a test API server shared by a whole session.

Why: one server per session keeps the `kube` tests fast (a server takes seconds to start), but
tests then share a cluster. Node objects are cluster-scoped, and a scheduler under test that
watches pods cluster-wide would see another test's pods. A `KubeScope` gives each test a unique
name prefix and its own namespace, and deletes what the test left behind.

Contract, at `cleanup()` the scope deletes, across every resource type the server serves
(custom resources included):
1. every object in the scope's namespace, and in any other namespace the test created whose name
   starts with the prefix or that carries the scope label;
2. any other object, cluster-scoped or not, whose name starts with `prefix` (Nodes, Leases in
   `kube-node-lease`, ClusterRoles, ...) or that is labelled `SCOPE_LABEL: <scope id>`
   (use `scope.labels` for objects, such as CRDs, whose names cannot carry the prefix);
3. then those namespaces themselves, finalizing them: no namespace controller runs, so without
   that they would stay Terminating forever.
Pods are deleted with grace period 0 (no kubelet will confirm a graceful stop). Whatever could
not be deleted is reported in one `KubeCleanupError`, so a leak fails the test that caused it.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from .kube import KubeApiServer, KubeHarnessError
from .kube_http import JsonSession

SCOPE_LABEL = "gputopo.test/scope"
# DNS-1123 label limit for the namespace (the prefix without its trailing dash).
_MAX_ID = 63
_SLUG_CHARS = 30
_DELETE_NOW = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}


class KubeCleanupError(KubeHarnessError):
    """Objects a test created could not be deleted; the message lists them."""


@dataclass(frozen=True)
class Resource:
    """One listable, deletable resource type, in its group's preferred version."""

    group_version: str
    plural: str
    namespaced: bool

    def path(self, *, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        ns = f"/namespaces/{namespace}" if namespace and self.namespaced else ""
        item = f"/{name}" if name else ""
        return f"{base}{ns}/{self.plural}{item}"


class KubeScope:
    """Names and a namespace of one test's own, and the cleanup of what the test made."""

    def __init__(self, kube: KubeApiServer, *, test_name: str) -> None:
        """Pick the names; nothing is created until `setup()`."""
        self.kube = kube
        self.id = _scope_id(test_name)
        self.prefix = f"{self.id}-"
        self.namespace = self.id
        self.labels: dict[str, str] = {SCOPE_LABEL: self.id}
        self._clients = contextlib.ExitStack()

    def name(self, base: str) -> str:
        """A name unique to this test, e.g. for a Node: `scope.name("gpu-node-0")`."""
        return f"{self.prefix}{base}"

    def api_client(
        self, token: str | None = None, *, impersonate: str | None = None
    ) -> k8s.ApiClient:
        """Like `KubeApiServer.api_client`, closed by `cleanup()`."""
        api = self.kube.api_client(token, impersonate=impersonate)
        self._clients.callback(api.close)
        return api

    def setup(self) -> None:
        """Create the scope's namespace, labelled with the scope id."""
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": self.labels},
        }
        with self.kube.json_session() as session:
            response = session.request("POST", "/api/v1/namespaces", body=body)
        if not response.ok:
            raise KubeHarnessError(
                f"could not create namespace {self.namespace}: {response.status} {response.body}"
            )

    def cleanup(self) -> None:
        """Delete what the test left (see the module docstring); raise if anything stays."""
        self._clients.close()
        with self.kube.json_session() as session:
            errors = _Sweep(session, self).run()
        if errors:
            raise KubeCleanupError(
                f"cleanup of test scope {self.id} left objects behind:\n  " + "\n  ".join(errors)
            )

    def owns(self, metadata: dict[str, Any], namespaces: frozenset[str]) -> bool:
        """Whether an object (by its metadata) is this test's to delete."""
        labels = metadata.get("labels") or {}
        return (
            metadata.get("namespace") in namespaces
            or str(metadata.get("name", "")).startswith(self.prefix)
            or labels.get(SCOPE_LABEL) == self.id
        )


class _Sweep:
    """One cleanup pass: discover resource types, delete owned objects, drop namespaces."""

    def __init__(self, session: JsonSession, scope: KubeScope) -> None:
        self._session = session
        self._scope = scope
        self.errors: list[str] = []

    def run(self) -> list[str]:
        """Custom resources go before their definitions, namespaces last.

        Deleting a CRD makes its group vanish from discovery while the pass is still walking
        it, so 404s on listing are expected and ignored.
        """
        namespaces = self._owned_namespaces()
        resources = sorted(self._resources(), key=_deletion_order)
        for resource in resources:
            if resource.plural != "namespaces":
                self._delete_owned(resource, namespaces)
        for namespace in sorted(namespaces):
            self._drop_namespace(namespace)
        return self.errors

    def _owned_namespaces(self) -> frozenset[str]:
        items = self._list(Resource("v1", "namespaces", namespaced=False))
        owned = {self._scope.namespace}
        owned.update(
            item["metadata"]["name"]
            for item in items
            if self._scope.owns(item["metadata"], frozenset())
        )
        return frozenset(owned)

    def _resources(self) -> Iterator[Resource]:
        """Every resource type with `list` and `delete`, in each group's preferred version."""
        group_versions = ["v1"]
        groups = self._get("/apis")
        if groups is not None:
            group_versions += [g["preferredVersion"]["groupVersion"] for g in groups["groups"]]
        for group_version in group_versions:
            base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
            listing = self._get(base, missing_ok=True)
            for entry in (listing or {}).get("resources", []):
                verbs = set(entry.get("verbs", []))
                if "/" not in entry["name"] and {"list", "delete"} <= verbs:
                    yield Resource(group_version, entry["name"], bool(entry["namespaced"]))

    def _delete_owned(self, resource: Resource, namespaces: frozenset[str]) -> None:
        for item in self._list(resource):
            metadata = item["metadata"]
            if self._scope.owns(metadata, namespaces):
                path = resource.path(namespace=metadata.get("namespace"), name=metadata["name"])
                self._delete(path)

    def _drop_namespace(self, namespace: str) -> None:
        """Delete, then finalize: with no namespace controller it would stay Terminating."""
        path = f"/api/v1/namespaces/{namespace}"
        self._delete(path)
        current = self._get(path, missing_ok=True)
        if current is None:
            return
        current["spec"] = {"finalizers": []}
        response = self._session.request("PUT", f"{path}/finalize", body=current)
        if not response.ok and response.status != 404:
            self.errors.append(f"PUT {path}/finalize: {response.status} {_reason(response.body)}")

    def _list(self, resource: Resource) -> list[dict[str, Any]]:
        listing = self._get(resource.path(), missing_ok=True)
        return list((listing or {}).get("items") or [])

    def _get(self, path: str, *, missing_ok: bool = False) -> dict[str, Any] | None:
        response = self._session.request("GET", path)
        if response.ok and isinstance(response.body, dict):
            return response.body
        if not (missing_ok and response.status == 404):
            self.errors.append(f"GET {path}: {response.status} {_reason(response.body)}")
        return None

    def _delete(self, path: str) -> None:
        response = self._session.request("DELETE", path, body=_DELETE_NOW)
        if not response.ok and response.status != 404:
            self.errors.append(f"DELETE {path}: {response.status} {_reason(response.body)}")


def _deletion_order(resource: Resource) -> int:
    return 1 if resource.plural == "customresourcedefinitions" else 0


def _scope_id(test_name: str) -> str:
    """`<slug of the test name>-<6 hex>`: readable in a leak report, unique per run."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:_SLUG_CHARS].strip("-")
    scope_id = f"{slug or 't'}-{secrets.token_hex(3)}"
    return scope_id[:_MAX_ID]


def _reason(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("message", body))
    return str(body)[:200]
