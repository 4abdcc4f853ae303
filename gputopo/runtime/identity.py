"""Who is on the other end of a gRPC call or an HTTP request, from what mutual TLS proved.

A node's exporter carries a certificate whose common name is `system:node:NAME` (the form the
kubelet's own client certificates use, so one issuer policy covers both). The aggregator lets a
stream report only for that NAME, as the NodeRestriction admission plugin does for kubelets: a
pod that holds some other valid certificate still cannot speak for a node it is not.

A certificate's Organizations (O=) are its groups, as Kubernetes reads client certificates
(`groups_of_rpc`, `groups_of_http`): a role may name a group rather than every member's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

__all__ = [
    "NODE_PREFIX",
    "caller_of_http",
    "caller_of_rpc",
    "groups_of_http",
    "groups_of_rpc",
    "node_of_peer",
    "report_denial",
]

NODE_PREFIX = "system:node:"


def node_of_peer(context: grpc.aio.ServicerContext) -> str | None:  # type: ignore[type-arg]
    """The node the peer's certificate names, or None (plain text, or no node identity)."""
    for cn in context.auth_context().get("x509_common_name", []):
        text = cn.decode("utf-8", "replace")
        if text.startswith(NODE_PREFIX):
            return text[len(NODE_PREFIX) :]
    return None


def report_denial(peer_node: str | None, reported: str, *, require: bool) -> str | None:
    """Why a report for `reported` is refused (one line), or None when it may be applied.

    `require` refuses peers without a node identity too (mutual TLS with node certificates).
    """
    if peer_node is None:
        if require:
            return f"node_name: {reported!r} needs a client certificate of CN {NODE_PREFIX}NAME"
        return None
    if peer_node != reported:
        return f"node_name: this exporter is {peer_node!r} and may not report {reported!r}"
    return None


def caller_of_rpc(context: grpc.aio.ServicerContext) -> str:  # type: ignore[type-arg]
    """The common name of the peer's verified client certificate; "" over plain text.

    A reservation remembers who made it by this name, so only that caller may commit or
    release it (an id alone, which sits in pod annotations, is not enough).
    """
    for cn in context.auth_context().get("x509_common_name", []):
        return cn.decode("utf-8", "replace")
    return ""


def caller_of_http(peercert: Mapping[str, Any] | None) -> str:
    """The same for an HTTPS request, from `ssl.SSLSocket.getpeercert()`'s dictionary (what
    aiohttp's `request.transport.get_extra_info("peercert")` returns); "" without one."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def groups_of_rpc(context: grpc.aio.ServicerContext) -> frozenset[str]:  # type: ignore[type-arg]
    """The Organizations (O=) of the peer's verified client certificate; none over plain text.

    gRPC hands over the certificate itself (`x509_pem_cert`), not its subject's parts."""
    for pem in context.auth_context().get("x509_pem_cert", []):
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError:
            return frozenset()
        return frozenset(
            str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
        )
    return frozenset()


def groups_of_http(peercert: Mapping[str, Any] | None) -> frozenset[str]:
    """The same for an HTTPS request, from `ssl.SSLSocket.getpeercert()`'s dictionary."""
    return frozenset(
        str(value)
        for rdn in (peercert or {}).get("subject", ())
        for key, value in rdn
        if key == "organizationName"
    )
