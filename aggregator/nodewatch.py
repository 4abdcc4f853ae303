"""The Node watcher: Kubernetes' Node objects into the cluster state, on every replica.

Node labels are an input of placement (node selectors, and the labels fabric source), not only
an output of the label publisher, so every replica reads them, leader or not, labels published
or not (`--no-labels`). Reading used to live inside the publisher, which runs only on the
leader and only when publishing; a follower or an aggregator run with `--no-labels` never saw
a label, and a deleted Node was never removed.

What it does (a `gputopo.runtime.informer` over Nodes):

- a Node seen (listed, added, modified): its labels go to the state, with the keys this
  aggregator owns (those do not count as a fabric source: they are our own output);
- a Node deleted: its labels are forgotten and the node leaves the state
  (`ClusterState.node_deleted`), so it is no longer placed on, listed or labelled; its exporter,
  should it still run, is not heard again until it restarts or the Node comes back.

The label publisher subscribes to the same events instead of watching Nodes itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from aggregator.labels import LabelScheme
from aggregator.state import ClusterState
from gputopo.runtime.informer import node_informer
from gputopo.runtime.kube import FIELD_MANAGER, KubeClient, NodeObject

__all__ = ["NodeListener", "NodeWatcher"]

# (node, relisted) for a Node seen; (node, None) for a Node deleted.
NodeListener = Callable[[NodeObject, bool | None], None]


class NodeWatcher:
    """Keeps the state's view of Node objects (see the module docstring)."""

    def __init__(
        self, state: ClusterState, kube: KubeClient, *, scheme: LabelScheme | None = None
    ) -> None:
        self.state = state
        self.scheme = scheme or LabelScheme()
        self.informer = node_informer(kube, on_upsert=self._seen, on_delete=self._deleted)
        self._listeners: list[NodeListener] = []
        self.deleted = 0

    @property
    def cache(self) -> Mapping[str, NodeObject]:
        """Every Node object as last seen, by name."""
        return self.informer.cache

    @property
    def synced(self) -> asyncio.Event:
        """Set once the first list is in."""
        return self.informer.synced

    def subscribe(self, listener: NodeListener) -> Callable[[], None]:
        """Call `listener(node, relisted)` for each Node seen and `listener(node, None)` for each
        deleted, after the state has it; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def run(self) -> None:
        """Watch until cancelled."""
        await self.informer.run()

    def _seen(self, node: NodeObject, relisted: bool) -> None:
        self.state.set_labels(node.name, node.labels, owned=node.labels_of(FIELD_MANAGER))
        for listener in list(self._listeners):
            listener(node, relisted)

    def _deleted(self, node: NodeObject) -> None:
        self.deleted += 1
        self.state.node_deleted(node.name)
        for listener in list(self._listeners):
            listener(node, None)
