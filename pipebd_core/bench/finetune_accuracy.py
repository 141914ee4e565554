"""End-to-end training's predictions checked out of sample: `pipebd bench SPEC --accuracy --phase finetune`.

The candidate plans: every strategy on the spec's partitioner's cut (ddp, gpipe, 1f1b, zb: `strategy`),
and every pipelined strategy on each other partitioner's cut (even, pipedream, layerpipe and the planner's
own, auto: `partition`). Each is planned from the one frozen layer profile before anything runs; two
candidates whose plans run the same (the same strategy on the same stages with the same moved shares; ddp
has one) are one arm, the first name it came under (the others kept in `also`, every partitioner whose cut
it is in `partitioners`: the partitions table, partitions.py). The chosen plan is the one `auto` plans
from that profile (its strategy and cut), a candidate of its own when no other plans it. Every arm then
runs in one end-to-end training bench (finetune.py: the same frozen profile, rotated repeats, the one
timing rule, the measured bound).

The figures are accuracy.py's: MAPE of each plan's prediction (its plan phase's, from the frozen layer
profile) against the median of its repeats, Kendall's tau-b, the chosen plan's regret. Calibrated, out of
sample (accuracy.CALIBRATION_RULE): each plan is predicted again, on its own strategy, stages and moved
shares, from the frozen layer profile calibrated (planning/finetune_calibration.py) by the first repeat of
the NEXT candidate's run, cyclically, that ran other stages (never its own, nor another strategy on the
same cut), under the guard of planning/calibration_guard.py: what each of that run's ranks measured of its
forwards and backwards against what the profile predicted for them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pipebd_core.bench import accuracy
from pipebd_core.bench.arms import BOUND
from pipebd_core.bench.doubt import noise_floor
from pipebd_core.bench.finetune import bench_spec, finetune_record, plan_stages, run_arm, run_with_bound
from pipebd_core.bench.fit import budget, probing
from pipebd_core.bench.progress import begin, write_record
from pipebd_core.documents.bench_record import Accuracy, Arm, ArmRun, BenchRecord, PlanAccuracy, Reference
from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.finetune.plan import PIPELINED, TrainPlan
from pipebd_core.job.profiling import obtain_layer_profile
from pipebd_core.planning.finetune_calibration import calibrated_layer_profile
from pipebd_core.planning.finetune_planner import ProbedNetwork, probe_network, resolve_train_plan
from pipebd_core.spec import Spec, parse_spec

PARTITIONS = ("even", "pipedream", "layerpipe", "auto")  # the cuts a pipelined strategy is checked on (auto: the
# planner's own, the fastest predicted of the others)
AUTO = "auto"


@dataclass(frozen=True)
class Candidate:
    """A strategy on a partitioner's cut (None: the spec's own), planned from the frozen profile."""

    name: str
    source: Literal["strategy", "partition"]  # on the spec's partitioner's cut, or on another's
    strategy: str
    partitioner: str | None
    plan: TrainPlan
    also: tuple[str, ...] = ()
    partitioners: tuple[str, ...] = ()  # a pipeline: every partitioner whose cut this is (ddp: none)

    def key(self) -> tuple[object, ...]:
        """What makes two candidates one run: the strategy the plan runs, its stages and moved shares."""
        return self.plan.strategy, tuple(self.plan.stages), tuple(self.plan.moved)

    def merged(self, other: Candidate) -> Candidate:
        """This candidate, also under `other`'s name and partitioners (the same run)."""
        cuts = tuple(dict.fromkeys((*self.partitioners, *other.partitioners)))
        return replace(self, also=(*self.also, other.name), partitioners=cuts)

    @property
    def predicted_step_s(self) -> float:
        predictions = self.plan.details.predictions if self.plan.details is not None else None
        if predictions is None or predictions.predicted_step_s is None:
            raise RuntimeError(f"bench --accuracy: {self.name}'s plan has no prediction; its profile was lost")
        return predictions.predicted_step_s


def listed(spec: Spec) -> list[tuple[str, Literal["strategy", "partition"], str, str | None]]:
    """(name, source, strategy, partitioner) of every candidate, before planning."""
    tune = spec.finetune
    assert tune is not None, "bench_spec refuses a spec without a finetune section"
    own: list[tuple[str, Literal["strategy", "partition"], str, str | None]]
    own = [(strategy, "strategy", strategy, None) for strategy in ("ddp", *PIPELINED)]
    other = [p for p in PARTITIONS if p != tune.partitioner]
    return own + [(f"{s}-{p}", "partition", s, p) for s in PIPELINED for p in other]


def plan_candidates(spec: Spec, profile: LayerProfile, steps: int) -> tuple[list[Candidate], str]:
    """Every candidate planned from `profile`, deduplicated, and the name of the one auto plans."""
    tune = spec.finetune
    assert tune is not None, "bench_spec refuses a spec without a finetune section"
    kept: dict[tuple[object, ...], Candidate] = {}
    probed = probe_network(spec, None)  # every candidate cuts the same network
    for name, source, strategy, partitioner in listed(spec):
        plan = resolve_train_plan(bench_spec(spec, strategy, steps, partitioner), None, profile, probed=probed)
        cut = (partitioner or tune.partitioner,) if plan.pipelined else ()
        candidate = Candidate(name, source, strategy, partitioner, plan, partitioners=cut)
        first = kept.get(candidate.key())
        kept[candidate.key()] = candidate if first is None else first.merged(candidate)
    plan = resolve_train_plan(bench_spec(spec, AUTO, steps), None, profile, probed=probed)
    auto = Candidate(AUTO, "strategy", AUTO, None, plan, partitioners=(tune.partitioner,) if plan.pipelined else ())
    chosen = kept.get(auto.key())
    if chosen is None:
        kept[auto.key()] = auto
        return list(kept.values()), AUTO
    kept[auto.key()] = replace(chosen, also=(*chosen.also, AUTO))
    return list(kept.values()), chosen.name


def plan_spec(spec: Spec, plan: TrainPlan, steps: int) -> Spec:
    """`spec` as a bench arm that runs `plan`'s strategy on its stages and moved shares, whatever a
    profile would cut."""
    arm = bench_spec(spec, plan.strategy, steps)
    if not plan.pipelined:
        return arm
    document = arm.model_dump(mode="json")
    partition = plan.details.partition if plan.details is not None else None
    moves = {move.boundary: move.share for move in partition.moves} if partition is not None else {}
    shares = [moves.get(boundary, 0.0) for boundary in range(len(plan.stages) - 1)]
    document["finetune"].update(
        stages=[start for start, _ in plan.stages],
        moved=shares if any(shares) else None,
        partitioner="pipedream",  # given stages are trained as given
    )
    return parse_spec(document)


def calibrated_step_s(
    spec: Spec, candidate: Candidate, profile: LayerProfile, steps: int, probed: ProbedNetwork | None = None
) -> float:
    """`candidate`'s plan predicted again from `profile` (a calibrated one); `probed`: `spec`'s network
    already probed (`probe_network`), or None to probe it."""
    plan = resolve_train_plan(plan_spec(spec, candidate.plan, steps), None, profile, probed=probed)
    return replace(candidate, plan=plan).predicted_step_s


def calibrated_steps(
    spec: Spec, candidates: list[Candidate], arms: dict[str, Arm], profile: LayerProfile, steps: int
) -> dict[str, tuple[float, str]]:
    """Per candidate, its step predicted from `profile` calibrated on its donor's first run, and the donor."""
    parts = {c.name: arms[c.name].runs[0].part_s for c in candidates}
    stages = {c.name: tuple(c.plan.stages) for c in candidates}
    given = accuracy.donors([c.name for c in candidates], {name for name, part in parts.items() if part}, stages)
    by_name = {c.name: c for c in candidates}
    result = {}
    probed = probe_network(spec, None)
    for candidate in candidates:
        donor = given[candidate.name]
        donor_parts = parts[donor] if donor is not None else None
        if donor is None or donor_parts is None:
            continue
        calibrated = calibrated_layer_profile(profile, by_name[donor].plan, donor_parts)
        result[candidate.name] = (calibrated_step_s(spec, candidate, calibrated, steps, probed), donor)
    return result


def plan_accuracy(candidate: Candidate, arm: Arm, calibrated: tuple[float, str] | None) -> PlanAccuracy:
    return PlanAccuracy(
        arm=candidate.name,
        also=list(candidate.also),
        source=candidate.source,
        mode=candidate.plan.strategy,
        stages=plan_stages(candidate.plan),
        partitioners=list(candidate.partitioners),
        moved=list(candidate.plan.moved),
        predicted_step_s=candidate.predicted_step_s,
        measured_step_s=arm.step_s,
        calibrated_step_s=calibrated[0] if calibrated is not None else None,
        calibrated_from=calibrated[1] if calibrated is not None else None,
    )


def accuracy_section(
    candidates: list[Candidate], arms: dict[str, Arm], chosen: str, calibrated: dict[str, tuple[float, str]]
) -> Accuracy:
    """The record's `accuracy`: every candidate's prediction, alone and calibrated, against its arm's
    measurement."""
    plans = [plan_accuracy(c, arms[c.name], calibrated.get(c.name)) for c in candidates]
    floor = noise_floor([arms[c.name] for c in candidates])
    return accuracy.accuracy_section(plans, seed=0, chosen=chosen, floor=floor)


def predicted_steps(candidates: list[Candidate], nproc: int) -> dict[str, float]:
    """Each candidate's step as its plan predicts it, and the bound's (ddp's times the ranks, or the slowest's)."""
    step_s = {c.name: c.predicted_step_s for c in candidates}
    return {**step_s, BOUND: step_s.get("ddp", max(step_s.values())) * nproc}


def run_finetune_accuracy_bench(
    spec: Spec,
    steps: int,
    repeats: int,
    out: Path,
    keep: bool = False,
    resume: BenchRecord | None = None,
    minutes: float | None = None,
) -> BenchRecord:
    """Every candidate plan of end-to-end training as an arm, and the bound, `repeats` times interleaved;
    the record with its `accuracy` (out/bench.json, written after every run; `resume` and `minutes` as in
    distill.run_bench)."""
    progress = begin(out, resume, lambda: obtain_layer_profile(bench_spec(spec, AUTO, steps)), LayerProfile)
    profile = progress.profile
    candidates, chosen = plan_candidates(spec, profile, steps)
    first = candidates[0]
    probe = probing(
        out, first.name, lambda n, at: run_arm(bench_spec(spec, first.strategy, n, first.partitioner), profile, at, -1)
    )
    fitted = budget(steps, repeats, minutes, resume, lambda: predicted_steps(candidates, spec.schedule.nproc), probe)
    steps, repeats = fitted.steps, fitted.repeats
    specs = {c.name: bench_spec(spec, c.strategy, steps, c.partitioner) for c in candidates}

    def build(runs: dict[str, list[ArmRun]], reference: Reference) -> BenchRecord:
        record = finetune_record(spec, runs, profile, progress.profile_hash, steps, repeats, "plans", reference)
        return record.model_copy(update={"fitted": fitted.fitted})

    runs = run_with_bound(spec, specs, progress, steps, repeats, keep, progress.writer(build))
    record = build(runs, progress.reference(ended=True))
    arms = {arm.name: arm for arm in record.arms}
    calibrated = calibrated_steps(spec, candidates, arms, profile, steps)
    record = record.model_copy(update={"accuracy": accuracy_section(candidates, arms, chosen, calibrated)})
    write_record(out, record)
    return record
