"""`gputopo certs`: a CA and the mutual-TLS Secrets deploy/ mounts, for clusters without
cert-manager (with it, apply `deploy/optional/cert-manager/` instead: the same Secrets)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "make a CA and the TLS Secrets the manifests mount (files and Secret YAML)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command."""
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="write ca.crt, ca.key, one directory per Secret (tls.crt, tls.key, ca.crt) and"
        " secrets.yaml here; existing files are never overwritten",
    )
    parser.add_argument(
        "--namespace",
        default="gputopo-system",
        help="namespace of the aggregator and the scheduler (default %(default)s)",
    )
    parser.add_argument(
        "--exporter-namespace",
        default="gputopo-exporter",
        help="namespace of the exporters (default %(default)s)",
    )
    parser.add_argument(
        "--cluster-domain",
        default="cluster.local",
        help="the cluster's DNS domain, for the fully qualified names (default %(default)s)",
    )
    parser.add_argument(
        "--days", type=int, default=365, help="validity of each certificate (default %(default)s)"
    )
    parser.add_argument(
        "--ca-cert",
        type=Path,
        help="sign with this existing CA certificate (PEM) instead of making a new CA",
    )
    parser.add_argument("--ca-key", type=Path, help="the private key (PEM) of --ca-cert")


def _yaml_secret(name: str, namespace: str, files: dict[str, bytes]) -> str:
    import base64

    import yaml

    doc = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "gputopo"},
        },
        "data": {k: base64.b64encode(v).decode("ascii") for k, v in files.items()},
    }
    return str(yaml.safe_dump(doc, sort_keys=False))


def run(args: argparse.Namespace) -> int:
    """Make the CA and the Secrets; exit 2 on bad input, nothing half written."""
    import datetime

    from gputopo.runtime.pki import default_secrets, issue_bundle

    if (args.ca_cert is None) != (args.ca_key is None):
        print("gputopo certs: --ca-cert and --ca-key go together", file=sys.stderr)
        return 2
    ca = None
    if args.ca_cert is not None:
        try:
            ca = (args.ca_cert.read_bytes(), args.ca_key.read_bytes())
        except OSError as exc:
            print(f"gputopo certs: {exc.filename}: {exc.strerror}", file=sys.stderr)
            return 2
    specs = default_secrets(
        namespace=args.namespace,
        exporter_namespace=args.exporter_namespace,
        cluster_domain=args.cluster_domain,
    )
    try:
        bundle = issue_bundle(specs, days=args.days, now=datetime.datetime.now(datetime.UTC), ca=ca)
    except ValueError as exc:
        print(f"gputopo certs: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    files: dict[Path, bytes] = {}
    if ca is None:
        files[out / "ca.crt"] = bundle.ca_cert
        files[out / "ca.key"] = bundle.ca_key
    yaml_docs = []
    for issued in bundle.issued:
        content = {"tls.crt": issued.cert, "tls.key": issued.key, "ca.crt": issued.ca}
        where = out / issued.spec.namespace / issued.spec.name
        for name, data in content.items():
            files[where / name] = data
        yaml_docs.append(_yaml_secret(issued.spec.name, issued.spec.namespace, content))
    files[out / "secrets.yaml"] = "---\n".join(yaml_docs).encode("utf-8")
    existing = [p for p in files if p.exists()]
    if existing:
        print(f"gputopo certs: {existing[0]} exists; choose an empty --out", file=sys.stderr)
        return 2
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = path.name.endswith(".key") or path.name == "secrets.yaml"
        path.touch(mode=0o600 if secret else 0o644)
        path.write_bytes(data)
    print(f"wrote the CA and {len(bundle.issued)} Secrets under {out}")
    print(f"  kubectl apply -f {out / 'secrets.yaml'}   (after the namespaces exist)")
    if ca is None:
        print(f"  keep {out / 'ca.key'} offline: it signs every identity gputopo trusts")
    return 0
