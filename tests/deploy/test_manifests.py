"""What the manifests say must be what the commands accept, and what they promise to run with.

A manifest that passes a flag the command rejects starts a crash loop that no test of the
command would see; so every container's args are parsed by gputopo's own parser. And the
defaults the issues ask for are checked where an operator reads them: mutual TLS everywhere,
probes on a plain-text port, the namespaces' Pod Security levels.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from typing import Any

import pytest

from gputopo.app.cli import _parser
from tests.deploy.manifests import DEPLOY, KUSTOMIZATIONS, every_object, render, with_component

WORKLOADS = {"Deployment", "DaemonSet"}


def _containers() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for doc in every_object():
        if doc["kind"] in WORKLOADS:
            for c in doc["spec"]["template"]["spec"]["containers"]:
                out.append((doc["metadata"]["name"], c))
    return out


def _expand(arg: str, env: dict[str, str]) -> str:
    """$(VAR) as the kubelet expands it from the container's env."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


@pytest.mark.parametrize(("name", "container"), _containers(), ids=lambda v: str(v)[:30])
def test_every_containers_args_parse(name: str, container: dict[str, Any]) -> None:
    env = {e["name"]: e.get("value", "placeholder") for e in container.get("env", [])}
    args = [_expand(a, env) for a in container["args"]]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parsed = _parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{name}: {err.getvalue().strip()}")
    assert isinstance(parsed, argparse.Namespace)
    assert parsed.command == args[0]
    if parsed.command in ("aggregator", "exporter", "scheduler"):
        assert not parsed.insecure, f"{name} runs in plain text"
        assert all((parsed.tls_cert, parsed.tls_key, parsed.tls_ca)), name
        assert parsed.health_port, f"{name}: the kubelet's probes need the plain-text port"


@pytest.mark.parametrize(("name", "container"), _containers(), ids=lambda v: str(v)[:30])
def test_probes_use_the_health_port_and_tls_files_are_mounted(
    name: str, container: dict[str, Any]
) -> None:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    health = next(int(a.split("=")[1]) for a in container["args"] if a.startswith("--health-port="))
    for probe in ("livenessProbe", "readinessProbe"):
        port = container[probe]["httpGet"]["port"]
        assert ports.get(port, port) == health, (name, probe)
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/etc/gputopo/tls" in mounts, name


@pytest.mark.parametrize(
    ("component", "namespace", "level"),
    [
        ("aggregator", "gputopo-system", "restricted"),
        ("scheduler", "gputopo-system", "restricted"),
        ("exporter", "gputopo-exporter", "privileged"),
    ],
)
def test_each_component_runs_in_its_namespace_at_its_pod_security_level(
    component: str, namespace: str, level: str
) -> None:
    docs = render(component)
    namespaces = {d["metadata"]["name"]: d for d in every_object() if d["kind"] == "Namespace"}
    labels = namespaces[namespace]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == level
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            assert doc["metadata"]["namespace"] == namespace
            pod = doc["spec"]["template"]["spec"]
            if level == "restricted":  # what the restricted profile demands of every container
                assert pod["securityContext"]["runAsNonRoot"] is True
                assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
                for c in pod["containers"]:
                    sc = c["securityContext"]
                    assert sc["allowPrivilegeEscalation"] is False
                    assert sc["capabilities"]["drop"] == ["ALL"]
                    assert not pod.get("hostNetwork")
                    assert all("hostPath" not in v for v in pod.get("volumes", []))


def test_bindings_name_the_accounts_where_they_run() -> None:
    where = {
        d["metadata"]["name"]: d["metadata"]["namespace"]
        for c in KUSTOMIZATIONS
        for d in render(c)
        if d["kind"] == "ServiceAccount"
    }
    for doc in every_object():
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in doc["subjects"]:
                assert where[subject["name"]] == subject["namespace"], doc["metadata"]["name"]


def test_the_nvidia_runtime_component_renders() -> None:
    (ds,) = [
        d
        for d in with_component(render("exporter"), DEPLOY / "exporter" / "nvidia-runtime")
        if d["kind"] == "DaemonSet"
    ]
    pod = ds["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert "privileged" not in pod["containers"][0]["securityContext"]
