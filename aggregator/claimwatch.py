"""The ResourceClaim watcher: GPUs that DRA allocated to claims, into the cluster state.

Runs on every replica where the API server serves `resource.k8s.io/v1` (Kubernetes 1.34 and
later); elsewhere it says so once and does nothing. It watches ResourceClaims and the
ResourceSlices that say which GPU (by UUID) each device is. Each claim seen goes through
`aggregator.claims` to `ClusterState.set_claim`, each deleted claim clears its devices; a slice
that changes re-reads the claims of its pool. Claims are kept whether or not their node has
reported yet, so a claim seen first is not lost. RBAC: list and watch both (deploy/aggregator).

The test API server (1.20) does not serve the API: tests install CRDs generated from the
upstream types (tests/data/crds/dra-*.yaml), so the watches run against a real server.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aggregator.claims import SliceIndex, claimed_devices
from aggregator.state import ClusterState
from gputopo.runtime.informer import Informer
from gputopo.runtime.kube import KubeClient, NotFoundError

__all__ = ["CLAIMS_API", "ClaimWatcher"]

log = logging.getLogger(__name__)

CLAIMS_API = "/apis/resource.k8s.io/v1"


def _key(claim: dict[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class ClaimWatcher:
    """Keeps the state's DRA-claimed GPUs (see the module docstring)."""

    def __init__(self, state: ClusterState, kube: KubeClient) -> None:
        self.state = state
        self.kube = kube
        self.served: bool | None = None  # None until asked
        self.slices = SliceIndex()
        self._claims: dict[str, dict[str, Any]] = {}
        slices = f"{CLAIMS_API}/resourceslices"
        self.slice_informer: Informer[dict[str, Any]] = Informer(
            name="resourceslices",
            list_objects=lambda: kube.list_all(slices),
            watch=lambda version: kube.watch_json(slices, version),
            key=lambda obj: str((obj.get("metadata") or {}).get("name", "")),
            version=lambda obj: str((obj.get("metadata") or {}).get("resourceVersion", "")),
            on_upsert=lambda obj, relisted: self._slice(obj, obj),
            on_delete=lambda obj: self._slice(obj, None),
        )
        path = f"{CLAIMS_API}/resourceclaims"
        self.informer: Informer[dict[str, Any]] = Informer(
            name="resourceclaims",
            list_objects=lambda: kube.list_all(path),
            watch=lambda version: kube.watch_json(path, version),
            key=_key,
            version=lambda claim: str((claim.get("metadata") or {}).get("resourceVersion", "")),
            on_upsert=self._seen,
            on_delete=self._deleted,
        )

    async def run(self) -> None:
        """Watch until cancelled, if the API server serves ResourceClaims."""
        try:
            await self.kube.request("GET", CLAIMS_API)
        except NotFoundError:
            self.served = False
            log.info("the API server does not serve resource.k8s.io/v1: DRA claims are not read")
            await asyncio.Event().wait()  # nothing to do; stay cancellable like the others
        self.served = True
        slices = asyncio.create_task(self.slice_informer.run(), name="resourceslices")
        try:
            await self.informer.run()
        finally:
            slices.cancel()
            await asyncio.gather(slices, return_exceptions=True)

    def _slice(self, obj: dict[str, Any], now: dict[str, Any] | None) -> None:
        self.slices.set_slice(str((obj.get("metadata") or {}).get("name", "")), now)
        for claim in self._claims.values():
            self._seen(claim, False)

    def _seen(self, claim: dict[str, Any], relisted: bool) -> None:
        self._claims[_key(claim)] = claim
        self.state.set_claim(_key(claim), claimed_devices([claim], slices=self.slices))

    def _deleted(self, claim: dict[str, Any]) -> None:
        self._claims.pop(_key(claim), None)
        self.state.set_claim(_key(claim), [])
