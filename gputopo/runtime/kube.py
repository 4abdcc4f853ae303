"""The aggregator's one door to the Kubernetes API: the only module that imports `kubernetes`.

The official client does the hard parts (kubeconfig and in-cluster configuration, TLS, token
files, proxies); requests go out as plain JSON through its `ApiClient`, because its generated
models re-serialise what we send (a Lease `renewTime` with zero microseconds comes out in a
form the API server rejects, for one). Blocking calls run in this adapter's own small thread
pool, watches in a thread each, so the asyncio loop never blocks and a slow API server cannot
starve the loop's default executor.

Errors come back as `KubeError` subclasses that say what to do: `ConflictError` (re-read and
retry), `ThrottledError` (wait `retry_after_s`), `NotFoundError`, `GoneError` (a watch's
resource version expired: list again), anything else as `KubeError` with the server's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import quote, urlencode

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gputopo.runtime.kube_errors import (
    ConflictError,
    GoneError,
    KubeError,
    NotFoundError,
    ThrottledError,
)

__all__ = [
    "APPLY_PATCH",
    "FIELD_MANAGER",
    "ConflictError",
    "GoneError",
    "KubeClient",
    "KubeError",
    "LeaseRecord",
    "NodeObject",
    "NotFoundError",
    "ThrottledError",
]

log = logging.getLogger(__name__)

_TIMEOUT = (5.0, 30.0)  # connect, read (seconds)
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply (JSON is valid YAML)
# The field manager gputopo's server-side applies are recorded under (Node labels).
FIELD_MANAGER = "gputopo"
_WRITES = frozenset({"POST", "PUT", "PATCH"})


# Pods a scheduler has bound to a node (the only ones that hold a node's devices).
_BOUND = "spec.nodeName!="


@dataclass(frozen=True, slots=True)
class NodeObject:
    """The parts of a Node the aggregator reads."""

    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    resource_version: str = ""
    # label key -> the field managers that own it (metadata.managedFields), and the same for
    # annotations: who set what, as the API server records it for server-side apply.
    label_managers: Mapping[str, frozenset[str]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    annotation_managers: Mapping[str, frozenset[str]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> NodeObject:
        """From the API's JSON."""
        meta = obj.get("metadata") or {}
        return cls(
            name=meta.get("name", ""),
            labels=MappingProxyType(dict(meta.get("labels") or {})),
            annotations=MappingProxyType(dict(meta.get("annotations") or {})),
            resource_version=str(meta.get("resourceVersion", "")),
            label_managers=_managers(meta.get("managedFields"), "f:labels"),
            annotation_managers=_managers(meta.get("managedFields"), "f:annotations"),
        )

    def labels_of(self, manager: str) -> frozenset[str]:
        """The label keys `manager` owns."""
        return frozenset(k for k, who in self.label_managers.items() if manager in who)

    def annotations_of(self, manager: str) -> frozenset[str]:
        """The annotation keys `manager` owns."""
        return frozenset(k for k, who in self.annotation_managers.items() if manager in who)


def _managers(entries: Any, section: str) -> Mapping[str, frozenset[str]]:
    """key -> managers, from `metadata.managedFields` (fieldsV1: {"f:metadata": {"f:labels":
    {"f:KEY": {}}}}; see the ManagedFieldsEntry type in apimachinery's meta/v1 types.go)."""
    out: dict[str, set[str]] = {}
    for entry in entries or ():
        if not isinstance(entry, Mapping) or entry.get("fieldsType", "FieldsV1") != "FieldsV1":
            continue
        fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get(section) or {}
        for key in fields:
            if key.startswith("f:"):
                out.setdefault(key[2:], set()).add(_manager_of(entry))
    return MappingProxyType({k: frozenset(v) for k, v in out.items()})


def _manager_of(entry: Mapping[str, Any]) -> str:
    """The owner an entry names, as server-side apply tells owners apart: by manager AND
    operation. Every write gputopo makes carries the manager `gputopo`, but only its applies
    (operation `Apply`) are the set an apply may change or drop; a key gputopo wrote with a plain
    create or patch (operation `Update`, the demo creating its Nodes) belongs to a separate
    owner, `gputopo (Update)`, that an apply leaves alone, exactly as the API server does."""
    manager = str(entry.get("manager", ""))
    if manager == FIELD_MANAGER and entry.get("operation", "Apply") != "Apply":
        return f"{manager} (Update)"
    return manager


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A `coordination.k8s.io/v1` Lease's spec, times as RFC 3339 strings."""

    holder: str = ""
    duration_s: int = 0
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0
    resource_version: str = ""

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LeaseRecord:
        """From the API's JSON."""
        spec = obj.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime") or "",
            renew_time=spec.get("renewTime") or "",
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((obj.get("metadata") or {}).get("resourceVersion", "")),
        )

    def spec(self) -> dict[str, Any]:
        """The Lease spec as JSON."""
        spec: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return spec


def _error(status: int, body: bytes, headers: Mapping[str, str] | None) -> KubeError:
    try:
        message = str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        message = body[:300].decode("utf-8", "replace")
    retry_after = 0.0
    if headers:
        with contextlib.suppress(TypeError, ValueError):
            retry_after = float(headers.get("Retry-After") or 0)
    cls: type[KubeError] = {
        409: ConflictError,
        404: NotFoundError,
        410: GoneError,
        429: ThrottledError,
    }.get(status, KubeError)
    if status == 503 and retry_after:
        cls = ThrottledError
    return cls(status, message or f"HTTP {status}", retry_after_s=retry_after)


class KubeClient:
    """JSON requests to one API server, off the event loop (see the module docstring)."""

    def __init__(self, api: k8s.ApiClient, *, workers: int = 4) -> None:
        self._api = api
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, *, context: str | None = None, workers: int = 4
    ) -> KubeClient:
        """From a kubeconfig file (default: $KUBECONFIG or ~/.kube/config); `workers` calls at
        once at most.

        Raises KubeError saying which file could not be used and why.
        """
        try:
            api = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context
            )
        except Exception as err:  # the client raises several unrelated types here
            where = path or "$KUBECONFIG or ~/.kube/config"
            raise KubeError(0, f"cannot use kubeconfig {where}: {err}") from None
        return cls(api, workers=workers)

    @classmethod
    def in_cluster(cls, *, workers: int = 4) -> KubeClient:
        """From the pod's service account; `workers` calls at once at most."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except Exception as err:  # not in a pod, or no service account mounted
            raise KubeError(0, f"no in-cluster configuration (not in a pod?): {err}") from None
        configuration.connection_pool_maxsize = max(workers, 4)
        return cls(k8s.ApiClient(configuration), workers=workers)

    def close(self) -> None:
        """Release connections and threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._api.close()  # type: ignore[no-untyped-call]

    # --- raw requests ------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        stream: bool = False,
    ) -> Any:
        if method in _WRITES and "fieldManager" not in (query or {}):
            # Every write under one name, so `managedFields` says gputopo (not the client
            # library's default, `OpenAPI-Generator`) and server-side apply can tell our fields.
            query = {**(query or {}), "fieldManager": FIELD_MANAGER}
        url_path = path + (f"?{urlencode(query)}" if query else "")
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self._api.param_serialize(
            method=method,
            resource_path=url_path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._api.call_api(*request, _request_timeout=None if stream else _TIMEOUT)
        except k8s.ApiException as err:
            raise _error(err.status or 0, (err.body or "").encode(), err.headers) from None
        except Exception as err:  # urllib3 connection errors and the like
            raise KubeError(0, f"{method} {path}: {err}") from None
        status: int = response.status
        if stream and 200 <= status < 300:
            return response.response
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= status < 300:
            raise _error(status, data, response.getheaders())  # type: ignore[no-untyped-call]
        return json.loads(data) if data else {}

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One API call, in the adapter's thread pool; returns the decoded JSON body."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool,
            lambda: self._call(method, path, query=query, body=body, content_type=content_type),
        )

    # --- nodes -------------------------------------------------------------------------------

    async def list_nodes(self) -> tuple[list[NodeObject], str]:
        """Every Node, and the list's resource version (to watch from)."""
        items, version = await self.list_all("/api/v1/nodes")
        return [NodeObject.from_json(obj) for obj in items], version

    async def list_all(
        self, path: str, *, query: Mapping[str, str] | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of a collection, 500 a page, and the list's resource version."""
        base = dict(query or {})
        page_query = base | {"limit": "500"}
        items: list[dict[str, Any]] = []
        while True:
            page = await self.request("GET", path, query=page_query)
            items += list(page.get("items") or [])
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion", ""))
            page_query = base | {"limit": "500", "continue": meta["continue"]}

    # --- pods --------------------------------------------------------------------------------

    async def list_bound_pods(self) -> tuple[list[dict[str, Any]], str]:
        """Every pod bound to a node, in every namespace, as the API's JSON."""
        return await self.list_all("/api/v1/pods", query={"fieldSelector": _BOUND})

    async def watch_bound_pods(
        self, resource_version: str, *, timeout_s: int = 60
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, pod JSON) for pods bound to a node; a pod that gets bound arrives as
        ADDED (it starts to match the field selector). As `watch_nodes` otherwise."""
        async for kind, obj in self.watch_json(
            "/api/v1/pods", resource_version, timeout_s=timeout_s, query={"fieldSelector": _BOUND}
        ):
            yield kind, obj

    async def get_node(self, name: str) -> NodeObject:
        """One Node."""
        return NodeObject.from_json(await self.request("GET", f"/api/v1/nodes/{quote(name)}"))

    async def create_node(self, name: str, *, labels: Mapping[str, str]) -> NodeObject:
        """Create a Node object (the demo's simulated nodes)."""
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        return NodeObject.from_json(await self.request("POST", "/api/v1/nodes", body=body))

    async def delete_node(self, name: str) -> None:
        """Delete a Node object (already gone is fine)."""
        with contextlib.suppress(NotFoundError):
            await self.request("DELETE", f"/api/v1/nodes/{quote(name)}")

    async def apply_node_metadata(
        self,
        name: str,
        *,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        resource_version: str,
        manager: str = FIELD_MANAGER,
    ) -> NodeObject:
        """Server-side apply of the labels and annotations `manager` owns, never forced.

        What is given is the whole of what `manager` claims: a key it owned and leaves out is
        removed (unless another manager owns it too). A key another manager owns with a
        different value is a conflict, 409 `ConflictError`, and nothing is written; so is a
        Node changed since `resource_version` was read.
        """
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "resourceVersion": resource_version,
                "labels": dict(labels),
                "annotations": dict(annotations),
            },
        }
        result = await self.request(
            "PATCH",
            f"/api/v1/nodes/{quote(name)}",
            query={"fieldManager": manager},
            body=body,
            content_type=APPLY_PATCH,
        )
        return NodeObject.from_json(result)

    async def watch_nodes(
        self, resource_version: str, *, timeout_s: int = 60
    ) -> AsyncIterator[tuple[str, NodeObject]]:
        """(event type, node) from a watch starting after `resource_version`.

        Ends when the server closes the watch (after about `timeout_s`); raises `GoneError` when the
        version is too old. Cancelling the consumer closes the connection.
        """
        async for kind, obj in self.watch_json(
            "/api/v1/nodes", resource_version, timeout_s=timeout_s
        ):
            yield kind, NodeObject.from_json(obj)

    async def watch_json(
        self,
        path: str,
        resource_version: str,
        *,
        timeout_s: int = 60,
        query: Mapping[str, str] | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, object JSON) of a watch on a collection after `resource_version`."""
        watch_query = dict(query or {}) | {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s),
            "allowWatchBookmarks": "true",
        }
        async for event in self._watch(path, watch_query):
            kind = event.get("type", "")
            obj = event.get("object") or {}
            if kind == "ERROR":
                raise _error(int(obj.get("code") or 500), json.dumps(obj).encode(), None)
            yield kind, obj

    async def _watch(self, path: str, query: Mapping[str, str]) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
        holder: dict[str, Any] = {}
        stop = threading.Event()

        def pump() -> None:
            try:
                response = self._call("GET", path, query=query, stream=True)
                holder["response"] = response
                buffer = b""
                for chunk in response.stream(4096, decode_content=True):
                    if stop.is_set():
                        break
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            loop.call_soon_threadsafe(queue.put_nowait, json.loads(line))
                loop.call_soon_threadsafe(queue.put_nowait, None)
            except BaseException as err:  # handed to the consumer
                if not stop.is_set():
                    with contextlib.suppress(RuntimeError):  # the loop may be closed
                        loop.call_soon_threadsafe(queue.put_nowait, err)

        thread = threading.Thread(target=pump, name="kube-watch", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    if isinstance(item, KubeError):
                        raise item
                    raise KubeError(0, f"watch {path}: {item}") from item
                yield item
        finally:
            stop.set()
            response = holder.get("response")
            if response is not None:
                with contextlib.suppress(Exception):
                    response.shutdown()
                with contextlib.suppress(Exception):
                    response.release_conn()

    # --- leases ------------------------------------------------------------------------------

    @staticmethod
    def _lease_path(namespace: str, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
        return f"{base}/{quote(name)}" if name else base

    async def get_lease(self, namespace: str, name: str) -> LeaseRecord | None:
        """A Lease, or None when there is none."""
        try:
            return LeaseRecord.from_json(
                await self.request("GET", self._lease_path(namespace, name))
            )
        except NotFoundError:
            return None

    async def create_lease(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """Create a Lease (`ConflictError` when someone else just did)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": record.spec(),
        }
        return LeaseRecord.from_json(
            await self.request("POST", self._lease_path(namespace), body=body)
        )

    async def replace_lease(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """Replace a Lease at `record.resource_version` (`ConflictError` when it moved on)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": record.resource_version,
            },
            "spec": record.spec(),
        }
        return LeaseRecord.from_json(
            await self.request("PUT", self._lease_path(namespace, name), body=body)
        )

    # --- pods (the leader marks its own pod so the Service routes to it) ---------------------

    async def set_pod_label(self, namespace: str, name: str, key: str, value: str | None) -> None:
        """Set (or with None remove) one label of a Pod."""
        await self.request(
            "PATCH",
            self._pod_path(namespace, name),
            body={"metadata": {"labels": {key: value}}},
            content_type=MERGE_PATCH,
        )

    async def pods_with_label(self, namespace: str, selector: str) -> list[str]:
        """Names of the Pods in a namespace matching a label selector."""
        page = await self.request(
            "GET",
            f"/api/v1/namespaces/{quote(namespace)}/pods",
            query={"labelSelector": selector},
        )
        return [obj["metadata"]["name"] for obj in page.get("items") or []]

    # --- pods (the gang binder records, binds, explains and undoes) ---------------------------

    @staticmethod
    def _pod_path(namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"

    async def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """A TokenReview's status (authentication.k8s.io/v1): `authenticated`, `user`
        (`username`, `extra`), `audiences`, `error`."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
        result = await self.request(
            "POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body
        )
        status: dict[str, Any] = result.get("status") or {}
        return status

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """A Pod's JSON (NotFoundError when it is gone)."""
        result: dict[str, Any] = await self.request("GET", self._pod_path(namespace, name))
        return result

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> dict[str, Any]:
        """A merge patch of a Pod's annotations (None removes a key); returns the Pod."""
        result: dict[str, Any] = await self.request(
            "PATCH",
            self._pod_path(namespace, name),
            body={"metadata": {"annotations": dict(annotations)}},
            content_type=MERGE_PATCH,
        )
        return result

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        uid: str = "",
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Bind a Pod to a node through the Binding subresource (409 when already bound).

        With `uid` the bind applies only to that incarnation of the pod, so a pod deleted and
        recreated under the same name is never bound by a stale decision. `annotations` are
        set on the pod by the same write (the API server copies a Binding's annotations onto
        the pod it binds), so a pod is never bound without them."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", self._pod_path(namespace, name) + "/binding", body=body)

    async def delete_pod(
        self, namespace: str, name: str, *, uid: str = "", grace_s: int | None = None
    ) -> None:
        """Delete a Pod (already gone is fine); with `uid`, only that incarnation."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        with contextlib.suppress(NotFoundError, ConflictError):
            await self.request("DELETE", self._pod_path(namespace, name), body=body)

    async def set_pod_condition(
        self, namespace: str, name: str, condition: Mapping[str, str]
    ) -> None:
        """Set one condition of a Pod's status (a strategic merge keyed by `type`)."""
        await self.request(
            "PATCH",
            self._pod_path(namespace, name) + "/status",
            body={"status": {"conditions": [dict(condition)]}},
            content_type=STRATEGIC_MERGE_PATCH,
        )

    async def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type_: str = "Normal",
        component: str = "gputopo-scheduler",
        now: str = "",
    ) -> None:
        """A core/v1 Event about an object (`involved`: its JSON), as kubectl describe shows."""
        meta = involved.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", "v1"),
                "kind": involved.get("kind", "Pod"),
                "name": meta.get("name", ""),
                "namespace": namespace,
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": component},
            "count": 1,
        }
        if now:
            body["firstTimestamp"] = body["lastTimestamp"] = now
        await self.request("POST", f"/api/v1/namespaces/{quote(namespace)}/events", body=body)

    # --- what this client may do ---------------------------------------------------------------

    async def can_i(
        self,
        verb: str,
        resource: str,
        *,
        group: str = "",
        namespace: str = "",
        subresource: str = "",
        name: str = "",
    ) -> bool:
        """Whether the API server's authorizer allows this client `verb` on `resource`
        (a SelfSubjectAccessReview, which every authenticated user may create)."""
        attributes = {"verb": verb, "resource": resource, "group": group}
        for key, value in (("namespace", namespace), ("subresource", subresource), ("name", name)):
            if value:
                attributes[key] = value
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        answer = await self.request(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=body
        )
        return bool((answer.get("status") or {}).get("allowed"))

    # --- custom resources (cluster-scoped scheduler objects) ----------------------------------

    @staticmethod
    def _cr_path(group_version: str, plural: str, name: str = "") -> str:
        base = f"/apis/{group_version}/{plural}"
        return f"{base}/{quote(name)}" if name else base

    async def list_objects(
        self, group_version: str, plural: str, *, selector: str = ""
    ) -> list[dict[str, Any]]:
        """Cluster-scoped objects of one kind (NotFoundError when the CRD is not installed)."""
        query = {"labelSelector": selector} if selector else None
        page = await self.request("GET", self._cr_path(group_version, plural), query=query)
        return list(page.get("items") or [])

    async def create_object(
        self, group_version: str, plural: str, body: Mapping[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Create a cluster-scoped object (server-side dry run when asked)."""
        result: dict[str, Any] = await self.request(
            "POST",
            self._cr_path(group_version, plural),
            query={"dryRun": "All"} if dry_run else None,
            body=dict(body),
        )
        return result

    async def replace_object(
        self, group_version: str, plural: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Replace a cluster-scoped object (body carries name and resourceVersion)."""
        name = body["metadata"]["name"]
        result: dict[str, Any] = await self.request(
            "PUT", self._cr_path(group_version, plural, name), body=dict(body)
        )
        return result

    async def delete_object(self, group_version: str, plural: str, name: str) -> None:
        """Delete a cluster-scoped object (already gone is fine)."""
        with contextlib.suppress(NotFoundError):
            await self.request("DELETE", self._cr_path(group_version, plural, name))
