"""Which reports a peer's node identity allows (table; the wire is in test_tls_loopback)."""

from __future__ import annotations

import pytest

from gputopo.runtime.identity import report_denial


@pytest.mark.parametrize(
    ("peer", "reported", "require", "denied"),
    [
        ("a100-01", "a100-01", True, None),
        ("a100-01", "a100-02", False, "this exporter is 'a100-01' and may not report 'a100-02'"),
        ("a100-01", "a100-02", True, "this exporter is 'a100-01' and may not report 'a100-02'"),
        (None, "a100-02", False, None),
        (None, "a100-02", True, "'a100-02' needs a client certificate of CN system:node:NAME"),
    ],
)
def test_a_peer_reports_only_the_node_it_is(
    peer: str | None, reported: str, require: bool, denied: str | None
) -> None:
    got = report_denial(peer, reported, require=require)
    assert got == (None if denied is None else f"node_name: {denied}")
