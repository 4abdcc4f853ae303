"""The exporter's DaemonSet: what it must say, and that a real API server accepts it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.harness.kube_scope import KubeScope

DEPLOY = Path(__file__).parents[2] / "deploy" / "exporter"


def documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    found = []
    for resource in kustomization["resources"]:
        found += [d for d in yaml.safe_load_all((DEPLOY / resource).read_text()) if d]
    return found


def daemonset() -> dict[str, Any]:
    (ds,) = [d for d in documents() if d["kind"] == "DaemonSet"]
    return ds


def container() -> dict[str, Any]:
    (found,) = daemonset()["spec"]["template"]["spec"]["containers"]
    return found


def test_sys_is_mounted_read_only_from_the_host() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in container()["volumeMounts"] if m["mountPath"] == "/host/sys"]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["hostPath"] == {"path": "/sys", "type": "Directory"}
    assert "--sysfs-root=/host/sys" in container()["args"]


def test_gpu_taints_are_tolerated_and_the_node_name_comes_from_the_downward_api() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    env = {e["name"]: e for e in container()["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "nvidia.com/gpu" not in container()["resources"].get("limits", {})  # watches, holds none


def test_resources_probes_and_the_privilege_nvidias_agents_run_with() -> None:
    c = container()
    assert set(c["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) & set(c["resources"]["limits"])
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # The kubelet cannot present a client certificate: probes hit the plain-text health port.
    assert c["livenessProbe"]["httpGet"]["port"] == "health"
    assert c["readinessProbe"]["httpGet"]["port"] == "health"
    assert ports == {"metrics": 9402, "probe": 9403, "health": 9405}
    assert "--health-port=9405" in c["args"]
    security = c["securityContext"]
    assert security["privileged"] is True  # as dcgm-exporter: hardened runtimes need it
    # Root, as dcgm-exporter: the kubelet's pod-resources directory is 0750 root
    # (tests/exporter/test_podresources_access.py reads it as this user).
    assert security["runAsUser"] == 0
    assert security["readOnlyRootFilesystem"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_mutual_tls_and_the_identity_token_are_on_by_default() -> None:
    c = container()
    pod = daemonset()["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for flag in ("--tls-cert=/etc/gputopo/tls/", "--tls-key=/etc/gputopo/tls/"):
        assert any(a.startswith(flag) for a in c["args"]), flag
    assert "--insecure" not in c["args"]
    assert volumes[mounts["/etc/gputopo/tls"]["name"]]["secret"]["secretName"] == (
        "gputopo-exporter-tls"
    )
    assert "--identity-token=/var/run/secrets/gputopo/token" in c["args"]
    (source,) = volumes[mounts["/var/run/secrets/gputopo"]["name"]]["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["audience"] == "gputopo-aggregator"
    assert token["path"] == "token"


def test_no_kubernetes_api_permissions_are_granted() -> None:
    kinds = {d["kind"] for d in documents()}
    assert kinds == {"Namespace", "ServiceAccount", "DaemonSet"}  # no Role, ClusterRole, binding
    (account,) = [d for d in documents() if d["kind"] == "ServiceAccount"]
    assert account["automountServiceAccountToken"] is False
    assert daemonset()["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_the_namespace_admits_privileged_pods_and_only_the_exporter_runs_there() -> None:
    (namespace,) = [d for d in documents() if d["kind"] == "Namespace"]
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == namespace["metadata"]["name"] == "gputopo-exporter"
    labels = namespace["metadata"]["labels"]
    for mode in ("enforce", "audit", "warn"):
        assert labels[f"pod-security.kubernetes.io/{mode}"] == "privileged"


def test_the_nvidia_runtime_component_runs_it_there_unprivileged() -> None:
    component = yaml.safe_load((DEPLOY / "nvidia-runtime" / "kustomization.yaml").read_text())
    (patch,) = component["patches"]
    ops = {op["path"]: op for op in yaml.safe_load(patch["patch"])}
    assert ops["/spec/template/spec/runtimeClassName"]["value"] == "nvidia"
    security = ops["/spec/template/spec/containers/0/securityContext"]["value"]
    assert "privileged" not in security
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsUser"] == 0  # the owner of the kubelet's root-only directories


@pytest.mark.kube
def test_a_real_api_server_accepts_the_manifests_and_grants_the_exporter_nothing(
    kube_scope: KubeScope,
) -> None:
    api = kube_scope.api_client()
    namespace = kube_scope.namespace
    for original in documents():
        if original["kind"] == "Namespace":
            continue  # the scope's namespace stands in for it
        doc = {**original, "metadata": {**original["metadata"], "namespace": namespace}}
        if doc["kind"] == "ServiceAccount":
            k8s.CoreV1Api(api).create_namespaced_service_account(namespace, doc)
        else:
            created = k8s.AppsV1Api(api).create_namespaced_daemon_set(namespace, doc)
            assert created.spec.template.spec.containers[0].volume_mounts[0].read_only
    authz = k8s.AuthorizationV1Api(api)

    def allowed(account: str, verb: str, resource: str) -> bool:
        review = authz.create_subject_access_review(
            k8s.V1SubjectAccessReview(
                spec=k8s.V1SubjectAccessReviewSpec(
                    user=f"system:serviceaccount:{namespace}:{account}",
                    groups=[
                        "system:serviceaccounts",
                        f"system:serviceaccounts:{namespace}",
                        "system:authenticated",
                    ],
                    resource_attributes=k8s.V1ResourceAttributes(
                        verb=verb, resource=resource, namespace=namespace
                    ),
                )
            )
        )
        return bool(review.status.allowed)

    # A control: an account bound to a role that writes pods may, so a denial below means
    # something. (No controller-manager runs, so aggregated roles such as `edit` stay empty.)
    rbac = k8s.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": kube_scope.name("writer")},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": kube_scope.name("control")},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": kube_scope.name("writer"),
            },
            "subjects": [{"kind": "ServiceAccount", "name": "control", "namespace": namespace}],
        },
    )
    assert allowed("control", "create", "pods")
    for verb in ("create", "update", "patch", "delete"):
        for resource in ("nodes", "pods", "configmaps", "events"):
            assert not allowed("gputopo-exporter", verb, resource), (verb, resource)
