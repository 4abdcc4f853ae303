"""Fake machines built from real recordings, for tests, the demo and benchmarks.

There are no GPUs where gputopo is developed and tested, so every fake machine is a real one:
a recording of `nvidia-smi topo -m` or NCCL topology XML published for a real machine (copied
verbatim, source line kept, into `recordings/`), completed by a profile (`profiles/<name>.yaml`)
that adds only what the recording lacks and says why (see `gputopo.machines.profile` for the
file format and `gputopo.machines.build` for how a machine is made from it).

`load_machine` is cheap per call: each profile is read and built once, then every node is that
template with its own name and GPU UUIDs (derived from the node name and GPU index, so the same
node gets the same UUIDs in every run). Everything else, PCI bus ids included, is the same on
every node of a profile, as on real machines of one model.

Multi-node NVLink (`gb200-tray`): NVML fabric info depends on which rack a tray sits in, so the
profile leaves `Gpu.fabric` unset and the caller (the demo) sets it per rack with
`with_gpu_fabric(topology, cluster_uuid=..., clique_id=...)`.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, replace
from importlib import resources

import yaml

from gputopo.machines.build import build_machine
from gputopo.machines.gfd import GFD_CLIQUE, GFD_COUNT, GFD_MEMORY, GFD_PRODUCT, gfd_labels
from gputopo.machines.profile import Profile, ProfileError, parse_profile
from gputopo.topology import FabricState, GpuFabric, NodeTopology

__all__ = [
    "GFD_CLIQUE",
    "GFD_COUNT",
    "GFD_MEMORY",
    "GFD_PRODUCT",
    "PROFILES",
    "ProfileError",
    "ProfileSummary",
    "describe_profiles",
    "gfd_labels",
    "gpu_uuid",
    "load_machine",
    "load_profile",
    "read_recording",
    "recordings",
    "with_gpu_fabric",
]

PROFILES: tuple[str, ...] = (
    "dgx-h100",
    "hgx-a100-roce",
    "ndv4-a100",
    "p4d-a100",
    "dgx1-v100",
    "h100-nv6-4x",
    "gb200-tray",
    "workstation-2x-rtx5090",
    "g5-a10g-8x",
    "pcie-h100-nvlbridge-8x",
)

# Fixed namespace for GPU UUIDs of fake machines: the same node name and index give the same UUID.
_UUID_NAMESPACE = uuid.UUID("5c1f8f9e-4f3a-4c7e-9a57-6d0b7e1c2a10")


def recordings() -> tuple[str, ...]:
    """File names of the bundled recordings (for `gputopo topo show --from NAME`)."""
    folder = resources.files(__name__).joinpath("recordings")
    return tuple(sorted(entry.name for entry in folder.iterdir() if entry.is_file()))


def read_recording(name: str) -> str:
    """The text of a bundled recording, its source line included."""
    if name not in recordings():
        raise ValueError(f"no bundled recording {name!r}; known: {', '.join(recordings())}")
    return resources.files(__name__).joinpath("recordings", name).read_text(encoding="utf-8")


@functools.cache
def load_profile(profile: str) -> Profile:
    """The parsed profile file; `ProfileError` naming the key when it is invalid."""
    if profile not in PROFILES:
        raise ValueError(f"unknown machine profile {profile!r}; known: {', '.join(PROFILES)}")
    text = resources.files(__name__).joinpath("profiles", f"{profile}.yaml").read_text("utf-8")
    return parse_profile(profile, yaml.safe_load(text))


@functools.cache
def _template(profile: str) -> NodeTopology:
    return build_machine(load_profile(profile), read_recording)


def load_machine(profile: str, *, node_name: str) -> NodeTopology:
    """A node of the given profile named `node_name`, with its own GPU UUIDs."""
    template = _template(profile)
    gpus = tuple(replace(g, uuid=gpu_uuid(node_name, g.index)) for g in template.gpus)
    return replace(template, name=node_name, gpus=gpus)


def gpu_uuid(node_name: str, index: int) -> str:
    """NVML-style UUID (`GPU-xxxxxxxx-...`) of a fake GPU, stable across runs."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


def with_gpu_fabric(
    topology: NodeTopology,
    *,
    cluster_uuid: str,
    clique_id: int,
    state: FabricState = FabricState.COMPLETED,
) -> NodeTopology:
    """The topology with NVML fabric info on every GPU, as a multi-node NVLink rack reports it.

    All trays of one NVL72 rack share `cluster_uuid`; `clique_id` names the NVLink partition.
    """
    fabric = GpuFabric(cluster_uuid=cluster_uuid, clique_id=clique_id, state=state)
    return replace(topology, gpus=tuple(replace(g, fabric=fabric) for g in topology.gpus))


@dataclass(frozen=True, slots=True)
class ProfileSummary:
    """What `gputopo machines` lists for a profile."""

    name: str
    summary: str
    machine: str
    gpu_count: int
    gpu_product: str
    nic_count: int
    recording: str
    multi_node_nvlink: bool
    assumptions: tuple[str, ...]

    def line(self) -> str:
        """One line for a listing: name, GPUs, NICs, summary."""
        nics = f"{self.nic_count} NIC{'' if self.nic_count == 1 else 's'}"
        return f"{self.name:<24} {self.gpu_count}x {self.gpu_product:<24} {nics:<7} {self.summary}"


def describe_profiles() -> tuple[ProfileSummary, ...]:
    """A summary of every profile, in `PROFILES` order."""
    found = []
    for name in PROFILES:
        profile, machine = load_profile(name), _template(name)
        found.append(
            ProfileSummary(
                name=name,
                summary=profile.summary,
                machine=profile.machine,
                gpu_count=machine.gpu_count,
                gpu_product=profile.gpus.product,
                nic_count=len(machine.nics),
                recording=profile.recording.file,
                multi_node_nvlink=profile.multi_node_nvlink,
                assumptions=profile.assumptions,
            )
        )
    return tuple(found)
