"""Elastic jobs, the pure logic (docs/multinode.md, "Elastic jobs"): the spec's bounds and their refusals, pinned
stages fitted to fewer ranks, a run directory reshaped for the nodes left, the machines a resumed job is planned
for, how the attempts list words a resume on another shape, and when a job below its max_nodes takes a larger
gang (the planner's prediction against a relaunch, the rule re-planning uses)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.attempts import closing_outcome, shape_note, shape_notes
from app.core.plan_summary import PlanSummary, cut
from app.core.tables import JobAttempt
from pipebd_core.documents.phases import PENDING, SUCCEEDED
from pipebd_core.job import grow
from pipebd_core.job.elastic import reshape
from pipebd_core.job.launch import temporary_run
from pipebd_core.job.phases import job_phases
from pipebd_core.planning.distill_planner import resolve_plan
from pipebd_core.planning.topology import Topology, planned_machines
from pipebd_core.spec import SpecError, StageSpec, fit_replicas
from tests.fake_profiles import fake_profile
from tests.helpers import tiny_spec

HYBRID = [{"start": 0, "stop": 1, "replicas": 2}, {"start": 1, "stop": 3, "replicas": 1}, {"start": 3, "stop": 4}]


def test_elastic_is_off_by_default_and_takes_its_bounds() -> None:
    assert tiny_spec().schedule.elastic is None
    elastic = tiny_spec(schedule={"nodes": 2, "elastic": {"min_nodes": 1}}).schedule.elastic
    assert elastic is not None and (elastic.min_nodes, elastic.max_nodes) == (1, None)
    growing = tiny_spec(schedule={"nproc": 1, "elastic": {"max_nodes": 2}}).schedule  # asks 1 node, may grow to 2
    assert growing.nodes == 1 and growing.elastic is not None and growing.elastic.max_nodes == 2


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"nodes": 2, "elastic": {"min_nodes": 3}}, "elastic.min_nodes: 3 is above schedule.nodes (2)"),
        ({"nodes": 2, "elastic": {"min_nodes": 3}}, "use min_nodes 2 or fewer"),
        ({"nodes": 2, "elastic": {"max_nodes": 1}}, "elastic.max_nodes: 1 is below schedule.nodes (2)"),
        ({"nodes": 2, "elastic": {"max_nodes": 1}}, "use max_nodes 2 or more"),
        ({"nodes": 2, "elastic": {"min_nodes": 2, "max_nodes": 1}}, "and elastic.min_nodes (2)"),
        (
            {"mode": "hybrid", "nproc": 2, "nodes": 2, "stages": HYBRID, "elastic": {"min_nodes": 1}},
            "1 node(s) x 2 rank(s) is fewer ranks than the 3 stages pinned in schedule.stages",
        ),
        (
            {"mode": "hybrid", "nproc": 2, "nodes": 2, "stages": HYBRID, "elastic": {"min_nodes": 1}},
            "use min_nodes 2 or more",
        ),
        ({"nodes": 2, "elastic": {"min_nodes": 0}}, "min_nodes"),
    ],
)
def test_bounds_no_plan_can_use_are_refused_naming_the_field_and_what_works(schedule: dict, message: str) -> None:
    with pytest.raises(SpecError) as refused:
        tiny_spec(schedule=schedule)
    assert message in str(refused.value) and "elastic" in str(refused.value)


def test_an_auto_job_that_may_grow_past_one_node_replans_mid_run_and_a_fixed_mode_never() -> None:
    growing = {"mode": "auto", "profile": True, "nproc": 1, "elastic": {"max_nodes": 2}}
    assert tiny_spec(schedule=growing).schedule.replans  # on by default for auto, on any number of nodes
    assert tiny_spec(schedule=growing).schedule.on_nodes(2).replans
    assert not tiny_spec(schedule={**growing, "replan": False}).schedule.on_nodes(2).replans
    assert not tiny_spec(schedule={**growing, "mode": "tr_dpu"}).schedule.on_nodes(2).replans


def test_pinned_stages_keep_their_cuts_and_give_up_replicas_largest_first() -> None:
    stages = [StageSpec(start=0, stop=2, replicas=3), StageSpec(start=2, stop=3, replicas=1)]
    assert [s.replicas for s in fit_replicas(stages, 3)] == [2, 1]
    assert [s.replicas for s in fit_replicas(stages, 2)] == [1, 1]
    assert [s.replicas for s in fit_replicas(stages, 6)] == [3, 3]  # growing: the fewest take one first
    assert [(s.start, s.stop) for s in fit_replicas(stages, 2)] == [(0, 2), (2, 3)]
    with pytest.raises(ValueError, match="2 pinned stages need at least 2 ranks, not 1"):
        fit_replicas(stages, 1)


def test_a_schedule_on_fewer_nodes_keeps_everything_else() -> None:
    stages = [{"start": 0, "stop": 1, "replicas": 3}, {"start": 1, "stop": 4, "replicas": 1}]
    spec = tiny_spec(schedule={"mode": "hybrid", "nproc": 2, "nodes": 2, "stages": stages})
    smaller = spec.schedule.on_nodes(1)
    assert (smaller.nodes, smaller.nproc, smaller.world_size) == (1, 2, 2)
    assert [(s.start, s.stop, s.replicas) for s in smaller.stages or []] == [(0, 1, 1), (1, 4, 1)]
    assert smaller.mode == "hybrid" and spec.schedule.nodes == 2  # the original is left as it was


def test_a_reshaped_run_directory_plans_again_for_its_nodes_unless_it_distilled(tmp_path: Path) -> None:
    spec = tiny_spec(schedule={"nodes": 2, "elastic": {"min_nodes": 1}})
    run_dir = temporary_run(spec, job_phases(spec))
    records = run_dir.load_phases()
    records[0].end(SUCCEEDED)  # planned; the distillation has not ended
    run_dir.save_phases(records)
    assert reshape(run_dir, 2) is None  # already on 2 nodes: nothing changes
    reshaped = reshape(run_dir, 1)
    assert reshaped is not None and (reshaped.was_nodes, reshaped.nodes, reshaped.nproc) == (2, 1, 1)
    assert reshaped.replanned and run_dir.load_spec().schedule.nodes == 1
    assert grow.room(run_dir.load_spec()) == 1  # max_nodes left out was the 2 it asked for: it may grow back
    states = {record.name: (record.state, record.outcome) for record in run_dir.load_phases()}
    assert states["plan"] == (PENDING, None) and states["distill"] == (PENDING, None)
    assert next(e for e in run_dir.read_events() if e["event"] == "reshaped")["from_nodes"] == 2
    records = run_dir.load_phases()
    for record in records:
        record.end(SUCCEEDED)
    run_dir.save_phases(records)
    again = reshape(run_dir, 2)  # distilled already: the plan stays (finalize reads the blocks as they are)
    assert again is not None and not again.replanned
    assert all(record.outcome == SUCCEEDED for record in run_dir.load_phases())


def test_a_resumed_job_is_planned_for_its_ranks_with_the_profiles_link(tmp_path: Path) -> None:
    from pipebd_core.documents.profile import LinkFit, Profile

    profile = Profile.model_construct(nodes=2, nproc=4, links={"inter": LinkFit(latency_s=1e-4, bytes_per_s=1e9)})
    same = tiny_spec(schedule={"nproc": 2, "nodes": 2})
    assert planned_machines(same, profile) == Topology.of(profile)
    fewer = planned_machines(tiny_spec(schedule={"nproc": 2, "nodes": 1}), profile)
    assert (fewer.nodes, fewer.per_node, fewer.inter) == (1, 2, profile.links["inter"])


def test_the_plan_cut_names_each_stages_blocks_and_replicas() -> None:
    stages = [{"start": 0, "stop": 7, "ranks": [0, 1]}, {"start": 7, "stop": 13, "ranks": [2]}]
    assert cut(PlanSummary(mode="hybrid", stages=stages)) == "0-6 x2 | 7-12"
    assert cut(PlanSummary(mode="tr", stages=[{"start": 0, "stop": 1, "ranks": [0]}])) == "0"
    assert cut(PlanSummary(mode="dp", stages=None)) == "dp"


def attempt(number: int, nodes: int | None, nproc: int | None, plan: str | None = None) -> JobAttempt:
    return JobAttempt(job_id=1, number=number, nodes=nodes, nproc=nproc, plan=plan)


def test_an_attempt_on_another_shape_says_so() -> None:
    first, smaller = attempt(1, 2, 2, "0-3 | 4-6 | 7-9 | 10-12"), attempt(2, 1, 2, "0-6 | 7-12")
    assert shape_note(smaller, first) == "resumed on 1 node x 2 ranks (was 2 x 2), plan 0-6 | 7-12"
    assert shape_note(attempt(2, 2, 2), first) is None  # the same shape: nothing to say
    assert shape_note(attempt(2, None, None), first) is None  # recorded by an older worker
    assert shape_notes([first, smaller, attempt(3, 2, 1)]) == [
        None,
        "resumed on 1 node x 2 ranks (was 2 x 2), plan 0-6 | 7-12",
        "resumed on 2 nodes x 1 rank (was 1 x 2)",
    ]


def test_an_attempt_requeued_because_its_worker_was_told_to_stop_is_preempted() -> None:
    assert closing_outcome("queued", "worker_shutdown") == "preempted"
    assert closing_outcome("queued", "node_lost") == "requeued"
    assert closing_outcome("failed", "worker_shutdown") == "failed"
    assert closing_outcome("queued", "grown") == "grown"  # took a larger gang: no restart used either


def test_a_job_below_its_max_nodes_grows_when_the_planner_predicts_the_saving_exceeds_a_relaunch() -> None:
    spec = tiny_spec(schedule={"nproc": 1, "profile": True, "elastic": {"max_nodes": 2}})
    profile = fake_profile([1.0] * 4, [1.0] * 4, nproc=1, batch_size=spec.data.batch_size, p2p=0.01)
    plan = resolve_plan(spec, profile).document()  # one rank runs every block: 8 s a step
    assert grow.room(spec) == 1 and grow.room(spec.model_copy(update={"schedule": spec.schedule.on_nodes(2)})) == 0
    taken = grow.consider(spec, profile, plan, free=3, remaining_steps=10, relaunch_s=5.0)
    assert taken is not None and taken.grow and taken.nodes == 2  # 3 hosts free, but max_nodes is 2
    assert (taken.running_step_s, round(taken.grown_step_s, 2)) == (8.0, 4.01)  # two stages, a transfer between
    declined = grow.consider(spec, profile, plan, free=1, remaining_steps=1, relaunch_s=50.0)
    assert declined is not None and not declined.grow
    assert declined.reason == "the remaining 1 steps would save 4.0 s, less than a relaunch (50.0 s)"
    assert grow.consider(spec, profile, plan, free=0, remaining_steps=10, relaunch_s=0.0) is None
    slow_link = fake_profile([1.0] * 4, [1.0] * 4, nproc=1, batch_size=spec.data.batch_size, p2p=10.0)
    no_faster = grow.consider(spec, slow_link, resolve_plan(spec, slow_link).document(), 1, 10, 0.0)
    assert no_faster is not None and not no_faster.grow and "predicted no faster" in no_faster.reason
    pinned = tiny_spec(schedule={"mode": "tr", "nproc": 3, "profile": True, "elastic": {"max_nodes": 2}})
    wide = fake_profile([1.0] * 4, [1.0] * 4, nproc=3, batch_size=spec.data.batch_size)
    too_many = grow.consider(pinned, wide, resolve_plan(pinned, wide).document(), 1, 10, 0.0)
    assert too_many is not None and not too_many.grow and "no plan on 2 nodes" in too_many.reason  # 6 ranks, 4 blocks
