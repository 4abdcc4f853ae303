"""A typed client of the Placement service, for the scheduler, the demo and tests.

Callers speak domain objects (`PlacementRequest` in, `PlacementResult` out) and never build
protobuf messages; the codec translates at this edge. gRPC failures surface as
`PlacementCallError` with the status name and the server's message (for a bad request, the
field path and the reason), so a caller can tell "fix the request" from "try again".
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from gputopo.codec import request_to_proto, result_from_proto
from gputopo.placement.result import PlacementResult
from gputopo.request import PlacementRequest
from gputopo.v1 import placement_pb2 as ppb
from gputopo.v1 import placement_pb2_grpc as pgrpc

__all__ = ["PlaceAnswer", "PlacementCallError", "PlacementClient", "ReservationInfo"]

_R = TypeVar("_R")


class PlacementCallError(Exception):
    """A call failed: `status` is the gRPC status name (INVALID_ARGUMENT, NOT_FOUND, ...)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class ReservationInfo:
    """The GPUs a Place held: until `expires_at` (unix seconds), or for good once committed."""

    id: str
    expires_at: float | None
    committed: bool
    owner: str = ""


@dataclass(frozen=True, slots=True)
class PlaceAnswer:
    """What Place answered: the result and, when GPUs were held, the reservation."""

    result: PlacementResult
    reservation: ReservationInfo | None
    topology_generation: int


def _reservation(msg: ppb.Reservation) -> ReservationInfo:
    expires = msg.expires_at.seconds + msg.expires_at.nanos / 1e9
    return ReservationInfo(
        id=msg.id,
        expires_at=expires if msg.HasField("expires_at") else None,
        committed=msg.committed,
        owner=msg.owner,
    )


class PlacementClient:
    """Place, Commit, Release and Explain over one channel (`gputopo.runtime.grpcio.channel`)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = pgrpc.PlacementStub(channel)

    def use_channel(self, channel: grpc.aio.Channel) -> None:
        """Make later calls over `channel` (a renewed client certificate)."""
        self._stub = pgrpc.PlacementStub(channel)

    async def place(
        self, request: PlacementRequest, *, dry_run: bool = False, ttl_s: float | None = None
    ) -> PlaceAnswer:
        """Place a request; unless `dry_run`, the GPUs are held for `ttl_s` (server default)."""
        msg = ppb.PlaceRequest(request=request_to_proto(request), dry_run=dry_run)
        if ttl_s is not None:
            msg.reservation_ttl.FromNanoseconds(round(ttl_s * 1e9))
        resp = await self._call(self._stub.Place(msg))
        return PlaceAnswer(
            result=result_from_proto(resp),
            reservation=_reservation(resp.reservation) if resp.HasField("reservation") else None,
            topology_generation=resp.topology_generation,
        )

    async def explain(self, reservation_id: str) -> PlacementResult:
        """Why a reservation sits where it does."""
        req = ppb.ExplainRequest(reservation_id=reservation_id)
        return result_from_proto(await self._call(self._stub.Explain(req)))

    async def explain_reservation(self, reservation_id: str) -> PlaceAnswer:
        """A live reservation: where it sits and whether it is committed (NOT_FOUND: gone)."""
        req = ppb.ExplainRequest(reservation_id=reservation_id)
        resp = await self._call(self._stub.Explain(req))
        return PlaceAnswer(
            result=result_from_proto(resp),
            reservation=_reservation(resp.reservation) if resp.HasField("reservation") else None,
            topology_generation=resp.topology_generation,
        )

    async def commit(self, reservation_id: str, *, owner: str = "") -> ReservationInfo:
        """Keep a reservation until released."""
        req = ppb.CommitRequest(reservation_id=reservation_id, owner=owner)
        resp = await self._call(self._stub.Commit(req))
        return _reservation(resp.reservation)

    async def release(self, reservation_id: str) -> int:
        """Free a reservation; returns the GPUs freed."""
        req = ppb.ReleaseRequest(reservation_id=reservation_id)
        resp = await self._call(self._stub.Release(req))
        return resp.gpus_freed

    async def gpu_uuids(self, nodes: Sequence[str]) -> dict[str, dict[int, str]]:
        """node -> GPU index -> UUID, as the nodes' exporters reported them (GetTopology)."""
        req = ppb.GetTopologyRequest(nodes=list(nodes), include_links=False)
        resp = await self._call(self._stub.GetTopology(req))
        return {
            state.topology.name: {gpu.index: gpu.uuid for gpu in state.topology.gpus}
            for state in resp.nodes
        }

    @staticmethod
    async def _call(call: Awaitable[_R]) -> _R:
        try:
            return await call
        except grpc.aio.AioRpcError as err:
            raise PlacementCallError(err.code().name, err.details() or "") from None
