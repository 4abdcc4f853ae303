"""The I/O kit the three processes share: Kubernetes, leader election, retries, gRPC, HTTP.

Exporter, aggregator and scheduler are independent of one another (an import contract says
so); what they have in common lives here, one floor above the pure core and one below them:

- `kube`: the one door to the Kubernetes API; `informer`: list, watch, relist on 410 Gone;
- `leader`: Lease-based leader election; `ratelimit`: a token bucket; `backoff`: jittered
  exponential backoff;
- `grpcio`: every gRPC channel and server is made here (the one place TLS and message-size
  limits go);
- `http`: the aiohttp boot with `/metrics` (prometheus_client's own handler), `/healthz` and
  `/readyz`; `metrics`: the one shape every process declares its metrics in;
- `placement_client`: a typed client of the Placement service.

Modules are imported by path (`gputopo.runtime.kube`), so a process that needs no Kubernetes
never loads the client.
"""
