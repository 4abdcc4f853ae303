"""Link and GPU health: what is degraded, why, and what the link still carries.

Rules (a link or GPU may have several reasons; they are joined with "; "):

1. NVLink lanes down: a pair with fewer active NVLinks than the hardware has is DEGRADED and its
   nominal bandwidth counts only the active lanes; a pair that lost every lane talks over PCIe
   and says so. Through NVSwitch, a GPU's missing lanes degrade all its switched pairs.
2. NVLink error counters climbing (replay, recovery, CRC): a link whose counters rose since the
   last check degrades the pairs that use it, and stays degraded for `hold_checks` clean checks,
   so a link that errs every other minute does not flap.
3. PCIe trained below its maximum: a narrower link (x8 of x16) always; a lower generation only
   while the GPU is busy, because idle GPUs drop to Gen1 to save power and train back up under
   load (`nvidia-smi -q` shows it). An idle downshift is not recorded at all: the model keeps the
   generation the link reaches when used. The GPU and its PCIe paths (to peers, NICs, host
   memory) are DEGRADED; their nominal bandwidth follows the link as trained.
4. NVML fabric state not complete (multi-node NVLink still registering, or registration failed):
   the GPU and its NVLink pairs are DEGRADED and count at their PCIe path's bandwidth, which is
   what traffic gets until the fabric is up. A fabric that reports degraded bandwidth in its
   health mask degrades them without a figure to lower.
5. A NIC that is down makes its GPU-NIC links DOWN (they carry nothing).

All functions are pure except `ErrorCounterWatch`, which remembers counters between checks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from exporter.readings import GpuReading, NvmlReading, RemoteType
from gputopo import bandwidth
from gputopo.links import LinkHealth, LinkKind
from gputopo.nominal import gpu_pcie_gbps, with_nominal_bandwidth
from gputopo.topology import (
    DeviceKind,
    DeviceRef,
    FabricState,
    Gpu,
    Link,
    NodeTopology,
    gpu,
)

__all__ = ["ErrorCounterWatch", "HealthPolicy", "assess"]

_FABRIC_DEGRADED_BW = 1  # NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE, in bits 0-1

Key = tuple[DeviceRef, DeviceRef]


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Thresholds of the rules in the module docstring."""

    busy_percent: int = 10
    error_increase: int = 1
    hold_checks: int = 3


class ErrorCounterWatch:
    """Remembers each NVLink's error counters and says which ones climbed (rule 2)."""

    def __init__(self, policy: HealthPolicy = HealthPolicy()) -> None:
        self._policy = policy
        self._last: dict[tuple[int, int], dict[str, int]] = {}
        self._recent: dict[tuple[int, int], tuple[str, int]] = {}  # reason, checks left

    def update(self, reading: NvmlReading) -> dict[tuple[int, int], str]:
        """(GPU, link) -> reason, for links whose counters rose recently."""
        seen: set[tuple[int, int]] = set()
        for g in reading.gpus:
            for link in g.nvlinks:
                key = (g.index, link.link)
                seen.add(key)
                before, now = self._last.get(key), link.errors
                self._last[key] = dict(now)
                if before is None:
                    continue
                rose = {
                    name: value - before[name]
                    for name, value in now.items()
                    if name in before and value - before[name] >= self._policy.error_increase
                }
                if rose:
                    text = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in rose.items())
                    reason = f"GPU{g.index} NVLink {link.link}: {text} errors since the last check"
                    self._recent[key] = (reason, self._policy.hold_checks)
                elif key in self._recent:
                    reason, left = self._recent[key]
                    self._recent[key] = (reason, left - 1)
        for key in [k for k, (_, left) in self._recent.items() if left <= 0 or k not in seen]:
            del self._recent[key]
        return {key: reason for key, (reason, _) in self._recent.items()}


def assess(
    topology: NodeTopology,
    nvml: NvmlReading,
    *,
    pcie_kinds: dict[tuple[int, int], LinkKind],
    climbing: dict[tuple[int, int], str] | None = None,
    policy: HealthPolicy = HealthPolicy(),
) -> NodeTopology:
    """The topology with health, reasons and effective bandwidth set (see the module docstring)."""
    readings = {g.index: g for g in nvml.gpus}
    gpu_reasons: dict[int, list[str]] = defaultdict(list)
    pcie_reasons: dict[int, list[str]] = defaultdict(list)
    link_reasons: dict[Key, list[str]] = defaultdict(list)
    down: dict[Key, str] = {}
    fallback: set[Key] = set()

    gpus = list(topology.gpus)
    for at, g in enumerate(gpus):
        reading = readings.get(g.index)
        if reading is not None:
            gpus[at] = _pcie_rule(g, reading, policy, pcie_reasons[g.index])
        gpu_reasons[g.index] += pcie_reasons[g.index]
        _fabric_rule(gpus[at], gpu_reasons[g.index])
        if g.nvlink_lanes < g.nvlink_max_lanes:
            gpu_reasons[g.index].append(
                f"{g.nvlink_max_lanes - g.nvlink_lanes} of {g.nvlink_max_lanes} NVLinks down"
            )
    fabric_bad = {g.index: found for g in gpus if (found := _fabric_problem(g)) is not None}

    for link in topology.links:
        key = link.key
        ends = [ref.index for ref in key if ref.kind is DeviceKind.GPU]
        if link.kind is LinkKind.NVLINK or link.max_lanes:
            _lane_rule(link, link_reasons[key])
        if link.kind is LinkKind.NVLINK:
            for i in ends:
                if i in fabric_bad:
                    link_reasons[key].append(f"GPU{i}: {fabric_bad[i][0]}")
                    if fabric_bad[i][1]:
                        fallback.add(key)
        elif link.kind.is_pcie:
            link_reasons[key] += [f"GPU{i}: {w}" for i in ends for w in pcie_reasons.get(i, [])]
        nic_end = next((ref for ref in key if ref.kind is DeviceKind.NIC), None)
        if nic_end is not None and not topology.nics[nic_end.index].up:
            down[key] = f"NIC {topology.nics[nic_end.index].name} is down"
    for key, reason in _climbing_links(topology, nvml, climbing or {}).items():
        link_reasons[key].append(reason)

    gpus = [_with_health(g, gpu_reasons.get(g.index, [])) for g in gpus]
    links = []
    for link in topology.links:
        why = list(dict.fromkeys(link_reasons.get(link.key, [])))
        if link.key in down:
            links.append(replace(link, health=LinkHealth.DOWN, health_reason=down[link.key]))
        elif why:
            links.append(replace(link, health=LinkHealth.DEGRADED, health_reason="; ".join(why)))
        elif link.health is LinkHealth.OK and not link.health_reason:
            links.append(link)  # already so: no copy (most links of a healthy node)
        else:
            links.append(replace(link, health=LinkHealth.OK, health_reason=""))
    unchanged = all(a is b for a, b in zip(gpus, topology.gpus, strict=True)) and all(
        a is b for a, b in zip(links, topology.links, strict=True)
    )
    judged = with_nominal_bandwidth(
        topology if unchanged else replace(topology, gpus=tuple(gpus), links=tuple(links))
    )
    if not fallback:
        return judged
    return replace(
        judged,
        links=tuple(
            replace(lk, nominal_gbps=_pcie_fallback(judged, lk, pcie_kinds))
            if lk.key in fallback
            else lk
            for lk in judged.links
        ),
    )


def _pcie_rule(g: Gpu, reading: GpuReading, policy: HealthPolicy, reasons: list[str]) -> Gpu:
    busy = (reading.utilization_percent or 0) >= policy.busy_percent
    if 0 < g.pcie_generation < g.pcie_max_generation:
        if not busy:
            g = replace(g, pcie_generation=g.pcie_max_generation)  # idle power saving
        else:
            reasons.append(
                f"PCIe trained at Gen{g.pcie_generation} of Gen{g.pcie_max_generation} under load"
            )
    if 0 < g.pcie_width < g.pcie_max_width:
        reasons.append(f"PCIe trained at x{g.pcie_width} of x{g.pcie_max_width}")
    return g


def _fabric_problem(g: Gpu) -> tuple[str, bool] | None:
    """What is wrong with a GPU's fabric, and whether NVLink is unusable because of it."""
    fabric = g.fabric
    if fabric is None or fabric.state is FabricState.NOT_SUPPORTED:
        return None
    if fabric.state is not FabricState.COMPLETED:
        state = fabric.state.name.lower().replace("_", " ")
        return f"NVLink fabric registration {state}: NVLink not usable yet", True
    if fabric.health_mask & 0x3 == _FABRIC_DEGRADED_BW:
        return "NVLink fabric reports degraded bandwidth", False
    return None


def _fabric_rule(g: Gpu, reasons: list[str]) -> None:
    problem = _fabric_problem(g)
    if problem is not None:
        reasons.append(problem[0])


def _lane_rule(link: Link, reasons: list[str]) -> None:
    if link.lanes >= link.max_lanes:
        return
    lost = link.max_lanes - link.lanes
    where = " to NVSwitch" if link.via_switch else ""
    if link.kind is LinkKind.NVLINK:
        reasons.append(f"{lost} of {link.max_lanes} NVLinks{where} down")
    else:
        reasons.append(f"all {link.max_lanes} NVLinks down: traffic goes over PCIe ({link.code})")


def _climbing_links(
    topology: NodeTopology, nvml: NvmlReading, climbing: dict[tuple[int, int], str]
) -> dict[Key, str]:
    """The GPU pairs that use each NVLink whose counters climbed."""
    by_bus = {g.pci_bus_id: g.index for g in nvml.gpus if g.pci_bus_id}
    readings = {g.index: g for g in nvml.gpus}
    found: dict[Key, str] = {}
    for (i, number), reason in climbing.items():
        reading = readings.get(i)
        link = next((lk for lk in reading.nvlinks if lk.link == number), None) if reading else None
        if link is None:
            continue
        if link.remote_type is RemoteType.SWITCH or link.remote_bus_id not in by_bus:
            peers: Iterable[Link] = (
                lk
                for lk in topology.gpu_links()
                if lk.via_switch and gpu(i) in lk.key and lk.kind is LinkKind.NVLINK
            )
        else:
            pair = topology.gpu_link(i, by_bus[link.remote_bus_id])
            peers = [pair] if pair is not None else []
        for lk in peers:
            found[lk.key] = reason
    return found


def _with_health(g: Gpu, reasons: list[str]) -> Gpu:
    if not reasons:
        if g.health is LinkHealth.OK and not g.health_reason:
            return g  # already so: no copy
        return replace(g, health=LinkHealth.OK, health_reason="")
    return replace(g, health=LinkHealth.DEGRADED, health_reason="; ".join(reasons))


def _pcie_fallback(
    topology: NodeTopology, link: Link, pcie_kinds: dict[tuple[int, int], LinkKind]
) -> float:
    a, b = link.a.index, link.b.index
    kind = pcie_kinds.get((min(a, b), max(a, b)), LinkKind.SYS)
    rate = min(gpu_pcie_gbps(topology.gpus[a]), gpu_pcie_gbps(topology.gpus[b]))
    return bandwidth.pcie_path_gbps(kind, link_gbps=rate)
