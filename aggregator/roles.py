"""Who may call what: roles by client certificate name, for gRPC and the HTTP mirror alike.

Mutual TLS proved who a caller is, but any valid certificate could do anything but Commit or
Release another's reservation: the exporters' shared certificate placed and committed a TP-8
(a commitment never expires), and any caller could Explain another's reservation (its nodes,
GPUs and predictions). So each method has a role (`METHOD_ROLES`, keyed on the full gRPC
method name, which the HTTP mirror borrows) and `Roles` says which names hold it:

- **report**: every caller (which node a stream may report is the node identity check's job);
- **place** (Place, Commit, Release) and **explain**: `placement_clients`, or, when none are
  named, every certificate that is not an exporter's (`exporter_clients`) or a node's
  (`system:node:NAME`): those report and nothing else;
- Explain of a reservation further needs its holder or an `operators` name;
- **read** (GetTopology, WatchTopology): every caller but exporters and nodes;
- the extender's verbs keep their own list (`--extender-client`).

An entry of these lists is a certificate's common name, or `group:ORG` for every certificate
with that Organization (O=) in its subject, as Kubernetes reads groups from client
certificates: a team's certificates share one entry, and a new member needs no flag change.

Over plain text there are no names, and no roles are enforced (`Roles.enforced` is False):
everything the README says about plain text holds.
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from gputopo.runtime.identity import NODE_PREFIX, caller_of_rpc, groups_of_rpc

__all__ = [
    "DEFAULT_EXPORTER_CLIENTS",
    "GROUP_PREFIX",
    "METHOD_ROLES",
    "Role",
    "RoleInterceptor",
    "Roles",
]

log = logging.getLogger(__name__)

# The certificate the manifests give every exporter (Secret gputopo-exporter-tls).
DEFAULT_EXPORTER_CLIENTS = ("gputopo-exporter",)
# An entry naming a certificate Organization (a Kubernetes group) rather than a common name.
GROUP_PREFIX = "group:"


def _named(entries: frozenset[str], caller: str, groups: frozenset[str]) -> bool:
    """Whether `entries` name the caller: its common name, or `group:` one of its groups."""
    if caller in entries and not caller.startswith(GROUP_PREFIX):
        return True
    return any(GROUP_PREFIX + group in entries for group in groups)


class Role(enum.Enum):
    """What a method does, for deciding who may call it."""

    REPORT = "report"
    PLACE = "place"
    EXPLAIN = "explain"
    READ = "read"


METHOD_ROLES = {
    "/gputopo.v1.Reporter/Report": Role.REPORT,
    "/gputopo.v1.Placement/Place": Role.PLACE,
    "/gputopo.v1.Placement/Commit": Role.PLACE,
    "/gputopo.v1.Placement/Release": Role.PLACE,
    "/gputopo.v1.Placement/Explain": Role.EXPLAIN,
    "/gputopo.v1.Placement/GetTopology": Role.READ,
    "/gputopo.v1.Placement/WatchTopology": Role.READ,
}


@dataclass(frozen=True, slots=True)
class Roles:
    """The role table (see the module docstring); pure, so gRPC and HTTP ask the same one."""

    enforced: bool
    exporter_clients: frozenset[str] = frozenset(DEFAULT_EXPORTER_CLIENTS)
    placement_clients: frozenset[str] = frozenset()  # empty: any certificate but a node agent's
    operators: frozenset[str] = frozenset()

    @staticmethod
    def of(
        *,
        enforced: bool,
        exporter_clients: Iterable[str] = DEFAULT_EXPORTER_CLIENTS,
        placement_clients: Iterable[str] = (),
        operators: Iterable[str] = (),
    ) -> Roles:
        """A table from the command line's lists."""
        return Roles(
            enforced,
            frozenset(exporter_clients),
            frozenset(placement_clients),
            frozenset(operators),
        )

    @property
    def uses_groups(self) -> bool:
        """Whether any entry names a group (else a caller's groups need not be read)."""
        entries = self.exporter_clients | self.placement_clients | self.operators
        return any(e.startswith(GROUP_PREFIX) for e in entries)

    def node_agent(self, caller: str, groups: frozenset[str] = frozenset()) -> bool:
        """An exporter's certificate or a node's: it reports, and does nothing else."""
        return _named(self.exporter_clients, caller, groups) or caller.startswith(NODE_PREFIX)

    def denial(
        self,
        method: str,
        caller: str,
        *,
        holder: str | None = None,
        groups: frozenset[str] = frozenset(),
    ) -> str | None:
        """Why `caller` (with its certificate's `groups`) may not call `method` (one line), or
        None. `holder` is the holder of the reservation an Explain names (None: no such
        reservation, or not an Explain)."""
        if not self.enforced:
            return None
        role = METHOD_ROLES.get(method)
        if role is None or role is Role.REPORT:
            return None
        if _named(self.operators, caller, groups):
            return None
        if self.node_agent(caller, groups):
            return f"{caller!r} is a node agent's certificate: it may Report only"
        named = self.placement_clients
        if role in (Role.PLACE, Role.EXPLAIN) and named and not _named(named, caller, groups):
            listed = ", ".join(sorted(named))
            return f"{caller!r} is not a placement client (--placement-client: {listed})"
        if role is Role.EXPLAIN and holder is not None and holder != caller:
            return (
                f"the reservation is held by {holder!r}; only its holder or an operator"
                " (--operator) may explain it"
            )
        return None


class RoleInterceptor(grpc.aio.ServerInterceptor):
    """Answers PERMISSION_DENIED to a unary call or a server stream (WatchTopology) its
    caller's role does not allow.

    `holder_of(reservation_id)` names a reservation's holder (None when unknown), for Explain.
    Report, a stream, is every caller's: the node identity check decides what it may report.
    """

    def __init__(self, roles: Roles, holder_of: Callable[[str], str | None]) -> None:
        self.roles = roles
        self._holder_of = holder_of
        self._read_groups = roles.uses_groups  # once: the table does not change
        self.denied = 0

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not self.roles.enforced:
            return handler
        if METHOD_ROLES.get(method) in (None, Role.REPORT):
            return handler

        async def check(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            caller = caller_of_rpc(context)
            groups = groups_of_rpc(context) if self._read_groups else frozenset()
            holder = None
            rid = getattr(request, "reservation_id", "")
            if METHOD_ROLES[method] is Role.EXPLAIN and isinstance(rid, str) and rid:
                holder = self._holder_of(rid)
            why = self.roles.denial(method, caller, holder=holder, groups=groups)
            if why is not None:
                self.denied += 1
                log.warning("%s refused to %s: %s", method, caller or "?", why)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method}: {why}")

        if handler.unary_stream is not None:  # WatchTopology: checked before its first event
            stream: Any = handler.unary_stream

            async def watched(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await check(request, context)
                async for item in stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                watched, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_unary is None:
            return handler
        inner: Any = handler.unary_unary  # async on an aio server; the stubs say sync

        async def checked(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await check(request, context)
            result = inner(request, context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(
            checked, handler.request_deserializer, handler.response_serializer
        )
