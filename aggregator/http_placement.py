"""The placement API over HTTP: a JSON mirror of the gRPC service, and kube-scheduler extender
endpoints, so clients without gRPC and an unmodified kube-scheduler can use the engine.

JSON mirror (bodies and answers are the gRPC messages in protobuf's JSON mapping, field names as
in placement.proto; errors are `{"error": ..., "code": "INVALID_ARGUMENT" | "NOT_FOUND"}` with
status 400 or 404):

    POST /api/v1/placement/place    PlaceRequest   -> PlaceResponse
    POST /api/v1/placement/commit   CommitRequest  -> CommitResponse
    POST /api/v1/placement/release  ReleaseRequest -> ReleaseResponse
    POST /api/v1/placement/explain  ExplainRequest -> PlaceResponse

kube-scheduler extender (`extenders` in the KubeSchedulerConfiguration, `urlPrefix:
http://<aggregator>/scheduler`, `filterVerb: filter`, `prioritizeVerb: prioritize`,
`managedResources: [{name: nvidia.com/gpu}]`, `nodeCacheCapable` either way):

    POST /scheduler/filter      ExtenderArgs -> ExtenderFilterResult
    POST /scheduler/prioritize  ExtenderArgs -> HostPriorityList

A pod's GPU count is its effective `nvidia.com/gpu` request as Kubernetes counts it
(`gputopo.pods.pod_gpus`). Annotations steer it:

- `gputopo.io/reservation: <id>`: the pod belongs to a placement reserved through Place; only
  the node(s) that placement chose pass the filter (`gputopo.io/group`, `gputopo.io/replica`
  and `gputopo.io/pod` narrow it to one pod's node);
- `gputopo.io/scope: nvlink`: the pod's GPUs must share one NVLink island;
- `gputopo.io/pattern`, `gputopo.io/message-bytes`: the collective to predict (default
  all-reduce of 256 MiB).

Without a reservation each node is judged on its own (`gputopo.placement.pernode`): fit, the
predicted collective on its best free GPUs, and damage to whole free nodes and domains.

This module only translates: JSON to messages or a `gputopo.pods.PodAsk`, the placement core's
answers back to JSON, its typed refusals to HTTP statuses. What to answer is the core's
(`gputopo.core.PlacementCore`: the verbs, `judge` and `rank`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from aggregator.roles import Roles
from aggregator.service import PlacementService
from gputopo.codec.placement import request_json_with_wire_names
from gputopo.core import PlacementError
from gputopo.pods import pod_ask
from gputopo.request import RequestError
from gputopo.runtime.identity import caller_of_http, groups_of_http
from gputopo.v1 import placement_pb2 as ppb

__all__ = ["GPU_RESOURCE", "add_placement_routes"]

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"

_HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "PERMISSION_DENIED": 403,
    "UNAVAILABLE": 503,
}


def _to_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _error(code: str, message: str) -> web.Response:
    return web.json_response({"error": message, "code": code}, status=_HTTP_STATUS.get(code, 500))


def _peercert(request: web.Request) -> dict[str, Any] | None:
    """The verified client certificate's fields (None over plain text)."""
    transport = request.transport
    return transport.get_extra_info("peercert") if transport else None


def _caller(request: web.Request) -> str:
    """Who the client certificate says the caller is ("" over plain text)."""
    return caller_of_http(_peercert(request))


def _mirror(
    handler: Callable[[Any, str], Awaitable[Message]],
    message_type: type[Message],
    gate: Callable[[Message, str, frozenset[str]], str | None] = lambda _msg, _caller, _g: None,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler that parses `message_type` from JSON, calls `handler` with it and the
    caller's identity, answers JSON.

    A body's `request` (Place, Explain) may use the YAML form's spellings (`nvlink`,
    `all_reduce`, edges `from`/`to`) besides protobuf's names: one vocabulary for requests.
    """

    async def serve(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as err:
            return _error("INVALID_ARGUMENT", f"body: not JSON ({err})")
        if not isinstance(body, dict):
            got = type(body).__name__
            return _error("INVALID_ARGUMENT", f"body: a JSON object expected, not {got}")
        try:
            if "request" in body:
                body = {**body, "request": request_json_with_wire_names(body["request"])}
        except RequestError as err:
            return _error("INVALID_ARGUMENT", str(err))
        try:
            msg = json_format.ParseDict(body, message_type())
        except json_format.ParseError as err:
            return _error("INVALID_ARGUMENT", f"body: {err}")
        peercert = _peercert(request)
        caller, groups = caller_of_http(peercert), groups_of_http(peercert)
        if (why := gate(msg, caller, groups)) is not None:  # the method's role (aggregator.roles)
            return _error("PERMISSION_DENIED", why)
        try:
            return web.json_response(_to_json(await handler(msg, caller)))
        except PlacementError as err:
            return _error(err.code, err.message)

    return serve


# The HTTP reads of the topology (`aggregator.http`) are GetTopology's role on gRPC.
_READS = "/api/v1/"
_READ_METHOD = "/gputopo.v1.Placement/GetTopology"


def _read_gate(roles: Roles) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware: a GET under /api/v1/ (topology, nodes, holders, summary) needs the read role,
    as GetTopology and WatchTopology do over gRPC, so a node agent's certificate that may only
    Report cannot read the cluster over HTTPS either."""

    @web.middleware
    async def gate(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if request.method == "GET" and request.path.startswith(_READS):
            peercert = _peercert(request)
            caller, groups = caller_of_http(peercert), groups_of_http(peercert)
            if (why := roles.denial(_READ_METHOD, caller, groups=groups)) is not None:
                return _error("PERMISSION_DENIED", f"GET {request.path}: {why}")
        return await handler(request)

    return gate


class _Extender:
    """kube-scheduler extender verbs: the placement core judges, this translates."""

    def __init__(self, service: PlacementService, callers: frozenset[str] | None) -> None:
        self._service = service
        self._callers = callers

    def _refused(self, request: web.Request) -> web.Response | None:
        """A 403 unless the caller is one the extender serves: what it filters decides where
        pods run, so only the scheduler's identity may ask (None: any, over plain text)."""
        if self._callers is None:
            return None
        caller = _caller(request)
        if caller in self._callers:
            return None
        log.warning("extender: refused %s", repr(caller) if caller else "a caller without a name")
        allowed = ", ".join(sorted(self._callers)) or "nobody (no --extender-client)"
        return _error(
            "PERMISSION_DENIED",
            f"client certificate: {caller!r} may not call the extender; allowed: {allowed}",
        )

    async def filter(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        args = await _extender_args(request)
        if isinstance(args, web.Response):
            return args
        pod, names, nodes_obj = args
        verdicts = self._service.core.judge(pod_ask(pod), names)
        passed = [n for n in names if verdicts[n] == ""]
        failed = {n: why for n, why in verdicts.items() if why}
        result: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": {}}
        result["Error"] = ""
        if nodes_obj is not None:
            keep = set(passed)
            items = [i for i in nodes_obj.get("items") or [] if _node_name(i) in keep]
            result["Nodes"] = {**nodes_obj, "items": items}
            result["NodeNames"] = None
        else:
            result["Nodes"] = None
            result["NodeNames"] = passed
        return web.json_response(result)

    async def prioritize(self, request: web.Request) -> web.Response:
        if (refused := self._refused(request)) is not None:
            return refused
        args = await _extender_args(request)
        if isinstance(args, web.Response):
            return args
        pod, names, _ = args
        points = self._service.core.rank(pod_ask(pod), names)
        return web.json_response([{"Host": n, "Score": points.get(n, 0)} for n in names])


async def _extender_args(
    request: web.Request,
) -> tuple[Mapping[str, Any], list[str], dict[str, Any] | None] | web.Response:
    try:
        body = await request.json()
    except ValueError as err:
        return web.json_response({"Error": f"body: not JSON ({err})"}, status=400)
    if not isinstance(body, dict) or not isinstance(body.get("Pod"), dict):
        return web.json_response({"Error": "body: ExtenderArgs with a Pod expected"}, status=400)
    if (why := _pod_shape(body["Pod"])) is not None:
        return web.json_response({"Error": why}, status=400)
    nodes_obj = body.get("Nodes")
    if isinstance(body.get("NodeNames"), list):
        if not all(isinstance(n, str) for n in body["NodeNames"]):
            return web.json_response({"Error": "NodeNames: a list of strings expected"}, status=400)
        names = list(body["NodeNames"])
        nodes_obj = None
    elif isinstance(nodes_obj, dict):
        items = nodes_obj.get("items") or []
        if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("metadata") or {}, dict) for i in items
        ):
            why = "Nodes.items: a list of Node objects expected"
            return web.json_response({"Error": why}, status=400)
        names = [_node_name(i) for i in items]
    else:
        return web.json_response({"Error": "body: Nodes or NodeNames expected"}, status=400)
    return body["Pod"], names, nodes_obj


def _pod_shape(pod: Mapping[str, Any]) -> str | None:
    """Why the Pod's parts this extender reads are not the shapes Kubernetes sends, or None.

    Checked up front so a wrong type gets a 400 naming its field rather than tripping later."""
    meta = pod.get("metadata") or {}
    if not isinstance(meta, dict):
        return "Pod.metadata: an object expected"
    if not isinstance(meta.get("annotations") or {}, dict):
        return "Pod.metadata.annotations: an object expected"
    spec = pod.get("spec") or {}
    if not isinstance(spec, dict):
        return "Pod.spec: an object expected"
    for key in ("containers", "initContainers"):
        containers = spec.get(key) or []
        if not isinstance(containers, list):
            return f"Pod.spec.{key}: a list expected"
        for i, c in enumerate(containers):
            if not isinstance(c, dict):
                return f"Pod.spec.{key}[{i}]: an object expected"
            res = c.get("resources") or {}
            if not isinstance(res, dict):
                return f"Pod.spec.{key}[{i}].resources: an object expected"
            for part in ("limits", "requests"):
                if not isinstance(res.get(part) or {}, dict):
                    return f"Pod.spec.{key}[{i}].resources.{part}: an object expected"
    return None


def _node_name(item: Mapping[str, Any]) -> str:
    return str((item.get("metadata") or {}).get("name", ""))


def add_placement_routes(
    app: web.Application,
    service: PlacementService,
    *,
    extender_callers: frozenset[str] | None = None,
    roles: Roles | None = None,
    holder_of: Callable[[str], str | None] = lambda _rid: None,
) -> None:
    """Serve the JSON mirror and the extender verbs from `app` (see the module docstring).

    `extender_callers`: the client certificate names the extender answers (None: anyone, for a
    plain-text server, where no caller has a name).
    """

    async def place(msg: ppb.PlaceRequest, caller: str) -> Message:
        return await service.place(msg, caller=caller)

    async def commit(msg: ppb.CommitRequest, caller: str) -> Message:
        return await service.commit(msg, caller=caller)

    async def release(msg: ppb.ReleaseRequest, caller: str) -> Message:
        return await service.release(msg, caller=caller)

    async def explain(msg: ppb.ExplainRequest, _caller: str) -> Message:
        return await service.explain(msg)

    def gate(method: str) -> Callable[[Message, str, frozenset[str]], str | None]:
        def check(msg: Message, caller: str, groups: frozenset[str]) -> str | None:
            if roles is None:
                return None
            rid = getattr(msg, "reservation_id", "") if method.endswith("/Explain") else ""
            holder = holder_of(rid) if rid else None
            why = roles.denial(method, caller, holder=holder, groups=groups)
            return None if why is None else f"{method}: {why}"

        return check

    base = "/gputopo.v1.Placement/"
    for verb, handler, kind in (
        ("place", place, ppb.PlaceRequest),
        ("commit", commit, ppb.CommitRequest),
        ("release", release, ppb.ReleaseRequest),
        ("explain", explain, ppb.ExplainRequest),
    ):
        route = _mirror(handler, kind, gate(base + verb.capitalize()))
        app.router.add_post(f"/api/v1/placement/{verb}", route)
    if roles is not None:
        app.middlewares.append(_read_gate(roles))
    extender = _Extender(service, extender_callers)
    app.router.add_post("/scheduler/filter", extender.filter)
    app.router.add_post("/scheduler/prioritize", extender.prioritize)
