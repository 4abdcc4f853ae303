"""Health: what is degraded, why, and what a degraded link still carries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from exporter.fake_machine import FakeMachine
from exporter.fake_nvml import FakeNvml
from exporter.health import ErrorCounterWatch, HealthPolicy
from exporter.nvml import Nvml
from exporter.readings import FabricReading
from gputopo.links import LinkHealth, LinkKind
from gputopo.nominal import link_nominal_gbps, with_nominal_bandwidth
from gputopo.topology import FabricState, NodeTopology, gpu, nic, numa
from tests.exporter.conftest import FakeNode


@dataclass(frozen=True)
class HealthCase:
    """A change to a healthy machine's hardware, and the health discovery should report."""

    profile: str
    change: Callable[[FakeNvml], None]
    want: Callable[[NodeTopology], None]


def _set(mapping_name: str, key: object, value: object) -> Callable[[FakeNvml], None]:
    def change(fake: FakeNvml) -> None:
        getattr(fake, mapping_name)[key] = value

    return change


def _down(*links: tuple[int, int]) -> Callable[[FakeNvml], None]:
    def change(fake: FakeNvml) -> None:
        for g, link in links:
            fake.set_nvlink_down(g, link)

    return change


def _want_one_lane_down_on_a_switch(t: NodeTopology) -> None:
    degraded = [lk for lk in t.gpu_links() if lk.health is LinkHealth.DEGRADED]
    assert sorted((lk.a.index, lk.b.index) for lk in degraded) == [
        (i, 3) if i < 3 else (3, i) for i in range(8) if i != 3
    ]
    for lk in degraded:
        assert (lk.code, lk.lanes, lk.max_lanes) == ("NV17", 17, 18)
        assert lk.nominal_gbps == 17 * 25.0
        assert lk.health_reason == "1 of 18 NVLinks to NVSwitch down"
    assert t.gpus[3].health is LinkHealth.DEGRADED
    assert t.gpus[3].health_reason == "1 of 18 NVLinks down"


def _want_direct_lane_down(t: NodeTopology) -> None:
    pair = t.gpu_link(0, 3)  # NV2 in the hybrid cube mesh
    assert pair is not None
    assert (pair.code, pair.max_lanes, pair.health) == ("NV1", 2, LinkHealth.DEGRADED)
    assert pair.nominal_gbps == 25.0
    assert pair.health_reason == "1 of 2 NVLinks down"
    others = [lk for lk in t.gpu_links() if lk.health is not LinkHealth.OK and lk.key != pair.key]
    assert others == []


def _want_pcie_fallback(t: NodeTopology) -> None:
    pair = t.gpu_link(0, 1)  # NV1 between GPU0 and GPU1; both ends of the one link go down
    assert pair is not None
    assert pair.kind.is_pcie
    assert pair.health is LinkHealth.DEGRADED
    assert pair.health_reason == f"all 1 NVLinks down: traffic goes over PCIe ({pair.code})"
    assert 0 < pair.nominal_gbps < 25.0


def _want_narrow_pcie(t: NodeTopology) -> None:
    g = t.gpus[2]
    assert (g.health, g.health_reason) == (LinkHealth.DEGRADED, "PCIe trained at x8 of x16")
    to_nic = t.link(gpu(2), nic(2))
    assert to_nic is not None
    assert to_nic.health is LinkHealth.DEGRADED
    assert to_nic.health_reason == "GPU2: PCIe trained at x8 of x16"
    assert to_nic.nominal_gbps == pytest.approx(8 * 3.938)  # Gen5 x8, below the NIC's 50 GB/s
    host = t.link(gpu(2), numa(0))
    assert host is not None
    assert host.health is LinkHealth.DEGRADED
    nvlinks = [lk for lk in t.gpu_links() if 2 in (lk.a.index, lk.b.index)]
    assert all(lk.health is LinkHealth.OK for lk in nvlinks)  # NVLink does not cross PCIe


def _want_idle_downshift_ignored(t: NodeTopology) -> None:
    assert t.gpus[1].health is LinkHealth.OK
    assert t.gpus[1].pcie_generation == 5
    assert t.degraded_links == ()


def _want_busy_downshift_degraded(t: NodeTopology) -> None:
    assert t.gpus[1].health_reason == "PCIe trained at Gen3 of Gen5 under load"
    assert t.gpus[1].pcie_generation == 3


def _want_fabric_in_progress(t: NodeTopology) -> None:
    g = t.gpus[0]
    assert g.health is LinkHealth.DEGRADED
    assert g.health_reason == "NVLink fabric registration in progress: NVLink not usable yet"
    for lk in t.gpu_links():
        if 0 in (lk.a.index, lk.b.index):
            assert lk.health is LinkHealth.DEGRADED
            assert lk.kind is LinkKind.NVLINK
            # Until the fabric is up, traffic gets the PCIe path: SYS between the Graces.
            assert lk.nominal_gbps < 60.0
        else:
            assert lk.health is LinkHealth.OK
            assert lk.nominal_gbps == 18 * 50.0


def _want_nic_down(t: NodeTopology) -> None:
    down = [lk for lk in t.links if lk.health is LinkHealth.DOWN]
    assert {lk.b for lk in down} == {nic(1)}
    reason = f"NIC {t.nics[1].name} is down"
    assert all(lk.health_reason == reason and lk.nominal_gbps == 0 for lk in down)
    assert 1 not in t.nearest_nics(0)


CASES = [
    pytest.param(
        HealthCase("dgx-h100", _down((3, 5)), _want_one_lane_down_on_a_switch),
        id="one of 18 switch lanes down degrades all 7 pairs of that GPU to NV17",
    ),
    pytest.param(
        HealthCase("dgx1-v100", _down((0, 2)), _want_direct_lane_down),
        id="one lane of a direct NV2 pair down: NV1, half the bandwidth, that pair only",
    ),
    pytest.param(
        HealthCase("dgx1-v100", _down((0, 0)), _want_pcie_fallback),
        id="a direct pair that lost its only lane talks over PCIe and says so",
    ),
    pytest.param(
        HealthCase("dgx-h100", _set("pcie_current", 2, (5, 8)), _want_narrow_pcie),
        id="PCIe trained x8 of x16 degrades the GPU's PCIe paths, not its NVLinks",
    ),
    pytest.param(
        HealthCase("dgx-h100", _set("pcie_current", 1, (1, 16)), _want_idle_downshift_ignored),
        id="an idle GPU at Gen1 is saving power, not degraded",
    ),
    pytest.param(
        HealthCase(
            "dgx-h100",
            lambda f: (f.pcie_current.__setitem__(1, (3, 16)), f.utilization.__setitem__(1, 80)),
            _want_busy_downshift_degraded,
        ),
        id="a busy GPU below its PCIe generation is degraded",
    ),
    pytest.param(
        HealthCase(
            "gb200-tray",
            _set(
                "fabric",
                0,
                FabricReading(
                    "7b968a6d-c8aa-45e1-9e07-e1e51be99c31", 1, int(FabricState.IN_PROGRESS)
                ),
            ),
            _want_fabric_in_progress,
        ),
        id="fabric registration in progress: the GPU's NVLinks count at PCIe speed",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_health(case: HealthCase, fake_node: Callable[..., FakeNode]) -> None:
    node = fake_node(case.profile)
    assert node.discovery.run().topology.degraded_links == ()
    case.change(node.nvml)
    case.want(node.discovery.run().topology)


def test_a_nic_that_is_down_takes_its_gpu_links_down(
    tmp_path: Path, fake_node: Callable[..., FakeNode]
) -> None:
    from exporter.discovery import Discovery
    from exporter.fake_sysfs import write_sysfs
    from exporter.sysfs import Sysfs

    node = fake_node("dgx-h100")
    root = write_sysfs(node.machine, tmp_path / "down", nic_up={1: False})
    topology = (
        Discovery(node_name="n", nvml=Nvml(node.nvml.library), sysfs=Sysfs(root)).run().topology
    )
    _want_nic_down(topology)


def test_error_counters_that_climb_degrade_the_link_and_recover_after_quiet_checks(
    fake_node: Callable[..., FakeNode],
) -> None:
    node = fake_node("dgx1-v100")  # direct links: GPU0's link 0 goes to GPU1
    discovery = node.discovery
    node.nvml.error_counts[(0, 0, "crc_flit")] = 5
    assert discovery.run().topology.degraded_links == ()  # a first reading is a baseline
    node.nvml.error_counts[(0, 0, "crc_flit")] = 45
    node.nvml.error_counts[(0, 0, "replay")] = 2
    climbing = discovery.run().topology
    (pair,) = climbing.degraded_links
    assert (pair.a, pair.b) == (gpu(0), gpu(1))
    assert pair.health_reason == "GPU0 NVLink 0: 2 replay, 40 crc flit errors since the last check"
    assert pair.nominal_gbps == 25.0  # the lanes are up: errors lower nothing we can count
    held = [discovery.run().topology.degraded_links for _ in range(3)]
    assert [len(h) for h in held] == [1, 1, 0]  # held for 3 checks, counting the climb


def test_a_counter_that_resets_is_a_new_baseline_not_a_climb() -> None:
    from exporter.readings import GpuReading, NvLinkReading, NvmlReading
    from gputopo.topology import NvmlStatus

    def reading(value: int) -> NvmlReading:
        link = NvLinkReading(link=0, active=True, errors={"replay": value})
        return NvmlReading(status=NvmlStatus(up=True), gpus=(GpuReading(0, nvlinks=(link,)),))

    watch = ErrorCounterWatch(HealthPolicy(error_increase=10))
    assert watch.update(reading(100)) == {}
    assert watch.update(reading(105)) == {}  # below the threshold
    assert watch.update(reading(3)) == {}  # driver reload reset it
    assert watch.update(reading(20)) == {
        (0, 0): "GPU0 NVLink 0: 17 replay errors since the last check"
    }


@pytest.mark.parametrize("profile", ["dgx-h100", "hgx-a100-roce", "workstation-2x-rtx5090"])
def test_nominal_bandwidth_set_by_copying_only_what_changes_is_the_same(profile: str) -> None:
    """`with_nominal_bandwidth` copies only what changes: the facts table's figures from no
    figures, from its own figures (the same object back), and after a link went down."""
    topology = FakeMachine.from_profile(profile, node_name="n").topology
    bare = replace(topology, links=tuple(replace(lk, nominal_gbps=0.0) for lk in topology.links))
    set_once = with_nominal_bandwidth(bare)
    assert [lk.nominal_gbps for lk in set_once.links] == [
        link_nominal_gbps(bare, lk) for lk in bare.links
    ]
    assert with_nominal_bandwidth(set_once) is set_once
    down = replace(
        set_once,
        links=(replace(set_once.links[0], health=LinkHealth.DOWN), *set_once.links[1:]),
    )
    assert with_nominal_bandwidth(down).links[0].nominal_gbps == 0.0
    assert with_nominal_bandwidth(down).links[1:] == set_once.links[1:]
