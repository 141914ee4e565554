"""Benchmark runs for the bench tests: one repeat of an arm that measured one step time, and nothing else."""

from __future__ import annotations

from pipebd_core.documents.bench_record import ArmRun, Load, TimingRule


def measured_run(
    repeat: int,
    seconds: float,
    timed_steps: int = 1,
    profile_hash: str | None = None,
    peak_mem: int = 1,
    part_s: list[dict[str, float]] | None = None,
) -> ArmRun:
    """Repeat `repeat` of an arm, measured at `seconds` a step on a quiet machine, with no prediction."""
    return ArmRun(
        repeat=repeat,
        step_s=[seconds],
        measured_step_s=seconds,
        predicted_step_s=None,
        profile_hash=profile_hash,
        timing=TimingRule(warmup_steps=2, timed_steps=timed_steps),
        load=Load(wall_s=1.0, other_cores=0.0, shared=False),
        stages=[],
        peak_mem_bytes=[peak_mem],
        part_s=part_s,
    )
