"""`pipebd bench --report --check FILE...`: every prediction of a record recomputed from its committed
frozen profile.

A record names the profile every arm planned from by its hash; the profile itself is committed beside
the record (`NAME.profile.json`, or `NAME.profile.json.gz` when large; in a bench's own folder,
frozen-profile.json beside bench.json). The check reads it, refuses it when its hash is not the
record's (the profile was edited, or is another one), and predicts again every arm's run (distillation:
its mode on the stages it ran, simulated as the plan phase simulates it; end-to-end training: the
candidate's plan, resolved from the layer profile as the bench resolved it) and every accuracy plan's
prediction. Any prediction that differs from the record's by more than TOLERANCE (relative) is a
difference; a record whose profile is not committed is one too.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipebd_core.bench.arms import FROZEN_PROFILE, RECORD
from pipebd_core.bench.finetune import bench_spec
from pipebd_core.bench.finetune_accuracy import plan_candidates
from pipebd_core.distill.plan import Plan, build_stages
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.bench_record import BenchRecord
from pipebd_core.documents.distill_plan import StageSpan
from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.profile import Profile
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_planner import cost_model, mode_plans, timeline
from pipebd_core.planning.finetune_planner import probe_network, resolve_train_plan
from pipebd_core.spec import StageSpec, parse_spec

TOLERANCE = 1e-9  # relative: the same profile, the same simulation, the same figure


@dataclass(frozen=True)
class Difference:
    what: str  # which prediction, or the profile
    recorded: float | None
    recomputed: float | None
    why: str = ""

    def text(self) -> str:
        if self.why:
            return f"{self.what}: {self.why}"
        return f"{self.what}: the record says {self.recorded!r}, the committed profile gives {self.recomputed!r}"


def profile_path(record_path: Path) -> Path | None:
    """The frozen profile committed beside a record; None when there is none."""
    if record_path.name == RECORD:
        beside = [record_path.parent / FROZEN_PROFILE]
    else:
        stem = record_path.with_suffix("")
        beside = [stem.with_name(stem.name + ".profile.json"), stem.with_name(stem.name + ".profile.json.gz")]
    return next((path for path in beside if path.exists()), None)


def read_profile(path: Path) -> dict[str, object]:
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    if not isinstance(data, dict):
        raise DocumentError(f"{path}: not a profile")
    return data


def check(record_path: Path, record: BenchRecord) -> list[Difference]:
    """Every difference between the record's predictions and its committed profile's (none: it holds)."""
    path = profile_path(record_path)
    if path is None:
        return [Difference("profile", None, None, f"no frozen profile committed beside {record_path}")]
    data = read_profile(path)
    profile: Profile | LayerProfile
    profile = LayerProfile.from_json(data) if record.phase == "finetune" else Profile.from_json(data)
    if profile.digest() != record.profile_hash:
        why = f"{path} has hash {profile.digest()}, the record planned from {record.profile_hash}: it was edited"
        return [Difference("profile", None, None, why)]
    if isinstance(profile, LayerProfile):
        pairs = finetune_pairs(record, with_cpus(profile, record))
    else:
        pairs = distill_pairs(record, profile)
    return [
        Difference(what, recorded, recomputed)
        for what, recorded, recomputed in pairs
        if abs(recomputed - recorded) > TOLERANCE * abs(recorded)
    ]


Pair = tuple[str, float, float]


def distill_pairs(record: BenchRecord, profile: Profile) -> Iterator[Pair]:
    model = cost_model(parse_spec(record.spec), profile)
    modes = {plan.arm: plan.mode for plan in record.accuracy.plans} if record.accuracy else {}
    for arm in record.arms:
        for run in arm.runs:
            if run.predicted_step_s is not None:
                step = predicted_step(model, modes.get(arm.name, arm.name), run.stages)
                yield f"{arm.name} repeat {run.repeat}", run.predicted_step_s, step
    for plan in record.accuracy.plans if record.accuracy else []:
        yield f"accuracy {plan.arm}", plan.predicted_step_s, predicted_step(model, plan.mode, plan.stages)


def predicted_step(model: CostModel, mode: str, stages: list[StageSpan]) -> float:
    """The step the plan phase predicts for `mode` on `stages` (dp and ls: their own plans)."""
    if mode in ("dp", "ls"):
        return timeline(mode_plans(model)[mode], model).step_s
    specs = [StageSpec(start=s.start, stop=s.stop, replicas=s.replicas) for s in stages]
    built = build_stages(specs, model.nproc, model.num_blocks, model.batch_size)
    plan = Plan(mode, model.nproc, model.num_blocks, model.batch_size, built, nodes=model.topology.nodes)
    return timeline(plan, model).step_s


def with_cpus(profile: LayerProfile, record: BenchRecord) -> LayerProfile:
    """A layer profile from before profiles recorded the node's cores, given the cores of the machine
    its record ran on (the same node: the bench profiled it)."""
    if profile.cpus is not None or profile.device != "cpu":
        return profile
    return profile.model_copy(update={"cpus": record.machine.cores})


def finetune_pairs(record: BenchRecord, profile: LayerProfile) -> Iterator[Pair]:
    spec = parse_spec(record.spec)
    if record.compares == "plans":
        predicted = {c.name: c.predicted_step_s for c in plan_candidates(spec, profile, record.steps)[0]}
    else:
        predicted = {}
        probed = probe_network(spec, None)  # every arm trains the same network
        for arm in record.arms:
            arm_spec = (
                bench_spec(spec, record.strategy or "zb", record.steps, arm.name)
                if record.compares == "partitioners"
                else bench_spec(spec, arm.name, record.steps)
            )
            train_plan = resolve_train_plan(arm_spec, None, profile, probed=probed)
            predictions = train_plan.details.predictions if train_plan.details is not None else None
            if predictions is not None and predictions.predicted_step_s is not None:
                predicted[arm.name] = predictions.predicted_step_s
    for arm in record.arms:
        for run in arm.runs:
            if run.predicted_step_s is not None and arm.name in predicted:
                yield f"{arm.name} repeat {run.repeat}", run.predicted_step_s, predicted[arm.name]
    for plan in record.accuracy.plans if record.accuracy else []:
        if plan.arm in predicted:
            yield f"accuracy {plan.arm}", plan.predicted_step_s, predicted[plan.arm]
