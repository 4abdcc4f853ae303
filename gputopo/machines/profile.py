"""Machine profiles: a recording plus the few facts it lacks, each with the reason it is there.

A profile file (`profiles/<name>.yaml`) names one recording and its format, the GPU and NIC
facts recordings do not hold (product, memory, link generations, NIC kind and speed), and an
ordered list of overrides that complete or change the recorded topology. Every section and every
override carries a one-line `why:` citing the recording or source that justifies it, and an
`assumed:` line when the fact is not in any recording. Unknown keys are errors, so a typo cannot
silently drop a fact. `gputopo.machines.build` turns a profile into a machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast, get_args

from gputopo.importers import DeviceClass, RecordingFormat
from gputopo.links import LinkKind, link_kind_from_code
from gputopo.topology import NicKind

__all__ = [
    "Change",
    "FillGpuNic",
    "GpuFacts",
    "GpuSettings",
    "MeasuredPairs",
    "NicFacts",
    "NumaByCpuAffinity",
    "NvSwitch",
    "NvlinkPairs",
    "Override",
    "Profile",
    "ProfileError",
    "RecordingRef",
    "parse_profile",
]


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class RecordingRef:
    """Which recording a profile is built from, and how to read it."""

    file: str
    format: RecordingFormat
    assume_classes: Mapping[str, DeviceClass]
    why: str = ""
    assumed: str = ""


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """Facts about every GPU of the machine; 0 or "" keeps what the recording says."""

    product: str
    memory_mib: int
    compute_capability: str = ""
    nvlink_generation: int = 0
    pcie_generation: int = 0
    pcie_width: int = 0
    why: str = ""
    assumed: str = ""


@dataclass(frozen=True, slots=True)
class NicFacts:
    """Kind and line rate of every NIC of the machine."""

    kind: NicKind
    speed_mbps: int
    why: str = ""
    assumed: str = ""


# Overrides: each is one small change to the recorded topology.


@dataclass(frozen=True, slots=True)
class NvSwitch:
    """All GPUs are NVLink peers through NVSwitch with `lanes` links each.

    `evidence` names an `nvidia-smi nvlink -s/-R` recording; its GPU `evidence_gpu` must list
    exactly `lanes` links (and, for `-s`, the per-link speed the facts table has).
    """

    lanes: int
    evidence: str = ""
    evidence_gpu: int = 0


@dataclass(frozen=True, slots=True)
class NvlinkPairs:
    """Direct NVLink (bridges) between the listed GPU pairs."""

    pairs: tuple[tuple[int, int], ...]
    lanes: int


@dataclass(frozen=True, slots=True)
class FillGpuNic:
    """Every GPU-NIC pair the recording lacks gets this path class."""

    kind: LinkKind


@dataclass(frozen=True, slots=True)
class GpuSettings:
    """Per-GPU facts the recording lacks (a cut row)."""

    index: int
    numa_node: int | None = None
    cpu_affinity: str = ""


@dataclass(frozen=True, slots=True)
class NumaByCpuAffinity:
    """GPU NUMA nodes from their CPU affinity, for drivers that print no NUMA column."""

    nodes: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class MeasuredPairs:
    """Attach an nccl-tests result (recording `evidence`) as the measurement of GPU pairs."""

    pairs: tuple[tuple[int, int], ...]
    evidence: str


Change = NvSwitch | NvlinkPairs | FillGpuNic | GpuSettings | NumaByCpuAffinity | MeasuredPairs


@dataclass(frozen=True, slots=True)
class Override:
    """One change to the recorded topology and the reason for it."""

    change: Change
    why: str
    assumed: str = ""


@dataclass(frozen=True, slots=True)
class Profile:
    """A fake machine: a recording, the facts it lacks, and the overrides that complete it."""

    name: str
    summary: str
    machine: str
    recording: RecordingRef
    gpus: GpuFacts
    nics: NicFacts | None
    overrides: tuple[Override, ...]
    multi_node_nvlink: bool = False

    @property
    def assumptions(self) -> tuple[str, ...]:
        """Every fact of the profile that no recording backs, one line each."""
        found = [
            (where, assumed)
            for where, assumed in (
                ("recording", self.recording.assumed),
                ("gpus", self.gpus.assumed),
                ("nics", self.nics.assumed if self.nics else ""),
                *((f"overrides[{i}]", o.assumed) for i, o in enumerate(self.overrides)),
            )
            if assumed
        ]
        return tuple(f"{where}: {text}" for where, text in found)


# ---------------------------------------------------------------------------------------------
# Reading a profile file

_NIC_KINDS = {
    "infiniband": NicKind.INFINIBAND,
    "roce": NicKind.ROCE,
    "ethernet": NicKind.ETHERNET,
    "efa": NicKind.EFA,
}


def parse_profile(name: str, data: object) -> Profile:
    """A `Profile` from the parsed YAML of `profiles/<name>.yaml`; `ProfileError` if invalid."""
    top = _Section(f"profiles/{name}.yaml", data)
    top.keys({"summary", "machine", "recording", "gpus", "nics", "overrides", "multi_node_nvlink"})
    rec = top.section("recording")
    rec.keys({"file", "format", "assume_classes", "why", "assumed"})
    fmt = rec.text("format")
    if fmt not in get_args(RecordingFormat):
        raise rec.error(f"format {fmt!r} is not one of {get_args(RecordingFormat)}")
    classes = rec.mapping("assume_classes")
    if any(v not in get_args(DeviceClass) for v in classes.values()):
        raise rec.error("assume_classes values must be 'gpu' or 'nic'")
    if classes and not rec.text("why", ""):
        raise rec.error("assume_classes needs a why: line saying how the classes were decided")
    recording = RecordingRef(
        file=rec.text("file"),
        format=cast(RecordingFormat, fmt),
        assume_classes={str(k).lower(): cast(DeviceClass, v) for k, v in classes.items()},
        why=rec.text("why", ""),
        assumed=rec.text("assumed", ""),
    )
    g = top.section("gpus")
    g.keys(
        {
            "product",
            "memory_mib",
            "compute_capability",
            "nvlink_generation",
            "pcie_generation",
            "pcie_width",
            "why",
            "assumed",
        }
    )
    gpus = GpuFacts(
        product=g.text("product"),
        memory_mib=g.integer("memory_mib"),
        compute_capability=g.text("compute_capability", ""),
        nvlink_generation=g.integer("nvlink_generation", 0),
        pcie_generation=g.integer("pcie_generation", 0),
        pcie_width=g.integer("pcie_width", 0),
        why=g.text("why"),
        assumed=g.text("assumed", ""),
    )
    nics = None
    if top.has("nics"):
        n = top.section("nics")
        n.keys({"kind", "speed_mbps", "why", "assumed"})
        kind = n.text("kind")
        if kind not in _NIC_KINDS:
            raise n.error(f"kind {kind!r} is not one of {sorted(_NIC_KINDS)}")
        nics = NicFacts(
            _NIC_KINDS[kind], n.integer("speed_mbps"), n.text("why"), n.text("assumed", "")
        )
    overrides = tuple(
        _override(top.child(f"overrides[{i}]", item))
        for i, item in enumerate(top.items("overrides"))
    )
    multi = top.raw("multi_node_nvlink", False)
    if not isinstance(multi, bool):
        raise top.error("multi_node_nvlink must be true or false")
    return Profile(
        name=name,
        summary=top.text("summary"),
        machine=top.text("machine"),
        recording=recording,
        gpus=gpus,
        nics=nics,
        overrides=overrides,
        multi_node_nvlink=multi,
    )


def _override(section: _Section) -> Override:
    ops = {"nvswitch", "nvlink_pairs", "fill_gpu_nic", "gpu", "numa_by_cpu_affinity", "measured"}
    section.keys(ops | {"why", "assumed"})
    present = [op for op in ops if section.has(op)]
    if len(present) != 1:
        raise section.error(f"needs exactly one of {sorted(ops)}, found {sorted(present)}")
    op = present[0]
    change: Change
    if op == "fill_gpu_nic":
        kind, _ = link_kind_from_code(section.text(op))
        change = FillGpuNic(kind)
    elif op == "numa_by_cpu_affinity":
        change = NumaByCpuAffinity({str(k): int(v) for k, v in section.mapping(op).items()})
    else:
        args = section.section(op)
        if op == "nvswitch":
            args.keys({"lanes", "evidence", "evidence_gpu"})
            change = NvSwitch(
                args.integer("lanes"), args.text("evidence", ""), args.integer("evidence_gpu", 0)
            )
        elif op == "nvlink_pairs":
            args.keys({"pairs", "lanes"})
            change = NvlinkPairs(args.pairs("pairs"), args.integer("lanes"))
        elif op == "gpu":
            args.keys({"index", "numa_node", "cpu_affinity"})
            numa = args.raw("numa_node", None)
            change = GpuSettings(
                args.integer("index"),
                int(numa) if numa is not None else None,
                args.text("cpu_affinity", ""),
            )
        else:
            args.keys({"pairs", "evidence"})
            change = MeasuredPairs(args.pairs("pairs"), args.text("evidence"))
    return Override(change, section.text("why"), section.text("assumed", ""))


class _Section:
    """A mapping from the YAML with errors that say which file and key are wrong."""

    def __init__(self, where: str, data: object) -> None:
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: expected a mapping")
        self.where = where
        self.data = cast(dict[str, Any], data)

    def error(self, reason: str) -> ProfileError:
        return ProfileError(f"{self.where}: {reason}")

    def keys(self, allowed: set[str]) -> None:
        unknown = sorted(set(self.data) - allowed)
        if unknown:
            raise self.error(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})")

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: object = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise self.error(f"missing key {key!r}")
            return default
        return self.data[key]

    def text(self, key: str, default: str | None = None) -> str:
        value = self.raw(key, ... if default is None else default)
        if not isinstance(value, str) or "\n" in value.strip():
            raise self.error(f"{key} must be one line of text")
        return value.strip()

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.raw(key, ... if default is None else default)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(f"{key} must be a whole number")
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.raw(key, {})
        if not isinstance(value, dict):
            raise self.error(f"{key} must be a mapping")
        return value

    def section(self, key: str) -> _Section:
        return _Section(f"{self.where}: {key}", self.raw(key))

    def child(self, where: str, data: object) -> _Section:
        return _Section(f"{self.where}: {where}", data)

    def items(self, key: str) -> list[object]:
        value = self.raw(key, [])
        if not isinstance(value, list):
            raise self.error(f"{key} must be a list")
        return value

    def pairs(self, key: str) -> tuple[tuple[int, int], ...]:
        value = self.raw(key)
        ok = isinstance(value, list) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(i, int) for i in p)
            for p in value
        )
        if not ok:
            raise self.error(f"{key} must be a list of [i, j] GPU index pairs")
        return tuple((min(p), max(p)) for p in value)
