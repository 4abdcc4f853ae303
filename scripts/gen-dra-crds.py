#!/usr/bin/env python3
"""Writes CRDs for `resource.k8s.io/v1` from the upstream Go types, for the 1.20 test API server.

    scripts/gen-dra-crds.py TYPES_GO [OUT_DIR]

TYPES_GO is k8s.io/api resource/v1/types.go (kubernetes/api @ 10b39a39b). OUT_DIR defaults to
tests/data/crds (one file a kind: dra-<plural>.yaml). The 1.20 test API server cannot serve the
native API, so the tests install these CRDs (same group, version, kinds, plural names, scope and
`status` subresource) and every write goes through a real API server with a structural schema
made from the Go structs: field names from the json tags, types from the Go types, `+required`
fields required. Not the native validation: no CEL, enum or format rules, quantities are
int-or-string, and core/v1 NodeSelector, metav1.Condition and RawExtension are free objects.
Needs PyYAML; the output is committed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
GROUP = "resource.k8s.io"
VERSION = "v1"
# kind: (plural, namespaced, has status)
KINDS = {
    "ResourceClaim": ("resourceclaims", True, True),
    "ResourceClaimTemplate": ("resourceclaimtemplates", True, False),
    "ResourceSlice": ("resourceslices", False, False),
    "DeviceClass": ("deviceclasses", False, False),
}
_STRUCT = re.compile(r"^type (\w+) struct \{$")
_ALIAS = re.compile(r"^type (\w+) (\w+)$")
_FIELD = re.compile(r"^\t(?:(\w+)\s+)?([\w.\[\]*]+)\s+`json:\"([^\"]*)\"")
_EMBEDDED = re.compile(r"^\t([\w.]+) `json:\"([^\"]*)\"")
# Types from other packages, as the API server's OpenAPI gives them (simplified).
_FOREIGN: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "bool": {"type": "boolean"},
    "int64": {"type": "integer", "format": "int64"},
    "int32": {"type": "integer", "format": "int32"},
    "types.UID": {"type": "string"},
    "metav1.Time": {"type": "string", "format": "date-time"},
    "resource.Quantity": {"x-kubernetes-int-or-string": True},
    "v1.NodeSelector": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    "v1.ResourceName": {"type": "string"},
    "metav1.Condition": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    "runtime.RawExtension": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
}


def parse(text: str) -> tuple[dict[str, list[tuple[str, str, bool]]], dict[str, str]]:
    """Structs (fields: json name, Go type, required) and named scalar types."""
    structs: dict[str, list[tuple[str, str, bool]]] = {}
    aliases: dict[str, str] = {}
    current: list[tuple[str, str, bool]] | None = None
    required = False
    for line in text.splitlines():
        if current is None:
            if m := _STRUCT.match(line):
                current = structs.setdefault(m[1], [])
                required = False
            elif m := _ALIAS.match(line):
                aliases[m[1]] = m[2]
            continue
        if line == "}":
            current = None
            continue
        stripped = line.strip()
        if stripped.startswith("//"):
            required = required or stripped in ("// +required", "// +k8s:required")
            continue
        m = _FIELD.match(line)
        if m is None:
            e = _EMBEDDED.match(line)
            if e is not None and e[2] == "":
                current.append(("", e[1], False))  # inlined struct (DeviceConfiguration)
            required = False
            continue
        json_name = m[3].split(",")[0]
        if json_name and json_name != "-":
            current.append((json_name, m[2], required))
        elif json_name == "" and m[1] is None:
            current.append(("", m[2], False))
        required = False
    return structs, aliases


class Schemas:
    """Go type -> OpenAPI v3 schema, resolving the file's own structs and aliases."""

    def __init__(self, structs: dict[str, list[tuple[str, str, bool]]], aliases: dict[str, str]):
        self.structs = structs
        self.aliases = aliases

    def of(self, go: str) -> dict[str, Any]:
        if go.startswith("*"):
            return self.of(go[1:])
        if go.startswith("[]"):
            return {"type": "array", "items": self.of(go[2:])}
        if go.startswith("map["):
            value = go[go.index("]") + 1 :]
            return {"type": "object", "additionalProperties": self.of(value)}
        if go in _FOREIGN:
            return dict(_FOREIGN[go])
        if go in self.aliases:
            return self.of(self.aliases[go])
        if go in self.structs:
            return self.struct(go)
        raise SystemExit(f"gen-dra-crds: no schema for Go type {go!r}: add it to _FOREIGN")

    def struct(self, name: str) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        required: list[str] = []
        for json_name, go, needed in self.structs[name]:
            if go in ("metav1.TypeMeta", "metav1.ObjectMeta", "metav1.ListMeta"):
                continue
            if not json_name:  # inlined
                inner = self.struct(go)
                properties.update(inner.get("properties", {}))
                required += inner.get("required", [])
                continue
            properties[json_name] = self.of(go)
            if needed:
                required.append(json_name)
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        return schema


def crd(kind: str, schemas: Schemas) -> dict[str, Any]:
    plural, namespaced, status = KINDS[kind]
    top = schemas.struct(kind)
    properties = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        **top["properties"],
    }
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": properties}},
    }
    if "required" in top:
        version["schema"]["openAPIV3Schema"]["required"] = top["required"]
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            # *.k8s.io groups are protected: an API server refuses a CRD in them without this.
            "annotations": {
                "api-approved.kubernetes.io": "unapproved, a test stand-in for the native API"
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if namespaced else "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
            },
            "versions": [version],
        },
    }


HEADER = """\
# Generated by scripts/gen-dra-crds.py from k8s.io/api resource/v1/types.go (kubernetes/api @
# 10b39a39b). Do not edit. A stand-in for the native resource.k8s.io/v1 API on the 1.20 test API
# server: same group, version, kinds and scope, a structural schema from the Go structs; not the
# native validation (no CEL, enums or formats).
"""


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    structs, aliases = parse(Path(argv[1]).read_text())
    out = Path(argv[2]) if len(argv) == 3 else ROOT / "tests" / "data" / "crds"
    out.mkdir(parents=True, exist_ok=True)
    schemas = Schemas(structs, aliases)
    for kind, (plural, _, _) in KINDS.items():
        text = HEADER + yaml.safe_dump(crd(kind, schemas), sort_keys=False, width=100)
        (out / f"dra-{plural}.yaml").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
