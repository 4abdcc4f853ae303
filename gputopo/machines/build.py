"""Build a machine from its profile: import the recording, add the facts, apply the overrides.

1. Import the recording (`gputopo.importers`).
2. Set the GPU and NIC facts of the profile.
3. Apply the overrides in order; those that cite evidence check it first, so a profile whose
   claim and recording disagree fails to build.
4. Tidy: NVLink links get the GPUs' generation and lane maxima (a fake machine is healthy), NIC
   NUMA nodes are inferred again, nominal bandwidth is filled in, and whatever a complete machine
   has and this one still lacks is listed in `problems` (and makes it `partial`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gputopo.bandwidth import NVLINK_GBPS_PER_LANE
from gputopo.importers import import_topology
from gputopo.importers.nvsmi import gpu_nvlink_lanes, with_numa_completed
from gputopo.links import LinkKind
from gputopo.machines.evidence import read_allreduce, read_nvlink_status
from gputopo.machines.profile import (
    Change,
    FillGpuNic,
    GpuSettings,
    NumaByCpuAffinity,
    NvlinkPairs,
    NvSwitch,
    Profile,
    ProfileError,
)
from gputopo.nominal import with_nominal_bandwidth
from gputopo.topology import Link, Measurement, NodeTopology, gpu, nic

__all__ = ["ReadRecording", "build_machine"]

ReadRecording = Callable[[str], str]


def build_machine(profile: Profile, read_recording: ReadRecording) -> NodeTopology:
    """The profile's machine, named after the profile, with nominal bandwidth filled in."""
    rec = profile.recording
    topology = import_topology(
        read_recording(rec.file),
        node_name=profile.name,
        recording_format=rec.format,
        assume_classes=rec.assume_classes,
    )
    topology = _with_facts(topology, profile)
    for override in profile.overrides:
        topology = _apply(topology, override.change, profile, read_recording)
    return _tidy(topology, profile)


def _with_facts(topology: NodeTopology, profile: Profile) -> NodeTopology:
    facts = profile.gpus
    gpus = tuple(
        replace(
            g,
            name=facts.product,
            memory_mib=facts.memory_mib,
            compute_capability=facts.compute_capability or g.compute_capability,
            nvlink_generation=facts.nvlink_generation or g.nvlink_generation,
            pcie_generation=facts.pcie_generation or g.pcie_generation,
            pcie_width=facts.pcie_width or g.pcie_width,
        )
        for g in topology.gpus
    )
    nics = topology.nics
    if profile.nics is not None:
        kind, speed = profile.nics.kind, profile.nics.speed_mbps
        nics = tuple(replace(n, kind=kind, speed_mbps=speed) for n in nics)
    return replace(topology, gpus=gpus, nics=nics)


def _apply(
    topology: NodeTopology, change: Change, profile: Profile, read_recording: ReadRecording
) -> NodeTopology:
    count = topology.gpu_count
    if isinstance(change, NvSwitch):
        _check_nvlink_evidence(change, profile, read_recording)
        new = [
            Link(gpu(i), gpu(j), LinkKind.NVLINK, change.lanes, via_switch=True)
            for i in range(count)
            for j in range(i + 1, count)
        ]
        return replace(topology, links=(*topology.links, *new))
    if isinstance(change, NvlinkPairs):
        _check_pairs(change.pairs, count, profile)
        new = [Link(gpu(i), gpu(j), LinkKind.NVLINK, change.lanes) for i, j in change.pairs]
        return replace(topology, links=(*topology.links, *new))
    if isinstance(change, FillGpuNic):
        new = [
            Link(gpu(i), nic(j), change.kind)
            for i in range(count)
            for j in range(len(topology.nics))
            if topology.link(gpu(i), nic(j)) is None
        ]
        return replace(topology, links=(*topology.links, *new))
    if isinstance(change, GpuSettings):
        if not 0 <= change.index < count:
            raise ProfileError(f"profiles/{profile.name}.yaml: no GPU{change.index}")
        settings = change
        return replace(
            topology,
            gpus=tuple(
                replace(
                    g,
                    numa_node=settings.numa_node,
                    cpu_affinity=settings.cpu_affinity or g.cpu_affinity,
                )
                if g.index == settings.index
                else g
                for g in topology.gpus
            ),
        )
    if isinstance(change, NumaByCpuAffinity):
        nodes = change.nodes
        return replace(
            topology,
            gpus=tuple(
                replace(g, numa_node=nodes.get(g.cpu_affinity, g.numa_node)) for g in topology.gpus
            ),
        )
    _check_pairs(change.pairs, count, profile)
    result = read_allreduce(read_recording(change.evidence))
    measurement = Measurement(
        gbps=result.busbw_gbps,
        method=f"nccl-tests all_reduce_perf busbw, recording {change.evidence}",
        size_bytes=result.size_bytes,
        duration_s=result.time_us / 1e6,
    )
    links = tuple(
        replace(lk, measured=measurement) if (lk.a.index, lk.b.index) in change.pairs else lk
        for lk in topology.links
    )
    return replace(topology, links=links)


def _check_nvlink_evidence(change: NvSwitch, profile: Profile, read: ReadRecording) -> None:
    if not change.evidence:
        return
    where = f"profiles/{profile.name}.yaml: nvswitch evidence {change.evidence}"
    status = read_nvlink_status(read(change.evidence)).get(change.evidence_gpu)
    if status is None or status.links != change.lanes:
        found = "no such GPU" if status is None else f"{status.links} links"
        raise ProfileError(
            f"{where}: GPU {change.evidence_gpu} should list {change.lanes} links, {found}"
        )
    per_lane = NVLINK_GBPS_PER_LANE.get(profile.gpus.nvlink_generation)
    if status.gbps_per_link and set(status.gbps_per_link) != {per_lane}:
        raise ProfileError(
            f"{where}: links run at {sorted(set(status.gbps_per_link))} GB/s, but NVLink "
            f"{profile.gpus.nvlink_generation} is {per_lane} GB/s per link in the facts table"
        )


def _check_pairs(pairs: tuple[tuple[int, int], ...], count: int, profile: Profile) -> None:
    bad = [p for p in pairs if not (0 <= p[0] < p[1] < count)]
    if bad:
        raise ProfileError(f"profiles/{profile.name}.yaml: GPU pair {list(bad[0])} does not exist")


def _tidy(topology: NodeTopology, profile: Profile) -> NodeTopology:
    gens = {g.index: g.nvlink_generation for g in topology.gpus}
    links = tuple(
        replace(lk, generation=min(gens[lk.a.index], gens[lk.b.index]), max_lanes=lk.lanes)
        if lk.kind is LinkKind.NVLINK
        else lk
        for lk in topology.links
    )
    # A fake machine is healthy: everything runs at its maximum.
    gpus = tuple(
        replace(
            g,
            nvlink_lanes=gpu_nvlink_lanes(links, g.index),
            nvlink_max_lanes=gpu_nvlink_lanes(links, g.index),
            pcie_max_generation=g.pcie_generation,
            pcie_max_width=g.pcie_width,
        )
        for g in topology.gpus
    )
    tidy = with_numa_completed(replace(topology, gpus=gpus, links=links))
    gaps = _gaps(tidy)
    return with_nominal_bandwidth(
        replace(
            tidy,
            name=profile.name,
            machine=profile.machine,
            profile=profile.name,
            partial=bool(gaps),
            problems=gaps,
        )
    )


def _gaps(topology: NodeTopology) -> tuple[str, ...]:
    """What a complete machine has and this one still lacks."""
    gaps = []
    count = topology.gpu_count
    for i in range(count):
        if topology.gpus[i].numa_node is None:
            gaps.append(f"GPU{i}: NUMA node unknown")
        gaps += [
            f"GPU{i}-GPU{j}: no link"
            for j in range(i + 1, count)
            if topology.gpu_link(i, j) is None
        ]
        gaps += [
            f"GPU{i}-NIC{j}: no link"
            for j in range(len(topology.nics))
            if topology.link(gpu(i), nic(j)) is None
        ]
    if not count:
        gaps.append("no GPU")
    return tuple(gaps)
