"""The test harness against a real kube-apiserver: the behaviours the project relies on.

Each test asserts what the server really answered (status codes, stored fields), so that a
harness that started the wrong thing, or a client that swallowed an error, fails here first.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.harness import kube as kube_module
from tests.harness.kube import (
    BINARY_ENV,
    BUILD_SCRIPT,
    CACHE_DIR_ENV,
    BinaryNotFoundError,
    KubeApiServer,
    KubeStartupError,
    find_binary,
)
from tests.harness.kube_scope import SCOPE_LABEL, KubeScope

pytestmark = pytest.mark.kube

SCHEDULER_NAME = "gputopo-test-scheduler"
T = TypeVar("T")


def eventually(check: Callable[[], T], *, timeout_s: float = 10.0) -> T:
    """Retry `check` until it stops raising AssertionError or ApiException, or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check()
        except (AssertionError, ApiException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def api_status(call: Callable[[], object]) -> int:
    """The HTTP status of an API call that is expected to fail."""
    with pytest.raises(ApiException) as error:
        call()
    return int(error.value.status)


def node(name: str, labels: dict[str, str]) -> k8s.V1Node:
    return k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name, labels=labels))


@pytest.fixture
def core(kube_scope: KubeScope) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_scope.api_client())


def test_node_labels_are_patched_and_selected(kube_scope: KubeScope, core: k8s.CoreV1Api) -> None:
    first, second = kube_scope.name("gpu-node-a"), kube_scope.name("gpu-node-b")
    created = core.create_node(node(first, kube_scope.labels))
    core.create_node(node(second, kube_scope.labels))

    patched = core.patch_node(first, {"metadata": {"labels": {"gputopo.test/fabric": "nvlink"}}})

    assert patched.metadata.labels["gputopo.test/fabric"] == "nvlink"
    assert patched.metadata.resource_version != created.metadata.resource_version
    selector = f"{SCOPE_LABEL}={kube_scope.id},gputopo.test/fabric=nvlink"
    selected = core.list_node(label_selector=selector)
    assert [n.metadata.name for n in selected.items] == [first]
    everything = core.list_node(label_selector=f"{SCOPE_LABEL}={kube_scope.id}")
    assert sorted(n.metadata.name for n in everything.items) == [first, second]


def test_lease_update_with_stale_resource_version_conflicts(kube_scope: KubeScope) -> None:
    leases = k8s.CoordinationV1Api(kube_scope.api_client())
    name, namespace = kube_scope.name("leader"), kube_scope.namespace
    lease = k8s.V1Lease(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1LeaseSpec(holder_identity="replica-a", lease_duration_seconds=15),
    )
    stale = leases.create_namespaced_lease(namespace, lease)

    fresh = leases.read_namespaced_lease(name, namespace)
    fresh.spec.holder_identity = "replica-b"
    updated = leases.replace_namespaced_lease(name, namespace, fresh)
    stale.spec.holder_identity = "replica-c"

    assert updated.spec.holder_identity == "replica-b"
    assert api_status(lambda: leases.replace_namespaced_lease(name, namespace, stale)) == 409
    assert leases.read_namespaced_lease(name, namespace).spec.holder_identity == "replica-b"


def test_pod_is_bound_once_through_the_binding_subresource(
    kube_scope: KubeScope, core: k8s.CoreV1Api
) -> None:
    namespace, pod_name = kube_scope.namespace, kube_scope.name("worker-0")
    node_a, node_b = kube_scope.name("node-a"), kube_scope.name("node-b")
    for name in (node_a, node_b):
        core.create_node(node(name, kube_scope.labels))
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=pod_name),
        spec=k8s.V1PodSpec(
            scheduler_name=SCHEDULER_NAME,
            containers=[k8s.V1Container(name="main", image="registry.invalid/pause:3")],
        ),
    )
    core.create_namespaced_pod(namespace, pod)

    assert bind(core, namespace, pod_name, node_a) == 201
    stored = core.read_namespaced_pod(pod_name, namespace)
    assert stored.spec.scheduler_name == SCHEDULER_NAME
    assert stored.spec.node_name == node_a
    assert api_status(lambda: bind(core, namespace, pod_name, node_b)) == 409
    assert core.read_namespaced_pod(pod_name, namespace).spec.node_name == node_a


def bind(core: k8s.CoreV1Api, namespace: str, pod: str, node_name: str) -> int:
    """POST pods/<pod>/binding; returns the HTTP status.

    `_preload_content=False` because the client applies the binding and then fails to decode
    the server's `Status` reply as a `V1Binding`.
    """
    binding = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(name=pod),
        target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=node_name),
    )
    response = core.create_namespaced_pod_binding(pod, namespace, binding, _preload_content=False)
    try:
        response.read()
        return int(response.status)
    finally:
        response.release_conn()


def test_non_admin_may_patch_nodes_only_once_granted(
    kube_scope: KubeScope, kube_apiserver: KubeApiServer, core: k8s.CoreV1Api
) -> None:
    name = kube_scope.name("gpu-node")
    core.create_node(node(name, kube_scope.labels))
    alice = k8s.CoreV1Api(kube_scope.api_client(kube_apiserver.token_for("alice")))
    bob = k8s.CoreV1Api(kube_scope.api_client(kube_apiserver.token_for("bob")))
    patch = {"metadata": {"labels": {"gputopo.test/labelled-by": "alice"}}}

    assert api_status(lambda: alice.patch_node(name, patch)) == 403
    grant_node_patch(kube_scope, user="alice")

    patched = eventually(lambda: alice.patch_node(name, patch))
    assert patched.metadata.labels["gputopo.test/labelled-by"] == "alice"
    assert api_status(lambda: bob.patch_node(name, patch)) == 403


def grant_node_patch(scope: KubeScope, *, user: str) -> None:
    rbac = k8s.RbacAuthorizationV1Api(scope.api_client())
    role = scope.name("node-labeller")
    rbac.create_cluster_role(
        k8s.V1ClusterRole(
            metadata=k8s.V1ObjectMeta(name=role),
            rules=[k8s.V1PolicyRule(api_groups=[""], resources=["nodes"], verbs=["get", "patch"])],
        )
    )
    rbac.create_cluster_role_binding(
        k8s.V1ClusterRoleBinding(
            metadata=k8s.V1ObjectMeta(name=role),
            role_ref=k8s.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role
            ),
            subjects=[
                k8s.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="User", name=user)
            ],
        )
    )


def test_custom_resource_schema_is_enforced(kube_scope: KubeScope) -> None:
    group, plural = f"{kube_scope.id}.gputopo.test", "gpufabrics"
    extensions = k8s.ApiextensionsV1Api(kube_scope.api_client())
    custom = k8s.CustomObjectsApi(kube_scope.api_client())
    extensions.create_custom_resource_definition(crd(group, plural, kube_scope.labels))

    eventually(lambda: assert_established(extensions, f"{plural}.{group}"))
    valid = fabric(group, kube_scope.name("ok"), gpus=8, link="nvlink")
    created = eventually(
        lambda: custom.create_namespaced_custom_object(
            group, "v1", kube_scope.namespace, plural, valid
        )
    )
    invalid = fabric(group, kube_scope.name("bad"), gpus=0, link="carrier-pigeon")

    assert created["spec"] == {"gpus": 8, "linkKind": "nvlink"}
    with pytest.raises(ApiException) as error:
        custom.create_namespaced_custom_object(group, "v1", kube_scope.namespace, plural, invalid)
    assert error.value.status == 422
    message = json.loads(error.value.body)["message"]
    assert "spec.gpus" in message
    assert "spec.linkKind" in message


def crd(group: str, plural: str, labels: dict[str, str]) -> k8s.V1CustomResourceDefinition:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["gpus"],
                "properties": {
                    "gpus": {"type": "integer", "minimum": 1},
                    "linkKind": {"type": "string", "enum": ["nvlink", "pcie"]},
                },
            }
        },
    }
    return k8s.V1CustomResourceDefinition.from_dict(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}", "labels": labels},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": "gpufabric", "kind": "GpuFabric"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": schema},
                    }
                ],
            },
        }
    )


def fabric(group: str, name: str, *, gpus: int, link: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/v1",
        "kind": "GpuFabric",
        "metadata": {"name": name},
        "spec": {"gpus": gpus, "linkKind": link},
    }


def assert_established(extensions: k8s.ApiextensionsV1Api, name: str) -> None:
    conditions = extensions.read_custom_resource_definition(name).status.conditions or []
    assert any(c.type == "Established" and c.status == "True" for c in conditions), conditions


def test_scope_cleanup_deletes_what_a_test_left(kube_apiserver: KubeApiServer) -> None:
    scope = KubeScope(kube_apiserver, test_name="leaky test")
    scope.setup()
    core = k8s.CoreV1Api(scope.api_client())
    leases = k8s.CoordinationV1Api(scope.api_client())
    core.create_node(node(scope.name("node"), {}))
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=scope.name("extra"))))
    heartbeat = k8s.V1Lease(metadata=k8s.V1ObjectMeta(name=scope.name("node")))
    leases.create_namespaced_lease("kube-node-lease", heartbeat)
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(generate_name="anonymous-"),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="x.invalid/y")]),
    )
    core.create_namespaced_pod(scope.namespace, pod)

    scope.cleanup()

    with kube_apiserver.api_client() as admin:
        check = k8s.CoreV1Api(admin)
        assert api_status(lambda: check.read_node(scope.name("node"))) == 404
        assert api_status(lambda: check.read_namespace(scope.namespace)) == 404
        assert api_status(lambda: check.read_namespace(scope.name("extra"))) == 404
        assert check.list_namespaced_pod(scope.namespace).items == []
        lease_check = k8s.CoordinationV1Api(admin)
        status = api_status(
            lambda: lease_check.read_namespaced_lease(scope.name("node"), "kube-node-lease")
        )
        assert status == 404


def test_missing_binary_names_the_build_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BINARY_ENV, raising=False)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))

    with pytest.raises(BinaryNotFoundError, match=BUILD_SCRIPT):
        find_binary()
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(BinaryNotFoundError, match=BINARY_ENV):
        find_binary()


def test_start_up_failure_reports_the_server_log(tmp_path: Path) -> None:
    with pytest.raises(KubeStartupError, match="unknown flag: --no-such-flag"):
        KubeApiServer.start(workdir=tmp_path, extra_args=["--no-such-flag"], ready_timeout_s=20)


def test_a_port_taken_before_start_is_retried_with_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        fresh = iter([kube_module._Ports(taken, taken + 1, taken + 2), kube_module._free_ports()])
        monkeypatch.setattr(kube_module, "_free_ports", lambda: next(fresh))

        with KubeApiServer.start(workdir=tmp_path) as kube:
            assert next(fresh, None) is None, "start() did not retry with new ports"
            assert not kube.host.endswith(f":{taken + 2}")
            with kube.json_session() as session:
                assert session.request("GET", "/readyz").status == 200


@pytest.fixture
def orphan_probe(tmp_path: Path) -> Path:
    """A Python process that starts a server, prints its pids and waits to be killed."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from tests.harness.kube import KubeApiServer\n"
        "kube = KubeApiServer.start(workdir=Path(sys.argv[1]))\n"
        "print(json.dumps(kube.pids), flush=True)\n"
        "time.sleep(600)\n"
    )
    return script


def test_servers_die_with_a_killed_test_process(orphan_probe: Path, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    with subprocess.Popen(
        [sys.executable, str(orphan_probe), str(tmp_path / "kube")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    ) as probe:
        assert probe.stdout is not None
        pids = json.loads(probe.stdout.readline())
        assert sorted(pids) == ["etcd", "kube-apiserver"]
        assert all(alive(pid) for pid in pids.values())
        probe.send_signal(signal.SIGKILL)
        probe.wait()

    eventually(lambda: assert_all_gone(pids.values()), timeout_s=5)


def test_stop_ends_both_processes(kube_apiserver: KubeApiServer, tmp_path: Path) -> None:
    with KubeApiServer.start(workdir=tmp_path) as second:
        pids = second.pids
        assert second.host != kube_apiserver.host
        with second.api_client() as api:
            assert k8s.VersionApi(api).get_code().git_version == "v1.20.2"

    assert second.pids == {}
    assert_all_gone(pids.values())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def assert_all_gone(pids: Any) -> None:
    survivors = [pid for pid in pids if alive(pid)]
    assert survivors == [], f"processes still running: {survivors}"
