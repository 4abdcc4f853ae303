"""The GPU Feature Discovery labels a machine profile carries, spelt as GFD writes them."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from gputopo.machines import PROFILES, gfd_labels, load_machine, with_gpu_fabric
from gputopo.topology import FabricState

CLUSTER_UUID = "9277d399-0674-44a9-b64e-d85bb19ce2b0"


@dataclass(frozen=True)
class Case:
    profile: str
    want: dict[str, str]


CASES = [
    pytest.param(
        Case(
            "dgx-h100",
            {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81559",
            },
        ),
        id="a DGX H100: product with spaces as dashes, 8 GPUs, MiB of one GPU",
    ),
    pytest.param(
        Case(
            "gb200-tray",
            {
                "nvidia.com/gpu.product": "NVIDIA-GB200",
                "nvidia.com/gpu.count": "4",
                "nvidia.com/gpu.memory": "189471",
            },
        ),
        id="a GB200 tray not yet in a rack: no clique",
    ),
    pytest.param(
        Case(
            "dgx1-v100",
            {
                "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "16384",
            },
        ),
        id="a Tesla-branded product keeps its brand",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_a_profile_carries_the_labels_gfd_would_write(case: Case) -> None:
    assert gfd_labels(load_machine(case.profile, node_name="n")) == case.want


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_has_valid_label_values(profile: str) -> None:
    labels = gfd_labels(load_machine(profile, node_name="n"))
    assert set(labels) >= {"nvidia.com/gpu.product", "nvidia.com/gpu.count"}
    assert all(len(v) <= 63 and " " not in v for v in labels.values())


def test_a_tray_in_a_registered_clique_gets_the_clique_label() -> None:
    tray = with_gpu_fabric(
        load_machine("gb200-tray", node_name="n"), cluster_uuid=CLUSTER_UUID, clique_id=3
    )
    assert gfd_labels(tray)["nvidia.com/gpu.clique"] == f"{CLUSTER_UUID}.3"


def test_no_clique_label_when_gpus_disagree_or_registration_is_not_complete() -> None:
    tray = with_gpu_fabric(
        load_machine("gb200-tray", node_name="n"), cluster_uuid=CLUSTER_UUID, clique_id=3
    )
    split = replace(tray, gpus=(replace(tray.gpus[0], fabric=None), *tray.gpus[1:]))
    assert "nvidia.com/gpu.clique" not in gfd_labels(split)
    pending = with_gpu_fabric(
        load_machine("gb200-tray", node_name="n"),
        cluster_uuid=CLUSTER_UUID,
        clique_id=3,
        state=FabricState.IN_PROGRESS,
    )
    assert "nvidia.com/gpu.clique" not in gfd_labels(pending)


def test_a_node_without_gpus_has_no_gfd_labels() -> None:
    machine = load_machine("dgx-h100", node_name="n")
    assert gfd_labels(replace(machine, gpus=(), links=())) == {}
