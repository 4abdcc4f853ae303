"""Which native group API a server serves, found by discovery, on discovery documents written
from the upstream `introduced=` tags (k8s.io/api `scheduling/*/types.go`) for 1.35 to 1.37, and
on the real 1.20 test server (which serves `scheduling.k8s.io/v1beta1` for priorityclasses only).
"""

from __future__ import annotations

from typing import Any

import pytest

from gputopo.runtime.kube import KubeClient
from scheduler.binder import Binder, BinderConfig
from scheduler.native import NativeApi, native_api, resources_of
from tests.aggregator.kubeutil import run
from tests.harness.kube import KubeApiServer


def _resource_list(version: str, *names: str) -> dict[str, Any]:
    """An APIResourceList as GET /apis/scheduling.k8s.io/VERSION answers it."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"scheduling.k8s.io/{version}",
        "resources": [{"name": n, "namespaced": n != "priorityclasses"} for n in names],
    }


# version -> resources, per Kubernetes minor (PriorityClass v1 since 1.14, v1beta1 until 1.21;
# Workload v1alpha1 in 1.35; PodGroup and Workload v1alpha2 in 1.36; both v1beta1 in 1.37).
SERVED: dict[str, dict[str, tuple[str, ...]]] = {
    "1.20": {"v1": ("priorityclasses",), "v1beta1": ("priorityclasses",)},
    "1.35": {"v1": ("priorityclasses",), "v1alpha1": ("workloads",)},
    "1.36": {
        "v1": ("priorityclasses",),
        "v1alpha2": ("podgroups", "podgroups/status", "workloads"),
    },
    "1.37": {
        "v1": ("priorityclasses",),
        "v1beta1": ("podgroups", "podgroups/status", "workloads"),
        "v1alpha2": ("podgroups", "podgroups/status", "workloads"),
    },
}


@pytest.mark.parametrize(
    ("minor", "want"),
    [
        pytest.param(
            "1.20", NativeApi(None, None), id="1.20: v1beta1 is PriorityClass, not groups"
        ),
        pytest.param("1.35", NativeApi(None, "v1alpha1"), id="1.35: Workload v1alpha1 only"),
        pytest.param("1.36", NativeApi("v1alpha2", "v1alpha2"), id="1.36: PodGroup v1alpha2"),
        pytest.param("1.37", NativeApi("v1beta1", "v1beta1"), id="1.37: v1beta1, the newest"),
    ],
)
def test_the_native_api_is_the_newest_version_discovery_lists(minor: str, want: NativeApi) -> None:
    served = {v: resources_of(_resource_list(v, *names)) for v, names in SERVED[minor].items()}
    assert native_api(served) == want


def test_paths_follow_the_discovered_version() -> None:
    api = NativeApi("v1alpha2", "v1alpha1")
    assert api.podgroup_path("ml", "t-0") == (
        "/apis/scheduling.k8s.io/v1alpha2/namespaces/ml/podgroups/t-0"
    )
    assert (
        api.workload_path("ml", "t") == "/apis/scheduling.k8s.io/v1alpha1/namespaces/ml/workloads/t"
    )
    assert NativeApi().podgroup_path("ml", "t") is None


def test_subresources_are_not_resources() -> None:
    assert resources_of(_resource_list("v1", "podgroups/status")) == frozenset()
    assert resources_of({"resources": "junk"}) == frozenset()


def test_the_binder_discovers_no_native_groups_on_the_1_20_server(
    kube_apiserver: KubeApiServer,
) -> None:
    async def body() -> None:
        kube = KubeClient(kube_apiserver.api_client())
        try:
            binder = Binder(kube, None, BinderConfig())  # type: ignore[arg-type]
            assert await binder._native_api() == NativeApi(None, None)
        finally:
            kube.close()

    run(body(), timeout_s=30)
