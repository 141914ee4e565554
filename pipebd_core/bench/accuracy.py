"""Predictions checked out of sample: `pipebd bench SPEC --accuracy`.

The candidate plans: every mode's own plan on the profile (dp, ls, ir, tr, tr_dpu), the planner's top
five (what `auto` ranks; the first is the plan it runs), and five more drawn with a seed from every plan
that fits (contiguous stages, replica counts summing to the ranks). Two candidates that would run the
same way are one arm (the first name it came under; the others are kept in `also`): dp and ls by their
mode, tr by its stages (its barrier sets it apart), every other pipelined mode (ir, tr_dpu, hybrid) by
its stages alone.

Every candidate is an arm of one distillation bench (distill.py): planned from the same frozen profile,
its calibration left out, re-planning off, timed by the one rule, rotated with the measured bound. The
prediction of a plan is the step its own plan phase predicted from that profile; the measurement, the
median of its repeats.

Calibrated predictions, out of sample (CALIBRATION_RULE): each arm's run writes a calibration.json into
its own run directory (nothing else reads it; its first repeat's is kept in out/first-runs). Candidate
j is predicted with the frozen profile calibrated by the calibration of the NEXT candidate's run in the
list, cyclically, that ran OTHER stages than j (a run of j's own stages, tr for tr_dpu, is j measuring
itself): the costs come from a different plan than the one they are checked against. With several
repeats, the donor's first repeat calibrates. The guard (planning/calibration_guard.py) then applies a
calibration to a plan only where the calibrated prediction agrees with the profile's within max(5%,
1.25 x the record's noise floor); elsewhere the calibrated figures use the profile's prediction, so a
calibration cannot move a plan's prediction further than the measurement can tell.

The figures (`Accuracy`, in the record): MAPE, the mean of |predicted - measured| / measured over the
candidates; rank correlation, Kendall's tau-b between predicted and measured step times; the chosen
plan's regret, its measured step over the best measured minus one. From the profile alone the chosen
plan is the planner's first; with calibrated costs, the candidate with the lowest calibrated prediction.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pipebd_core.bench.arms import BOUND
from pipebd_core.bench.distill import bench_record, bench_spec, frozen_profile, run_arm, run_arms
from pipebd_core.bench.doubt import apply_guard, guarded_predictions, kendall_tau, mape, noise_floor, regret
from pipebd_core.bench.fit import budget, probing
from pipebd_core.bench.progress import begin, write_record
from pipebd_core.distill.plan import Plan, build_stages
from pipebd_core.documents.bench_record import (
    Accuracy,
    AccuracyFigures,
    Arm,
    ArmRun,
    BenchRecord,
    PlanAccuracy,
    Reference,
)
from pipebd_core.documents.calibration import Calibration
from pipebd_core.documents.distill_plan import StageSpan
from pipebd_core.documents.profile import Profile
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_planner import cost_model, mode_plans, timeline
from pipebd_core.planning.distill_search import search
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, StageSpec

MODE_CANDIDATES = ("dp", "ls", "ir", "tr", "tr_dpu")  # each mode's own plan (hybrid's is the planner's first)
TOP = 5  # the planner's best plans
DRAWN = 5  # plans drawn with the seed
DRAW_ATTEMPTS = 2_000  # draws tried before settling for fewer new plans (a small workload has few)
CHOSEN = "top1"  # the planner's first plan: what auto runs
CALIBRATION_RULE = (
    "each plan predicted with the calibration of the next candidate's run that ran other stages (cyclically),"
    " applied only where it agrees with the profile within max(5%, 1.25 x the noise floor)"
)

Triple = tuple[int, int, int]  # (start, stop, replicas)
Source = Literal["mode", "top", "drawn"]


@dataclass(frozen=True)
class Candidate:
    """A plan to predict and run: `mode` with `stages` (none for dp and ls)."""

    name: str
    source: Source  # a mode's own plan, the planner's top, or drawn
    mode: str
    stages: tuple[Triple, ...] = ()
    also: tuple[str, ...] = field(default=())

    def key(self) -> tuple[object, ...]:
        """What makes two candidates the same run: dp and ls by mode, tr by its stages, other pipelines by
        their stages alone (ir, tr_dpu and hybrid run one stage list the same way)."""
        if self.mode in ("dp", "ls"):
            return (self.mode,)
        return ("tr" if self.mode == "tr" else "pipeline", self.stages)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.also)


def plan_triples(plan: Plan) -> tuple[Triple, ...]:
    return tuple((stage.start, stage.stop, stage.replicas) for stage in plan.stages)


def mode_candidates(model: CostModel) -> list[Candidate]:
    """Every mode's own plan on `model` (tr and tr_dpu only where every rank can have a block)."""
    plans = mode_plans(model)
    return [Candidate(m, "mode", m, plan_triples(plans[m])) for m in MODE_CANDIDATES if m in plans]


def top_candidates(model: CostModel, count: int = TOP) -> list[Candidate]:
    """The planner's `count` best plans, best first (top1 is what auto runs)."""
    ranked = search(model, top_k=count).plans
    return [Candidate(f"top{rank}", "top", "hybrid", tuple(p.triples())) for rank, p in enumerate(ranked, start=1)]


def draw_plan(model: CostModel, rng: random.Random) -> tuple[Triple, ...] | None:
    """One plan drawn at random: a number of stages, cuts between blocks, ranks split among the stages;
    None when a stage has more replicas than rows or does not fit in memory."""
    blocks, nproc = model.num_blocks, model.nproc
    count = rng.randint(1, min(nproc, blocks))
    cuts = [0, *sorted(rng.sample(range(1, blocks), count - 1)), blocks]
    splits = [0, *sorted(rng.sample(range(1, nproc), count - 1)), nproc]
    triples = tuple((cuts[i], cuts[i + 1], splits[i + 1] - splits[i]) for i in range(count))
    for start, stop, replicas in triples:
        if replicas > model.batch_size or not model.fits(model.stage(start, stop, replicas)):
            return None
    return triples


def drawn_candidates(model: CostModel, seed: int, taken: Sequence[Candidate], count: int = DRAWN) -> list[Candidate]:
    """Up to `count` plans drawn with `seed` that are none of `taken` (fewer when the workload has fewer)."""
    rng = random.Random(seed)
    keys = {candidate.key() for candidate in taken}
    drawn: list[Candidate] = []
    for _ in range(DRAW_ATTEMPTS):
        if len(drawn) == count:
            break
        stages = draw_plan(model, rng)
        candidate = Candidate(f"drawn{len(drawn) + 1}", "drawn", "hybrid", stages or ())
        if stages is not None and candidate.key() not in keys:
            keys.add(candidate.key())
            drawn.append(candidate)
    return drawn


def deduplicate(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per distinct run, in first-seen order; later names for it go to its `also`."""
    kept: dict[tuple[object, ...], Candidate] = {}
    for candidate in candidates:
        first = kept.get(candidate.key())
        if first is None:
            kept[candidate.key()] = candidate
        else:
            kept[candidate.key()] = replace(first, also=(*first.also, candidate.name))
    return list(kept.values())


def candidates(model: CostModel, seed: int, top: int = TOP, drawn: int = DRAWN) -> list[Candidate]:
    """Every mode's plan, the planner's `top` best, `drawn` more drawn with `seed`; deduplicated."""
    listed = deduplicate([*mode_candidates(model), *top_candidates(model, top)])
    return listed + drawn_candidates(model, seed, listed, drawn)


def candidate_spec(spec: Spec, candidate: Candidate, steps: int) -> Spec:
    """`spec` as a bench arm running `candidate`: its mode (hybrid with the candidate's explicit stages)."""
    if candidate.mode != "hybrid":
        return bench_spec(spec, candidate.mode, steps)
    document = spec.model_dump(mode="json")
    stages = [{"start": start, "stop": stop, "replicas": k} for start, stop, k in candidate.stages]
    document["schedule"].update({"mode": "hybrid", "stages": stages})
    return bench_spec(Spec.model_validate(document), "hybrid", steps)


def donors(
    names: Sequence[str], calibrated: set[str], stages: Mapping[str, Hashable] | None = None
) -> dict[str, str | None]:
    """For each arm, the arm whose calibration predicts it: the next in `names` (cyclically) that wrote
    one (`calibrated`) and ran other stages (`stages`: by arm, what it ran), never itself; None when no
    other did."""
    chosen: dict[str, str | None] = {}
    for index, name in enumerate(names):
        following = [names[(index + step) % len(names)] for step in range(1, len(names))]
        others = [other for other in following if stages is None or stages[other] != stages[name]]
        chosen[name] = next((other for other in others if other in calibrated), None)
    return chosen


def stage_key(candidate: Candidate) -> Hashable:
    """What a candidate's run ran: its stages, or (dp, ls) its mode."""
    return candidate.stages or (candidate.mode,)


@dataclass(frozen=True)
class RunRead:
    """What an accuracy bench keeps of a candidate's first run: the plan it ran, its calibration."""

    plan: Plan
    calibration: Calibration | None


def read_run(folder: Path) -> RunRead:
    """The plan a run directory ran and the calibration it wrote (None if it wrote none)."""
    run_dir = RunDir(folder)
    calibration = run_dir.load_calibration() if run_dir.calibration.exists() else None
    return RunRead(Plan.from_document(run_dir.load_plan()), calibration)


def calibrated_prediction(plan: Plan, spec: Spec, profile: Profile, calibration: Calibration) -> float:
    """`plan`'s step as its plan phase would predict it from `profile` calibrated by `calibration`."""
    return timeline(plan, cost_model(spec, profile.calibrated(calibration))).step_s


def figures(plans: Sequence[PlanAccuracy], predicted: dict[str, float], chosen: str) -> AccuracyFigures:
    """MAPE, Kendall's tau and the regret of `chosen` for the arms `predicted` gives a prediction for."""
    measured = {plan.arm: plan.measured_step_s for plan in plans if plan.arm in predicted}
    names = list(measured)
    return AccuracyFigures(
        mape=mape([(predicted[name], measured[name]) for name in names]),
        rank_correlation=kendall_tau([predicted[name] for name in names], [measured[name] for name in names]),
        chosen=chosen,
        chosen_regret=regret(measured[chosen], list(measured.values())),
    )


def accuracy_section(
    plans: list[PlanAccuracy],
    seed: int,
    chosen: str | None = None,
    rule: str = CALIBRATION_RULE,
    floor: float | None = None,
) -> Accuracy:
    """The record's `accuracy` from every candidate's predictions and measurement; `chosen`: the arm the
    planner runs (by default the one the planner's first plan is). With the noise `floor` (doubt.py) the
    guard (planning/calibration_guard.py) decides for each plan whether its calibration is applied; the
    calibrated figures use the guarded predictions."""
    if chosen is None:
        chosen = next(plan.arm for plan in plans if CHOSEN in (plan.arm, *plan.also))
    alone = figures(plans, {plan.arm: plan.predicted_step_s for plan in plans}, chosen)
    plans = apply_guard(plans, floor)
    calibrated_s = guarded_predictions(plans)
    calibrated = None
    if calibrated_s:
        best = min(calibrated_s, key=lambda arm: calibrated_s[arm])
        calibrated = figures(plans, calibrated_s, best)
    return Accuracy(
        seed=seed,
        plans=plans,
        mape=alone.mape,
        rank_correlation=alone.rank_correlation,
        chosen=chosen,
        chosen_regret=alone.chosen_regret,
        calibrated=calibrated,
        rule=rule,
    )


def plan_accuracy(
    candidate: Candidate, arm: Arm, predicted_s: float, calibrated_s: float | None, donor: str | None
) -> PlanAccuracy:
    first = arm.runs[0]
    return PlanAccuracy(
        arm=candidate.name,
        also=list(candidate.also),
        source=candidate.source,
        mode=candidate.mode,
        stages=[StageSpan(start=s.start, stop=s.stop, replicas=s.replicas) for s in first.stages],
        predicted_step_s=predicted_s,
        measured_step_s=arm.step_s,
        calibrated_step_s=calibrated_s,
        calibrated_from=donor if calibrated_s is not None else None,
    )


FIRST_RUNS = "first-runs"  # out/first-runs/<arm>/: the plan and calibration of each candidate's first run


def candidate_plan(model: CostModel, candidate: Candidate) -> Plan:
    """The plan `candidate` runs, built on `model` (dp and ls: their mode plans)."""
    if candidate.mode in ("dp", "ls"):
        return mode_plans(model)[candidate.mode]
    stages = [StageSpec(start=start, stop=stop, replicas=k) for start, stop, k in candidate.stages]
    built = build_stages(stages, model.nproc, model.num_blocks, model.batch_size)
    return Plan(candidate.mode, model.nproc, model.num_blocks, model.batch_size, built, nodes=model.topology.nodes)


def keep_first_run(out: Path, name: str, folder: Path) -> None:
    """Copy the plan and the calibration of `name`'s run in `folder` to out/first-runs/<name> (once)."""
    source, kept = RunDir(folder), RunDir(out / FIRST_RUNS / name)
    if kept.plan.exists():
        return
    for path in (source.plan, source.calibration):
        if path.exists():
            target = kept.root / path.relative_to(source.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def forget_first_runs(out: Path, names: Sequence[str], done: Mapping[str, list[ArmRun]]) -> None:
    """Drop the kept first run of every arm whose first repeat is still to run (a bench resumed with
    `--again-shared` measures a shared first repeat again: its calibration must be the quiet run's)."""
    for name in names:
        if not any(run.repeat == 0 for run in done.get(name, [])):
            shutil.rmtree(out / FIRST_RUNS / name, ignore_errors=True)


def run_accuracy_bench(
    spec: Spec,
    steps: int,
    repeats: int,
    out: Path,
    keep: bool = False,
    seed: int = 0,
    resume: BenchRecord | None = None,
    minutes: float | None = None,
    reprofile: bool = False,
) -> BenchRecord:
    """Every candidate plan as an arm, and the bound, `repeats` times interleaved; the record with its
    `accuracy` (out/bench.json, written after every run; `resume`, `minutes` and `reprofile` as in
    distill.run_bench)."""
    progress = begin(out, resume, lambda: frozen_profile(bench_spec(spec, "auto", steps), reprofile), Profile)
    profile = progress.profile
    model = cost_model(bench_spec(spec, "auto", steps), profile)
    listed = candidates(model, seed)

    def arm_steps() -> dict[str, float]:
        step_s = {c.name: timeline(candidate_plan(model, c), model).step_s for c in listed}
        return {**step_s, BOUND: model.ideal_step() * model.nproc}

    first = listed[0]
    probe = probing(out, first.name, lambda n, at: run_arm(candidate_spec(spec, first, n), profile, at, -1))
    fitted = budget(steps, repeats, minutes, resume, arm_steps, probe)
    steps, repeats = fitted.steps, fitted.repeats
    base = bench_spec(spec, "auto", steps)
    specs = {candidate.name: candidate_spec(spec, candidate, steps) for candidate in listed}
    forget_first_runs(out, list(specs), progress.done)

    def build(runs: dict[str, list[ArmRun]], reference: Reference) -> BenchRecord:
        record = bench_record(spec, runs, profile, steps, repeats, progress.profile_hash, reference)
        return record.model_copy(update={"compares": "plans", "seed": seed, "fitted": fitted.fitted})

    def keep_first(name: str, folder: Path) -> None:
        keep_first_run(out, name, folder)

    written = progress.writer(build)
    runs = run_arms(spec, specs, profile, steps, repeats, out, keep, keep_first, progress.done, written)
    record = build(runs, progress.reference(ended=True))
    read = {c.name: read_run(out / FIRST_RUNS / c.name) for c in listed}
    arms = {arm.name: arm for arm in record.arms}
    calibrated_runs = {name for name, run in read.items() if run.calibration is not None}
    given = donors(list(specs), calibrated_runs, {c.name: stage_key(c) for c in listed})
    plans = []
    for candidate in listed:
        arm, donor = arms[candidate.name], given[candidate.name]
        predicted = arm.runs[0].predicted_step_s
        if predicted is None:
            raise RuntimeError(f"bench --accuracy: {candidate.name} ran without a prediction; its profile was lost")
        calibration = read[donor].calibration if donor is not None else None
        calibrated = None
        if calibration is not None:
            calibrated = calibrated_prediction(read[candidate.name].plan, base, profile, calibration)
        plans.append(plan_accuracy(candidate, arm, predicted, calibrated, donor))
    floor = noise_floor(record.arms)
    record = record.model_copy(update={"accuracy": accuracy_section(plans, seed, floor=floor)})
    write_record(out, record)
    return record
