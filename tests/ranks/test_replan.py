"""Profiles that know how good they are, calibration from telemetry, and re-planning mid-run.

Tier: pure logic (re-measuring, trust, calibration, the re-plan decision, where ranks stop), then
2-rank gloo runs through torchrun that share one measured profile: a run started from a
deliberately wrong profile re-plans once and learns exactly what the sequential loop learns; the
next `pipebd plan` predicts what that run measured; a run that starts from the calibrated profile
never re-plans.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from pipebd_core.data.streams import SearchSchedule
from pipebd_core.distill.control import StopWatch, request_stop, stop_step
from pipebd_core.distill.plan import Plan
from pipebd_core.distill.schedule import rank_tasks
from pipebd_core.documents.distill_plan import Replan, StageEntry
from pipebd_core.documents.profile import Conditions, Profile
from pipebd_core.documents.telemetry import BlockSeconds, DistillLine
from pipebd_core.job.replan import RELAUNCH_ENV, decide
from pipebd_core.planning import profiles
from pipebd_core.planning.distill_calibration import calibrate
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_planner import resolve_plan
from pipebd_core.planning.distill_simulate import simulate
from pipebd_core.planning.trust import assess
from pipebd_core.profile.blocks import CpuUse, RankLoad, conditions, timed
from pipebd_core.profile.measure import MAX_REMEASURES, NOISY_SPREAD, spread_of
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from tests.fake_profiles import fake_profile
from tests.helpers import assert_same_weights, load_students, pipebd, plain_loop, run_job, tiny_spec
from tests.telemetry_lines import distill_line

CPU = torch.device("cpu")
# Other processes' use of the node (in cores, over the whole run) above which a step time measured there
# is not the one a quiet node would measure: the 10% prediction claim is then not checkable.


def sleeper(durations: Iterator[float]) -> Any:
    return lambda: time.sleep(next(durations))


def test_trials_that_disagree_are_taken_again_and_the_steadiest_kept() -> None:
    noisy_once = itertools.chain([0.005, 0.05] * 3, itertools.repeat(0.02))  # warm-up + 5 trials, then steady
    trials = timed(sleeper(noisy_once), 5, CPU)
    assert trials.remeasured == 1 and spread_of(trials.samples) < NOISY_SPREAD

    always_noisy = itertools.cycle([0.005, 0.05])
    trials = timed(sleeper(always_noisy), 5, CPU)
    assert trials.remeasured == MAX_REMEASURES and spread_of(trials.samples) > NOISY_SPREAD

    # steady: 0.1 s sleeps, so a scheduling delay under a full suite's load (one 20 ms sleep of five ran long
    # enough to pass the spread rule once) stays far inside it
    assert timed(sleeper(itertools.repeat(0.1)), 5, CPU).remeasured == 0


def test_trust_names_what_stays_noisy_the_load_and_the_age() -> None:
    profile = fake_profile([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], nproc=2)
    assert assess(profile).trusted and assess(profile).flags == []
    noisy = profile.blocks[2].teacher_s[6]
    noisy.spread, noisy.remeasured = 0.9, 2
    profile.conditions = Conditions(cpus=2, other_cpu_cores=1.3, load_average_1m=2.0, noisy_spread=NOISY_SPREAD)
    profile.measured_at = time.time() - 10 * 86400
    trust = assess(profile).model_dump(mode="json")
    assert trust["flags"] == ["noisy", "busy", "stale"] and not trust["trusted"]
    assert trust["noisy"] == [{"what": "block 2 teacher", "block": 2, "batch": 6, "spread": 0.9, "remeasured": 2}]
    assert "block 2 teacher at batch 6 spread 0.90" in trust["messages"][0]
    assert "1.30 CPU cores" in trust["messages"][1] and "10 days ago" in trust["messages"][2]


def test_conditions_count_what_other_processes_used_while_the_ranks_measured() -> None:
    ranks = [
        RankLoad(CpuUse(wall_s=10.0, node_busy_s=32.0, own_s=10.0), gpu_others=None),
        RankLoad(CpuUse(wall_s=9.5, node_busy_s=31.0, own_s=10.0), gpu_others=None),
    ]
    measured = conditions(ranks)  # the node was busy 32 s, the ranks 20 s of it: 1.2 cores of others
    assert measured.other_cpu_cores == pytest.approx(1.2) and measured.gpu_other_processes is None


def line(
    rank: int, step: int, at: float, teacher: dict[int, float], student: dict[int, float], **phases: float
) -> DistillLine:
    return distill_line(
        rank,
        step,
        time=at,
        samples=12,
        loss=dict.fromkeys(student, 1.0),
        block_s=BlockSeconds(teacher=teacher, student=student),
        phases={"data": 0.0, "allreduce": 0.0, "recv_wait": 0.0, **phases},
    )


def test_calibration_is_measured_over_profiled_per_block_with_the_rest_as_task_overhead() -> None:
    profile = fake_profile([1.0, 1.0], [2.0, 2.0], nproc=2, data=0.5)
    # rank 0 runs blocks 0-1: teacher 2x and 1x the profile, students 0.5x; 0.25 s between lines unaccounted
    lines = [line(0, s, 6.25 * s, {0: 2.0, 1: 1.0}, {0: 1.0, 1: 1.0}, data=1.0) for s in range(4)]
    calibration = calibrate(profile, {0: lines}, {0: 1}, {"run": "r", "steps": [0, 3]})
    blocks = calibration.blocks
    assert [blocks[0].teacher, blocks[1].teacher, blocks[0].student] == [2.0, 1.0, 0.5]
    assert calibration.data == 2.0 and calibration.task_overhead_s == pytest.approx(0.25)
    assert calibration.measured_step_s == pytest.approx(6.25)
    model = CostModel(profile.calibrated(calibration))
    assert model.teacher(0, 12) == 2.0 and model.student(1, 12) == 1.0
    assert model.pipeline_step([(0, 2, 1)]) == pytest.approx(6.25)  # what was measured


def stage(start: int, stop: int, rank: int) -> StageEntry:
    return StageEntry(start=start, stop=stop, replicas=1, ranks=[rank], rows=[(0, 16)])


def test_the_decision_needs_a_wrong_prediction_a_faster_plan_room_left_and_no_bound_reached() -> None:
    model = CostModel(fake_profile([1.0] * 4, [1.0] * 4, nproc=2))  # the best plan: 2 blocks a stage, 4 s
    stages = [(0, 3, 1), (3, 4, 1)]

    def verdict(measured: float, remaining: int = 100, done: int = 0, bound: int = 2) -> Any:
        return decide(6.0, stages, model, measured, remaining, relaunch_s=10.0, replans_done=done, max_replans=bound)

    assert verdict(6.5).reason.startswith("the prediction held")  # 8% off
    chosen = verdict(12.0)
    assert chosen.replan and chosen.stages == [(0, 2, 1), (2, 4, 1)] and chosen.best_step_s == 4.0
    assert "re-planned 2 times" in verdict(12.0, done=2).reason and not verdict(12.0, done=2).replan
    assert not verdict(12.0, done=0, bound=0).replan
    assert "less than a relaunch" in verdict(12.0, remaining=4).reason  # 4 steps x 2 s saved < 10 s
    stages[:] = [(0, 2, 1), (2, 4, 1)]
    assert "no plan is 10% faster" in verdict(12.0).reason


def test_every_rank_stops_before_the_step_the_first_stage_chose(tmp_path: Path) -> None:
    spec = tiny_spec(schedule={"mode": "tr_dpu", "nproc": 2})
    run_dir = RunDir(tmp_path)
    plan = resolve_plan(spec, None)
    total = plan.step_plan.total
    watches = [StopWatch(run_dir, plan, rank, list(rank_tasks(plan, rank, total, [0] * 4, None))) for rank in (0, 1)]
    assert not watches[1].before(3, 3)
    request_stop(run_dir, "pause")
    assert not watches[1].before(3, 3)  # only the first rank of stage 0 decides
    assert not watches[0].before(2, 2)  # it finishes step 2 and 3 ...
    assert stop_step(run_dir) == 4 and watches[0].before(4, 4)  # ... and stops before step 4
    assert not watches[1].before(3, 3) and watches[1].before(4, 4)


def test_data_parallel_ranks_stop_at_a_step_boundary_not_between_a_nas_round_pair(tmp_path: Path) -> None:
    spec = tiny_spec(schedule={"mode": "dp", "nproc": 2})
    run_dir = RunDir(tmp_path)
    plan = resolve_plan(spec, None)
    tasks = list(rank_tasks(plan, 0, 8, [0] * 4, SearchSchedule(0, 2)))  # an arch round every 2nd step
    watch = StopWatch(run_dir, plan, 0, tasks)
    request_stop(run_dir, "pause")
    assert tasks[1].round == "weights" and tasks[2].round == "arch"
    assert not watch.before(1, tasks[1].step)  # decided at task 1 (step 1's weights): after its arch round
    assert watch.before(3, tasks[3].step) and not watch.before(2, tasks[2].step)


# --- 2-rank runs from one measured profile ---------------------------------------------------------------


def replan_spec(samples: int) -> Spec:
    """8 tiny conv blocks at 32x32: a step of tens of ms on 2 CPU ranks, the best plan two stages."""
    spec = tiny_spec(
        workload={"options": {"channels": 16, "num_blocks": 8}},
        data={"image_size": 32, "num_samples": samples, "batch_size": 16},
        schedule={"mode": "auto", "nproc": 2, "profile": True},
    )
    return spec.model_copy(update={"name": "replan"})  # a profile cache entry of its own


FIXED_PROFILE = Profile.from_json(
    json.loads((Path(__file__).parents[1] / "fixtures" / "replan_profile.json").read_text())
)


def misplanned(profile: Profile, batch: int) -> tuple[Profile, int]:
    """The profile as if measured while something slowed every block 2x, the blocks after the worst cut
    k much more, and the all-reduces 4x: auto then plans stages [0, k) and [k, 8), which really run at
    the pace of the larger side. Returns (that profile, k)."""
    model = CostModel(profile)
    cost = [model.teacher(b, batch) + model.student(b, batch) for b in range(model.num_blocks)]
    cut = max(range(1, model.num_blocks), key=lambda k: max(sum(cost[:k]), sum(cost[k:])))
    slower = {b: 2.0 if b < cut else 2.0 * sum(cost[:cut]) / sum(cost[cut:]) for b in range(model.num_blocks)}
    wrong = profile.uncalibrated().model_copy(deep=True)
    for block, factor in slower.items():
        for table in (wrong.blocks[block].teacher_s, wrong.blocks[block].student_s):
            for entry in table.values():
                entry.median *= factor
        for entry in wrong.blocks[block].allreduce_s.values():
            entry.median *= 4.0  # never measured by an unreplicated plan, so never calibrated
    return wrong, cut


def events_of(run_dir: RunDir, kind: str) -> list[dict[str, Any]]:
    events = [json.loads(text) for text in run_dir.events.read_text().splitlines()]
    return [event for event in events if event["event"] == kind]


@pytest.fixture(scope="module")
def replanned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Spec, RunDir, int]:
    """A run of 120 steps from a deliberately wrong profile (tests/fixtures/replan_profile.json, measured
    once on a 2-core machine, made wrong by `misplanned`: fixed, so the plan it gives does not depend on
    the load while the suite runs)."""
    # The decision comes near step 37 and weighs the steps left times the step time the better plan saves
    # (4.6-6.3 ms measured beside the other test process: about 0.4 s over the 80-odd steps left) against a
    # relaunch. That relaunch is fixed at 0.05 s (PIPEBD_RELAUNCH_S): measured from this launch's start-up
    # beside the other test process it ranged from 1.6 s to 7.7 s between machines, and the job then rightly
    # declined (that rule is test_the_decision_needs_...'s); here the mechanism is checked, not the machine.
    spec = replan_spec(samples=16 * 120)
    wrong, cut = misplanned(FIXED_PROFILE, spec.data.batch_size)
    profiles.store(spec, wrong)
    stages = [(s.start, s.stop, s.replicas) for s in resolve_plan(spec, wrong).stages]
    assert stages == [(0, cut, 1), (cut, 8, 1)], f"the wrong profile should plan the cut at {cut}, not {stages}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RELAUNCH_ENV, "0.05")
        code, run_dir = run_job(spec, tmp_path_factory.mktemp("replan") / "run")
    assert code == 0, run_dir.events.read_text()[-3000:]
    return spec, run_dir, cut


@pytest.mark.timeout(900)  # its fixture's 120-step run and the reference loop
def test_a_run_from_a_wrong_profile_replans_once_and_learns_what_the_sequential_loop_learns(
    replanned: tuple[Spec, RunDir, int],
) -> None:
    spec, run_dir, cut = replanned
    plan = run_dir.read_json(run_dir.plan)
    assert len(plan["replans"]) == 1, events_of(run_dir, "replan_declined")
    entry = plan["replans"][0]
    assert [(s["start"], s["stop"]) for s in entry["from"]] == [(0, cut), (cut, 8)]
    assert entry["to"] == plan["stages"] and entry["to"] != entry["from"]
    assert entry["measured_before_s"] < 0.8 * entry["predicted_before_s"]  # the profile said 2x slower
    assert entry["measured_after_s"] is not None and entry["predicted_after_s"] < entry["measured_before_s"]
    resumed = entry["resumed_at_step"]
    assert [e["reached"] for e in events_of(run_dir, "rank_stopped")] != []
    assert {tuple(e["start_steps"]) for e in events_of(run_dir, "rank_started")[2:]} == {(resumed,) * 8}
    assert len(events_of(run_dir, "replanned")) == 1 and len(events_of(run_dir, "replan_requested")) == 1
    assert_same_weights(load_students(run_dir), plain_loop(spec))


def test_calibration_is_cached_and_pipebd_plan_reads_it(replanned: tuple[Spec, RunDir, int]) -> None:
    """How close a calibrated prediction comes is a benchmark figure (`pipebd bench`), measured on a quiet
    machine; here: the calibration reaches the cache with its source, and the next plan reads it."""
    spec, run_dir, _ = replanned
    cached = profiles.load_cached(spec)
    assert cached is not None and cached.calibration is not None
    assert cached.calibration.source.run == run_dir.root.name
    assert cached.blocks == run_dir.load_profile().blocks  # the measured numbers stay
    assert run_dir.load_calibration().measured_step_s is not None  # under the plan it ended with
    path = run_dir.root.parent / "spec.json"
    path.write_text(spec.model_dump_json())
    result = pipebd("plan", str(path), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["profile_trust"]["calibrated_from"]["run"] == run_dir.root.name


def test_a_run_from_the_calibrated_profile_never_replans(replanned: tuple[Spec, RunDir, int], tmp_path: Path) -> None:
    spec = replan_spec(samples=16 * 150)  # same workload, so the same cached (now calibrated) profile
    code, run_dir = run_job(spec, tmp_path / "run")
    assert code == 0, run_dir.events.read_text()[-3000:]
    assert events_of(run_dir, "calibrated"), "the run never calibrated"
    assert not events_of(run_dir, "replan_requested") and "replans" not in run_dir.read_json(run_dir.plan)
    trust = run_dir.read_json(run_dir.plan)["profile_trust"]
    assert trust["calibrated_from"]["run"] == replanned[1].root.name
    # out of sample: run A's calibration predicts run B's plan (not fitted on B: the mechanism, exactly)
    first = replanned[1]  # run A; the cache now holds run B's own calibration
    calibrated = first.load_profile().calibrated(first.load_calibration())
    plan = resolve_plan(spec, calibrated)
    predicted = run_dir.load_plan().details.predicted_step_s
    assert predicted is not None
    assert predicted == pytest.approx(simulate(plan, CostModel(calibrated))[0], rel=1e-9)
    assert predicted != pytest.approx(simulate(plan, CostModel(calibrated.uncalibrated()))[0], rel=1e-3)


def test_a_noisy_profile_is_reported_in_plan_json_and_by_pipebd_plan(tmp_path: Path) -> None:
    spec = replan_spec(samples=16 * 10).model_copy(update={"name": "noisy"})
    noisy = fake_profile([0.01] * 8, [0.02] * 8, nproc=2, batch_size=16)  # every measurement agreed ...
    disagreed = noisy.blocks[1].student_s[16]  # ... but one
    disagreed.spread, disagreed.remeasured = 1.7, MAX_REMEASURES
    plan = Plan.to_json(resolve_plan(spec, noisy))
    assert plan["profile_trust"]["flags"] == ["noisy"]
    assert plan["profile_trust"]["noisy"] == [
        {"what": "block 1 student", "block": 1, "batch": 16, "spread": 1.7, "remeasured": MAX_REMEASURES}
    ]
    profiles.store(spec, noisy)
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json())
    result = pipebd("plan", str(path))
    assert result.returncode == 0, result.stderr
    assert "profile: NOISY" in result.stdout and "block 1 student at batch 16 spread 1.70" in result.stdout


def test_pipebd_run_says_when_it_replanned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipebd_core.commands import ProgressLine

    entry = Replan(
        at=time.time(),
        decided_at_step=41,
        resumed_at_step=42,
        from_=[stage(0, 7, 0), stage(7, 8, 1)],
        to=[stage(0, 3, 0), stage(3, 8, 1)],
        measured_before_s=0.0301,
        predicted_before_s=0.0566,
        predicted_after_s=0.0179,
        measured_after_s=None,
        reason="measured 47% off the prediction; a plan 40% faster",
    )
    ProgressLine(RunDir(tmp_path), replan_spec(16)).replanned(entry)
    said = capsys.readouterr().err
    assert "re-planned at step 42: 0-6 x1 | 7-7 x1 -> 0-2 x1 | 3-7 x1 (measured 30.1 ms" in said and "17.9 ms" in said
