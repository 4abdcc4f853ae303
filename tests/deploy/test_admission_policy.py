"""The ValidatingAdmissionPolicies of deploy/optional/admission-policy, on admission requests.

The test API server (1.20) cannot serve ValidatingAdmissionPolicy (GA in 1.30), so its CEL is
evaluated here the way the API server does: match constraints and conditions first, then the
variables in order, then every validation. The requests are what the aggregator sends (a
server-side apply of its labels, the leader label on its pod) and what a compromised one would
(cordon, taint, relabel, rewrite another's objects).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from tests.deploy.manifests import overlay

POLICY_FILE = (
    Path(__file__).parent.parent.parent
    / "deploy"
    / "optional"
    / "admission-policy"
    / "admission-policy.yaml"
)
AGGREGATOR = "system:serviceaccount:gputopo-system:gputopo-aggregator"
DOCS = list(yaml.safe_load_all(POLICY_FILE.read_text(encoding="utf-8")))
POLICIES = {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"}
ENV = celpy.Environment()


def _eval(expression: str, activation: dict[str, Any]) -> Any:
    return ENV.program(ENV.compile(expression)).evaluate(activation)


def admit(
    policy: str,
    *,
    user: str,
    operation: str,
    resource: tuple[str, str],
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None,
) -> str | None:
    """The message of the first failed validation, or None when admitted (or not matched)."""
    spec = POLICIES[policy]["spec"]
    group, plural = resource
    if not any(
        group in rule["apiGroups"]
        and plural in rule["resources"]
        and operation in rule["operations"]
        for rule in spec["matchConstraints"]["resourceRules"]
    ):
        return None
    request = {"operation": operation, "userInfo": {"username": user}}
    act: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
    }
    if not all(bool(_eval(c["expression"], act)) for c in spec.get("matchConditions", [])):
        return None
    variables: dict[str, Any] = {}
    for var in spec.get("variables", []):
        act["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
        variables[var["name"]] = _eval(var["expression"], act)
    act["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(k): v for k, v in variables.items()}
    )
    for check in spec["validations"]:
        result = _eval(check["expression"], act)
        assert isinstance(result, celpy.celtypes.BoolType), (check["expression"], result)
        if not result:
            return str(check["message"])
    return None


NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "h100-01",
        "labels": {
            "kubernetes.io/hostname": "h100-01",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "gputopo.io/gpu-count": "8",
            "fabric.topograph.run/tier-0": "leaf-1",
        },
        "annotations": {
            "node.alpha.kubernetes.io/ttl": "0",
            "gputopo.io/topology-fingerprint": "a",
        },
    },
    "spec": {"podCIDR": "10.0.1.0/24", "providerID": "aws:///us-east-1a/i-0abc"},
}


def changed(**edits: Any) -> dict[str, Any]:
    node = copy.deepcopy(NODE)
    for path, value in edits.items():
        section, _, key = path.partition("__")
        target = node["spec"] if section == "spec" else node["metadata"].setdefault(section, {})
        key = key.replace("_SLASH_", "/").replace("_DOT_", ".").replace("_DASH_", "-")
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return node


NODE_CASES = [
    ("its own labels change", changed(labels__gputopo_DOT_io_SLASH_gpu_DASH_count="4"), None),
    ("a new own label", changed(labels__gputopo_DOT_io_SLASH_stale="true"), None),
    (
        "topograph's key, removed",
        changed(labels__fabric_DOT_topograph_DOT_run_SLASH_tier_DASH_0=None),
        None,
    ),
    (
        "its fingerprint",
        changed(annotations__gputopo_DOT_io_SLASH_topology_DASH_fingerprint="b"),
        None,
    ),
    ("cordon", changed(spec__unschedulable=True), "spec"),
    ("a taint", changed(spec__taints=[{"key": "x", "effect": "NoSchedule"}]), "spec"),
    ("another's label", changed(labels__nvidia_DOT_com_SLASH_gpu_DOT_product="RTX"), "labels"),
    ("a new foreign label", changed(labels__team="ml"), "labels"),
    ("a foreign label removed", changed(labels__kubernetes_DOT_io_SLASH_hostname=None), "labels"),
    (
        "a foreign annotation",
        changed(annotations__node_DOT_alpha_DOT_kubernetes_DOT_io_SLASH_ttl="5"),
        "annotations",
    ),
]


@pytest.mark.parametrize(("what", "new", "denied"), NODE_CASES, ids=[c[0] for c in NODE_CASES])
def test_the_aggregator_may_change_only_its_own_node_labels(
    what: str, new: dict[str, Any], denied: str | None
) -> None:
    got = admit(
        "gputopo-aggregator-nodes",
        user=AGGREGATOR,
        operation="UPDATE",
        resource=("", "nodes"),
        obj=new,
        old=NODE,
    )
    if denied is None:
        assert got is None, what
    else:
        assert got is not None, what
        assert denied in got


def test_other_users_are_not_this_policys_business() -> None:
    got = admit(
        "gputopo-aggregator-nodes",
        user="kubernetes-admin",
        operation="UPDATE",
        resource=("", "nodes"),
        obj=changed(spec__unschedulable=True),
        old=NODE,
    )
    assert got is None


POD: dict[str, Any] = {
    "metadata": {"name": "gputopo-aggregator-0", "labels": {"app": "gputopo-aggregator"}},
    "spec": {"containers": [{"name": "aggregator", "image": "ghcr.io/gputopo/gputopo:0.1.0"}]},
}


@pytest.mark.parametrize(
    ("what", "edit", "denied"),
    [
        (
            "the leader label",
            {"labels": {"app": "gputopo-aggregator", "gputopo.io/role": "leader"}},
            False,
        ),
        ("another label", {"labels": {"app": "x"}}, True),
        ("an annotation", {"annotations": {"a": "b"}}, True),
    ],
)
def test_the_aggregator_may_only_mark_the_leader_pod(
    what: str, edit: dict[str, Any], denied: bool
) -> None:
    new = copy.deepcopy(POD)
    new["metadata"].update(edit)
    got = admit(
        "gputopo-aggregator-pods",
        user=AGGREGATOR,
        operation="UPDATE",
        resource=("", "pods"),
        obj=new,
        old=POD,
    )
    assert (got is not None) == denied, what


def test_the_aggregator_may_not_swap_an_image() -> None:
    new = copy.deepcopy(POD)
    new["spec"]["containers"][0]["image"] = "evil:latest"
    got = admit(
        "gputopo-aggregator-pods",
        user=AGGREGATOR,
        operation="UPDATE",
        resource=("", "pods"),
        obj=new,
        old=POD,
    )
    assert got is not None
    assert "spec" in got


OURS = {
    "metadata": {"name": "gputopo-leaf-a", "labels": {"app.kubernetes.io/managed-by": "gputopo"}}
}
THEIRS = {"metadata": {"name": "rack-7", "labels": {"team": "infra"}}}


@pytest.mark.parametrize(
    ("operation", "obj", "old", "denied"),
    [
        ("CREATE", OURS, None, False),
        ("UPDATE", OURS, OURS, False),
        ("DELETE", None, OURS, False),
        ("CREATE", THEIRS, None, True),
        ("UPDATE", OURS, THEIRS, True),  # taking someone's object over by labelling it
        ("DELETE", None, THEIRS, True),
    ],
)
def test_the_aggregator_writes_only_hypernodes_and_topologies_it_manages(
    operation: str, obj: dict[str, Any] | None, old: dict[str, Any] | None, denied: bool
) -> None:
    for resource in (("topology.volcano.sh", "hypernodes"), ("kueue.x-k8s.io", "topologies")):
        got = admit(
            "gputopo-aggregator-scheduler-objects",
            user=AGGREGATOR,
            operation=operation,
            resource=resource,
            obj=obj,
            old=old,
        )
        assert (got is not None) == denied, (operation, resource)


def test_the_policies_name_the_account_deploy_installs() -> None:
    docs = overlay("default", components=("optional/admission-policy",))
    (sa,) = [
        d
        for d in docs
        if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "gputopo-aggregator"
    ]
    account = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    assert account == AGGREGATOR
    rendered = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert len(rendered) == len(POLICIES)
    for policy in rendered:
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"].split("==")[1].strip() == f'"{account}"'
    bindings = {d["spec"]["policyName"] for d in DOCS if d["kind"].endswith("Binding")}
    assert bindings == set(POLICIES)
