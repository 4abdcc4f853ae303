"""Trust, but verify: the kubelet's GPUs against gputopo's record, counted, told, and held."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from aggregator.choices import Mismatch
from aggregator.ingest import IngestStats
from aggregator.metrics import AggregatorCollector, Sources
from aggregator.state import ClusterState
from gputopo.gpu_use import GpuHolder, GpuUse
from gputopo.runtime.kube import KubeClient
from tests.aggregator.kubeutil import aggregator, eventually, run
from tests.builders import pcie_node
from tests.harness.kube import KubeApiServer
from tests.harness.kube_scope import KubeScope


def recorded_pod(name: str, gpus: str) -> dict[str, Any]:
    count = len(gpus.split(","))
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": {"gputopo.io/gpus": gpus}},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(count)}}}],
        },
        "status": {"phase": "Running"},
    }


def kubelet(**by_pod: tuple[int, ...]) -> GpuUse:
    return GpuUse(
        held={
            g: GpuHolder("ns", pod, "c", "nvidia.com/gpu") for pod, gs in by_pod.items() for g in gs
        }
    )


def test_other_gpus_than_recorded_are_counted_told_and_the_kubelets_are_held() -> None:
    state = ClusterState(clock=lambda: 1000.0)
    state.add_static(pcie_node("n1", gpus=8))
    told: list[Mismatch] = []
    state.choices.listeners.append(told.append)
    state.pod_seen(recorded_pod("a", "0,1"))
    state.pod_seen(recorded_pod("b", "4,5"))
    state.set_kubelet_use("n1", kubelet(a=(2, 3), b=(4,)))  # b: mid-admission, both recorded
    assert told == [Mismatch("n1", "ns/a", frozenset({0, 1}), frozenset({2, 3}))]
    assert "GPUs 2,3 on n1, gputopo recorded 0,1" in told[0].message
    assert state.choices.counts == {"n1": 1}
    # a holds what the kubelet gave (2, 3), not its record; b what the kubelet gave so far (4)
    assert state.snapshot().node("n1").free == frozenset({0, 1, 5, 6, 7})
    state.set_kubelet_use("n1", kubelet(a=(2, 3), b=(4, 5)))  # the same answer again
    assert state.choices.counts == {"n1": 1}

    registry = CollectorRegistry()
    registry.register(AggregatorCollector(Sources(state=state, ingest=IngestStats())))
    sample = registry.get_sample_value("gputopo_gpu_choice_mismatches_total", {"node": "n1"})
    assert sample == 1


def test_the_recorded_gpus_are_no_mismatch() -> None:
    state = ClusterState(clock=lambda: 1000.0)
    state.add_static(pcie_node("n1", gpus=8))
    state.pod_seen(recorded_pod("a", "6,7"))
    state.set_kubelet_use("n1", kubelet(a=(7, 6)))
    assert not state.choices.counts


def test_a_mismatch_puts_a_warning_event_on_the_pod(
    kube_apiserver: KubeApiServer, kube_scope: KubeScope
) -> None:
    ns = kube_scope.namespace

    async def body() -> None:
        async with aggregator(kube_apiserver) as agg:
            agg.state.add_static(pcie_node("n1", gpus=8))
            pod = recorded_pod("a", "0,1")
            pod["metadata"]["namespace"] = ns
            agg.state.pod_seen(pod)
            agg.state.set_kubelet_use(
                "n1", GpuUse(held={g: GpuHolder(ns, "a", "c", "nvidia.com/gpu") for g in (5, 6)})
            )
            admin = KubeClient(kube_apiserver.api_client())
            try:

                async def told() -> bool:
                    events = (await admin.request("GET", f"/api/v1/namespaces/{ns}/events"))[
                        "items"
                    ]
                    return any(
                        e["reason"] == "GpuChoiceMismatch"
                        and e["type"] == "Warning"
                        and e["involvedObject"]["name"] == "a"
                        and "GPUs 5,6 on n1" in e["message"]
                        for e in events
                    )

                await eventually(told, timeout_s=30, what="a GpuChoiceMismatch Event on the pod")
            finally:
                admin.close()

    run(body())
