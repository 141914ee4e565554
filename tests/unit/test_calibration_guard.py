"""Calibration that never makes a plan worse: a donor never ran the stages of the plan it calibrates, and
a calibration that contradicts the profile beyond the noise is not applied (on the record where the old
rule chose a plan 42% slower than the best measured)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebd_core.bench.accuracy import accuracy_section, candidates, donors, stage_key
from pipebd_core.bench.doubt import noise_floor, regret
from pipebd_core.documents.bench_record import BenchRecord
from pipebd_core.planning.calibration_guard import guarded, tolerance
from pipebd_core.planning.distill_costmodel import CostModel
from tests.fake_profiles import fake_profile

# the 3-rank end-to-end training accuracy record (quiet) whose calibrated predictions chose 1f1b, 42% slower
# than ddp, the fastest measured and the profile's own choice
FORTY_TWO = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "calibration-42.json"


def test_a_donor_never_ran_the_stages_of_the_plan_it_calibrates() -> None:
    teacher = [0.001 * (index + 1) for index in range(6)]
    model = CostModel(fake_profile(teacher, [2 * t for t in teacher], nproc=2, batch_size=12))
    listed = candidates(model, seed=0)
    names, stages = [c.name for c in listed], {c.name: stage_key(c) for c in listed}
    old = donors(names, set(names))  # the next candidate, whatever it ran
    assert any(stages[donor] == stages[name] for name, donor in old.items() if donor), "no same-stage pair"
    given = donors(names, set(names), stages)
    for name, donor in given.items():
        assert donor is not None and donor != name and stages[donor] != stages[name]
    assert donors(["tr", "tr_dpu"], {"tr", "tr_dpu"}, {"tr": (1,), "tr_dpu": (1,)}) == {"tr": None, "tr_dpu": None}


def test_the_guard_keeps_the_profiles_prediction_where_a_calibration_disagrees_beyond_the_noise() -> None:
    assert tolerance(None) == 0.05 and tolerance(0.02) == 0.05 and tolerance(0.08) == pytest.approx(0.1)
    assert guarded(1.0, 1.04, 0.05) == 1.04 and guarded(1.0, 0.9, 0.05) == 1.0 and guarded(1.0, None, 0.05) == 1.0


def test_on_the_record_where_calibration_chose_a_plan_42_percent_slower_the_profiles_choice_stays() -> None:
    record = BenchRecord.from_json(json.loads(FORTY_TWO.read_text()))
    assert record.accuracy is not None
    measured = {plan.arm: plan.measured_step_s for plan in record.accuracy.plans}
    raw = {plan.arm: plan.calibrated_step_s for plan in record.accuracy.plans if plan.calibrated_step_s}
    old_choice = min(raw, key=lambda arm: raw[arm])  # the old rule: every calibration applied
    assert old_choice == "1f1b" and regret(measured[old_choice], list(measured.values())) > 0.4
    floor = noise_floor(record.arms)
    plans = [plan.model_copy(update={"calibration_applied": None}) for plan in record.accuracy.plans]
    guarded_section = accuracy_section(plans, seed=0, chosen=record.accuracy.chosen, floor=floor)
    assert guarded_section.calibrated is not None
    assert guarded_section.calibrated.chosen == record.accuracy.chosen == "ddp"
    assert guarded_section.calibrated.chosen_regret == 0.0
    assert guarded_section.calibrated.mape <= record.accuracy.mape + tolerance(floor)
    applied = {plan.arm: plan.calibration_applied for plan in guarded_section.plans}
    assert applied["1f1b"] is False and applied["ddp"] is True  # -12% off the profile: beyond the noise
