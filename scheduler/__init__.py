"""The gang-binding scheduler (not implemented yet).

Planned (DESIGN.md): watch pods with gputopo's schedulerName, group them by pod group, wait for
the group's minimum, ask the aggregator's Placement API for a placement, and bind every pod or
none, recording the chosen GPUs on each pod and emitting Events that explain the decision.
No open issue covers it yet; this package only reserves the name in the layout.
"""
