"""Cluster and trace sources of the simulator, read from the copies in tests/data/traces."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gputopo.sim.clusters import (
    ClusterSourceError,
    lingjun_cluster,
    load_cluster,
    nvl72_cluster,
    openb_cluster,
)
from gputopo.sim.traces import (
    JobClass,
    TraceSourceError,
    kalos_jobs,
    llm_mix,
    openb_jobs,
    read_trace,
)

DATA = Path(__file__).parent.parent / "data" / "traces"


def test_lingjun_hosts_become_leaf_spine_core_tiers() -> None:
    cluster = lingjun_cluster((DATA / "alibaba_lingjun2023_topo.csv").read_text())
    assert len(cluster.nodes) == 847
    assert cluster.gpus == 847 * 8
    leaves = {n.fabric.tiers for n in cluster.nodes}
    assert len({t[1:] for t in leaves}) == 3  # 3 aggregation switches under 1 core
    assert len({t[2] for t in leaves}) == 1  # one core switch
    assert len(leaves) == 119  # 119 ToR switches, each named with its path
    assert len({n.name for n in cluster.nodes}) == 847


def test_lingjun_takes_a_node_profile_and_refuses_an_unknown_one() -> None:
    text = "ip,DSW,PSW,ASW\nx,G1,P1,S1\n"
    assert lingjun_cluster(text, profile="gb200-tray").nodes[0].gpu_count == 4
    with pytest.raises(ClusterSourceError, match="node profile 'nope' is unknown"):
        lingjun_cluster(text, profile="nope")
    with pytest.raises(ClusterSourceError, match="missing column"):
        lingjun_cluster("ip,DSW\nx,G1\n")


def test_openb_nodes_keep_their_gpu_counts() -> None:
    text = (DATA / "alibaba_v2023_openb_node_list_gpu_node_every25th.csv").read_text()
    cluster = openb_cluster(text)
    counts = sorted({n.gpu_count for n in cluster.nodes})
    assert counts == [1, 2, 4, 8]
    assert len(cluster.nodes) == 49


def test_nvl72_racks_are_nvlink_domains_under_leaves() -> None:
    cluster = nvl72_cluster(9)
    assert len(cluster.nodes) == 9 * 18
    assert len({n.fabric.accelerator_domain for n in cluster.nodes}) == 9
    assert len({n.fabric.tiers[0] for n in cluster.nodes}) == 2  # 8 racks per leaf
    with pytest.raises(ClusterSourceError, match="at least 1 rack"):
        nvl72_cluster(0)


def test_load_cluster_names_the_bad_source() -> None:
    with pytest.raises(ClusterSourceError, match="unknown cluster kind 'slurm'"):
        load_cluster("slurm:x")
    with pytest.raises(ClusterSourceError, match="nvl72 takes a number"):
        load_cluster("nvl72:many")
    with pytest.raises(ClusterSourceError, match=r"missing\.csv"):
        load_cluster("lingjun:missing.csv")
    inventory = load_cluster(str(Path(__file__).parent.parent / "data" / "inventory_small.yaml"))
    assert inventory.nodes


def test_openb_default_list_has_arrivals_and_durations() -> None:
    text = (DATA / "alibaba_v2023_openb_pod_list_default_head80.csv").read_text()
    jobs = openb_jobs(text)
    assert jobs
    assert all(j.job_class is JobClass.POD for j in jobs)
    assert all(j.gpus >= 1 for j in jobs)  # CPU-only pods are left out
    first = jobs[0]  # openb-pod-0000: created 0, scheduled 0, deleted 12537496
    assert (first.arrival, first.duration) == (0.0, 12537496.0)
    assert all(math.isfinite(j.duration) and j.duration >= 1 for j in jobs)


def test_openb_multigpu50_arrives_all_at_once_and_never_leaves() -> None:
    text = (DATA / "alibaba_v2023_openb_pod_list_multigpu50_head200.csv").read_text()
    jobs = openb_jobs(text)
    assert len(jobs) == 193  # 200 pods, 7 without GPUs
    assert all(j.arrival == 0 and math.isinf(j.duration) for j in jobs)


def test_kalos_jobs_are_gangs_split_onto_small_nodes() -> None:
    text = (DATA / "acme_kalos_converted_hyunnnchoi.csv").read_text()
    jobs = kalos_jobs(text)
    assert len(jobs) == 319
    biggest = max(jobs, key=lambda j: j.gpus)
    assert biggest.gpus == 1024
    assert {j.job_class for j in jobs} == {JobClass.PRETRAIN, JobClass.FINETUNE}
    assert jobs[0].duration == 208 * 0.5  # num_iteration x 0.5 s
    on_trays = kalos_jobs(text, node_gpus=4)
    group = max(on_trays, key=lambda j: j.gpus).request.groups[0]
    assert (group.pods, group.gpus_per_pod) == (256, 4)


def test_trace_errors_name_the_row_and_column() -> None:
    with pytest.raises(TraceSourceError, match=r"row 2: num_gpu: not a number"):
        openb_jobs("name,num_gpu\np,x\n")
    with pytest.raises(TraceSourceError, match="missing column"):
        kalos_jobs("job_id\n1\n")
    with pytest.raises(TraceSourceError, match="unknown trace kind"):
        read_trace("philly:x", cluster_gpus=8)
    with pytest.raises(TraceSourceError, match="llm:JOBS"):
        read_trace("llm:ten", cluster_gpus=8)


def test_llm_mix_is_seeded_and_covers_every_shape() -> None:
    a = llm_mix(400, seed=7, cluster_gpus=1024)
    b = llm_mix(400, seed=7, cluster_gpus=1024)
    c = llm_mix(400, seed=8, cluster_gpus=1024)
    assert a == b
    assert a != c
    classes = {j.job_class for j in a}
    assert classes == {JobClass.TRAIN, JobClass.SMALL, JobClass.SERVE}
    serving = [j for j in a if j.serving]
    assert all({g.name for g in j.request.groups} == {"prefill", "decode"} for j in serving)
    # Some training gangs have pods smaller than their TP group: a count-only scheduler may cut it.
    assert any(j.tp > j.request.groups[0].gpus_per_pod for j in a if j.job_class is JobClass.TRAIN)
    arrivals = [j.arrival for j in a]
    assert arrivals == sorted(arrivals)
    # No required scope: every policy gets the same freedom.
    assert all(j.request.scope.required is None for j in a)


def test_a_file_trace_can_be_replayed_faster() -> None:
    path = DATA / "acme_kalos_converted_hyunnnchoi.csv"
    plain = read_trace(f"kalos:{path}", cluster_gpus=8)
    fast = read_trace(f"kalos:{path}@0.05", cluster_gpus=8)
    assert [j.arrival * 0.05 for j in plain] == pytest.approx([j.arrival for j in fast])
    assert [j.duration for j in plain] == [j.duration for j in fast]
    with pytest.raises(TraceSourceError, match="time scale"):
        read_trace(f"kalos:{path}@0", cluster_gpus=8)
