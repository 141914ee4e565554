"""The distillation rank: what one rank of the `distill` phase runs (its entry, runtime, schedule, plan,
communication, students, cross-rank BatchNorm, checkpoints, telemetry), and the `finalize` phase after it.
"""
