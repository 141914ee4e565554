"""`pipebd bench --accuracy` without running anything: the figures (MAPE, Kendall's tau, regret), the
candidate plans (every mode's, the planner's top five, five drawn with a seed, deduplicated), the rule
that picks the run whose calibration predicts another, and the accuracy table of the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebd_core.bench.accuracy import (
    CHOSEN,
    Candidate,
    accuracy_section,
    candidate_spec,
    candidates,
    deduplicate,
    donors,
    kendall_tau,
    mape,
    regret,
)
from pipebd_core.bench.report import render
from pipebd_core.documents.bench_record import BenchRecord, PlanAccuracy
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_search import search
from tests.fake_profiles import fake_profile
from tests.helpers import pipebd_here, tiny_spec

RECORD = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "record.json"


def model(blocks: int, nproc: int = 2) -> CostModel:
    """Blocks of growing cost, so that plans differ and rank strictly."""
    teacher = [0.001 * (index + 1) for index in range(blocks)]
    return CostModel(fake_profile(teacher, [2 * t for t in teacher], nproc=nproc, batch_size=12))


def test_mape_is_the_mean_of_absolute_relative_errors() -> None:
    assert mape([(1.1, 1.0), (0.5, 1.0), (2.0, 2.0)]) == pytest.approx((0.1 + 0.5 + 0.0) / 3)
    with pytest.raises(ValueError, match="at least one plan"):
        mape([])


def test_kendall_tau_counts_agreeing_and_disagreeing_pairs_and_ties() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # 5 agree, 1 disagrees
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / (3 * 2) ** 0.5)  # tau-b: one tie in x
    assert kendall_tau([1.0], [2.0]) is None and kendall_tau([1, 1], [1, 2]) is None
    with pytest.raises(ValueError, match="paired"):
        kendall_tau([1, 2], [1])


def test_regret_is_the_chosen_step_over_the_best_minus_one() -> None:
    assert regret(1.2, [1.2, 1.0, 1.5]) == pytest.approx(0.2)
    assert regret(1.0, [1.2, 1.0]) == 0.0


def test_each_plan_is_calibrated_by_the_next_run_that_wrote_a_calibration_never_its_own() -> None:
    names = ["dp", "ls", "ir", "top1"]
    assert donors(names, set(names)) == {"dp": "ls", "ls": "ir", "ir": "top1", "top1": "dp"}
    assert donors(names, {"ls", "top1"}) == {"dp": "ls", "ls": "top1", "ir": "top1", "top1": "ls"}
    assert donors(names, {"ir"}) == {"dp": "ir", "ls": "ir", "ir": None, "top1": "ir"}


def test_the_candidates_are_every_mode_the_top_five_and_five_drawn_each_run_once() -> None:
    listed = candidates(model(13), seed=0)
    names = [name for candidate in listed for name in candidate.names]
    assert {"dp", "ls", "ir", "tr", "tr_dpu"} <= set(names)
    assert {f"top{rank}" for rank in range(1, 6)} <= set(names)
    assert [c.name for c in listed if c.source == "drawn"] == [f"drawn{i}" for i in range(1, 6)]
    keys = [candidate.key() for candidate in listed]
    assert len(keys) == len(set(keys)), "two arms would run the same plan"
    best = search(model(13), top_k=1).plans[0]
    chosen = next(c for c in listed if CHOSEN in c.names)
    assert list(chosen.stages) == best.triples()
    for candidate in listed:
        assert sum(k for _, _, k in candidate.stages) in (0, 2)  # dp and ls have no stages
        covered = [block for start, stop, _ in candidate.stages for block in range(start, stop)]
        assert covered in ([], list(range(13)))


def test_the_drawn_plans_follow_the_seed() -> None:
    def drawn(seed: int) -> list[tuple[tuple[int, int, int], ...]]:
        return [c.stages for c in candidates(model(13), seed) if c.source == "drawn"]

    assert drawn(3) == drawn(3) and drawn(3) != drawn(4)


def test_a_small_workload_draws_only_the_plans_left() -> None:
    listed = candidates(model(4), seed=0)  # 4 blocks on 2 ranks: 3 cuts and one replicated stage
    pipelines = [c for c in listed if c.mode not in ("dp", "ls", "tr")]
    assert len(pipelines) == 4 and len({c.key() for c in listed}) == len(listed)


def test_tr_is_its_own_run_but_tr_dpu_and_the_planners_plan_with_its_stages_are_one() -> None:
    stages = ((0, 2, 1), (2, 4, 1))
    merged = deduplicate(
        [
            Candidate("tr", "mode", "tr", stages),
            Candidate("tr_dpu", "mode", "tr_dpu", stages),
            Candidate("top1", "top", "hybrid", stages),
            Candidate("dp", "mode", "dp"),
            Candidate("ls", "mode", "ls"),
        ]
    )
    assert [(c.name, c.also) for c in merged] == [("tr", ()), ("tr_dpu", ("top1",)), ("dp", ()), ("ls", ())]


def test_a_candidate_runs_as_its_mode_or_as_hybrid_with_its_stages() -> None:
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    hybrid = candidate_spec(spec, Candidate("drawn1", "drawn", "hybrid", ((0, 4, 2),)), steps=5)
    assert hybrid.schedule.mode == "hybrid" and hybrid.schedule.replan is False and hybrid.train.max_steps == 5
    assert [(s.start, s.stop, s.replicas) for s in hybrid.schedule.stages or []] == [(0, 4, 2)]
    dp = candidate_spec(spec, Candidate("dp", "mode", "dp"), steps=5)
    assert dp.schedule.mode == "dp" and dp.schedule.stages is None


def plan(
    arm: str, predicted: float, measured: float, calibrated: float | None, also: tuple[str, ...] = ()
) -> PlanAccuracy:
    return PlanAccuracy(
        arm=arm,
        also=list(also),
        source="mode",
        mode="hybrid",
        stages=[],
        predicted_step_s=predicted,
        measured_step_s=measured,
        calibrated_step_s=calibrated,
        calibrated_from=None if calibrated is None else "dp",
    )


def test_the_section_judges_the_planners_first_plan_and_the_lowest_calibrated_one() -> None:
    plans = [
        plan("dp", 2.0, 2.0, 2.08),
        plan("tr_dpu", 0.5, 1.0, 0.95, also=(CHOSEN,)),  # the planner's first: 10% slower than ir
        plan("ir", 0.8, 0.9, 0.9),
    ]
    section = accuracy_section(plans, seed=7)
    assert section.chosen == "tr_dpu" and section.chosen_regret == pytest.approx(1.0 / 0.9 - 1)
    assert section.mape == pytest.approx((0.0 + 0.5 + 0.1 / 0.9) / 3)
    assert section.rank_correlation == pytest.approx(1 / 3)  # (dp, tr_dpu) and (dp, ir) agree; (tr_dpu, ir) not
    # the guard (5% without a noise floor): dp's +4% applies; tr_dpu's +90% and ir's +12.5% do not
    calibrated = section.calibrated
    assert [plan.calibration_applied for plan in section.plans] == [True, False, False]
    assert calibrated is not None and calibrated.chosen == "tr_dpu"
    assert calibrated.mape == pytest.approx((0.08 / 2.0 + 0.5 + 0.1 / 0.9) / 3)
    believed = accuracy_section(plans, seed=7, floor=0.8)  # a noise floor of 80%: every calibration within it
    assert believed.calibrated is not None and believed.calibrated.chosen == "ir"
    assert believed.calibrated.chosen_regret == 0.0 and believed.calibrated.rank_correlation == pytest.approx(1.0)
    uncalibrated = accuracy_section([plan("dp", 2.0, 2.0, None), plan("ir", 1.0, 1.1, None, (CHOSEN,))], seed=0)
    assert uncalibrated.calibrated is None


def test_the_report_renders_the_accuracy_table_from_the_record() -> None:
    record = BenchRecord.from_json(json.loads(RECORD.read_text()))
    plans = [plan("dp", 2.0, 2.0, 2.1), plan("tr_dpu", 0.5, 1.0, 0.95, also=(CHOSEN,))]
    stored = record.model_copy(update={"compares": "plans", "accuracy": accuracy_section(plans, seed=7)})
    again = BenchRecord.from_json(json.loads(stored.model_dump_json()))
    text = render([again])
    assert "the planner's predictions checked" in text and "#### Predictions checked" in text
    assert "| tr_dpu = top1 | mode | - | 1 | 0.5 | -50% | 0.95 | -5% | dp (not applied) |" in text
    assert "From the profile alone: MAPE " in text and "chosen plan tr_dpu (the planner's first plan)" in text
    assert "Calibrated out of sample (each plan predicted with the calibration of the next candidate's run" in text
    assert "#### Predictions checked" not in render([record])  # a record without accuracy has no such table


@pytest.mark.parametrize("extra", [["--modes", "dp,auto"], ["--replan"]])
def test_accuracy_chooses_its_own_plans_and_refuses_what_it_does_not_measure(extra: list[str]) -> None:
    code, _, err = pipebd_here("bench", "examples/tiny-custom.yaml", "--accuracy", *extra)
    assert code == 2 and "--accuracy chooses its own plans" in err and "give it no --modes" in err
