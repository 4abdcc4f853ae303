"""The pod watcher: pods bound to nodes, by anyone, into the cluster state's occupancy.

Runs on every replica, like the Node watcher: what is free is an input of every Place a
replica may answer after a failover, not only the leader's. Each bound pod seen (listed, added,
modified) goes to `ClusterState.pod_seen`, each deleted one (or one that stopped matching the
`spec.nodeName!=` selector) to `ClusterState.pod_deleted`; `aggregator.occupancy` says what
counts.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aggregator.state import ClusterState
from gputopo.runtime.informer import bound_pod_informer
from gputopo.runtime.kube import KubeClient

__all__ = ["PodWatcher"]


class PodWatcher:
    """Keeps the state's occupancy from bound pods (see the module docstring)."""

    def __init__(self, state: ClusterState, kube: KubeClient) -> None:
        self.state = state
        self.informer = bound_pod_informer(kube, on_upsert=self._seen, on_delete=self._deleted)

    @property
    def synced(self) -> asyncio.Event:
        """Set once the first list is in."""
        return self.informer.synced

    async def run(self) -> None:
        """Watch until cancelled."""
        await self.informer.run()

    def _seen(self, pod: dict[str, Any], relisted: bool) -> None:
        self.state.pod_seen(pod)

    def _deleted(self, pod: dict[str, Any]) -> None:
        self.state.pod_deleted(pod)
