"""Translate between `gputopo.v1` protobuf messages and domain objects, one module per message
family: `topology` (a node's topology), `report` (the exporter's stream: deltas, peer probes),
`placement` (requests and results) and `cluster` (GetTopology's nodes and domains).

Protobuf stays at the edge: services decode what arrives with these functions and the core only
ever sees domain values. Decoding validates what the wire format cannot (indices in range, names
present) and raises `CodecError` naming the field, which servers return as INVALID_ARGUMENT.
Everything public is re-exported here, so callers import from `gputopo.codec`.
"""

import importlib
from typing import TYPE_CHECKING

from gputopo.codec._base import CodecError, seconds, timestamp
from gputopo.codec.limits import check_limits, clip_texts
from gputopo.codec.report import (
    delta_from_proto,
    delta_to_proto,
    gpu_use_from_proto,
    gpu_use_to_proto,
    peer_probe_from_proto,
    peer_probe_to_proto,
)
from gputopo.codec.topology import (
    fabric_from_proto,
    fabric_to_proto,
    gpu_from_proto,
    gpu_to_proto,
    link_from_proto,
    link_to_proto,
    nic_from_proto,
    nic_to_proto,
    nvml_from_proto,
    nvml_to_proto,
    topology_from_proto,
    topology_to_proto,
)

if TYPE_CHECKING:
    from gputopo.codec.cluster import cluster_to_proto, node_state_to_proto
    from gputopo.codec.placement import (
        request_from_proto,
        request_to_proto,
        result_from_proto,
        result_to_proto,
    )

# The cluster and placement families pull in the placement engine and numpy (about 13 MiB of
# RSS). The exporter on every node only ever speaks the report family, so those two load on
# first use (PEP 562) rather than with the package.
_LAZY = {
    "cluster_to_proto": "gputopo.codec.cluster",
    "node_state_to_proto": "gputopo.codec.cluster",
    "request_from_proto": "gputopo.codec.placement",
    "request_to_proto": "gputopo.codec.placement",
    "result_from_proto": "gputopo.codec.placement",
    "result_to_proto": "gputopo.codec.placement",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "CodecError",
    "check_limits",
    "clip_texts",
    "cluster_to_proto",
    "delta_from_proto",
    "delta_to_proto",
    "fabric_from_proto",
    "fabric_to_proto",
    "gpu_from_proto",
    "gpu_to_proto",
    "gpu_use_from_proto",
    "gpu_use_to_proto",
    "link_from_proto",
    "link_to_proto",
    "nic_from_proto",
    "nic_to_proto",
    "node_state_to_proto",
    "nvml_from_proto",
    "nvml_to_proto",
    "peer_probe_from_proto",
    "peer_probe_to_proto",
    "request_from_proto",
    "request_to_proto",
    "result_from_proto",
    "result_to_proto",
    "seconds",
    "timestamp",
    "topology_from_proto",
    "topology_to_proto",
]
