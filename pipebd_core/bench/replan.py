"""The recovery benchmark: `auto` planned from a profile taken under load, with and without re-planning,
next to `auto` planned from a clean profile, side by side in one run.

`pipebd bench SPEC --replan` measures two profiles of the spec first: a clean one, and one taken while
`--load-cores` processes keep cores busy (loadgen.py; stopped before any training). Then, `repeats`
times with the order rotated, it runs the same steps three ways, each from a fresh copy of its
profile in a cache of its own (so no run's calibration reaches another):

    loaded      the loaded profile, schedule.replan false: what a job did before calibration
    replanned   the loaded profile, schedule.replan true: calibrates and re-plans mid-run
    clean       the clean profile, schedule.replan false

Each run is timed by the benchmarks' one rule (arms.py) over its last launch (the plan it ended with:
that launch's first WARMUP_STEPS steps left out), and records the load on the node, the hash of the
profile it planned from, its re-plans, and its last calibration's predicted step for the plan it ran
next to the measured one. The record (bench.json, `ReplanBenchRecord`) holds every run; the table gives
replanned / clean (target: within 5%) and the calibrated prediction's error (target: within 10%).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipebd_core.bench.arms import RECORD, RUN_TIMEOUT_S, rotate, timed
from pipebd_core.bench.conditions import LoadMeter, commit, machine
from pipebd_core.bench.distill import bench_spec
from pipebd_core.bench.loadgen import busy_cores
from pipebd_core.documents.bench_record import ProfileUsed, ReplanBenchRecord, ReplanRun, ReplanVariant
from pipebd_core.documents.distill_plan import StageSpan
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.profile import Profile
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.job.launch import prepare_run
from pipebd_core.job.outcomes import SUCCEEDED
from pipebd_core.job.profiling import obtain_profile
from pipebd_core.job.supervisor import Supervisor
from pipebd_core.planning import profiles
from pipebd_core.planning.trust import assess
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec

VARIANTS = ("loaded", "replanned", "clean")


@contextmanager
def profile_cache(folder: Path) -> Iterator[Path]:
    """Point the profile cache at `folder` while the block runs (the phases' processes inherit it)."""
    before = os.environ.get(profiles.CACHE_ENV)
    os.environ[profiles.CACHE_ENV] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop(profiles.CACHE_ENV, None)
        else:
            os.environ[profiles.CACHE_ENV] = before


def measure_profiles(spec: Spec, out: Path, load_cores: int, trials: int) -> dict[str, Profile]:
    """The clean profile, then the one taken under load."""
    with profile_cache(out / "cache-clean"):
        clean, _ = obtain_profile(spec, refresh=True, trials=trials)
    with profile_cache(out / "cache-loaded"), busy_cores(load_cores):
        loaded, _ = obtain_profile(spec, refresh=True, trials=trials)
    return {"clean": clean, "loaded": loaded}


def variant_spec(spec: Spec, variant: str, steps: int) -> Spec:
    document = bench_spec(spec, "auto", steps).model_dump(mode="json")
    document["schedule"]["replan"] = variant == "replanned"
    return Spec.model_validate(document)


def last_launch_lines(run_dir: RunDir, nproc: int, since: float) -> list[list[DistillLine]]:
    """Each rank's lines written after `since` (the last launch's start)."""
    lines = []
    for rank in range(nproc):
        written = [line for line in run_dir.read_telemetry(rank) if isinstance(line, DistillLine)]
        lines.append([line for line in written if line.time >= since])
    return lines


def run_variant(spec: Spec, profile: Profile, out: Path, repeat: int) -> ReplanRun:
    """One run from `profile`, stored afresh in a cache of its own."""
    with profile_cache(out / "cache"):
        profiles.store(spec, profile)
        run_dir = prepare_run(spec, out / "run")
        meter = LoadMeter.open()
        outcome = Supervisor(run_dir, time_limit_s=RUN_TIMEOUT_S).run()
        load = meter.load()
    if outcome.result != SUCCEEDED:
        raise RuntimeError(f"bench --replan: a run {outcome.result} in {outcome.phase}: {outcome.error}")
    events = [json.loads(line) for line in run_dir.events.read_text().splitlines()]
    distill_start = next(e["time"] for e in events if e["event"] == "phase_started" and e["phase"] == DISTILL)
    since = max([distill_start, *(e["time"] for e in events if e["event"] == "replanned")])
    plan = run_dir.load_plan()
    calibrations = [e for e in events if e["event"] == "calibrated" and e["time"] >= since]
    last = calibrations[-1] if calibrations else {}
    lines = last_launch_lines(run_dir, plan.nproc, since)
    first = min(line.step for rank in lines for line in rank)  # where the last launch resumed
    shifted = [[line.model_copy(update={"step": line.step - first}) for line in rank] for rank in lines]
    steps, timing = timed(shifted, run_dir)
    run_dir.compressed_model.unlink(missing_ok=True)
    return ReplanRun(
        repeat=repeat,
        step_s=steps,
        measured_step_s=statistics.fmean(steps),
        predicted_step_s=plan.details.predicted_step_s,
        profile_hash=run_dir.load_profile().uncalibrated().digest(),
        timing=timing,
        load=load,
        stages=[StageSpan(start=s.start, stop=s.stop, replicas=s.replicas) for s in plan.stages],
        peak_mem_bytes=[max(line.peak_mem for line in rank) for rank in lines],
        calibrated_step_s=last.get("calibrated_step_s"),
        calibration_measured_step_s=last.get("measured_step_s"),
        replans=len(plan.details.replans),
        declined=[e["reason"] for e in events if e["event"] == "replan_declined"],
    )


def profile_used(profile: Profile) -> ProfileUsed:
    trust = assess(profile)
    return ProfileUsed(
        hash=profile.digest(), trusted=trust.trusted, flags=trust.flags, other_cores=trust.other_cpu_cores
    )


def run_replan_bench(
    spec: Spec, steps: int, repeats: int, out: Path, load_cores: int = 1, trials: int = 5, keep: bool = False
) -> ReplanBenchRecord:
    """Measure both profiles, run every variant `repeats` times interleaved; the record (out/bench.json)."""
    measured = measure_profiles(spec, out, load_cores, trials)

    def run(name: str, variant: Spec, folder: Path, repeat: int) -> ReplanRun:
        return run_variant(variant, measured["clean" if name == "clean" else "loaded"], folder, repeat)

    specs = {variant: variant_spec(spec, variant, steps) for variant in VARIANTS}
    runs = rotate(specs, repeats, out, keep, run)
    record = ReplanBenchRecord(
        name=spec.name,
        commit=commit(),
        machine=machine(),
        spec=spec.model_dump(mode="json"),
        nproc=spec.schedule.nproc,
        steps=steps,
        repeats=repeats,
        load_cores=load_cores,
        profiles={name: profile_used(profile) for name, profile in measured.items()},
        variants=[ReplanVariant(name=variant, runs=runs[variant]) for variant in VARIANTS],
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORD).write_text(record.model_dump_json(indent=1))
    return record


def calibrated_error(runs: list[ReplanRun]) -> float | None:
    """The median over the runs of the last calibration's prediction against what it measured."""
    pairs = [(r.calibrated_step_s, r.calibration_measured_step_s) for r in runs]
    errors = [predicted / measured - 1 for predicted, measured in pairs if predicted and measured]
    return statistics.median(errors) if errors else None


def format_table(record: ReplanBenchRecord) -> str:
    head = f"{'variant':10} {'step ms':>8} {'vs clean':>9} {'planned ms':>11} {'calib. err':>10} {'re-plans':>8}"
    lines = [f"{head}  other cores  final stages"]
    steps = {v.name: statistics.median(r.measured_step_s for r in v.runs) for v in record.variants}
    for variant in record.variants:
        step, error, first = steps[variant.name], calibrated_error(variant.runs), variant.runs[0]
        loads = ",".join(f"{r.load.other_cores:.2f}" + ("*" if r.load.shared else "") for r in variant.runs)
        predicted = first.predicted_step_s
        lines.append(
            f"{variant.name:10} {step * 1e3:8.1f} {step / steps['clean']:8.2f}x"
            f" {(predicted or float('nan')) * 1e3:11.1f} {'-' if error is None else f'{error:+.0%}':>10}"
            f" {','.join(str(r.replans) for r in variant.runs):>8}  {loads:11}"
            f"  {[s.triple() for s in variant.runs[-1].stages]}"
        )
    for variant in record.variants:
        for run in variant.runs:
            lines.extend(f"{variant.name}: no re-plan: {reason}" for reason in run.declined[-1:])
    for name, used in record.profiles.items():
        lines.append(f"{name} profile {used.hash}: {'trusted' if used.trusted else ', '.join(used.flags)}")
    lines.append("other cores: what other processes used during each run (* shared)")
    return "\n".join(lines)
