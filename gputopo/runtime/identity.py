"""Who is on the other end of a gRPC call, from what mutual TLS already proved.

A node's exporter carries a certificate whose common name is `system:node:NAME` (the form the
kubelet's own client certificates use, so one issuer policy covers both). The aggregator lets a
stream report only for that NAME, as the NodeRestriction admission plugin does for kubelets: a
pod that holds some other valid certificate still cannot speak for a node it is not.
"""

from __future__ import annotations

import grpc

__all__ = ["NODE_PREFIX", "node_of_peer", "report_denial"]

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
