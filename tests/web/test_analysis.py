"""Pure logic of the dashboard: per-rank time shares, the bottleneck sentence, the compare summary,
the plan as ranks x blocks, and the number filters of the templates."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.tables import Job
from app.web.analysis import JobSummary, find_bottleneck, latest_losses, predicted_bottleneck, summarize
from app.web.architecture import block_history, candidate_names, spaced
from app.web.compare import Compared, with_speedups
from app.web.templating import blocks, duration, millis, size
from app.web.views import chosen_mode, job_row, mode_text, plan_text, plan_view, stages_text
from pipebd_core.documents.distill_plan import PlanDocument, StageSpan
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.figures import rank_load, rank_loads, samples_per_s, step_s
from tests.telemetry_lines import distill_line

ZERO = {
    "data": 0.0,
    "recv_wait": 0.0,
    "teacher": 0.0,
    "send": 0.0,
    "student": 0.0,
    "allreduce": 0.0,
    "barrier": 0.0,
    "optim": 0.0,
}


def line(rank: int, step: int, time: float, blocks: list[int], **phases: float) -> DistillLine:
    return distill_line(
        rank,
        step,
        time=time,
        loss={b: 1.0 / (step + 1) for b in blocks},
        phases={**ZERO, **phases},
        samples=12,
        peak_mem=1000 * (rank + 1) + step,
        total=10,
    )


def pipeline(steps: int = 10) -> dict[int, list[DistillLine]]:
    """Two stages: rank 1's student work takes 3x rank 0's, so rank 0 blocks in send and rank 1 never waits."""
    records: dict[int, list[DistillLine]] = {0: [], 1: []}
    for step in range(steps):
        end = 0.1 * (step + 1)
        records[0].append(
            line(0, step, end - 0.04, [0, 1], data=0.005, teacher=0.01, send=0.05, student=0.02, optim=0.005)
        )
        records[1].append(line(1, step, end, [2, 3], recv_wait=0.002, teacher=0.02, student=0.075, optim=0.003))
    return records


def test_rank_load_splits_wall_time_into_phases_and_gaps() -> None:
    load = rank_load(0, pipeline()[0])
    assert load is not None
    assert load.tasks == 10
    # wall: from the first task's start (0.06 - 0.09) to the last task's end (0.96)
    assert load.wall_s == pytest.approx(0.96 - (0.06 - 0.09))
    assert load.share("send") == pytest.approx(0.5 / load.wall_s)
    assert sum(share for _, share in load.shares()) == pytest.approx(1.0, abs=0.01)


def plan_document(**fields: Any) -> PlanDocument:
    """plan.json with the fields a test gives (a 2-rank pipeline of 4 blocks unless it says otherwise);
    given alternatives or mode steps, the other predictions are there, saying nothing."""
    document: dict[str, Any] = {"mode": "tr_dpu", "nproc": 2, "num_blocks": 4, "batch_size": 12, **fields}
    if {"alternatives", "mode_step_s"} & fields.keys():
        nothing = {"alternatives": [], "mode_step_s": {}, "plans_considered": 0, "stages_rejected_for_memory": 0}
        document = {"predicted_step_s": 0.0, "ideal_step_s": 0.0, "simulation": {}, **nothing, **document}
    return PlanDocument.model_validate(document)


def ranked(stages: list[dict[str, int]], step_s: float, bottleneck: int) -> dict[str, Any]:
    """An entry of plan.json's `alternatives` with the numbers the dashboard reads."""
    parts = {"stage_s": [], "stage_parts": [], "memory_bytes": []}
    return {"stages": stages, "step_s": step_s, "bottleneck_stage": bottleneck, **parts}


def test_the_bottleneck_is_the_rank_that_works_most_and_others_say_how_they_wait() -> None:
    loads = rank_loads(pipeline())
    ranks = [
        {"rank": 0, "blocks": [0, 1], "rows": [0, 12], "stage": 0, "role": "stage"},
        {"rank": 1, "blocks": [2, 3], "rows": [0, 12], "stage": 1, "role": "stage"},
    ]
    plan = plan_document(ranks=ranks)
    measured = step_s(12, samples_per_s(pipeline(), 4))
    finding = find_bottleneck(loads, plan, measured)
    assert finding.rank == 1
    assert finding.headline.startswith("Rank 1 (stage 1, blocks 2–3) is the bottleneck")
    assert "student work" in finding.headline
    # the busy share the sentence quotes is the table's Busy column (one figure, one name)
    busy = next(load for load in loads if load.rank == 1).busy_share
    assert f"busy {100 * busy:.0f}% of the time" in finding.headline
    assert f"Measured: {millis(measured)} per step" in finding.details[1]
    assert "rank 0 is held up sending its output on (send)" in finding.details[0]
    assert "no prediction" in finding.details[1]


def test_a_downstream_rank_waiting_for_input_is_named_as_waiting() -> None:
    records = pipeline()
    for record in records[1]:
        record.phases.update(recv_wait=0.06, student=0.015)  # rank 1 now mostly waits
    for record in records[0]:
        record.phases.update(send=0.0, student=0.08)
    finding = find_bottleneck(rank_loads(records), None, None)
    assert finding.rank == 0
    assert "rank 1 waits for its input (recv_wait)" in finding.details[0]


def test_even_ranks_are_reported_as_balanced() -> None:
    records = {
        rank: [line(rank, s, 0.1 * (s + 1), [rank], teacher=0.05, student=0.05) for s in range(5)] for rank in (0, 1)
    }
    finding = find_bottleneck(rank_loads(records), None, None)
    assert finding.balanced and finding.headline.startswith("The ranks are evenly loaded (each computes about 100%")


def test_no_telemetry_and_a_single_rank() -> None:
    assert find_bottleneck([], None, None).rank is None
    single = rank_loads({0: [line(0, 0, 1.0, [0, 1], teacher=0.2, student=0.6)]})
    finding = find_bottleneck(single, None, 0.5)
    assert finding.rank == 0 and finding.headline.startswith("One rank does all the work")


def test_the_prediction_of_the_chosen_plan_is_quoted() -> None:
    stages = [{"start": 0, "stop": 2, "replicas": 1}, {"start": 2, "stop": 4, "replicas": 1}]
    plan = plan_document(
        stages=[{**stage, "ranks": [i], "rows": [[0, 12]]} for i, stage in enumerate(stages)],
        alternatives=[
            ranked([{"start": 0, "stop": 1, "replicas": 1}, {"start": 1, "stop": 4, "replicas": 1}], 0.05, 0),
            ranked(stages, 0.08, 1),
        ],
    )
    assert predicted_bottleneck(plan) == (1, 0.08)
    finding = find_bottleneck(rank_loads(pipeline()), plan, 0.1)
    assert "predicted stage 1 as the bottleneck at 80.00 ms per step" in finding.details[1]


def test_the_compare_summary_is_the_job_s_stored_figures_and_final_losses() -> None:
    records = pipeline()
    spec = {"data": {"batch_size": 12}}
    job = Job(id=1, name="a", state="succeeded", nproc=2, queue="q", spec=spec, samples_per_s=120.0, busy_share=0.5)
    job.peak_mem = 2009
    summary = summarize(job, records, final_loss=None)
    assert (summary.samples_per_s, summary.step_s, summary.busy_share) == (120.0, pytest.approx(0.1), 0.5)
    assert summary.peak_mem == 2009 and summary.spread is not None
    assert summary.final_loss == {"0": 0.1, "1": 0.1, "2": 0.1, "3": 0.1}
    assert summarize(job, records, {"0": 0.5}).final_loss == {"0": 0.5}


def test_latest_losses_average_replicas_and_skip_architecture_rounds() -> None:
    records = {0: [line(0, 3, 1.0, [0])], 1: [line(1, 3, 1.0, [0])]}
    records[1][0].loss = {0: 0.5}
    arch = line(0, 4, 2.0, [0])
    arch.round = "arch"
    records[0].append(arch)
    assert latest_losses(records) == {"0": pytest.approx((0.25 + 0.5) / 2)}


def test_plan_view_shows_replicated_stages_and_alternatives() -> None:
    plan = plan_document(
        mode="hybrid",
        nproc=3,
        num_blocks=3,
        batch_size=12,
        block_names=["conv1", "conv2", "conv3"],
        stages=[
            {"start": 0, "stop": 1, "replicas": 2, "ranks": [0, 1], "rows": [[0, 6], [6, 12]]},
            {"start": 1, "stop": 3, "replicas": 1, "ranks": [2], "rows": [[0, 12]]},
        ],
        ranks=[
            {"rank": 0, "blocks": [0], "rows": [0, 6], "stage": 0, "role": "replica"},
            {"rank": 1, "blocks": [0], "rows": [6, 12], "stage": 0, "role": "replica"},
            {"rank": 2, "blocks": [1, 2], "rows": [0, 12], "stage": 1, "role": "stage"},
        ],
        alternatives=[
            ranked([{"start": 0, "stop": 1, "replicas": 2}, {"start": 1, "stop": 3, "replicas": 1}], 0.01, 1),
            ranked([{"start": 0, "stop": 2, "replicas": 1}, {"start": 2, "stop": 3, "replicas": 2}], 0.015, 0),
        ],
        mode_step_s={"dp": 0.04, "hybrid": 0.01},
    )
    view = plan_view(plan)
    assert [stage.replicas for stage in view.stages] == [2, 1]
    assert [[cell.owned for cell in row.cells] for row in view.rank_rows] == [
        [True, False, False],
        [True, False, False],
        [False, True, True],
    ]
    assert view.rank_rows[1].cells[0].rows == (6, 12)
    assert [alt.chosen for alt in view.alternatives] == [True, False]
    assert view.alternatives[1].relative == pytest.approx(1.5)
    assert view.mode_steps == [("dp", 0.04, 1.0), ("hybrid", 0.01, 4.0)]
    assert stages_text(plan.stages) == "0 ×2 | 1–2"


def test_list_rows_describe_plan_duration_and_eta() -> None:
    job = Job(id=1, name="a", state="running", nproc=2, queue="q", spec={"schedule": {"mode": "auto"}}, created_at=0.0)
    assert plan_text(job) == "auto on 2 ranks, planned when it starts"
    job.plan_summary = {
        "mode": "tr_dpu",
        "stages": [{"start": 0, "stop": 2, "replicas": 1}, {"start": 2, "stop": 4, "replicas": 1}],
    }
    assert plan_text(job) == "auto → tr_dpu: 0–1 | 2–3"  # the mode submitted, and what auto chose
    job.started_at, job.progress = 100.0, 0.25
    row = job_row(job, now=140.0)
    assert row.elapsed_s == 40.0 and row.eta_s == pytest.approx(120.0) and row.cancellable
    job.state, job.finished_at = "succeeded", 150.0
    row = job_row(job, now=999.0)
    assert row.elapsed_s == 50.0 and row.eta_s is None and not row.cancellable


def stage(start: int, stop: int, replicas: int = 1) -> dict[str, int]:
    return {"start": start, "stop": stop, "replicas": replicas}


def spans(*stages: dict[str, int]) -> list[StageSpan]:
    return [StageSpan(**entry) for entry in stages]


def test_the_mode_shown_is_the_one_submitted_with_what_auto_chose() -> None:
    def job(mode: str, summary: dict[str, Any] | None) -> Job:
        spec = {"schedule": {"mode": mode}}
        return Job(id=1, name="a", state="running", nproc=2, queue="q", spec=spec, plan_summary=summary)

    # plan.json keeps `auto` as its mode; what auto chose is the mode that lays out the same stages
    assert chosen_mode("auto", spans(stage(0, 4, 2))) == "ir"
    assert chosen_mode("auto", spans(stage(0, 1), stage(1, 4))) == "tr_dpu"
    assert chosen_mode("auto", spans(stage(0, 1, 2), stage(1, 4))) == "hybrid"
    assert chosen_mode("auto", []) is None and chosen_mode("ls", []) == "ls"
    assert mode_text(job("auto", None)) == "auto"  # not planned yet
    assert mode_text(job("auto", {"mode": "auto", "stages": [stage(0, 4, 2)]})) == "auto → ir"
    assert mode_text(job("auto", {"mode": "hybrid", "stages": [stage(0, 1, 2), stage(1, 4)]})) == "auto → hybrid"
    assert mode_text(job("dp", {"mode": "dp"})) == "dp" and mode_text(job("ls", None)) == "ls"
    assert plan_text(job("auto", {"mode": "auto", "stages": [stage(0, 1, 1), stage(1, 4)]})) == "auto → tr_dpu: 0 | 1–3"
    assert plan_text(job("dp", {"mode": "dp"})) == "dp: 2 ranks, data parallel per block"
    assert plan_text(job("ls", {"mode": "ls"})) == "ls: blocks bin-packed on 2 ranks"
    view = plan_view(plan_document(mode="auto", nproc=2, num_blocks=4, batch_size=8))
    assert view.chosen is None and view.auto_choice is None
    replicated = [
        {**stage(0, 1, 2), "ranks": [0, 1], "rows": [[0, 4], [4, 8]]},
        {**stage(1, 4), "ranks": [2], "rows": [[0, 8]]},
    ]
    view = plan_view(plan_document(mode="auto", nproc=3, num_blocks=4, batch_size=8, stages=replicated))
    assert view.chosen == "hybrid" and view.auto_choice is not None and "replicated" in view.auto_choice


def test_template_filters() -> None:
    assert duration(42) == "42.0 s" and duration(185) == "3 min 05 s" and duration(7620) == "2 h 07 min"
    assert duration(None) == "—"
    assert size(512) == "512 B" and size(3 * 2**20) == "3.0 MiB" and size(2**31) == "2.00 GiB"
    assert blocks([1, 2, 3]) == "1–3" and blocks([0, 2]) == "0, 2" and blocks([4]) == "4"


def test_speed_ups_are_over_the_first_measured_dp_job_and_within_noise_inside_the_spread() -> None:
    def row(job_id: int, mode: str, speed: float | None, spread: float | None = 0.01) -> Compared:
        job = Job(id=job_id, name="j", state="succeeded", nproc=2, queue="q", spec={})
        return Compared(job, mode, JobSummary(speed, None, None, None, spread, {}))

    rows = with_speedups([row(1, "dp", None), row(2, "tr_dpu", 300.0), row(3, "dp", 100.0)])
    assert [r.baseline for r in rows] == [False, False, True]  # the dp job without telemetry cannot be it
    assert [r.speedup.text() if r.speedup else None for r in rows] == [None, "×3.00", "×1.00"]
    unmeasured = with_speedups([row(4, "dp", None)])
    assert unmeasured[0].speedup is None and not unmeasured[0].baseline
    noisy = with_speedups([row(5, "dp", 100.0, spread=1.0), row(6, "ir", 280.0, spread=1.0)])
    assert noisy[1].speedup is not None and noisy[1].speedup.text() == "within noise"  # ln 2.8 < sqrt 2
    assert noisy[1].speedup.ratio == pytest.approx(2.8)


def test_architecture_history_columns_names_and_leaders() -> None:
    assert spaced(5, 24) == [0, 1, 2, 3, 4]
    assert spaced(100, 5) == [0, 25, 50, 74, 99] and spaced(100, 1) == [99]
    assert candidate_names(7)[-1] == "zero" and candidate_names(6)[0] == "mbconv_k3_e3"
    assert candidate_names(3) == ["c0", "c1", "c2"]  # not a supernet layer: no names to give
    updates = [(step, [[0.1 * step, 1 - 0.1 * step] + [0.0] * 4]) for step in range(1, 10)]  # k3_e3 takes over
    history = block_history(2, updates, "features.7", most=4, total=40)
    assert history.steps == [1, 4, 6, 9] and history.updates == 40 and history.thinned
    (layer,) = history.layers
    assert layer.chosen == "mbconv_k3_e3" and layer.chosen_p == pytest.approx(0.9)
    assert [cell.other_leads for cell in layer.cells if cell] == [True, True, False, False]  # k3_e6 led until 5
    assert [cell.leader for cell in layer.cells if cell][:2] == ["mbconv_k3_e6", "mbconv_k3_e6"]
