"""Placement requests: a communication graph of GPU groups, and its validation.

A `Group` is `replicas` independent copies of a gang of `pods` x `gpus_per_pod` GPUs that run a
collective (`pattern`) among the GPUs of one replica: a TP-8 group is one replica of one pod with
8 GPUs; a 4 x 8 training gang is one replica of 4 pods; a prefill pool of two TP4 engines is two
replicas of one 4-GPU pod. An `Edge` asks for bandwidth between the replicas of two groups (the
KV-cache path from prefill to decode). Constraints say which scope must or should hold a replica
(or the whole request).

`request_from_mapping` reads the YAML/JSON form users write; every error names the field path
(`groups[1].gpus_per_pod: must be at least 1`), which the gRPC layer returns as INVALID_ARGUMENT.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

__all__ = [
    "DEFAULT_MESSAGE_BYTES",
    "DEFAULT_PATTERN",
    "MAX_GPUS_PER_REQUEST",
    "Constraint",
    "Edge",
    "Group",
    "Pairing",
    "Pattern",
    "PlacementRequest",
    "RequestError",
    "Scope",
    "Spread",
    "pairing_from_text",
    "pattern_from_text",
    "request_from_mapping",
    "scope_from_text",
    "validate",
]

# The size of one collective when the request gives no hint: large enough that bandwidth, not
# latency, decides, which is the regime tensor and data parallelism run in.
DEFAULT_MESSAGE_BYTES = 256 * 1024 * 1024
# A request larger than this is almost certainly a typo (pods and GPUs swapped, an extra zero).
MAX_GPUS_PER_REQUEST = 1_000_000

_E = TypeVar("_E", bound=enum.Enum)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")


class Scope(enum.IntEnum):
    """A set of GPUs that must or should stay together (see placement.proto)."""

    NVLINK = 1
    NODE = 2
    LEAF = 3
    SPINE = 4
    CORE = 5
    ZONE = 6
    CLUSTER = 7


class Pattern(enum.Enum):
    """The collective the GPUs of one replica run among themselves."""

    NONE = "none"
    ALL_REDUCE = "all_reduce"
    ALL_TO_ALL = "all_to_all"
    PIPELINE = "pipeline"


# What a group runs when its request does not say, in every form of a request (YAML, JSON, gRPC's
# zero value, the page): tensor and data parallel groups all-reduce, and a request that asks for
# GPUs together almost always wants them to talk. "No communication" must be asked for (`none`).
DEFAULT_PATTERN = Pattern.ALL_REDUCE


class Pairing(enum.Enum):
    """Which replicas an edge joins."""

    ALL = "all"
    ONE_TO_ONE = "one_to_one"


@dataclass(frozen=True, slots=True)
class Constraint:
    """A required scope (hard) and a preferred one (soft); either may be absent."""

    required: Scope | None = None
    preferred: Scope | None = None


@dataclass(frozen=True, slots=True)
class Spread:
    """Put the replicas of a group in different domains of `across`."""

    across: Scope
    required: bool = False


@dataclass(frozen=True, slots=True)
class Group:
    """`replicas` copies of a gang of `pods` x `gpus_per_pod` GPUs."""

    name: str
    pods: int = 1
    gpus_per_pod: int = 1
    replicas: int = 1
    pattern: Pattern = DEFAULT_PATTERN
    message_bytes: int = DEFAULT_MESSAGE_BYTES
    scope: Constraint = Constraint()
    spread: Spread | None = None
    node_selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # The only nodes this group's pods may run on (None: any node). A caller that knows more
    # than the aggregator sets it: the gang binder puts here the nodes kube-scheduler's filters
    # would allow (cordons, taints, affinity, CPU/memory, host ports; `gputopo.fitness`).
    allowed_nodes: frozenset[str] | None = None

    @property
    def gpus_per_replica(self) -> int:
        """GPUs in one replica."""
        return self.pods * self.gpus_per_pod

    @property
    def total_gpus(self) -> int:
        """GPUs over all replicas."""
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True, slots=True)
class Edge:
    """A bandwidth need from the replicas of `source` to those of `target`.

    `min_gbps` is GB/s summed over the GPU shards of one pair of replicas. A transfer of
    `transfer_bytes` that must take at most `max_transfer_seconds` is another way to say it.
    """

    source: str
    target: str
    min_gbps: float = 0.0
    max_transfer_seconds: float = 0.0
    transfer_bytes: int = 0
    pairing: Pairing = Pairing.ALL

    @property
    def required_gbps(self) -> float:
        """The bandwidth the edge needs, from whichever way it was stated (the stricter wins)."""
        need = self.min_gbps
        if self.max_transfer_seconds > 0 and self.transfer_bytes > 0:
            need = max(need, self.transfer_bytes / self.max_transfer_seconds / 1e9)
        return need


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """A communication graph to place as one unit."""

    groups: tuple[Group, ...]
    edges: tuple[Edge, ...] = ()
    job: str = ""
    namespace: str = ""
    scope: Constraint = Constraint()
    node_selector: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    priority: int = 0
    policy: str = ""

    @property
    def total_gpus(self) -> int:
        """GPUs the whole request needs."""
        return sum(g.total_gpus for g in self.groups)

    def group(self, name: str) -> Group:
        """The group called `name`; KeyError if there is none."""
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)


class RequestError(ValueError):
    """An invalid request; `field` is the path of the offending field."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field = field_path
        self.reason = reason


def validate(request: PlacementRequest) -> None:
    """Raise `RequestError` for the first problem found, naming the field."""
    if not request.groups:
        raise RequestError("groups", "at least one group is required")
    seen: set[str] = set()
    for i, g in enumerate(request.groups):
        path = f"groups[{i}]"
        if not _NAME.match(g.name):
            raise RequestError(
                f"{path}.name",
                f"{g.name!r} is not a valid name (lower-case letters, digits, '-', '_', '.')",
            )
        if g.name in seen:
            raise RequestError(f"{path}.name", f"duplicate group name {g.name!r}")
        seen.add(g.name)
        for attr in ("replicas", "pods", "gpus_per_pod"):
            if getattr(g, attr) < 1:
                raise RequestError(f"{path}.{attr}", "must be at least 1")
        for attr in ("replicas", "pods", "gpus_per_pod"):
            _check_fits(f"{path}.{attr}", getattr(g, attr), _UINT32)
        if g.message_bytes < 0:
            raise RequestError(f"{path}.message_bytes", "must not be negative")
        _check_fits(f"{path}.message_bytes", g.message_bytes, _UINT64)
        _check_constraint(f"{path}.scope", g.scope)
        if g.allowed_nodes is not None:
            if not g.allowed_nodes:
                raise RequestError(
                    f"{path}.allowed_nodes",
                    "is empty: the caller allows no node at all (leave it unset for any node)",
                )
            if not all(n for n in g.allowed_nodes):
                raise RequestError(f"{path}.allowed_nodes", "a node name must not be empty")
        if g.spread is not None and g.replicas < 2 and g.spread.required:
            raise RequestError(f"{path}.spread", "a required spread needs at least 2 replicas")
    if request.total_gpus > MAX_GPUS_PER_REQUEST:
        raise RequestError(
            "groups", f"asks for {request.total_gpus} GPUs, more than {MAX_GPUS_PER_REQUEST}"
        )
    _check_constraint("scope", request.scope)
    if not _INT32[0] <= request.priority <= _INT32[1]:
        raise RequestError("priority", f"must be within {_INT32[0]}..{_INT32[1]} (int32)")
    for i, e in enumerate(request.edges):
        path = f"edges[{i}]"
        for attr in ("source", "target"):
            name = getattr(e, attr)
            if name not in seen:
                raise RequestError(f"{path}.{attr}", f"no group named {name!r}")
        if e.source == e.target:
            raise RequestError(path, "an edge must join two different groups")
        for attr in ("min_gbps", "max_transfer_seconds"):
            value = getattr(e, attr)
            if not math.isfinite(value):
                raise RequestError(f"{path}.{attr}", f"must be a finite number, not {value}")
            if value < 0:
                raise RequestError(f"{path}.{attr}", "must not be negative")
        _check_fits(f"{path}.transfer_bytes", e.transfer_bytes, _UINT64)
        if (e.max_transfer_seconds > 0) != (e.transfer_bytes > 0):
            raise RequestError(
                path, "max_transfer_seconds and transfer_bytes must be given together"
            )
        if e.pairing is Pairing.ONE_TO_ONE:
            src, dst = request.group(e.source), request.group(e.target)
            if src.replicas != dst.replicas:
                raise RequestError(
                    f"{path}.pairing",
                    f"one_to_one needs equal replicas ({src.replicas} vs {dst.replicas})",
                )


# What the wire form (placement.proto) can carry: a number past its type is refused in every
# form, so YAML, JSON, the CLI and gRPC agree, and arithmetic on it cannot overflow a float.
_UINT32 = (0, 2**32 - 1)
_UINT64 = (0, 2**64 - 1)
_INT32 = (-(2**31), 2**31 - 1)


def _check_fits(path: str, value: int, kind: tuple[int, int]) -> None:
    if value > kind[1]:
        raise RequestError(
            path, f"a {value.bit_length()}-bit number is past its type (at most {kind[1]})"
        )


def _check_constraint(path: str, c: Constraint) -> None:
    if c.required is not None and c.preferred is not None and c.preferred > c.required:
        raise RequestError(
            f"{path}.preferred",
            f"{c.preferred.name.lower()} is wider than the required {c.required.name.lower()}",
        )


# --- the YAML/JSON form ------------------------------------------------------------------------


def request_from_mapping(data: Any) -> PlacementRequest:
    """Build and validate a request from its YAML/JSON form.

    The form (documented in the README):

        job: train-7b
        scope: {required: leaf}             # or {preferred: node}
        node_selector: {gpu: h100}
        groups:
          - {name: tp, pods: 1, gpus_per_pod: 8, pattern: all_reduce, message_bytes: 1073741824,
             replicas: 1, scope: {required: nvlink}, spread: {across: node, required: true}}
        edges:
          - {from: prefill, to: decode, min_gbps: 300}
    """
    root = _mapping("request", data)
    _known(
        "request",
        root,
        {"job", "namespace", "scope", "node_selector", "groups", "edges", "priority", "policy"},
    )
    groups_raw = root.get("groups")
    if not isinstance(groups_raw, Sequence) or isinstance(groups_raw, str | bytes):
        raise RequestError("groups", "must be a list of groups")
    groups = tuple(_group(f"groups[{i}]", g) for i, g in enumerate(groups_raw))
    edges_raw = root.get("edges", [])
    if not isinstance(edges_raw, Sequence) or isinstance(edges_raw, str | bytes):
        raise RequestError("edges", "must be a list of edges")
    edges = tuple(_edge(f"edges[{i}]", e) for i, e in enumerate(edges_raw))
    request = PlacementRequest(
        groups=groups,
        edges=edges,
        job=_str("job", root.get("job", "")),
        namespace=_str("namespace", root.get("namespace", "")),
        scope=_constraint("scope", root.get("scope")),
        node_selector=_labels("node_selector", root.get("node_selector")),
        priority=_int("priority", root.get("priority", 0), minimum=-(2**31)),
        policy=_str("policy", root.get("policy", "")),
    )
    try:
        validate(request)
    except RequestError as err:
        raise RequestError(_yaml_path(err.field), err.reason) from None
    return request


# `validate` names an edge's ends as the domain (and protobuf) does; the YAML form says from/to.
_EDGE_END = re.compile(r"^(edges\[\d+\])\.(source|target)$")
_YAML_EDGE_KEYS = {"source": "from", "target": "to"}


def _yaml_path(field_path: str) -> str:
    """A field path as the YAML form spells it (`edges[0].target` -> `edges[0].to`)."""
    match = _EDGE_END.match(field_path)
    return f"{match[1]}.{_YAML_EDGE_KEYS[match[2]]}" if match else field_path


def scope_from_text(path: str, value: Any) -> Scope:
    """A scope as a user writes it (`nvlink`, `leaf`, `tier-0`, `rack`, ...); `RequestError`
    naming `path` and the valid values otherwise. The one vocabulary of YAML, CLI and HTTP."""
    return _scope(path, value)


def pattern_from_text(path: str, value: Any) -> Pattern:
    """A collective pattern as a user writes it (`all_reduce`, `all-to-all`, `none`, ...)."""
    return _enum(path, Pattern, value)


def pairing_from_text(path: str, value: Any) -> Pairing:
    """An edge's pairing as a user writes it (`all`, `one_to_one`)."""
    return _enum(path, Pairing, value)


def _group(path: str, data: Any) -> Group:
    m = _mapping(path, data)
    _known(
        path,
        m,
        {
            "name",
            "pods",
            "gpus_per_pod",
            "replicas",
            "pattern",
            "message_bytes",
            "scope",
            "spread",
            "node_selector",
            "allowed_nodes",
        },
    )
    if "name" not in m:
        raise RequestError(f"{path}.name", "is required")
    spread = None
    if m.get("spread") is not None:
        s = _mapping(f"{path}.spread", m["spread"])
        _known(f"{path}.spread", s, {"across", "required"})
        if "across" not in s:
            raise RequestError(f"{path}.spread.across", "is required")
        spread = Spread(
            across=_scope(f"{path}.spread.across", s["across"]),
            required=_bool(f"{path}.spread.required", s.get("required", False)),
        )
    return Group(
        name=_str(f"{path}.name", m["name"]),
        pods=_int(f"{path}.pods", m.get("pods", 1)),
        gpus_per_pod=_int(f"{path}.gpus_per_pod", m.get("gpus_per_pod", 1)),
        replicas=_int(f"{path}.replicas", m.get("replicas", 1)),
        pattern=_pattern(f"{path}.pattern", m.get("pattern")),
        message_bytes=_int(
            f"{path}.message_bytes", m.get("message_bytes", DEFAULT_MESSAGE_BYTES), minimum=0
        ),
        scope=_constraint(f"{path}.scope", m.get("scope")),
        spread=spread,
        node_selector=_labels(f"{path}.node_selector", m.get("node_selector")),
        allowed_nodes=_names(f"{path}.allowed_nodes", m.get("allowed_nodes")),
    )


def _pattern(path: str, value: Any) -> Pattern:
    """A group's collective: absent (or protobuf's `PATTERN_UNSPECIFIED`) means all-reduce, the
    same in YAML, JSON, gRPC and the page (README, "One meaning of a request")."""
    if value is None or _unspecified(value, Pattern):
        return DEFAULT_PATTERN
    return _enum(path, Pattern, value)


def _names(path: str, data: Any) -> frozenset[str] | None:
    """A list of node names, or None when absent (an empty list stays empty: `validate` says
    why that cannot be placed)."""
    if data is None:
        return None
    if not isinstance(data, list):
        raise RequestError(path, f"expected a list of node names, got {type(data).__name__}")
    return frozenset(_str(f"{path}[{i}]", v) for i, v in enumerate(data))


def _edge(path: str, data: Any) -> Edge:
    m = _mapping(path, data)
    _known(path, m, {"from", "to", "min_gbps", "max_transfer_seconds", "transfer_bytes", "pairing"})
    for key in ("from", "to"):
        if key not in m:
            raise RequestError(f"{path}.{key}", "is required")
    return Edge(
        source=_str(f"{path}.from", m["from"]),
        target=_str(f"{path}.to", m["to"]),
        min_gbps=_float(f"{path}.min_gbps", m.get("min_gbps", 0.0)),
        max_transfer_seconds=_float(
            f"{path}.max_transfer_seconds", m.get("max_transfer_seconds", 0.0)
        ),
        transfer_bytes=_int(f"{path}.transfer_bytes", m.get("transfer_bytes", 0), minimum=0),
        pairing=_enum(f"{path}.pairing", Pairing, m.get("pairing", "all")),
    )


def _constraint(path: str, data: Any) -> Constraint:
    if data is None:
        return Constraint()
    m = _mapping(path, data)
    _known(path, m, {"required", "preferred"})
    required, preferred = (
        _scope(f"{path}.{end}", m[end]) if m.get(end) and not _unspecified(m[end], Scope) else None
        for end in ("required", "preferred")
    )
    return Constraint(required=required, preferred=preferred)


def _scope(path: str, value: Any) -> Scope:
    text = _plain(_str(path, value), Scope)
    aliases = {
        "nvlink_domain": "nvlink",
        "host": "node",
        "hostname": "node",
        "tier_0": "leaf",
        "tier_1": "spine",
        "tier_2": "core",
        "rack": "leaf",
        "block": "spine",
    }
    text = aliases.get(text, text)
    try:
        return Scope[text.upper()]
    except KeyError:
        names = ", ".join(s.name.lower() for s in Scope)
        raise RequestError(path, f"unknown scope {value!r}; one of {names}") from None


def _enum(path: str, kind: type[_E], value: Any) -> _E:
    text = _plain(_str(path, value), kind)
    for member in kind:
        if member.value == text:
            return member
    names = ", ".join(str(m.value) for m in kind)
    raise RequestError(path, f"unknown value {value!r}; one of {names}")


def _plain(text: str, kind: type[enum.Enum]) -> str:
    """An enum value as the YAML form spells it, from either spelling: `all-reduce`,
    `all_reduce` or protobuf's `PATTERN_ALL_REDUCE` (`SCOPE_NVLINK`, `PAIRING_ONE_TO_ONE`) all
    give `all_reduce`. Why: the JSON mirror takes protobuf's names, and a request copied from
    one form to another must mean the same (README, "One meaning of a request")."""
    plain = text.strip().lower().replace("-", "_")
    prefix = kind.__name__.lower() + "_"
    return plain.removeprefix(prefix)


def _unspecified(value: Any, kind: type[enum.Enum]) -> bool:
    """Whether `value` is protobuf's zero name for `kind` (`PATTERN_UNSPECIFIED`): the same as
    leaving the field out, in every form."""
    return isinstance(value, str) and _plain(value, kind) == "unspecified"


def _mapping(path: str, data: Any) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise RequestError(path, f"must be a mapping, not {type(data).__name__}")
    return data


def _known(path: str, m: Mapping[str, Any], keys: set[str]) -> None:
    unknown = sorted(set(m) - keys)
    if unknown:
        raise RequestError(
            f"{path}.{unknown[0]}", f"unknown field; known: {', '.join(sorted(keys))}"
        )


def _str(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise RequestError(path, f"must be a string, not {type(value).__name__}")
    return value


def _int(path: str, value: Any, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(path, f"must be an integer, not {value!r}")
    if minimum is not None and value < minimum:
        raise RequestError(path, f"must be at least {minimum}")
    return value


def _float(path: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(path, f"must be a number, not {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise RequestError(path, "is past what a double can hold") from None
    if not math.isfinite(number):
        raise RequestError(path, f"must be a finite number, not {number}")
    return number


def _bool(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise RequestError(path, f"must be true or false, not {value!r}")
    return value


def _labels(path: str, data: Any) -> Mapping[str, str]:
    if data is None:
        return MappingProxyType({})
    m = _mapping(path, data)
    out: dict[str, str] = {}
    for k, v in m.items():
        out[_str(f"{path}", k)] = _str(f"{path}.{k}", v)
    return MappingProxyType(out)
