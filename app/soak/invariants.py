"""The invariants a soak's history (history.py) must hold, each a pure function of the records: a Verdict that
names the first violation found. `check_all` runs them in the order of INVARIANTS, which is the order in which
a failed soak names them.

    terminal_states_allowed    every job ends at rest, in a state its actions allow: nothing runs after an
                               accepted cancel or pause until an accepted resume; a cancelled or paused job
                               goes back to the queue only through a resume
    no_queued_job_beside_idle_worker   no job stays queued longer than IDLE_BOUND_S while a live worker that
                               fits it has a free slot
    telemetry_once             every (phase, rank, seq) telemetry row stored at most once per job
    followers_saw_every_event  every SSE follower was sent each of its job's events once, in order, across
                               its reconnects with Last-Event-ID
    webhooks_exactly_once      every delivery in the server's log ended (none pending); a succeeded one was
                               answered 2xx by the receiver exactly once, a failed one never (over every
                               segment of a resumed soak: the last log, what the receiver got in each)
    outputs_equal_undisturbed  each sampled succeeded job's weights equal (within WEIGHT_RTOL, WEIGHT_ATOL) those
                               of its spec run again undisturbed after the drain
    no_5xx                     no request answered with a server error, but 503 (with its reason) while the
                               soak had PostgreSQL or Redis stopped, or within OUTAGE_GRACE_S of its return
    nothing_leaked             no process, listening port, shared-memory segment or run lock left behind
    memory_bounded             no process's resident memory grew by more than MEMORY_SLOPE_BYTES_PER_S: judged
                               over one life (least squares over its samples after WARMUP_S and the next
                               WARMUP_FRACTION) where those span LONG_LIFE_S at least, and, for a process started
                               again (a worker after each kill), over the levels its lives settled at (the
                               median-pairwise slope through each life's medians, MIN_LIVES lives at least,
                               spanning LONG_LIFE_S)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median
from typing import TypeVar

from app.core.states import AT_REST, CANCELLED, FAILED, PAUSED, QUEUED, RUNNING, STARTING
from app.soak.history import (
    Deliveries,
    Follower,
    JobStates,
    Leftovers,
    Memory,
    Outage,
    Outputs,
    Record,
    Request,
    Snapshot,
    Submitted,
    Telemetry,
)

IDLE_BOUND_S = 30.0  # a queued job may wait this long beside an idle worker that fits it (claim, launch, restarts)
MEMORY_SLOPE_BYTES_PER_S = 64 * 1024  # 3.75 MiB a minute, 225 MiB an hour: more is a leak, not a cache warming
WARMUP_S = 60.0  # a process's first minute (imports, pools, caches filling) is not counted in its slope
WARMUP_FRACTION = 0.2  # nor the first fifth of the samples after it
MIN_SPAN_S = 60.0  # a life whose warm samples span less has not settled: its level is not counted
LONG_LIFE_S = 600.0  # a process's own slope is judged over ten minutes of warm samples at least: over fewer, one
# step (a burst of failed tasks logging their tracebacks, 14 MiB once) reads as a slope; a step of h bytes at the
# middle of T seconds fits a line of slope 1.5 h / T, so at T = 600 s a one-off step under 25 MiB holds
MIN_LIVES = 3  # a process started again this many times at least has its levels across lives judged
OUTAGE_GRACE_S = 15.0  # after a server answers again, the API's pool reconnects within this
WEIGHT_RTOL, WEIGHT_ATOL = 1e-5, 1e-7  # the suite's equivalence tolerance (tests/helpers.py assert_same_weights)
RUNS = frozenset({STARTING, RUNNING})
T = TypeVar("T")


@dataclass(frozen=True)
class Verdict:
    held: bool
    detail: str | None = None  # the first violation, or None


HELD = Verdict(True)


def violated(detail: str) -> Verdict:
    return Verdict(False, detail)


def of_type(records: Sequence[Record], cls: type[T]) -> list[T]:
    return [record for record in records if isinstance(record, cls)]


def terminal_states_allowed(records: Sequence[Record]) -> Verdict:
    states = {record.job_id: record for record in of_type(records, JobStates)}
    actions: dict[int, list[Request]] = defaultdict(list)
    for request in of_type(records, Request):
        if request.job_id is not None and request.accepted and request.action in ("cancel", "pause", "resume"):
            actions[request.job_id].append(request)
    for submitted in of_type(records, Submitted):
        job = states.get(submitted.job_id)
        if job is None or job.final is None:
            return violated(f"job {submitted.job_id} ({submitted.kind}): no state was recorded for it")
        problem = _job_problem(job, sorted(actions[job.job_id], key=lambda r: r.time))
        if problem is not None:
            return violated(f"job {job.job_id} ({submitted.kind}): {problem}")
    return HELD


def _job_problem(job: JobStates, actions: list[Request]) -> str | None:
    if job.final not in AT_REST:
        return f"still {job.final} when the soak ended (stuck)"
    resumes = [action.time for action in actions if action.action == "resume"]
    used = 0
    for before, after in zip(job.changes, job.changes[1:], strict=False):
        if before.state in (CANCELLED, PAUSED, FAILED) and after.state == QUEUED:
            # back in the queue from rest: only a user's resume does that, one resume per return
            if used >= len(resumes) or resumes[used] > after.time:
                return f"{before.state} -> queued at {after.time:.3f} without a resume before it"
            used += 1
        elif before.state == CANCELLED:
            return f"cancelled, then {after.state} at {after.time:.3f} without a resume"
        elif before.state == PAUSED and after.state != CANCELLED:
            return f"paused, then {after.state} at {after.time:.3f} without a resume"
    for action in actions:
        if action.action not in ("cancel", "pause"):
            continue
        until = min((r.time for r in actions if r.action == "resume" and r.time > action.answered_at), default=None)
        for change in job.changes:
            late = change.time > action.answered_at and (until is None or change.time < until)
            if late and (change.state in RUNS or (action.action == "cancel" and change.state == QUEUED)):
                return (
                    f"{change.state} at {change.time:.3f} after its {action.action} was accepted at"
                    f" {action.answered_at:.3f} and before any resume"
                )
    return None


def no_queued_job_beside_idle_worker(records: Sequence[Record], bound_s: float = IDLE_BOUND_S) -> Verdict:
    since: dict[int, float] = {}  # job -> when it was first seen queued beside a fitting idle worker, still so
    for snapshot in sorted(of_type(records, Snapshot), key=lambda s: s.time):
        free = [w for w in snapshot.workers if w.alive and w.busy < w.slots]
        waiting = set()
        for job in snapshot.queued:
            hosts = {w.host for w in free if w.devices >= job.nproc}
            if len(hosts) < job.nodes:
                continue
            waiting.add(job.job_id)
            start = since.setdefault(job.job_id, snapshot.time)
            if snapshot.time - start > bound_s:
                names = ", ".join(sorted(w.name for w in free if w.devices >= job.nproc))
                return violated(
                    f"job {job.job_id} stayed queued {snapshot.time - start:.1f} s (bound {bound_s:g} s) while"
                    f" {names} had a free slot for its {job.nproc} rank(s)"
                )
        since = {job_id: start for job_id, start in since.items() if job_id in waiting}
    return HELD


def telemetry_once(records: Sequence[Record]) -> Verdict:
    for telemetry in of_type(records, Telemetry):
        counts = Counter((row.phase, row.rank, row.seq) for row in telemetry.rows)
        twice = sorted(key for key, count in counts.items() if count > 1)
        if twice:
            phase, rank, seq = twice[0]
            return violated(
                f"job {telemetry.job_id}: {phase} rank {rank} step seq {seq} stored {counts[twice[0]]} times"
                f" ({len(twice)} rows repeated)"
            )
    return HELD


def followers_saw_every_event(records: Sequence[Record]) -> Verdict:
    for follower in of_type(records, Follower):
        if follower.seen == follower.stored:
            continue
        repeated = sorted(i for i, count in Counter(follower.seen).items() if count > 1)
        missed = sorted(set(follower.stored) - set(follower.seen))
        extra = sorted(set(follower.seen) - set(follower.stored))
        if repeated:
            what = f"event {repeated[0]} sent {Counter(follower.seen)[repeated[0]]} times"
        elif missed:
            what = f"event {missed[0]} never sent ({len(missed)} missed)"
        elif extra:
            what = f"event {extra[0]} sent but not stored"
        else:
            what = "the events out of order"
        return violated(f"follower {follower.name} of job {follower.job_id} ({follower.reconnects} reconnects): {what}")
    return HELD


def webhooks_exactly_once(records: Sequence[Record]) -> Verdict:
    segments = of_type(records, Deliveries)
    if not segments:
        return HELD
    received: Counter[int] = Counter()
    for segment in segments:
        received.update(segment.received)
    logged = {delivery.delivery_id for delivery in segments[-1].logged}
    for delivery in sorted(segments[-1].logged, key=lambda d: d.delivery_id):
        count = received[delivery.delivery_id]
        if delivery.state == "pending":
            return violated(f"delivery {delivery.delivery_id} ({delivery.event}) still pending at the end")
        if delivery.state == "succeeded" and count != 1:
            return violated(
                f"delivery {delivery.delivery_id} ({delivery.event}) succeeded but was received {count} times"
            )
        if delivery.state == "failed" and count != 0:
            return violated(
                f"delivery {delivery.delivery_id} ({delivery.event}) logged failed but was received {count} times"
            )
    unknown = sorted(set(received) - logged)
    if unknown:
        return violated(f"delivery {unknown[0]} received but not in the server's delivery log")
    return HELD


def outputs_equal_undisturbed(records: Sequence[Record]) -> Verdict:
    for outputs in of_type(records, Outputs):
        job = f"job {outputs.job_id} ({outputs.kind}) against its undisturbed rerun {outputs.reference_id}"
        if outputs.reference_state != "succeeded":
            return violated(f"{job}: the rerun ended {outputs.reference_state}")
        if not outputs.compared:
            return violated(f"{job}: no weight file to compare")
        if outputs.differing:
            return violated(f"{job}: {len(outputs.differing)} tensors differ, first {outputs.differing[0]}")
    return HELD


def no_5xx(records: Sequence[Record]) -> Verdict:
    outages = of_type(records, Outage)
    for request in of_type(records, Request):
        during = any(o.start <= request.answered_at and request.time <= o.end + OUTAGE_GRACE_S for o in outages)
        if request.status >= 500 and not (request.status == 503 and during):
            return violated(f"{request.method} {request.path} ({request.action}) answered {request.status}")
    return HELD


def nothing_leaked(records: Sequence[Record]) -> Verdict:
    for leftovers in of_type(records, Leftovers):
        for what, found in (
            ("process", leftovers.processes),
            ("listening port", [str(port) for port in leftovers.ports]),
            ("shared-memory segment", leftovers.shared_memory),
            ("run lock", leftovers.locks),
        ):
            if found:
                return violated(f"{what} left behind ({len(found)} in all), first: {found[0]}")
    return HELD


def memory_bounded(records: Sequence[Record], bound: float = MEMORY_SLOPE_BYTES_PER_S) -> Verdict:
    lives = process_lives(records)
    for (process, _), kept in sorted(lives.items()):
        if kept[-1].time - kept[0].time < LONG_LIFE_S:
            continue
        slope = least_squares_slope([s.time for s in kept], [float(s.rss_bytes) for s in kept])
        if slope > bound:
            return violated(
                f"{process}'s resident memory grew {slope / 1024:.0f} KiB/s (bound {bound / 1024:.0f} KiB/s):"
                f" {kept[0].rss_bytes >> 20} MiB to {kept[-1].rss_bytes >> 20} MiB"
            )
    for process, levels in sorted(levels_across_lives(lives).items()):
        if len(levels) < MIN_LIVES or levels[-1][0] - levels[0][0] < LONG_LIFE_S:
            continue
        slope = median_pairwise_slope([time for time, _ in levels], [level for _, level in levels])
        if slope > bound:
            return violated(
                f"{process}'s level across its {len(levels)} processes rose {slope / 1024:.0f} KiB/s"
                f" (bound {bound / 1024:.0f} KiB/s): {int(levels[0][1]) >> 20} MiB to {int(levels[-1][1]) >> 20} MiB"
            )
    return HELD


def process_lives(records: Sequence[Record]) -> dict[tuple[str, int], list[Memory]]:
    """Each process's samples after its warm-up (WARMUP_S, then WARMUP_FRACTION of the rest), in time order;
    a process with none left is not listed."""
    by_process: dict[tuple[str, int], list[Memory]] = defaultdict(list)
    for sample in of_type(records, Memory):
        by_process[(sample.process, sample.pid)].append(sample)
    lives = {}
    for key, samples in by_process.items():
        samples.sort(key=lambda s: s.time)
        warm = [s for s in samples if s.time >= samples[0].time + WARMUP_S]
        kept = warm[int(len(warm) * WARMUP_FRACTION) :]
        if kept:
            lives[key] = kept
    return lives


def levels_across_lives(lives: dict[tuple[str, int], list[Memory]]) -> dict[str, list[tuple[float, float]]]:
    """Per process name, the (median time, median resident bytes) each of its lives settled at, over lives whose
    warm samples span MIN_SPAN_S at least, in time order."""
    levels: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (process, _), kept in lives.items():
        if kept[-1].time - kept[0].time >= MIN_SPAN_S:
            levels[process].append((median([s.time for s in kept]), median([float(s.rss_bytes) for s in kept])))
    return {process: sorted(points) for process, points in levels.items()}


def median_pairwise_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Theil-Sen: the median of the slopes between every two points of distinct x (0 without such a pair), so
    that one life that settled high or low (it ran an unusual job, it was killed early) does not set the trend."""
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]
    ]
    return median(slopes) if slopes else 0.0


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The slope of the least-squares line through the points; 0 for fewer than two distinct x."""
    if len(xs) < 2:
        return 0.0
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


INVARIANTS: dict[str, Callable[[Sequence[Record]], Verdict]] = {
    "terminal_states_allowed": terminal_states_allowed,
    "no_queued_job_beside_idle_worker": no_queued_job_beside_idle_worker,
    "telemetry_once": telemetry_once,
    "followers_saw_every_event": followers_saw_every_event,
    "webhooks_exactly_once": webhooks_exactly_once,
    "outputs_equal_undisturbed": outputs_equal_undisturbed,
    "no_5xx": no_5xx,
    "nothing_leaked": nothing_leaked,
    "memory_bounded": memory_bounded,
}


def check_all(records: Sequence[Record]) -> dict[str, Verdict]:
    return {name: check(records) for name, check in INVARIANTS.items()}


def first_violated(verdicts: dict[str, Verdict]) -> str | None:
    return next((name for name, verdict in verdicts.items() if not verdict.held), None)
