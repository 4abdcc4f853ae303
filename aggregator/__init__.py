"""The aggregator: ingests node topology streams, keeps the cluster graph, serves placement.

`aggregator.state` holds the one mutable cluster state (reports and labels, the reservation book,
`aggregator.occupancy` for everything else that holds GPUs); `aggregator.ingest` is the Reporter
gRPC service exporters stream to; `aggregator.service` and `aggregator.http_placement` translate
the Placement API to and from `gputopo.core.PlacementCore`; `aggregator.promises` keeps
reservations as GpuReservation objects; the `*watch` modules feed the state from Kubernetes
(Nodes, Pods, ResourceClaims); `aggregator.publisher` and `aggregator.schedwriter` write labels
and scheduler objects; `aggregator.server` runs them all in one asyncio loop.
"""
