"""Changes to a node's topology: compute them (exporter side) and apply them (aggregator side).

Exporters stream a full snapshot once and then only what changed; both ends use this module so
that `apply(old, diff(old, new)) == new` holds by construction (tested as a property). Upserts are
keyed by GPU index, NIC index and link endpoints. A change that upserts cannot express (a GPU or
NIC disappearing, NUMA nodes changing, the node renamed) makes `diff` return None: send a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputopo.topology import (
    DeviceKind,
    DeviceRef,
    FabricPosition,
    Gpu,
    Link,
    Nic,
    NodeTopology,
    NvmlStatus,
)

__all__ = ["DeltaError", "NodeDelta", "apply_delta", "check_delta", "diff_topology"]


@dataclass(frozen=True, slots=True)
class NodeDelta:
    """Changes to a node, keyed like the wire Delta (upserts by index or endpoints)."""

    gpus: tuple[Gpu, ...] = ()
    nics: tuple[Nic, ...] = ()
    links: tuple[Link, ...] = ()
    removed_links: tuple[tuple[DeviceRef, DeviceRef], ...] = ()
    fabric: FabricPosition | None = None
    nvml: NvmlStatus | None = None
    problems: tuple[str, ...] | None = None

    @property
    def empty(self) -> bool:
        """True when the delta changes nothing."""
        return self == NodeDelta()


def diff_topology(old: NodeTopology, new: NodeTopology) -> NodeDelta | None:
    """What turns `old` into `new`, or None when only a full snapshot can say it."""
    if (old.name, old.numa_nodes, old.machine, old.profile, old.partial) != (
        new.name,
        new.numa_nodes,
        new.machine,
        new.profile,
        new.partial,
    ):
        return None
    if len(new.gpus) < len(old.gpus) or len(new.nics) < len(old.nics):
        return None
    old_gpus = dict(enumerate(old.gpus))
    old_nics = dict(enumerate(old.nics))
    old_links = {lk.key: lk for lk in old.links}
    new_links = {lk.key: lk for lk in new.links}
    return NodeDelta(
        gpus=tuple(g for i, g in enumerate(new.gpus) if old_gpus.get(i) != g),
        nics=tuple(n for i, n in enumerate(new.nics) if old_nics.get(i) != n),
        links=tuple(lk for k, lk in new_links.items() if old_links.get(k) != lk),
        removed_links=tuple(k for k in old_links if k not in new_links),
        fabric=new.fabric if new.fabric != old.fabric else None,
        nvml=new.nvml if new.nvml != old.nvml else None,
        problems=new.problems if new.problems != old.problems else None,
    )


def apply_delta(topology: NodeTopology, delta: NodeDelta) -> NodeTopology:
    """`topology` with the delta's upserts and removals applied.

    The result shares every part the delta leaves alone (`NodeTopology.amended`): the
    aggregator applies a delta per report, and most change one link of a hundred."""
    gpus = nics = None
    if delta.gpus:
        merged = {g.index: g for g in topology.gpus} | {g.index: g for g in delta.gpus}
        gpus = tuple(merged[i] for i in sorted(merged))
    if delta.nics:
        by_index = {n.index: n for n in topology.nics} | {n.index: n for n in delta.nics}
        nics = tuple(by_index[i] for i in sorted(by_index))
    return topology.amended(
        links=delta.links,
        removed_links=delta.removed_links,
        gpus=gpus,
        nics=nics,
        fabric=delta.fabric,
        nvml=delta.nvml,
        problems=delta.problems,
    )


class DeltaError(ValueError):
    """A delta its base cannot take; `field` names where (`delta.gpus[0].index`)."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field = field_path
        self.reason = reason


def check_delta(base: NodeTopology, delta: NodeDelta) -> None:
    """DeltaError unless the delta keeps devices numbered 0..n-1 and links on real devices of
    `base` (the snapshot it continues): applied anyway, it would leave a node placement cannot
    reason about."""
    counts: dict[DeviceKind, int] = {DeviceKind.GPU: len(base.gpus), DeviceKind.NIC: len(base.nics)}
    for kind, device, have, upserts in (
        ("gpus", DeviceKind.GPU, len(base.gpus), [g.index for g in delta.gpus]),
        ("nics", DeviceKind.NIC, len(base.nics), [n.index for n in delta.nics]),
    ):
        if not upserts:
            continue  # most deltas: links only
        indices = set(range(have)) | set(upserts)
        if indices != set(range(len(indices))):
            i, bad = next((i, x) for i, x in enumerate(upserts) if x >= len(indices))
            raise DeltaError(
                f"delta.{kind}[{i}].index",
                f"is {bad}; the node has {have}, so new ones must continue at {have}",
            )
        counts[device] = len(indices)
    numa = {n.id for n in base.numa_nodes}
    for i, link in enumerate(delta.links):
        for end, ref in (("a", link.a), ("b", link.b)):
            ok = ref.index in numa if ref.kind is DeviceKind.NUMA else ref.index < counts[ref.kind]
            if not ok:
                raise DeltaError(f"delta.links[{i}].{end}", f"no such device {ref}")
