"""The side-by-side benchmark of distillation: every mode (an arm), the same steps, repeated and
interleaved, and the measured bound, in one run that writes a benchmark record (bench.json).

The arms are independent:
- every arm plans from the same frozen profile: the spec's profile (cached, or measured once at the
  start, or again with `--reprofile`), its calibration left out, written to `frozen-profile.json` and copied
  into each arm's own run directory (no arm runs a profile phase or reads the cache), its hash in the record;
  a profile measured on a busy machine is refused (`frozen_profile`);
- no arm writes calibration anywhere another reads: the supervisor's calibration write-back into the
  profile cache is off, and each arm's calibration.json stays in its own run directory;
- re-planning is off (`schedule.replan: false`): `auto` runs the plan it chose (bench/replan.py is
  where re-planning is measured);
- one timing rule for every mode (arms.py: the first WARMUP_STEPS global steps left out, every later
  one timed from the ranks' own telemetry).

The bound is measured in the same bench, as one more arm of the rotation: one rank runs every block's
teacher and student work of a global step alone, on the same global batch (BOUND_MODE at one rank: one
stage of every block, each teacher block and each student block once per step), T1; the bound is T1
divided by the ranks. The arms rotate (arms.py); each run records the load other processes put on the
node.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path

from pipebd_core.bench.arms import BOUND, WARMUP_STEPS, check_steps, rotate, run_in_own_dir, timed, timing_rule
from pipebd_core.bench.conditions import commit, machine
from pipebd_core.bench.fit import budget, probing
from pipebd_core.bench.progress import begin, write_record
from pipebd_core.documents.bench_record import Arm, ArmRun, BenchRecord, Bound, Reference
from pipebd_core.documents.distill_plan import StageSpan
from pipebd_core.documents.phases import DISTILL, PLAN
from pipebd_core.documents.profile import Profile
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.job.profiling import obtain_profile
from pipebd_core.planning.distill_planner import cost_model, mode_plans, step_plan, timeline
from pipebd_core.planning.profiles import ProfileError, cache_path
from pipebd_core.planning.trust import BUSY_CORES, assess
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError

BOUND_MODE = "tr_dpu"  # at one rank: one stage of every block, each block's teacher and student once a step


def bench_spec(spec: Spec, mode: str, steps: int) -> Spec:
    """The spec with `mode`, exactly `steps` optimiser steps per block, re-planning off, and no explicit
    stages unless hybrid."""
    check_steps(steps)
    per_epoch = step_plan(spec).per_epoch
    document = spec.model_dump(mode="json")
    document["schedule"].update({"mode": mode, "profile": True, "replan": False})
    if mode != "hybrid":
        document["schedule"]["stages"] = None
    elif not document["schedule"]["stages"]:
        raise SpecError("bench: mode 'hybrid' needs schedule.stages in the spec (or use 'auto')")
    document["train"].update({"max_steps": steps, "epochs": math.ceil(steps / per_epoch)})
    return Spec.model_validate(document)


def bound_spec(spec: Spec, steps: int) -> Spec:
    """The T1 run: every block as one stage on one rank, the same global batch, no profile (none is needed
    to plan one stage, and a one-rank profile would be another measurement)."""
    document = bench_spec(spec, BOUND_MODE, steps).model_dump(mode="json")
    document["schedule"].update({"nproc": 1, "profile": False})
    return Spec.model_validate(document)


def read_metrics(run_dir: RunDir, nproc: int) -> list[list[DistillLine]]:
    """Each rank's distillation lines, in the order it wrote them."""
    return [[line for line in run_dir.read_telemetry(rank) if isinstance(line, DistillLine)] for rank in range(nproc)]


def run_arm(spec: Spec, profile: Profile | None, out: Path, repeat: int) -> ArmRun:
    """One run of `spec` in its own run directory, planned from `profile` (a copy in that directory)."""
    copy = (RunDir(out).profile, profile.model_dump_json()) if profile is not None else None
    finished = run_in_own_dir(spec, out, [PLAN, DISTILL], copy)
    run_dir = finished.run_dir
    plan = run_dir.load_plan()
    metrics = read_metrics(run_dir, plan.nproc)
    steps, timing = timed(metrics, run_dir)
    return ArmRun(
        repeat=repeat,
        step_s=steps,
        measured_step_s=statistics.fmean(steps),
        predicted_step_s=plan.details.predicted_step_s,
        profile_hash=run_dir.load_profile().digest() if run_dir.profile.exists() else None,
        timing=timing,
        load=finished.load,
        stages=[StageSpan(start=s.start, stop=s.stop, replicas=s.replicas) for s in plan.stages],
        peak_mem_bytes=[max(line.peak_mem for line in lines) for lines in metrics],
    )


def run_bench(
    spec: Spec,
    modes: list[str],
    steps: int,
    repeats: int,
    out: Path,
    keep: bool = False,
    resume: BenchRecord | None = None,
    minutes: float | None = None,
    reprofile: bool = False,
) -> BenchRecord:
    """Every mode and the bound `repeats` times, interleaved; the record (out/bench.json, written after
    every run: progress.py). `resume`: the record of this bench stopped half-way; `minutes`: choose the
    steps and repeats that fit (fit.py); `reprofile`: measure the profile now (`frozen_profile`)."""
    progress = begin(out, resume, lambda: frozen_profile(bench_spec(spec, modes[0], steps), reprofile), Profile)
    first = probing(out, modes[0], lambda n, at: run_arm(bench_spec(spec, modes[0], n), progress.profile, at, -1))
    fitted = budget(steps, repeats, minutes, resume, lambda: predicted_steps(spec, modes, progress.profile), first)
    steps, repeats = fitted.steps, fitted.repeats
    specs = {mode: bench_spec(spec, mode, steps) for mode in modes}

    def build(runs: dict[str, list[ArmRun]], reference: Reference) -> BenchRecord:
        record = bench_record(spec, runs, progress.profile, steps, repeats, progress.profile_hash, reference)
        return record.model_copy(update={"fitted": fitted.fitted})

    written = progress.writer(build)
    runs = run_arms(spec, specs, progress.profile, steps, repeats, out, keep, None, progress.done, written)
    record = build(runs, progress.reference(ended=True))
    write_record(out, record)
    return record


def predicted_steps(spec: Spec, modes: list[str], profile: Profile) -> dict[str, float]:
    """Each mode's step predicted from `profile` (auto and hybrid: the planner's best plan), and the
    bound's (all the work on one rank)."""
    model = cost_model(bench_spec(spec, modes[0], WARMUP_STEPS + 1), profile)
    plans = mode_plans(model)
    chosen = {mode: plans.get(mode, plans["hybrid"]) for mode in modes}  # auto: the planner's best, as hybrid's
    predicted = {mode: timeline(plan, model).step_s for mode, plan in chosen.items()}
    return {**predicted, BOUND: model.ideal_step() * model.nproc}


REPROFILE = "--reprofile"  # `pipebd bench`'s flag: measure the profile now, whatever the cache holds


def frozen_profile(spec: Spec, reprofile: bool = False) -> Profile:
    """The profile every arm plans from: cached or measured now (`reprofile`: measured now whatever is cached),
    as measured (its calibration left out). A profile measured while the machine was busy (planning/trust.py)
    is refused, named, with the flag that measures it again: every arm would plan from times others' load
    inflated, and nothing in the record would say so."""
    profile, cached = obtain_profile(spec, refresh=reprofile)
    trust = assess(profile)
    if "busy" in trust.flags:
        why = next(message for message in trust.messages if message.startswith("busy: "))
        raise ProfileError(
            f"bench: the {'cached' if cached else 'newly measured'} profile {cache_path(spec)} was measured on a"
            f" busy machine ({why.removeprefix('busy: ')}, more than {BUSY_CORES:g}): no arm is planned from it;"
            f" measure it again on a quiet machine with `pipebd bench {REPROFILE}` and the same arguments"
        )
    return profile.uncalibrated()


def run_arms(
    spec: Spec,
    specs: dict[str, Spec],
    profile: Profile,
    steps: int,
    repeats: int,
    out: Path,
    keep: bool,
    after: Callable[[str, Path], None] | None = None,
    done: dict[str, list[ArmRun]] | None = None,
    written: Callable[[dict[str, list[ArmRun]], list[str]], None] | None = None,
) -> dict[str, list[ArmRun]]:
    """Every arm of `specs` and the bound (BOUND), rotated, `repeats` times (but those `done`);
    `after(arm, folder)` reads a run's directory before it is removed, `written` after every run."""
    arms = {**specs, BOUND: bound_spec(spec, steps)}

    def run(name: str, arm: Spec, folder: Path, repeat: int) -> ArmRun:
        done = run_arm(arm, None if name == BOUND else profile, folder, repeat)
        if after is not None and name != BOUND:
            after(name, folder)
        return done

    return rotate(arms, repeats, out, keep, run, done, written)


def bench_record(
    spec: Spec,
    runs: dict[str, list[ArmRun]],
    profile: Profile,
    steps: int,
    repeats: int,
    profile_hash: str,
    reference: Reference | None,
) -> BenchRecord:
    """The record of a distillation bench: every arm of `runs` in order, the bound from its BOUND runs."""
    t1 = Arm(name=BOUND, runs=runs[BOUND]).step_s if runs[BOUND] else None
    return BenchRecord(
        name=spec.name,
        commit=commit(),
        machine=machine(),
        reference=reference,
        spec=spec.model_dump(mode="json"),
        nproc=spec.schedule.nproc,
        batch_size=spec.data.batch_size,
        steps=steps,
        repeats=repeats,
        timing=timing_rule(WARMUP_STEPS, steps - WARMUP_STEPS),
        profile_hash=profile_hash,
        arms=[Arm(name=name, runs=arm_runs) for name, arm_runs in runs.items() if name != BOUND],
        bound=Bound(
            t1_s=t1,
            ideal_s=t1 / spec.schedule.nproc if t1 is not None else None,
            runs=runs[BOUND],
            profile_ideal_s=cost_model(spec, profile).ideal_step(),
        ),
    )
