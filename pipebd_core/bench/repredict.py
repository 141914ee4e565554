"""`pipebd bench --report FILE... --repredict`: a record's predictions made again from its committed frozen
profile, after a change to a cost model, and written back into it. Nothing is measured again.

Every prediction the record stores is recomputed as the bench would have made it with today's cost model
from the same frozen profile (check.py finds the profile and refuses it when its hash is not the
record's): each run's predicted step (and, end-to-end, its per-stage prediction), each accuracy plan's
prediction, the profile's ideal step, and the accuracy section's figures from them. Calibrated
predictions are recomputed where the record holds what calibrated them (end-to-end training: the donor
run's measured parts); a distillation calibration was read from the donor run's calibration.json, which
the record does not keep, so its calibrated predictions stay as measured then (a calibrated profile is
costed as it was: cpu_sharing.py leaves it alone). The plan each arm ran and the plan the planner chose
when the bench ran stay the record's: a plan the new model would cut otherwise is refused, naming it,
since nothing ran it. Afterwards `--check` holds.
"""

from __future__ import annotations

from pathlib import Path

from pipebd_core.bench import accuracy, finetune_accuracy
from pipebd_core.bench.check import predicted_step, profile_path, read_profile, with_cpus
from pipebd_core.bench.doubt import noise_floor
from pipebd_core.bench.finetune import plan_stages
from pipebd_core.documents.bench_record import Arm, ArmRun, BenchRecord
from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.profile import Profile
from pipebd_core.planning.distill_planner import cost_model
from pipebd_core.spec import SpecError, parse_spec


def repredict(record_path: Path, record: BenchRecord) -> BenchRecord:
    """`record` with every prediction made again from the frozen profile committed beside it."""
    path = profile_path(record_path)
    if path is None:
        raise SpecError(f"--repredict {record_path}: no frozen profile committed beside it; nothing to predict from")
    data = read_profile(path)
    if record.phase == "finetune":
        layers = LayerProfile.from_json(data)
        _same_profile(record_path, record, layers.digest())
        return _finetune(record_path, record, with_cpus(layers, record))
    profile = Profile.from_json(data)
    _same_profile(record_path, record, profile.digest())
    return _distill(record, profile)


def _same_profile(record_path: Path, record: BenchRecord, digest: str) -> None:
    if digest != record.profile_hash:
        raise SpecError(
            f"--repredict {record_path}: its frozen profile has hash {digest}, the record planned from"
            f" {record.profile_hash}: restore the committed profile"
        )


def _distill(record: BenchRecord, profile: Profile) -> BenchRecord:
    model = cost_model(parse_spec(record.spec), profile)
    modes = {plan.arm: plan.mode for plan in record.accuracy.plans} if record.accuracy else {}

    def run(arm: Arm, one: ArmRun) -> ArmRun:
        if one.predicted_step_s is None:
            return one
        step = predicted_step(model, modes.get(arm.name, arm.name), one.stages)
        return one.model_copy(update={"predicted_step_s": step})

    arms = [arm.model_copy(update={"runs": [run(arm, one) for one in arm.runs]}) for arm in record.arms]
    bound = record.bound.model_copy(update={"profile_ideal_s": model.ideal_step()})
    updated = record.model_copy(update={"arms": arms, "bound": bound})
    if record.accuracy is None:
        return updated
    plans = [
        plan.model_copy(update={"predicted_step_s": predicted_step(model, plan.mode, plan.stages)})
        for plan in record.accuracy.plans
    ]
    section = accuracy.accuracy_section(
        plans, record.accuracy.seed, record.accuracy.chosen, record.accuracy.rule, noise_floor(arms)
    )
    return updated.model_copy(update={"accuracy": section})


def _finetune(record_path: Path, record: BenchRecord, profile: LayerProfile) -> BenchRecord:
    if record.compares != "plans" or record.accuracy is None:
        raise SpecError(
            f"--repredict {record_path}: an end-to-end record comparing {record.compares}; only plans"
            " (bench --accuracy, --partitioners) are predicted again"
        )
    spec = parse_spec(record.spec)
    candidates, _ = finetune_accuracy.plan_candidates(spec, profile, record.steps)
    by_name = {candidate.name: candidate for candidate in candidates}
    for plan in record.accuracy.plans:
        candidate = by_name.get(plan.arm)
        if candidate is None or (plan_stages(candidate.plan), list(candidate.plan.moved)) != (plan.stages, plan.moved):
            raise SpecError(
                f"--repredict {record_path}: {plan.arm} is planned otherwise from this profile now than it ran"
                f" ({plan.stages}, moved {plan.moved}); measure the bench again"
            )
    arms = {arm.name: arm for arm in record.arms}

    def run(arm: Arm, one: ArmRun) -> ArmRun:
        candidate = by_name.get(arm.name)
        details = candidate.plan.details if candidate is not None else None
        predictions = details.predictions if details is not None else None
        if one.predicted_step_s is None or predictions is None:
            return one
        stage_s = predictions.predicted_stage_s if one.predicted_stage_s is not None else None
        return one.model_copy(update={"predicted_step_s": predictions.predicted_step_s, "predicted_stage_s": stage_s})

    updated = [arm.model_copy(update={"runs": [run(arm, one) for one in arm.runs]}) for arm in record.arms]
    ran = [by_name[plan.arm] for plan in record.accuracy.plans]
    calibrated = finetune_accuracy.calibrated_steps(spec, ran, arms, profile, record.steps)
    section = finetune_accuracy.accuracy_section(ran, arms, record.accuracy.chosen, calibrated)
    return record.model_copy(update={"arms": updated, "accuracy": section})
