"""The side-by-side benchmark of end-to-end training: every strategy (or partitioner), the same steps,
interleaved and repeated, and the measured bound, in one run that writes a benchmark record (bench.json).

`pipebd bench SPEC --phase finetune --modes ddp,gpipe,1f1b,zb,auto` runs, for each strategy (an arm),
just the end-to-end training's plan and training phases on the spec's network freshly initialised
(speed does not depend on the weights, so no distillation runs first). `--partitioners
even,pipedream,layerpipe` runs one pipelined strategy (the spec's, or `--modes` with a single one, else
zb) with each partitioner's cut instead. As in distillation (distill.py, arms.py): every arm plans from
the same frozen layer profile (cached, or measured once at the start; copied into each arm's run
directory, its hash in the record), the arms rotate, every run is timed by the one rule and records the
load on the node. The bound: ddp on one rank, the full batch through the whole network (T1), in the
same rotation; efficiency is (T1 / N) / a run's step. Each run also records each rank's bubble (the
share of its step it waits: receives, sends, idle), its compute a step, and the planner's predicted
step and stage times; the record keeps what splitting the backward costs by itself, (I + W) / B over
the network's layers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pipebd_core.bench.arms import (
    BOUND,
    WARMUP_STEPS,
    check_steps,
    epoch_starts,
    rotate,
    run_in_own_dir,
    timed,
    timing_rule,
)
from pipebd_core.bench.conditions import commit, machine
from pipebd_core.bench.fit import budget, probing
from pipebd_core.bench.progress import Progress, begin, write_record
from pipebd_core.documents.bench_record import Arm, ArmRun, BenchRecord, Bound, Reference, TimingRule
from pipebd_core.documents.distill_plan import StageSpan
from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.phases import FINETUNE, PLAN_FINETUNE
from pipebd_core.documents.telemetry import FinetuneLine
from pipebd_core.finetune.plan import PIPELINED, TrainPlan
from pipebd_core.job.profiling import obtain_layer_profile
from pipebd_core.planning.finetune_planner import probe_network, resolve_train_plan
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError, parse_spec

STRATEGIES = ("ddp", "gpipe", "1f1b", "zb", "auto")
COMPUTE = ("F", "B", "I", "W", "optim")
WAITING = ("recv_wait", "send", "idle")


def bench_spec(spec: Spec, strategy: str, steps: int, partitioner: str | None = None) -> Spec:
    """`spec` training end to end with `strategy` for exactly `steps` steps, from a fresh network (with
    `partitioner`, cut by it rather than by the spec's stages)."""
    if spec.finetune is None:
        raise SpecError("bench --phase finetune: the spec has no finetune section; add finetune: {} to it")
    check_steps(steps)
    document = spec.model_dump(mode="json")
    tune = document["finetune"]
    tune.update(strategy=strategy, max_steps=steps, epochs=1_000, profile=True, init="scratch")
    if strategy in ("ddp", "auto") or partitioner is not None:
        tune.update(stages=None, moved=None)
    if partitioner is not None:
        tune["partitioner"] = partitioner
    return parse_spec(document)


def partitioner_strategy(spec: Spec, strategies: list[str]) -> str:
    """The one pipelined strategy a partitioner benchmark runs: --modes', the spec's, or zb."""
    if not strategies:
        tune = spec.finetune
        return tune.strategy if tune is not None and tune.strategy in PIPELINED else "zb"
    if len(strategies) != 1 or strategies[0] not in PIPELINED:
        raise SpecError(
            f"bench --partitioners: runs one pipelined schedule with every partition; give --modes one of"
            f" {', '.join(PIPELINED)}, not {','.join(strategies)}"
        )
    return strategies[0]


def read_lines(run_dir: RunDir, nproc: int) -> list[list[FinetuneLine]]:
    """Each rank's step lines (evaluations left out)."""
    lines = []
    for rank in range(nproc):
        lines.append([line for line in run_dir.read_telemetry(rank, FINETUNE) if isinstance(line, FinetuneLine)])
    return lines


def bound_spec(spec: Spec, steps: int) -> Spec:
    """The T1 run: ddp on one rank, the full batch through the whole network, no layer profile (none is
    needed to plan it)."""
    document = bench_spec(spec, "ddp", steps).model_dump(mode="json")
    document["schedule"]["nproc"] = 1
    document["finetune"].update(profile=False, partitioner="pipedream")  # ddp cuts nothing
    return parse_spec(document)


def plan_stages(plan: TrainPlan) -> list[StageSpan]:
    """The stages a plan ran: one per rank for a pipeline, the whole network on every rank for ddp."""
    if plan.pipelined:
        return [StageSpan(start=start, stop=stop, replicas=1) for start, stop in plan.stages]
    start, stop = plan.stages[0]
    return [StageSpan(start=start, stop=stop, replicas=plan.nproc)]


def run_arm(spec: Spec, profile: LayerProfile | None, out: Path, repeat: int) -> ArmRun:
    """One run of `spec`'s end-to-end training in its own run directory, planned from `profile`."""
    copy = (RunDir(out).layer_profile, profile.model_dump_json()) if profile is not None else None
    finished = run_in_own_dir(spec, out, [PLAN_FINETUNE, FINETUNE], copy)
    run_dir = finished.run_dir
    plan = TrainPlan.from_document(run_dir.load_finetune_plan())
    lines = read_lines(run_dir, plan.nproc)
    left_out = epoch_starts(plan.steps.per_epoch, plan.steps.total)
    steps, timing = timed(lines, run_dir, left_out)
    step = statistics.fmean(steps)
    timed_steps = set(range(WARMUP_STEPS, plan.steps.total)) - set(left_out)
    steady = [[line for line in records if line.step in timed_steps] for records in lines]
    per_rank = [{k: statistics.median(r.times[k] for r in records) for k in (*COMPUTE, *WAITING)} for records in steady]
    predictions = plan.details.predictions if plan.details is not None else None
    return ArmRun(
        repeat=repeat,
        step_s=steps,
        measured_step_s=step,
        predicted_step_s=predictions.predicted_step_s if predictions else None,
        profile_hash=run_dir.load_layer_profile().digest() if run_dir.layer_profile.exists() else None,
        timing=timing,
        load=finished.load,
        stages=plan_stages(plan),
        peak_mem_bytes=[max(record.peak_mem for record in records) for records in lines],
        strategy=plan.strategy,
        bubble=[sum(times[k] for k in WAITING) / step for times in per_rank],
        stage_s=[sum(times[k] for k in COMPUTE) for times in per_rank],
        predicted_stage_s=predictions.predicted_stage_s if predictions else None,
        part_s=[{k: times[k] for k in COMPUTE} for times in per_rank],
    )


def split_cost(profile: LayerProfile) -> float:
    """(I + W) / B over every layer at one micro-batch: what splitting the backward costs by itself."""
    layers = [layer.microbatch for layer in profile.layers]
    split = sum(layer.I.median + layer.W.median for layer in layers)
    whole = sum(layer.B.median for layer in layers)
    return split / whole if whole else float("nan")


def run_finetune_bench(
    spec: Spec,
    strategies: list[str],
    steps: int,
    repeats: int,
    out: Path,
    keep: bool = False,
    partitioners: list[str] | None = None,
    resume: BenchRecord | None = None,
    minutes: float | None = None,
) -> BenchRecord:
    """Strategies side by side, or (`partitioners`) one pipelined strategy on each partitioner's cut, and
    the bound; the record (out/bench.json, written after every run; `resume` and `minutes` as in
    distill.run_bench)."""
    strategy = partitioner_strategy(spec, strategies) if partitioners else None

    def arm_specs(steps: int) -> dict[str, Spec]:
        if partitioners:
            return {name: bench_spec(spec, strategy or "zb", steps, name) for name in partitioners}
        return {name: bench_spec(spec, name, steps) for name in strategies}

    progress = begin(out, resume, lambda: obtain_layer_profile(next(iter(arm_specs(steps).values()))), LayerProfile)
    first = next(iter(arm_specs(steps)))
    probe = probing(out, first, lambda n, at: run_arm(arm_specs(n)[first], progress.profile, at, -1))
    fitted = budget(
        steps,
        repeats,
        minutes,
        resume,
        lambda: predicted_steps(arm_specs(steps), progress.profile, spec.schedule.nproc),
        probe,
    )
    steps, repeats = fitted.steps, fitted.repeats
    specs = arm_specs(steps)
    compares: Literal["strategies", "partitioners"] = "partitioners" if partitioners else "strategies"

    def build(runs: dict[str, list[ArmRun]], reference: Reference) -> BenchRecord:
        record = finetune_record(
            spec, runs, progress.profile, progress.profile_hash, steps, repeats, compares, reference, strategy
        )
        return record.model_copy(update={"fitted": fitted.fitted})

    runs = run_with_bound(spec, specs, progress, steps, repeats, keep, progress.writer(build))
    record = build(runs, progress.reference(ended=True))
    write_record(out, record)
    return record


def predicted_steps(specs: dict[str, Spec], profile: LayerProfile, nproc: int) -> dict[str, float]:
    """Each arm's step as its plan phase predicts it from `profile`, and the bound's (ddp's on one rank:
    its prediction at `nproc` ranks times `nproc`, or the slowest arm's where ddp is no arm)."""
    predicted = {}
    probed = probe_network(next(iter(specs.values())), None)  # every arm trains the same network
    for name, arm in specs.items():
        plan = resolve_train_plan(arm, None, profile, probed=probed)
        predictions = plan.details.predictions if plan.details is not None else None
        if predictions is None or predictions.predicted_step_s is None:
            raise RuntimeError(f"bench --minutes: {name}'s plan has no prediction from the layer profile")
        predicted[name] = predictions.predicted_step_s
    return {**predicted, BOUND: predicted.get("ddp", max(predicted.values())) * nproc}


def run_with_bound(
    spec: Spec,
    specs: dict[str, Spec],
    progress: Progress[LayerProfile],
    steps: int,
    repeats: int,
    keep: bool,
    written: Callable[[dict[str, list[ArmRun]], list[str]], None],
) -> dict[str, list[ArmRun]]:
    """Every arm of `specs`, each planned from the progress's profile, and the bound, rotated `repeats`
    times (but the runs already done)."""
    arms = {**specs, BOUND: bound_spec(spec, steps)}

    def run(name: str, arm: Spec, folder: Path, repeat: int) -> ArmRun:
        return run_arm(arm, None if name == BOUND else progress.profile, folder, repeat)

    return rotate(arms, repeats, progress.out, keep, run, progress.done, written)


def finetune_record(
    spec: Spec,
    runs: dict[str, list[ArmRun]],
    profile: LayerProfile,
    profile_hash: str,
    steps: int,
    repeats: int,
    compares: Literal["strategies", "partitioners", "plans"],
    reference: Reference | None,
    strategy: str | None = None,
) -> BenchRecord:
    """The record of an end-to-end training bench: every arm of `runs` in order, the bound from its BOUND runs."""
    t1 = Arm(name=BOUND, runs=runs[BOUND]).step_s if runs[BOUND] else None
    tune = spec.finetune
    assert tune is not None, "bench_spec refuses a spec without a finetune section"
    return BenchRecord(
        phase=FINETUNE,
        compares=compares,
        baseline="pipedream" if compares == "partitioners" else "ddp",
        strategy=strategy,
        name=spec.name,
        commit=commit(),
        machine=machine(),
        reference=reference,
        spec=spec.model_dump(mode="json"),
        nproc=spec.schedule.nproc,
        batch_size=tune.batch_size or spec.data.batch_size,
        steps=steps,
        repeats=repeats,
        timing=timing_of(runs, steps),  # every arm's: the same steps, batch and data set
        profile_hash=profile_hash,
        arms=[Arm(name=name, runs=arm_runs) for name, arm_runs in runs.items() if name != BOUND],
        bound=Bound(
            t1_s=t1,
            ideal_s=t1 / spec.schedule.nproc if t1 is not None else None,
            runs=runs[BOUND],
            profile_ideal_s=None,
        ),
        split_cost=split_cost(profile),
    )


def timing_of(runs: dict[str, list[ArmRun]], steps: int) -> TimingRule:
    """The timing every run was measured by: the bound's first run's (every arm's alike), or before any
    bound ran, the first run's; before any run, the rule without its epoch starts."""
    first = runs[BOUND][:1] or [run for arm_runs in runs.values() for run in arm_runs][:1]
    return first[0].timing if first else timing_rule(WARMUP_STEPS, steps - WARMUP_STEPS)
