"""A replicated stage's student step is costed as training runs it: with its BatchNorm synchronised over the
stage's k ranks (profile.student_group_s, measured with every group at once), not as the plain step at
ceil(B/k) rows; the cost model, the simulator, the planner and calibration agree on it. Tier: pure logic."""

from __future__ import annotations

import pytest

from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.profile import Profile
from pipebd_core.documents.telemetry import BlockSeconds, DistillLine
from pipebd_core.planning.distill_calibration import calibrate
from pipebd_core.planning.distill_costmodel import CostModel, profiled_allreduce
from pipebd_core.planning.distill_planner import mode_plans
from pipebd_core.planning.distill_search import best_plan
from pipebd_core.planning.distill_simulate import simulate
from tests.fake_profiles import fake_profile
from tests.telemetry_lines import distill_line

TEACHER = [4.0, 1.0, 3.0, 2.0, 0.5]
STUDENT = [1.0, 2.0, 0.5, 1.5, 1.0]


def test_a_replicated_stage_costs_the_synchronised_student_step() -> None:
    plain = CostModel(fake_profile(TEACHER, STUDENT, 2, allreduce=0.1))
    synced = CostModel(fake_profile(TEACHER, STUDENT, 2, allreduce=0.1, replicated=3.0))
    half = [s * 6 / 12 for s in STUDENT]
    assert plain.stage(0, 5, 2).compute_s == pytest.approx(sum(TEACHER) / 2 + sum(half))
    assert synced.stage(0, 5, 2).compute_s == pytest.approx(sum(TEACHER) / 2 + 3 * sum(half))
    assert synced.stage(0, 5, 1) == plain.stage(0, 5, 1)  # one rank: plain BatchNorm, the plain step
    for model in (plain, synced):
        plans = mode_plans(model)
        assert simulate(plans["ir"], model)[0] == pytest.approx(model.stage(0, 5, 2).total_s)
        assert simulate(plans["dp"], model)[0] == pytest.approx(model.dp_step())
        assert simulate(plans["ls"], model)[0] == pytest.approx(model.ls_step())
    assert synced.dp_step() == pytest.approx(plain.dp_step() + 2 * sum(half))
    assert synced.ls_step() == plain.ls_step()


def test_a_smaller_shard_scales_the_synchronised_step_by_its_rows() -> None:
    # 12 rows over 5 replicas: shards 3, 3, 2, 2, 2; the group step was measured at ceil(12/5) = 3 rows
    model = CostModel(fake_profile(TEACHER, STUDENT, 5, replicated=2.0))
    assert model.student(1, 3, replicas=5) == pytest.approx(2.0 * STUDENT[1] * 3 / 12)
    assert model.student(1, 2, replicas=5) == pytest.approx(model.student(1, 3, replicas=5) * 2 / 3)
    assert model.student(1, 3) == pytest.approx(STUDENT[1] * 3 / 12)


def test_the_planner_leaves_replicated_stages_when_their_students_synchronise_slowly() -> None:
    # the plain half-batch step makes replicating everything (ir) the best plan; at 3x it is a pipeline
    plain = best_plan(CostModel(fake_profile(TEACHER, STUDENT, 2)))
    assert any(replicas > 1 for _, _, replicas in plain.triples())
    synced = best_plan(CostModel(fake_profile(TEACHER, STUDENT, 2, replicated=3.0)))
    assert all(replicas == 1 for _, _, replicas in synced.triples())


def replica_lines(group: int, allreduce_s: float) -> dict[int, list[DistillLine]]:
    """Each of `group` replicas trained 6 rows of both blocks for three steps (0.5 s of teacher, 3 s of student a
    block), all-reducing for `allreduce_s` a step (none where 0)."""
    lines = [
        distill_line(
            rank,
            step,
            time=10.0 * step,
            loss={0: 1.0, 1: 1.0},
            samples=6,
            phases={"teacher": 0.01, **({"allreduce": allreduce_s} if allreduce_s else {})},
            block_s=BlockSeconds(teacher={0: 0.5, 1: 0.5}, student={0: 3.0, 1: 3.0}),
        )
        for rank in range(group)
        for step in range(3)
    ]
    return {rank: [line for line in lines if line.rank == rank] for rank in range(group)}


def test_calibration_compares_a_replicated_rank_with_the_synchronised_step() -> None:
    profile = fake_profile([1.0, 1.0], [2.0, 2.0], nproc=2, replicated=3.0)
    # each replica trained 6 rows of both blocks in 3 s a block: the profiled synchronised step exactly
    calibration = calibrate(profile, replica_lines(2, 0.0), {0: 2, 1: 2}, {"run": "r", "steps": [0, 2]})
    assert [block.student for block in calibration.blocks] == [1.0, 1.0]
    assert [block.teacher for block in calibration.blocks] == [1.0, 1.0]


def test_a_profile_of_version_1_is_refused_saying_so() -> None:
    old = {**fake_profile(TEACHER, STUDENT, 2).to_json(), "format_version": 1}
    with pytest.raises(DocumentError, match=r"block profile was written as version 1.*reads version 2"):
        Profile.from_json(old)


def test_calibration_prices_an_all_reduce_the_profile_did_not_measure_as_the_cost_model_does() -> None:
    # a profile of one rank (an elastic job's first node) has no all-reduce: a group of two after it grew is
    # compared with nothing (this raised KeyError: 2 in the worker that followed the grown job)
    single = fake_profile([1.0, 1.0], [2.0, 2.0], nproc=1)
    lone = calibrate(single, replica_lines(2, 0.4), {0: 2, 1: 2}, {"run": "r", "steps": [0, 2]})
    assert lone.allreduce == 1.0
    # a group larger than profiled: the largest measured one scaled as a ring's traffic, as the cost model prices it
    pair = fake_profile([1.0, 1.0], [2.0, 2.0], nproc=2, allreduce=0.1)
    estimate = 2 * profiled_allreduce(pair.blocks[0], 3)  # both blocks' all-reduces in a step
    assert estimate == pytest.approx(2 * 0.1 * (2 / 3) * 2)
    trio = calibrate(pair, replica_lines(3, 2 * estimate), {0: 3, 1: 3, 2: 3}, {"run": "r", "steps": [0, 2]})
    assert trio.allreduce == pytest.approx(2.0)
