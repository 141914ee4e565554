"""The soak's invariant checkers (app/soak/invariants.py) on hand-written histories: a clean one holds every
invariant; each violating one (a job that succeeded after its cancel, a telemetry step stored twice, a webhook
delivered twice, a leaked process, ...) breaks exactly the invariant it is written against, which names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.soak.history import (
    Deliveries,
    Delivery,
    Follower,
    HistoryError,
    HistoryWriter,
    JobStates,
    Leftovers,
    Memory,
    Outage,
    Outputs,
    QueuedJob,
    Record,
    Request,
    Snapshot,
    StateChange,
    Submitted,
    Telemetry,
    TelemetryRow,
    WorkerLoad,
    from_line,
    read_history,
)
from app.soak.invariants import INVARIANTS, check_all, first_violated, least_squares_slope


def changes(*pairs: tuple[float, str]) -> list[StateChange]:
    return [StateChange(time, state) for time, state in pairs]


def action(time: float, name: str, job_id: int, status: int = 200) -> Request:
    return Request(time, "POST", f"/api/v1/jobs/{job_id}/{name}", status, 0.1, name, job_id)


WORKER = WorkerLoad("worker-a", "host-a", devices=4, slots=2, busy=0, alive=True)


def clean() -> list[Record]:
    """Two jobs: one cancelled while queued (1); one paused while running, resumed, and finished (2)."""
    return [
        Submitted(1.0, 1, "custom"),
        Submitted(1.0, 2, "compression"),
        action(2.0, "cancel", 1),
        action(3.0, "pause", 2),
        action(10.0, "resume", 2),
        Request(4.0, "POST", "/api/v1/jobs", 422, 0.05, "bad_request"),
        Outage("postgres", 30.0, 34.0),
        Request(33.0, "GET", "/api/v1/jobs", 503, 0.05, "read"),  # the database was down: 503, not a fault
        Request(40.0, "GET", "/api/v1/jobs/2", 503, 0.05, "read", 2),  # its pool reconnecting, within the grace
        Outputs(2, "compression", 3, compared=["student.pt", "compressed_model.pt"]),
        JobStates(1, changes((1.0, "queued"), (2.05, "cancelled"))),
        JobStates(
            2,
            changes(
                (1.0, "queued"),
                (1.5, "starting"),
                (1.6, "running"),
                (3.05, "pausing"),
                (4.0, "paused"),
                (10.05, "queued"),
                (11.0, "starting"),
                (11.1, "running"),
                (20.0, "succeeded"),
            ),
        ),
        Snapshot(5.0, [QueuedJob(3, 2)], [WorkerLoad("worker-a", "host-a", 4, 2, busy=2, alive=True)]),
        Snapshot(50.0, [QueuedJob(3, 2)], [WORKER]),  # idle beside it, but only just
        Snapshot(60.0, [], [WORKER]),
        Telemetry(2, [TelemetryRow("distill", rank, seq) for rank in (0, 1) for seq in range(5)]),
        Follower("f0", 2, seen=[1, 2, 3, 4], stored=[1, 2, 3, 4], reconnects=2),
        Deliveries(
            [Delivery(1, "job.queued", "succeeded"), Delivery(2, "job.running", "failed")],
            received=[1],
        ),
        Leftovers(),
        *[Memory(float(t), "api", 100 << 20) for t in range(0, 600, 10)],
        # a worker killed at 300 s and started again: two processes, each flat (not one that grew by 580 MiB)
        *[
            Memory(float(t), "worker-a", (20 if t < 300 else 600) << 20, 11 if t < 300 else 12)
            for t in range(0, 600, 10)
        ],
        *restarted("worker-b", [710, 724, 708, 727, 715], life_s=180),
    ]


def restarted(process: str, levels_mib: list[int], life_s: int, start: int = 0) -> list[Memory]:
    """A process killed every `life_s` seconds and started again, each life flat at its level (sampled each 2 s)."""
    return [
        Memory(float(start + n * life_s + t), process, level << 20, 100 + n)
        for n, level in enumerate(levels_mib)
        for t in range(0, life_s, 2)
    ]


def step(process: str, pid: int, life_s: int, at_s: int, low_mib: int, high_mib: int) -> list[Memory]:
    """One life flat at `low_mib`, stepping to `high_mib` at `at_s` and flat again (sampled each 2 s)."""
    return [Memory(float(t), process, (low_mib if t < at_s else high_mib) << 20, pid) for t in range(0, life_s, 2)]


def test_a_clean_history_holds_every_invariant() -> None:
    verdicts = check_all(clean())
    assert set(verdicts) == set(INVARIANTS)
    assert {name: verdict.detail for name, verdict in verdicts.items() if not verdict.held} == {}
    assert first_violated(verdicts) is None


def replaced(records: list[Record], cls: type, *new: Record) -> list[Record]:
    """`records` with those of `cls` swapped for `new` (matched per job where the record has one)."""
    jobs = {getattr(record, "job_id", None) for record in new}
    kept = [r for r in records if not (isinstance(r, cls) and getattr(r, "job_id", None) in jobs)]
    return [*kept, *new]


SUCCEEDED_AFTER_CANCEL = JobStates(
    1, changes((1.0, "queued"), (1.5, "starting"), (1.6, "running"), (5.0, "succeeded"))
)  # its cancel (answered at 2.1) was accepted while it ran: it should have gone to cancelling


VIOLATIONS: dict[str, tuple[str, str, list[Record]]] = {
    "job succeeded after its cancel": (
        "terminal_states_allowed",
        "cancelled, then running at 3.000 without a resume",
        replaced(
            clean(),
            JobStates,
            JobStates(1, changes((1.0, "queued"), (2.05, "cancelled"), (3.0, "running"), (5.0, "succeeded"))),
        ),
    ),
    "job ran after an accepted cancel": (
        "terminal_states_allowed",
        "after its cancel was accepted",
        replaced(
            [r for r in clean() if not isinstance(r, Request) or r.action != "cancel"],
            JobStates,
            SUCCEEDED_AFTER_CANCEL,
            action(1.2, "cancel", 1),
        ),
    ),
    "paused job ran without a resume": (
        "terminal_states_allowed",
        "paused -> queued at 10.050 without a resume",
        [r for r in clean() if not (isinstance(r, Request) and r.action == "resume")],
    ),
    "job stuck running": (
        "terminal_states_allowed",
        "still running when the soak ended",
        replaced(clean(), JobStates, JobStates(1, changes((1.0, "queued"), (1.5, "starting"), (1.6, "running")))),
    ),
    "job queued beside an idle worker": (
        "no_queued_job_beside_idle_worker",
        "job 3 stayed queued 35.0 s (bound 30 s) while worker-a had a free slot",
        [*clean(), Snapshot(95.0, [QueuedJob(3, 2)], [WORKER]), Snapshot(130.0, [QueuedJob(3, 2)], [WORKER])],
    ),
    "telemetry step stored twice": (
        "telemetry_once",
        "distill rank 1 step seq 3 stored 2 times",
        [*clean(), Telemetry(2, [TelemetryRow("distill", 1, 3)] * 2)],
    ),
    "follower missed an event after a reconnect": (
        "followers_saw_every_event",
        "event 3 never sent",
        [*clean(), Follower("f1", 2, seen=[1, 2, 4], stored=[1, 2, 3, 4], reconnects=1)],
    ),
    "follower sent an event twice": (
        "followers_saw_every_event",
        "event 2 sent 2 times",
        [*clean(), Follower("f1", 2, seen=[1, 2, 2, 3, 4], stored=[1, 2, 3, 4], reconnects=1)],
    ),
    "follower saw them out of order": (
        "followers_saw_every_event",
        "out of order",
        [*clean(), Follower("f1", 2, seen=[1, 3, 2, 4], stored=[1, 2, 3, 4], reconnects=1)],
    ),
    "webhook delivered twice": (
        "webhooks_exactly_once",
        "delivery 1 (job.queued) succeeded but was received 2 times",
        replaced(clean(), Deliveries, Deliveries([Delivery(1, "job.queued", "succeeded")], received=[1, 1])),
    ),
    "webhook still pending": (
        "webhooks_exactly_once",
        "delivery 1 (job.queued) still pending",
        replaced(clean(), Deliveries, Deliveries([Delivery(1, "job.queued", "pending")], received=[])),
    ),
    "a server error": (
        "no_5xx",
        "answered 500",
        [*clean(), Request(7.0, "GET", "/api/v1/jobs/2/plan", 500, 0.2, "read", 2)],
    ),
    "a 503 with no outage": (
        "no_5xx",
        "GET /api/v1/jobs/2 (read) answered 503",
        [*clean(), Request(70.0, "GET", "/api/v1/jobs/2", 503, 0.05, "read", 2)],
    ),
    "outputs differ from the undisturbed rerun": (
        "outputs_equal_undisturbed",
        "job 2 (compression) against its undisturbed rerun 3: 1 tensors differ, first student.pt:b.0.w: differs",
        replaced(
            clean(),
            Outputs,
            Outputs(2, "compression", 3, ["student.pt"], ["student.pt:b.0.w: differs by up to 0.01"]),
        ),
    ),
    "the undisturbed rerun failed": (
        "outputs_equal_undisturbed",
        "the rerun ended failed",
        replaced(clean(), Outputs, Outputs(2, "compression", 3, ["student.pt"], [], "failed")),
    ),
    "no weights to compare": (
        "outputs_equal_undisturbed",
        "no weight file to compare",
        replaced(clean(), Outputs, Outputs(2, "compression", 3, [], [])),
    ),
    "webhook received again in a resumed segment": (
        "webhooks_exactly_once",
        "delivery 1 (job.queued) succeeded but was received 2 times",
        [*clean(), Deliveries([Delivery(1, "job.queued", "succeeded"), Delivery(2, "job.running", "failed")], [1])],
    ),
    "a leaked process": (
        "nothing_leaked",
        "process left behind (1 in all), first: 4242 torchrun",
        [*clean(), Leftovers(processes=["4242 torchrun --standalone ... job-2"])],
    ),
    "a leaked run lock": (
        "nothing_leaked",
        "run lock",
        [*clean(), Leftovers(locks=["runs/job-2/.lock"])],
    ),
    "memory growing over a long life": (
        "memory_bounded",
        "api's resident memory grew",
        [r for r in clean() if not isinstance(r, Memory)]
        + [Memory(float(t), "api", (100 << 20) + t * (200 << 10)) for t in range(0, 1200, 10)],
    ),
    "memory growing in a worker that lives long after a restart": (
        "memory_bounded",
        "worker-a's resident memory grew",
        [*clean(), *[Memory(float(t), "worker-a", (20 << 20) + t * (200 << 10), 13) for t in range(600, 1500, 10)]],
    ),
    "memory level rising across a worker's restarts": (
        "memory_bounded",
        "worker-c's level across its 8 processes rose",
        [*clean(), *restarted("worker-c", [600 + 20 * n for n in range(8)], life_s=150)],  # 20 MiB / 150 s
    ),
}


@pytest.mark.parametrize("case", list(VIOLATIONS))
def test_each_checker_catches_the_history_written_against_it(case: str) -> None:
    invariant, detail, records = VIOLATIONS[case]
    verdicts = check_all(records)
    assert [name for name, verdict in verdicts.items() if not verdict.held] == [invariant]
    assert detail in (verdicts[invariant].detail or ""), verdicts[invariant].detail
    assert first_violated(verdicts) == invariant


def test_one_step_in_memory_is_not_a_leak() -> None:
    """A burst of failed tasks logging their tracebacks raised a worker 14 MiB once, then it stayed flat: in a life
    of 171 s (too short to judge its own slope) and in a 15-minute API life (judged, the step at its middle)."""
    short = [*clean(), *step("worker-d", 7, life_s=171, at_s=120, low_mib=710, high_mib=724)]
    long = [*clean(), *step("api", 8, life_s=900, at_s=480, low_mib=138, high_mib=152)]
    assert check_all(short)["memory_bounded"].held
    assert check_all(long)["memory_bounded"].held


def test_one_life_that_settled_high_does_not_make_a_trend() -> None:
    """Eight lives of a worker flat at 700 MiB but one (it loaded a language model) at 1,200: the median pairwise
    slope through their levels stays flat where a least-squares line through them would not."""
    levels = [700, 700, 700, 700, 700, 700, 700, 1200]
    assert check_all([*clean(), *restarted("worker-c", levels, life_s=150)])["memory_bounded"].held
    assert least_squares_slope([75.0 + 150 * n for n in range(8)], [float(m << 20) for m in levels]) > 64 * 1024


def test_a_resumed_soak_s_deliveries_count_over_its_segments() -> None:
    """Each segment's receiver saw its own deliveries; the last segment's log holds them all."""
    later = Deliveries([Delivery(1, "job.queued", "succeeded"), Delivery(3, "job.queued", "succeeded")], [3])
    assert check_all([*clean(), later])["webhooks_exactly_once"].held
    assert not check_all([*clean(), Deliveries([Delivery(3, "job.queued", "succeeded")], [])])[
        "webhooks_exactly_once"
    ].held


def test_a_resumed_history_appends_to_the_records_before_it(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    first = HistoryWriter(path)
    first.extend(clean()[:3])
    first.close()
    again = HistoryWriter(path, resume=True)
    again.add(Submitted(99.0, 7, "nas"))
    again.close()
    assert again.records == [*clean()[:3], Submitted(99.0, 7, "nas")] == read_history(path)


def test_the_history_file_reads_back_the_records_written(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path / "history.jsonl")
    writer.extend(clean())
    writer.close()
    assert read_history(tmp_path / "history.jsonl") == clean()
    with pytest.raises(HistoryError, match=r"type 'Nonsense', version 1: this soak reads \['Deliveries'"):
        from_line('{"type": "Nonsense", "v": 1}')


def test_least_squares_slope() -> None:
    assert least_squares_slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert least_squares_slope([5], [1]) == 0.0 and least_squares_slope([1, 1], [0, 9]) == 0.0
