"""Reservations kept in the API server (GpuReservation objects), so no promise dies with a process.

A restart used to forget every reservation: pods pinned to one could never schedule, and the
GPUs were handed out again. Now each reservation is a `gputopo.io/v1alpha1` GpuReservation in
the aggregator's namespace (CRD in `deploy/aggregator/crd-gpureservations.yaml`), named by its id:

1. Place writes the object before it answers with the id (`put`); if the write fails, the
   reservation is dropped and the caller told UNAVAILABLE: an id a caller holds is always stored.
   Commit patches it (committed, owner) before answering; Release deletes it before answering.
2. A replica that starts to lead (or runs alone) loads every object (`load`) and restores the
   live ones before it answers its first Place, Commit or Release; expired ones are deleted.
3. Expiry happens in memory first (the GPUs are free at once); `sync` then deletes the objects of
   reservations the book no longer has, so a failed delete is retried, not forgotten.

This is the aggregator's `ReservationStore` (`gputopo.reservations`): the placement core
(`gputopo.core`) calls it before it answers, and restores from it when this replica starts to
lead. The book stays in memory and synchronous, so a reservation is made in one turn of the
event loop, on GPUs checked to be still free; only the answer waits for the write. Every
failure of the API server reaches the core as a `StoreError`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, ParamSpec, TypeVar
from urllib.parse import quote

from google.protobuf import json_format

from gputopo.codec import result_from_proto, result_to_proto
from gputopo.reservations import Reservation, StoreError
from gputopo.runtime.kube import MERGE_PATCH, ConflictError, KubeClient, KubeError, NotFoundError
from gputopo.v1 import placement_pb2 as ppb

__all__ = [
    "API_VERSION",
    "KIND",
    "KubePromises",
    "reservation_from_object",
    "reservation_to_object",
]

log = logging.getLogger(__name__)

API_VERSION = "gputopo.io/v1alpha1"
KIND = "GpuReservation"
_PLURAL = "gpureservations"

_P = ParamSpec("_P")
_T = TypeVar("_T")


def _as_store_error(
    call: Callable[_P, Coroutine[Any, Any, _T]],
) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """The API server's refusals as the store protocol's `StoreError` (same message)."""

    @functools.wraps(call)
    async def wrapped(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await call(*args, **kwargs)
        except KubeError as err:
            raise StoreError(str(err)) from err

    return wrapped


def reservation_to_object(res: Reservation, namespace: str) -> dict[str, Any]:
    """A reservation as a GpuReservation object."""
    spec: dict[str, Any] = {
        "gpus": {node: sorted(gpus) for node, gpus in sorted(res.gpus.items())},
        "committed": res.committed,
    }
    # Empty strings are left out: the generated client sends them as null, which the schema
    # (type: string) refuses.
    spec |= {
        key: value
        for key, value in (("owner", res.owner), ("job", res.job), ("holder", res.holder))
        if value
    }
    if res.expires_at is not None:
        spec["expiresAt"] = res.expires_at
    if res.result is not None:
        spec["placement"] = json_format.MessageToJson(
            result_to_proto(res.result), indent=None, preserving_proto_field_name=True
        )
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": res.id,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gputopo"},
        },
        "spec": spec,
    }


def reservation_from_object(obj: Mapping[str, Any]) -> Reservation:
    """A GpuReservation object as a reservation; ValueError naming the field if malformed."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    rid = str(meta.get("name", ""))
    if not rid:
        raise ValueError("metadata.name: missing")
    gpus: dict[str, frozenset[int]] = {}
    for node, indices in (spec.get("gpus") or {}).items():
        if not isinstance(indices, list) or not all(isinstance(i, int) for i in indices):
            raise ValueError(f"spec.gpus.{node}: not a list of GPU indices")
        gpus[str(node)] = frozenset(indices)
    committed = bool(spec.get("committed"))
    expires = spec.get("expiresAt")
    if not committed and not isinstance(expires, int | float):
        raise ValueError("spec.expiresAt: required until committed")
    result = None
    if spec.get("placement"):
        result = result_from_proto(json_format.Parse(spec["placement"], ppb.PlaceResponse()))
    return Reservation(
        id=rid,
        gpus=gpus,
        expires_at=None if committed else float(expires),  # type: ignore[arg-type]
        owner=str(spec.get("owner", "")),
        job=str(spec.get("job", "")),
        result=result,
        holder=str(spec.get("holder", "")),
    )


class KubePromises:
    """Reservations as GpuReservation objects in one namespace (see the module docstring): a
    `gputopo.reservations.ReservationStore`."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self._kube = kube
        self.namespace = namespace
        self._path = f"/apis/gputopo.io/v1alpha1/namespaces/{quote(namespace)}/{_PLURAL}"
        self.stored: set[str] = set()

    @_as_store_error
    async def put(self, res: Reservation) -> None:
        """Create the object, or patch it when it exists (Commit): one round trip either way,
        two only when this replica did not know it was stored."""
        body = reservation_to_object(res, self.namespace)
        if res.id not in self.stored:
            try:
                await self._kube.request("POST", self._path, body=body)
                self.stored.add(res.id)
                return
            except ConflictError:
                pass
        # null removes expiresAt in a merge patch: a commitment has none
        patch = {"spec": body["spec"] | {"expiresAt": body["spec"].get("expiresAt")}}
        await self._kube.request(
            "PATCH", f"{self._path}/{quote(res.id)}", body=patch, content_type=MERGE_PATCH
        )
        self.stored.add(res.id)

    @_as_store_error
    async def delete(self, rid: str) -> None:
        """Delete the object (already gone is fine)."""
        with contextlib.suppress(NotFoundError):
            await self._kube.request("DELETE", f"{self._path}/{quote(rid)}")
        self.stored.discard(rid)

    @_as_store_error
    async def load(self, *, now: float) -> list[Reservation]:
        """Every live reservation stored; expired and malformed objects are deleted."""
        items, _ = await self._kube.list_all(self._path)
        live = []
        for obj in items:
            name = str((obj.get("metadata") or {}).get("name", ""))
            try:
                res = reservation_from_object(obj)
            except ValueError as err:
                log.warning("GpuReservation %s is malformed (%s): deleting it", name, err)
                await self.delete(name)
                continue
            if res.expires_at is not None and res.expires_at <= now:
                await self.delete(res.id)
                continue
            live.append(res)
            self.stored.add(res.id)
        return live

    @_as_store_error
    async def sync(self, live: Iterable[str]) -> int:
        """Delete the objects of reservations no longer live (expired); returns how many."""
        gone = self.stored - set(live)
        for rid in sorted(gone):
            await self.delete(rid)
        return len(gone)
