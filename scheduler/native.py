"""Which native group API (`scheduling.k8s.io` Workload/PodGroup) the API server serves.

The Workload API moved between versions as it matured (the `introduced=` tags of k8s.io/api
`scheduling/*/types.go`): Kubernetes 1.35 serves only `Workload` at v1alpha1 (pods point at
it with `spec.workloadRef`); 1.36 adds the `PodGroup` object at v1alpha2 (pods point at it with
`spec.schedulingGroup.podGroupName`); 1.37 serves both at v1beta1. A binder that assumed one
version would read nothing on the others, and `scheduling.k8s.io/v1beta1` also exists on old
servers for `priorityclasses` (1.11 to 1.21), so the group version alone proves nothing: the
binder asks API discovery which version lists which resource, and reads the newest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

__all__ = [
    "COSCHEDULING_PATH",
    "GROUP",
    "KNOWN_VERSIONS",
    "NativeApi",
    "native_api",
    "resources_of",
]

GROUP = "scheduling.k8s.io"
# Newest first: the first version that lists a resource is the one read.
KNOWN_VERSIONS = ("v1beta1", "v1alpha2", "v1alpha1")
COSCHEDULING_PATH = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}"


@dataclass(frozen=True, slots=True)
class NativeApi:
    """The versions to read native `PodGroup`s and `Workload`s at (None: not served)."""

    podgroup_version: str | None = None
    workload_version: str | None = None

    def podgroup_path(self, namespace: str, name: str) -> str | None:
        """The object path of a native PodGroup, or None when the server serves none."""
        if self.podgroup_version is None:
            return None
        return (
            f"/apis/{GROUP}/{self.podgroup_version}/namespaces/{quote(namespace)}"
            f"/podgroups/{quote(name)}"
        )

    def workload_path(self, namespace: str, name: str) -> str | None:
        """The object path of a Workload, or None when the server serves none."""
        if self.workload_version is None:
            return None
        return (
            f"/apis/{GROUP}/{self.workload_version}/namespaces/{quote(namespace)}"
            f"/workloads/{quote(name)}"
        )


def resources_of(discovery: Mapping[str, object]) -> frozenset[str]:
    """The resource names an `APIResourceList` (GET /apis/GROUP/VERSION) lists, without
    subresources (`podgroups/status`)."""
    out = set()
    resources = discovery.get("resources")
    for item in resources if isinstance(resources, list) else []:
        name = item.get("name") if isinstance(item, Mapping) else None
        if isinstance(name, str) and "/" not in name:
            out.add(name)
    return frozenset(out)


def native_api(served: Mapping[str, Iterable[str]]) -> NativeApi:
    """From version -> resources served (discovery), the newest version of each kind."""

    def newest(resource: str) -> str | None:
        for version in KNOWN_VERSIONS:
            if resource in set(served.get(version, ())):
                return version
        return None

    return NativeApi(podgroup_version=newest("podgroups"), workload_version=newest("workloads"))
