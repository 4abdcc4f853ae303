"""The gang binder: binds a pod group's pods all together, or none, where the aggregator placed it.

It watches pods with gputopo's schedulerName, groups them by pod group (`scheduler.groups`),
waits for the group's minimum, asks the aggregator's Placement API for a placement, records the
chosen GPUs on each pod and binds every pod or none, emitting Events that explain the decision
(`scheduler.binder`); `scheduler.server` runs it behind a Lease (`gputopo scheduler`). Design:
the repository's README ("The gang binder").
"""
