"""The device-plugin component: one flag, the kubelet's directory, read-only access to pods."""

from __future__ import annotations

from pathlib import Path

import yaml

from gputopo.app.cli import _parser
from tests.deploy.manifests import render
from tests.exporter.test_deploy import container, daemonset

COMPONENT = Path(__file__).parents[2] / "deploy" / "exporter" / "device-plugin"


def test_the_kubelets_device_plugin_directory_is_mounted() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [
        m
        for m in container()["volumeMounts"]
        if m["mountPath"] == "/var/lib/kubelet/device-plugins"
    ]
    assert not mount.get("readOnly")  # the plugin makes its socket there
    assert volumes[mount["name"]]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"


def test_the_component_turns_the_plugin_on_and_may_only_read_pods() -> None:
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    (patch,) = component["patches"]
    ops = {op["path"]: op["value"] for op in yaml.safe_load(patch["patch"])}
    assert ops["/spec/template/spec/containers/0/args/-"] == "--device-plugin=nvidia.com/gpu"
    assert ops["/spec/template/spec/automountServiceAccountToken"] is True
    role, binding = yaml.safe_load_all((COMPONENT / "rbac.yaml").read_text())
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gputopo-exporter", "namespace": "gputopo-exporter"}
    ]


def test_the_component_renders_into_args_the_exporter_accepts() -> None:
    """Applied as kustomize applies a JSON 6902 patch (`args/-` appends), the args parse."""
    (ds,) = [d for d in render("exporter") if d["kind"] == "DaemonSet"]
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    (patch,) = component["patches"]
    pod = ds["spec"]["template"]["spec"]
    for op in yaml.safe_load(patch["patch"]):
        if op["path"] == "/spec/template/spec/containers/0/args/-":
            pod["containers"][0]["args"].append(op["value"])
        else:
            pod[op["path"].rsplit("/", 1)[1]] = op["value"]
    args = [a for a in pod["containers"][0]["args"] if "$(" not in a]
    parsed = _parser().parse_args(args)
    assert parsed.device_plugin == "nvidia.com/gpu"
    assert parsed.device_plugin_dir == "/var/lib/kubelet/device-plugins"
    assert pod["automountServiceAccountToken"] is True
