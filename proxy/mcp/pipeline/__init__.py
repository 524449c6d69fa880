"""The `tools/call` pipeline: context, classification hand-off, admission (or deferral), side
effects (claim, forward, record), attempts, stored outcomes, and the record of an upstream's own
task answered to a read-only call (`upstream_tasks`)."""
