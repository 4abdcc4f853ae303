"""Placement messages (placement.proto): requests in, results out, and back for clients."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gputopo.codec._base import CodecError, wire_enum
from gputopo.placement.result import (
    EdgePrediction,
    GroupPrediction,
    PlacementResult,
    PodPlacement,
    Prediction,
    Rejection,
    RejectionCode,
)
from gputopo.request import (
    DEFAULT_MESSAGE_BYTES,
    DEFAULT_PATTERN,
    Constraint,
    Edge,
    Group,
    Pairing,
    Pattern,
    PlacementRequest,
    Scope,
    Spread,
    pairing_from_text,
    pattern_from_text,
    scope_from_text,
)
from gputopo.v1 import placement_pb2 as ppb

__all__ = [
    "request_from_proto",
    "request_json_with_wire_names",
    "request_to_proto",
    "result_from_proto",
    "result_to_proto",
]

_PATTERN_TO = {
    Pattern.NONE: ppb.PATTERN_NONE,
    Pattern.ALL_REDUCE: ppb.PATTERN_ALL_REDUCE,
    Pattern.ALL_TO_ALL: ppb.PATTERN_ALL_TO_ALL,
    Pattern.PIPELINE: ppb.PATTERN_PIPELINE,
}
# protobuf's zero value is what a client that never set the field sends (and what the JSON
# mirror parses an absent `pattern` into): it means the default, as an absent `pattern` does in
# YAML. PATTERN_NONE is how a request says "no communication".
_PATTERN_FROM = {v: k for k, v in _PATTERN_TO.items()} | {ppb.PATTERN_UNSPECIFIED: DEFAULT_PATTERN}
# Fields the YAML form defaults to 1 when absent; protobuf's JSON parser would read them as 0,
# which `validate` refuses, so an absent one in a JSON body gets the YAML form's default.
# By the .proto name and protobuf's JSON name (either may be used in a body).
_COUNTS = {"replicas": "replicas", "pods": "pods", "gpus_per_pod": "gpusPerPod"}


def _scope_from(value: int, path: str) -> Scope | None:
    return None if value == ppb.SCOPE_UNSPECIFIED else wire_enum(Scope, value, path)


def _scope_to(scope: Scope | None) -> ppb.Scope.ValueType:
    return ppb.Scope.ValueType(int(scope) if scope else 0)


def _constraint_to(c: Constraint) -> ppb.Constraint:
    return ppb.Constraint(
        required=_scope_to(c.required),
        preferred=_scope_to(c.preferred),
    )


def _constraint_from(msg: ppb.Constraint, path: str) -> Constraint:
    return Constraint(
        _scope_from(msg.required, f"{path}.required"),
        _scope_from(msg.preferred, f"{path}.preferred"),
    )


def request_json_with_wire_names(data: Any, path: str = "request") -> Any:
    """A `PlacementRequest` in protobuf's JSON mapping, its enum values as protobuf names.

    Why: the HTTP mirror parses bodies with protobuf's JSON parser, which knows only
    `SCOPE_NVLINK` and `PATTERN_ALL_REDUCE` and answers anything else with its own parser text.
    Users write the YAML form's spellings (`nvlink`, `all_reduce`, `tier-0`, edges `from`/`to`),
    so those are translated here with the YAML form's own parsers: one vocabulary, and an unknown
    spelling is a `RequestError` naming the field and the valid values. A protobuf name or number
    passes unchanged; a shape that is not a request's is left for the protobuf parser to refuse.
    A group's absent `replicas`, `pods` and `gpus_per_pod` are 1, as in YAML; an absent
    `pattern` is all-reduce through `request_from_proto`: one meaning of a request.
    """
    if not isinstance(data, Mapping):
        return data
    out = dict(data)
    _wire_constraint(out, "scope", path)
    groups = out.get("groups")
    if isinstance(groups, list):
        out["groups"] = [_wire_group(g, f"{path}.groups[{i}]") for i, g in enumerate(groups)]
    edges = out.get("edges")
    if isinstance(edges, list):
        out["edges"] = [_wire_edge(e, f"{path}.edges[{i}]") for i, e in enumerate(edges)]
    return out


def _is_spelled(value: Any, enum_type: Any) -> bool:
    """Whether protobuf's JSON parser takes `value` as it is (a name of the enum, or a number)."""
    if not isinstance(value, str):
        return True
    try:
        enum_type.Value(value)
    except ValueError:
        return False
    return True


def _wire_scope(holder: dict[str, Any], key: str, path: str) -> None:
    value = holder.get(key)
    if value is not None and not _is_spelled(value, ppb.Scope):
        holder[key] = ppb.Scope.Name(_scope_to(scope_from_text(f"{path}.{key}", value)))


def _wire_constraint(holder: dict[str, Any], key: str, path: str) -> None:
    constraint = holder.get(key)
    if isinstance(constraint, Mapping):
        holder[key] = dict(constraint)
        for end in ("required", "preferred"):
            _wire_scope(holder[key], end, f"{path}.{key}")


def _wire_group(data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        return data
    group = dict(data)
    for count, json_name in _COUNTS.items():
        if count not in group and json_name not in group:
            group[count] = 1
    _wire_constraint(group, "scope", path)
    if isinstance(group.get("spread"), Mapping):
        group["spread"] = dict(group["spread"])
        _wire_scope(group["spread"], "across", f"{path}.spread")
    pattern = group.get("pattern")
    if pattern is not None and not _is_spelled(pattern, ppb.Pattern):
        wire = _PATTERN_TO[pattern_from_text(f"{path}.pattern", pattern)]
        group["pattern"] = ppb.Pattern.Name(wire)
    return group


def _wire_edge(data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        return data
    edge = dict(data)
    for yaml_key, wire_key in _EDGE_KEYS.items():
        if yaml_key in edge and wire_key not in edge:
            edge[wire_key] = edge.pop(yaml_key)
    pairing = edge.get("pairing")
    if pairing is not None and not _is_spelled(pairing, ppb.Pairing):
        one_to_one = pairing_from_text(f"{path}.pairing", pairing) is Pairing.ONE_TO_ONE
        edge["pairing"] = "PAIRING_ONE_TO_ONE" if one_to_one else "PAIRING_ALL"
    return edge


# The YAML form's names for an edge's ends, and the message's.
_EDGE_KEYS = {"from": "source", "to": "target"}


def request_to_proto(r: PlacementRequest) -> ppb.PlacementRequest:
    """A placement request as a message."""
    groups = []
    for g in r.groups:
        gm = ppb.Group(
            name=g.name,
            replicas=g.replicas,
            pods=g.pods,
            gpus_per_pod=g.gpus_per_pod,
            pattern=_PATTERN_TO[g.pattern],
            message_bytes=g.message_bytes,
            scope=_constraint_to(g.scope),
            node_selector=dict(g.node_selector),
        )
        if g.allowed_nodes is not None:
            gm.allowed_nodes.CopyFrom(ppb.NodeSet(names=sorted(g.allowed_nodes)))
        if g.spread is not None:
            gm.spread.CopyFrom(
                ppb.Spread(across=_scope_to(g.spread.across), required=g.spread.required)
            )
        groups.append(gm)
    edges = [
        ppb.Edge(
            source=e.source,
            target=e.target,
            min_gbps=e.min_gbps,
            max_transfer_seconds=e.max_transfer_seconds,
            transfer_bytes=e.transfer_bytes,
            pairing=ppb.PAIRING_ONE_TO_ONE if e.pairing is Pairing.ONE_TO_ONE else ppb.PAIRING_ALL,
        )
        for e in r.edges
    ]
    return ppb.PlacementRequest(
        job=r.job,
        namespace=r.namespace,
        groups=groups,
        edges=edges,
        scope=_constraint_to(r.scope),
        node_selector=dict(r.node_selector),
        priority=r.priority,
        policy=r.policy,
    )


def request_from_proto(msg: ppb.PlacementRequest, path: str = "request") -> PlacementRequest:
    """A request message as a domain request (not yet validated: call `validate`)."""
    groups = []
    for i, gm in enumerate(msg.groups):
        gpath = f"{path}.groups[{i}]"
        spread = None
        if gm.HasField("spread"):
            across = _scope_from(gm.spread.across, f"{gpath}.spread.across")
            if across is None:
                raise CodecError(f"{gpath}.spread.across", "is required when spread is set")
            spread = Spread(across, gm.spread.required)
        try:
            pattern = _PATTERN_FROM[gm.pattern]
        except KeyError:
            raise CodecError(f"{gpath}.pattern", f"unknown pattern {gm.pattern}") from None
        groups.append(
            Group(
                name=gm.name,
                replicas=gm.replicas or 1,
                pods=gm.pods,
                gpus_per_pod=gm.gpus_per_pod,
                pattern=pattern,
                message_bytes=gm.message_bytes or DEFAULT_MESSAGE_BYTES,
                scope=_constraint_from(gm.scope, f"{gpath}.scope"),
                spread=spread,
                node_selector=dict(gm.node_selector),
                allowed_nodes=(
                    frozenset(gm.allowed_nodes.names) if gm.HasField("allowed_nodes") else None
                ),
            )
        )
    edges = [
        Edge(
            source=em.source,
            target=em.target,
            min_gbps=em.min_gbps,
            max_transfer_seconds=em.max_transfer_seconds,
            transfer_bytes=em.transfer_bytes,
            pairing=Pairing.ONE_TO_ONE if em.pairing == ppb.PAIRING_ONE_TO_ONE else Pairing.ALL,
        )
        for em in msg.edges
    ]
    return PlacementRequest(
        groups=tuple(groups),
        edges=tuple(edges),
        job=msg.job,
        namespace=msg.namespace,
        scope=_constraint_from(msg.scope, f"{path}.scope"),
        node_selector=dict(msg.node_selector),
        priority=msg.priority,
        policy=msg.policy,
    )


def _finite(x: float) -> float:
    """Protobuf doubles carry inf, but JSON mirrors do not: cap unbounded figures at 0."""
    return x if math.isfinite(x) else 0.0


def result_to_proto(
    result: PlacementResult,
    *,
    uuids: Mapping[str, tuple[str, ...]] | None = None,
    nics: Mapping[tuple[str, int], str] | None = None,
) -> ppb.PlaceResponse:
    """A placement result as a response (reservation fields are the service's to fill).

    Each pod's UUIDs and NICs are its own (`PodPlacement.uuids`, `.nics`, filled by the
    placement core), else looked up in `uuids` (node -> UUID by index) and `nics`."""
    msg = ppb.PlaceResponse(placed=result.placed, reason=result.reason, policy=result.policy)
    for p in result.pods:
        node_uuids = (uuids or {}).get(p.node, ())
        msg.assignments.append(
            ppb.PodAssignment(
                group=p.group,
                replica=p.replica,
                pod=p.pod,
                rank=p.rank,
                node=p.node,
                gpus=list(p.gpus),
                gpu_uuids=list(p.uuids) or [node_uuids[g] for g in p.gpus if g < len(node_uuids)],
                nics=sorted(
                    set(p.nics or [(nics or {}).get((p.node, g), "") for g in p.gpus]) - {""}
                ),
            )
        )
    if result.prediction is not None:
        pred = result.prediction
        msg.predicted.CopyFrom(
            ppb.Prediction(
                groups=[
                    ppb.GroupPrediction(
                        group=g.group,
                        bus_gbps=_finite(g.bus_gbps),
                        collective_seconds=_finite(g.collective_seconds),
                        bottleneck=g.bottleneck,
                        span=_scope_to(g.span),
                        message_bytes=g.message_bytes,
                    )
                    for g in pred.groups
                ],
                edges=[
                    ppb.EdgePrediction(
                        source=e.source,
                        target=e.target,
                        gbps=_finite(e.gbps),
                        transfer_seconds=_finite(e.transfer_seconds),
                        satisfied=e.satisfied,
                    )
                    for e in pred.edges
                ],
                communication_seconds=_finite(pred.communication_seconds),
                bottleneck_gbps=_finite(pred.bottleneck_gbps),
            )
        )
    msg.rejections.extend(
        ppb.Rejection(domain=r.domain, code=r.code, message=r.message) for r in result.rejections
    )
    return msg


def result_from_proto(msg: ppb.PlaceResponse) -> PlacementResult:
    """A response as a placement result (for clients and tests)."""
    pods = tuple(
        PodPlacement(a.group, a.replica, a.pod, a.rank, a.node, tuple(a.gpus))
        for a in msg.assignments
    )
    prediction = None
    if msg.HasField("predicted"):
        p = msg.predicted
        prediction = Prediction(
            groups=tuple(
                GroupPrediction(
                    g.group,
                    g.bus_gbps,
                    g.collective_seconds,
                    g.bottleneck,
                    Scope(g.span) if g.span else Scope.CLUSTER,
                    g.message_bytes,
                )
                for g in p.groups
            ),
            edges=tuple(
                EdgePrediction(e.source, e.target, e.gbps, e.transfer_seconds, e.satisfied)
                for e in p.edges
            ),
            communication_seconds=p.communication_seconds,
            bottleneck_gbps=p.bottleneck_gbps,
        )
    return PlacementResult(
        placed=msg.placed,
        policy=msg.policy,
        pods=pods,
        prediction=prediction,
        reason=msg.reason,
        rejections=tuple(
            Rejection(r.domain, RejectionCode(r.code), r.message) for r in msg.rejections
        ),
    )
