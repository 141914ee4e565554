"""The distillation rank: what one rank of the `distill` phase runs (its entry, runtime, schedule, plan,
communication, the stop protocol), and the `finalize` phase after it. What every rank shares (students,
cross-rank BatchNorm, checkpoints, telemetry) is the rank toolkit's (pipebd_core/rank/).
"""
