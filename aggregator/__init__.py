"""The aggregator: ingests node topology streams, keeps the cluster graph, serves placement.

`aggregator.state` holds the one mutable cluster state; `aggregator.ingest` is the Reporter gRPC
service exporters stream to; `aggregator.service` is the Placement gRPC service;
`aggregator.server` runs them (and the HTTP endpoints) in one asyncio loop.
"""
