"""The gang binder (`gputopo scheduler`): binds the pods that name it a whole group at a time
where gputopo placed them, and keeps the group semantics users rely on.

Modules: `binder` (the passes and the steps), `decisions` (what to do, typed as kube-scheduler's
statuses, pure), `groups` (which pods form a gang and what it asks, pure), `native` (which native
Workload API version the server serves), `status` (group status, pure), `server` (the process),
`metrics`, `fitness` (kube-scheduler's node filters over the Nodes and bound Pods it watches),
`dra` (allocating a pod's GPU ResourceClaims before the Binding), `preflight` (what the process
needs from the cluster, checked at start). README "The gang binder" says what it does.
"""
