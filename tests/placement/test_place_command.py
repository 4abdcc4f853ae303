"""`gputopo place`: offline placement against an inventory file, its JSON and its exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gputopo.app.cli import main

INVENTORY = Path(__file__).resolve().parent.parent / "data" / "inventory_small.yaml"

PD_REQUEST = """\
job: serve-pd
groups:
  - {name: prefill, replicas: 2, pods: 1, gpus_per_pod: 4, pattern: all_reduce,
     message_bytes: 268435456}
  - {name: decode, replicas: 2, gpus_per_pod: 4}
edges:
  - {from: prefill, to: decode, min_gbps: 300}
"""


def write(tmp_path: Path, text: str, name: str = "request.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, object]]:
    code = main(["place", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_prefill_decode_pipeline_lands_in_the_nvl72_domain_with_its_kv_need_met(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_json(
        capsys, ["--cluster", str(INVENTORY), "--request", write(tmp_path, PD_REQUEST)]
    )
    assert code == 0
    assert out["placed"] is True
    assignments = out["assignments"]
    assert isinstance(assignments, list)
    assert {a["node"][:5] for a in assignments} == {"gb200"}
    assert sorted((a["group"], a["replica"], len(a["gpus"])) for a in assignments) == [
        ("decode", 0, 4),
        ("decode", 1, 4),
        ("prefill", 0, 4),
        ("prefill", 1, 4),
    ]
    predicted = out["predicted"]
    assert isinstance(predicted, dict)
    (edge,) = predicted["edges"]
    assert edge["satisfied"] is True
    assert edge["gbps"] >= 300
    assert predicted["communication_seconds"] > 0


def test_used_gpus_of_the_inventory_are_never_handed_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # In zone-1 the H100s are the fastest; h100-01 has GPUs 0-3 in use, so a TP-4 that packs
    # it (rather than break a whole H100) must take 4-7 there.
    request = write(
        tmp_path,
        "groups: [{name: tp, gpus_per_pod: 4}]\n"
        "node_selector: {topology.kubernetes.io/zone: zone-1}\n",
    )
    code, out = run_json(capsys, ["--cluster", str(INVENTORY), "--request", request])
    assert code == 0
    (a,) = out["assignments"]  # type: ignore[misc]
    assert a["node"] == "h100-01"
    assert sorted(a["gpus"]) == [4, 5, 6, 7]


def test_a_baseline_can_be_named_and_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--cluster", str(INVENTORY), "--request", write(tmp_path, PD_REQUEST)]
    code, out = run_json(capsys, [*argv, "--policy", "first-fit", "--compare"])
    assert out["policy"] == "first-fit"
    compare = out["compare"]
    assert isinstance(compare, dict)
    assert set(compare) == {"gputopo", "kueue-bestfit", "default"}
    assert compare["gputopo"]["predicted"]["edges"][0]["satisfied"] is True
    assert code == 0  # first-fit places it, missing the KV need, which its prediction says
    assert out["predicted"]["edges"][0]["satisfied"] is False  # type: ignore[index]


def test_a_request_that_cannot_be_placed_exits_1_with_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = write(tmp_path, "groups: [{name: big, pods: 40, gpus_per_pod: 8}]\n")
    code, out = run_json(capsys, ["--cluster", str(INVENTORY), "--request", request])
    assert code == 1
    assert out["placed"] is False
    assert "only" in str(out["reason"])


def test_bad_input_exits_2_naming_the_file_and_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path, "groups: [{name: tp, gpus_per_pod: 0}]\n")
    assert main(["place", "--cluster", str(INVENTORY), "--request", bad]) == 2
    err = capsys.readouterr().err
    assert "request.yaml" in err
    assert "groups[0].gpus_per_pod: must be at least 1" in err
    broken = write(tmp_path, "blocks: [{switch: nowhere, nodes: [a]}]\n", "model.yaml")
    ok = write(tmp_path, "groups: [{name: tp}]\n")
    assert main(["place", "--cluster", broken, "--request", ok]) == 2
    assert "blocks[0].switch" in capsys.readouterr().err
    typo = write(tmp_path, "blocks: [{nodes: [a], nodeprofile: dgx-h100}]\n", "typo.yaml")
    assert main(["place", "--cluster", typo, "--request", ok]) == 2
    assert "blocks[0].nodeprofile: unknown key; did you mean nodeProfile?" in (
        capsys.readouterr().err
    )
    assert main(["place", "--cluster", str(INVENTORY), "--request", ok, "--policy", "x"]) == 2
    assert "gputopo" in capsys.readouterr().err


def test_text_output_is_a_table_with_the_prediction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["place", "--cluster", str(INVENTORY), "--request", write(tmp_path, PD_REQUEST)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "GROUP" in text
    assert "predicted edge prefill -> decode" in text


def _readme_yaml_block(starts_with: str) -> str:
    """The README's ```yaml block whose first line starts with `starts_with`, as written."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```yaml\n(.*?)^```", readme, flags=re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if b.startswith(starts_with)]
    return block


def test_the_readme_request_places_on_the_readme_cluster_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = _readme_yaml_block("job: serve-pd")
    cluster = _readme_yaml_block("defaults: {nodeProfile: dgx-h100}")
    assert "nvidia.com/gpu.product: NVIDIA-GB200" in request  # the selector this is about
    argv = ["--cluster", write(tmp_path, cluster, "cluster.yaml")]
    code, out = run_json(capsys, [*argv, "--request", write(tmp_path, request)])
    assert (code, out["placed"]) == (0, True), out["reason"]
    assignments = out["assignments"]
    assert isinstance(assignments, list)
    assert {a["node"][:5] for a in assignments} == {"gb200"}
    assert sorted((a["group"], a["replica"], len(a["gpus"])) for a in assignments) == [
        ("decode", 0, 4),
        ("decode", 1, 4),
        ("prefill", 0, 4),
        ("prefill", 1, 4),
    ]


def test_a_selector_no_node_matches_is_a_selector_rejection_not_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = PD_REQUEST.replace(
        "groups:", "node_selector: {nvidia.com/gpu.product: NVIDIA-GB300}\ngroups:"
    )
    code, out = run_json(
        capsys, ["--cluster", str(INVENTORY), "--request", write(tmp_path, request)]
    )
    assert (code, out["placed"]) == (1, False)
    want = "no node matches the selectors of group prefill (nvidia.com/gpu.product=NVIDIA-GB300)"
    assert out["reason"] == want
    assert out["rejections"] == [{"domain": "placement", "code": "selector", "message": want}]
