"""The latest probe results of a node, and the topology with them laid over it."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, replace

from gputopo.topology import DeviceRef, Measurement, NodeTopology

__all__ = ["ProbeOutcome", "ProbeRecord", "ProbeResults"]

Key = tuple[DeviceRef, DeviceRef]


class ProbeOutcome(enum.Enum):
    """How a probe attempt ended (a metric label)."""

    MEASURED = "measured"
    SKIPPED_BUSY = "skipped_busy"
    UNAVAILABLE = "unavailable"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """One result as metrics show it: which probe, what it measured, the measurement."""

    probe: str
    target: str
    measurement: Measurement


class ProbeResults:
    """Latest measurement per link and per peer node, and counts of outcomes.

    One asyncio loop owns it; probes running in threads hand results back through the loop.
    """

    def __init__(self) -> None:
        self.links: dict[Key, ProbeRecord] = {}
        self.peers: dict[str, ProbeRecord] = {}
        self.outcomes: Counter[tuple[str, ProbeOutcome]] = Counter()
        self.available: dict[str, tuple[bool, str]] = {}

    def record_link(self, probe: str, a: DeviceRef, b: DeviceRef, m: Measurement) -> None:
        """Keep a link's measurement (replacing the previous one)."""
        key = (a, b) if a < b else (b, a)
        self.links[key] = ProbeRecord(probe, f"{key[0]}-{key[1]}", m)
        self.outcomes[(probe, ProbeOutcome.MEASURED)] += 1

    def record_peer(self, probe: str, peer: str, m: Measurement) -> None:
        """Keep a peer node's measurement."""
        self.peers[peer] = ProbeRecord(probe, peer, m)
        self.outcomes[(probe, ProbeOutcome.MEASURED)] += 1

    def count(self, probe: str, outcome: ProbeOutcome, n: int = 1) -> None:
        """Count attempts that measured nothing."""
        self.outcomes[(probe, outcome)] += n

    def records(self) -> list[ProbeRecord]:
        """Every kept result."""
        return [*self.links.values(), *self.peers.values()]

    def apply(self, topology: NodeTopology) -> NodeTopology:
        """The topology with each probed link's `measured` set; nominal figures stay."""
        if not self.links:
            return topology
        return replace(
            topology,
            links=tuple(
                replace(lk, measured=self.links[lk.key].measurement) if lk.key in self.links else lk
                for lk in topology.links
            ),
        )
