"""What the gang binder needs from the cluster, checked once before it starts.

Without its namespace or its RBAC the binder would start and then fail on every call: the
leader election alone warns every 2 s forever, and no line says what to do. So before serving it
asks the API server (a GET of the namespace, then SelfSubjectAccessReviews, which need no
permission of their own) and, when something is missing, says in one line what and how to fix it.

The checks follow the manifests (deploy/scheduler/rbac.yaml): leader election in its namespace,
watch and bind pods everywhere, record on them, events. The optional group APIs (coscheduling
PodGroups, native Workloads) are not required: the binder works without them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gputopo.runtime.kube import KubeClient, KubeError, NotFoundError

__all__ = ["Need", "missing", "needs"]

log = logging.getLogger(__name__)

FIX = "apply the manifests: kubectl apply --server-side -k deploy/overlays/default"


@dataclass(frozen=True, slots=True)
class Need:
    """One permission: `verb` on `resource` (`/subresource`), cluster-wide or in `namespace`."""

    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    namespaced: bool = False
    name: str = ""

    def text(self, namespace: str) -> str:
        """As `kubectl auth can-i` would name it."""
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        if self.group:
            what += f".{self.group}"
        if self.name:
            what += f" {self.name}"
        where = f"in namespace {namespace}" if self.namespaced else "cluster-wide"
        return f"{self.verb} {what} {where}"


def needs(*, leader_election: bool, lease_name: str) -> list[Need]:
    """The permissions the binder uses (deploy/scheduler/rbac.yaml grants exactly these)."""
    out = [
        Need("list", "pods"),
        Need("watch", "pods"),
        Need("patch", "pods"),
        Need("create", "pods", subresource="binding"),
        Need("patch", "pods", subresource="status"),
        Need("create", "events"),
    ]
    if leader_election:
        out += [
            Need("create", "leases", group="coordination.k8s.io", namespaced=True),
            Need("get", "leases", group="coordination.k8s.io", namespaced=True, name=lease_name),
            Need("update", "leases", group="coordination.k8s.io", namespaced=True, name=lease_name),
        ]
    return out


async def missing(
    kube: KubeClient,
    *,
    namespace: str,
    leader_election: bool,
    lease_name: str = "gputopo-scheduler",
) -> str | None:
    """One line naming what is missing and how to fix it, or None when all is there."""
    try:
        if leader_election:
            try:
                await kube.request("GET", f"/api/v1/namespaces/{namespace}")
            except NotFoundError:
                return f"namespace {namespace} does not exist (--namespace): {FIX}"
            except KubeError as err:
                if err.status != 403:  # may not read namespaces: the RBAC checks say more
                    raise
        for need in needs(leader_election=leader_election, lease_name=lease_name):
            allowed = await kube.can_i(
                need.verb,
                need.resource,
                group=need.group,
                subresource=need.subresource,
                namespace=namespace if need.namespaced else "",
                name=need.name,
            )
            if not allowed:
                return (
                    f"RBAC: this account may not {need.text(namespace)} "
                    f"(deploy/scheduler/rbac.yaml grants it): {FIX}"
                )
    except KubeError as err:
        # The API server unreachable or odd: the binder's own retries handle that, as before.
        log.warning("could not check the cluster for the binder's namespace and RBAC: %s", err)
    return None
