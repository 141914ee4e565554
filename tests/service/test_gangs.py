"""Service tier: gang claims of jobs on several nodes (app/core/gangs.py) on real SQLite and PostgreSQL: all N
seats on N distinct hosts or none, the head gang filled before the next (two gangs never split the hosts),
concurrent claimers that never deadlock nor overfill, and an incomplete gang released after its bound, unless
the job is elastic and has its minimum seated (then it runs with them, and asks for all its nodes again when
requeued); a follower's worker told to stop says so on its seat; a seat removal that meets a database error is
retried, and the reaper drops the seats no worker gave up (issue 42), taking the gangs' lock only when it finds one."""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy import event, update
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col

from app.core import gangs
from app.core.database import get_engine, migrate
from app.core.lifecycle import requeue
from app.core.limits import hold
from app.core.reaper import reap_stale_seats
from app.core.settings import Settings
from app.core.tables import GangSeat, Job
from tests.service.factories import insert_job, tiny_job
from worker.gang import RELEASED, take_part


def take(settings: Settings, host: str, skip: tuple[int, ...] = ()) -> GangSeat | None:
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        return gangs.take_seat(session, host=host, worker=f"w@{host}", skip=skip)


def gang(settings: Settings, job_id: int) -> list[tuple[str, int]]:
    with Session(get_engine(settings.database)) as session:
        return [(seat.host, seat.node) for seat in gangs.seats(session, job_id)]


def test_a_gang_takes_distinct_hosts_head_first_and_never_more_than_its_nodes(settings: Settings) -> None:
    migrate(settings.database)
    single = insert_job(settings, nodes=1, priority=50)  # a job on one node is not a gang
    first = insert_job(settings, nodes=2)
    urgent = insert_job(settings, nodes=2, priority=5)  # queued later, but ahead by priority
    insert_job(settings, "running", nodes=2, priority=99)  # not in the queue
    a = take(settings, "a")
    assert a is not None and (a.job_id, a.node) == (urgent.id, 0)
    assert take(settings, "a") is None  # one seat per host: a second worker on host a waits
    b = take(settings, "b")
    assert b is not None and (b.job_id, b.node) == (urgent.id, 1)
    c = take(settings, "c")  # the urgent gang is full: the next one
    assert c is not None and c.job_id == first.id and c.node == 0
    assert gang(settings, urgent.id) == [("a", 0), ("b", 1)]
    assert gang(settings, single.id) == []
    with Session(get_engine(settings.database)) as session:
        assert "seated on c; waiting for 1 more host(s)" in (gangs.waiting_for(session, first) or "")
        assert gangs.release(session, urgent.id) is False  # complete: it runs, nothing is given back
    assert gangs.wait_for_gang(settings.database, a, bound_s=0.0) is not None


def test_a_host_joining_a_gang_whose_node_0_left_takes_node_0(settings: Settings) -> None:
    """Found by the hour's soak: node 0's seat went (its worker's part ended) while node 1's stayed; the next host
    was numbered by the count of seats (1), its insert broke the (job, node) key, and every worker with room
    failed every task on it, whatever job the task named, until the reaper dropped the gang (issue 42)."""
    migrate(settings.database)
    job = insert_job(settings, nodes=2)
    first, second = take(settings, "a"), take(settings, "b")
    assert first is not None and second is not None and (first.node, second.node) == (0, 1)
    with Session(get_engine(settings.database)) as session:
        gangs.leave(session, first)
    again = take(settings, "c")
    assert again is not None and (again.job_id, again.node) == (job.id, 0)
    assert gang(settings, job.id) == [("c", 0), ("b", 1)]
    assert gangs.wait_for_gang(settings.database, again, bound_s=60.0) is not None  # complete: both run


def test_concurrent_claimers_fill_two_gangs_without_deadlock_or_split(settings: Settings) -> None:
    """Four hosts race for two gangs of two: each gang gets two distinct hosts, both complete, none waits on
    a half-filled gang (the half-and-half split that deadlocks a naive claim)."""
    migrate(settings.database)
    one, two = insert_job(settings, nodes=2), insert_job(settings, nodes=2)
    results: dict[str, list[GangSeat] | None] = {}
    barrier = threading.Barrier(4)

    def claim(host: str) -> None:
        barrier.wait()
        seat = take(settings, host)
        results[host] = None if seat is None else gangs.wait_for_gang(settings.database, seat, bound_s=20)

    threads = [threading.Thread(target=claim, args=(host,)) for host in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a claimer is stuck"
    # every claimer's gang completed within its 20 s bound: a split gang would have been given up (None)
    assert all(results[host] is not None for host in "abcd"), results
    for job in (one, two):
        hosts = [host for host, _ in gang(settings, job.id)]
        assert len(hosts) == 2 and len(set(hosts)) == 2
        assert sorted(node for _, node in gang(settings, job.id)) == [0, 1]


def test_an_incomplete_gang_is_released_whole_after_its_bound(settings: Settings) -> None:
    migrate(settings.database)
    job = insert_job(settings, nodes=3)
    seated = [take(settings, host) for host in ("a", "b")]  # the third host never comes
    assert all(seat is not None for seat in seated)
    started = time.monotonic()
    assert gangs.wait_for_gang(settings.database, seated[0], bound_s=0.3) is None  # type: ignore[arg-type]
    assert 0.3 <= time.monotonic() - started < 60  # waited its bound, then gave up (60 s: only a hang misses it)
    assert gang(settings, job.id) == []  # every seat went, not only the waiter's
    assert gangs.wait_for_gang(settings.database, seated[1], bound_s=60) is None  # type: ignore[arg-type]
    with Session(get_engine(settings.database)) as session:
        assert session.get(type(job), job.id).state == "queued"  # type: ignore[union-attr]
    assert take(settings, "a", skip=(job.id,)) is None  # a worker that gave up on it skips it a while
    again = take(settings, "a")
    assert again is not None and (again.job_id, again.node) == (job.id, 0)


def test_node_zero_publishes_the_rendezvous_for_the_others(settings: Settings) -> None:
    migrate(settings.database)
    job = insert_job(settings, nodes=2)
    zero, one = take(settings, "a"), take(settings, "b")
    assert zero is not None and one is not None
    with Session(get_engine(settings.database)) as session:
        gangs.publish_endpoint(session, job.id, "a:29500")
    ready = gangs.wait_for_gang(settings.database, one, bound_s=5)
    assert ready is not None and ready[0].endpoint == "a:29500" and ready[0].host == "a"
    with Session(get_engine(settings.database)) as session:
        gangs.leave(session, one)
    assert gang(settings, job.id) == [("a", 0)]


def test_node_zero_hears_of_a_silent_seat_and_a_dissolved_gang_stops_the_beats(settings: Settings) -> None:
    migrate(settings.database)
    job = insert_job(settings, nodes=3)
    zero, one, two = take(settings, "a"), take(settings, "b"), take(settings, "c")
    assert zero is not None and one is not None and two is not None
    with Session(get_engine(settings.database)) as session:
        start = one.joined_at
        assert gangs.beat(session, one.id, at=start + 10) and gangs.beat(session, zero.id, at=start - 100)
        # node 0's own seat is never "silent"; node 2 never beat: its seat counts from when it sat down
        assert [seat.host for seat in gangs.silent(session, job.id, 5, at=start + 12)] == ["c"]
        assert [seat.host for seat in gangs.silent(session, job.id, 5, at=start + 16)] == ["b", "c"]
        gangs.dissolve(session, job.id)
        assert gangs.beat(session, one.id) is False  # node 0 ended the job: the follower hears it
    assert gang(settings, job.id) == []


def test_an_elastic_gang_with_its_minimum_seated_runs_with_them_at_the_bound(settings: Settings) -> None:
    migrate(settings.database)
    elastic = tiny_job(schedule={"nodes": 3, "elastic": {"min_nodes": 2}})
    job = insert_job(settings, nodes=3, min_nodes=2, max_nodes=3, spec=elastic)
    alone = take(settings, "a")
    assert alone is not None
    with Session(get_engine(settings.database)) as session:
        assert gangs.release(session, job.id) is True  # one seat, below the minimum: released as ever
    a, b = take(settings, "a"), take(settings, "b")  # the third host never comes
    assert a is not None and b is not None
    with Session(get_engine(settings.database)) as session:
        waiting = gangs.waiting_for(session, job) or ""
    assert "waiting for 1 more host(s) (elastic: runs on 2 or more after the gang's bound)" in waiting, waiting
    ready = gangs.wait_for_gang(settings.database, b, bound_s=0.3)
    assert ready is not None and [seat.host for seat in ready] == ["a", "b"]
    assert gangs.wait_for_gang(settings.database, a, bound_s=0.3) is not None  # the same gang, for node 0 too
    with Session(get_engine(settings.database)) as session:
        assert session.get(Job, job.id).nodes == 2  # type: ignore[union-attr]
        session.execute(update(Job).where(col(Job.id) == job.id).values(state="running"))  # it ran on 2
        assert requeue(session, job.id, ["running"], "node_lost")
        session.commit()
        assert session.get(Job, job.id, populate_existing=True).nodes == 3  # type: ignore[union-attr]


def test_a_follower_told_to_stop_says_so_on_its_seat(settings: Settings) -> None:
    migrate(settings.database)
    job = insert_job(settings, nodes=2)
    zero, one = take(settings, "a"), take(settings, "b")
    assert zero is not None and one is not None
    with Session(get_engine(settings.database)) as session:
        assert gangs.leaving(session, job.id) == []
        gangs.leave_soon(session, one.id, at=123.0)
        gangs.leave_soon(session, one.id, at=456.0)  # the first notice counts
        gangs.leave_soon(session, zero.id)  # node 0 preempts the job itself: its seat is never "leaving"
        assert [(seat.host, seat.leaving_at) for seat in gangs.leaving(session, job.id)] == [("b", 123.0)]


def test_the_reaper_drops_leaked_seats_and_the_hosts_take_a_gang_again(settings: Settings) -> None:
    """Seats a failed removal left behind (issue 42's soak): one of a job that ended, one of a gang past its
    forming time; the reaper drops them (and only them), and the hosts they blocked form the queued gang."""
    migrate(settings.database)
    ended = insert_job(settings, "succeeded", nodes=2)
    stuck = insert_job(settings, nodes=3)  # its gang never formed and its seat was never given up
    running = insert_job(settings, "running", nodes=2)
    forming = insert_job(settings, nodes=2, priority=1)  # a gang forming now, within its bound: the head
    waiting = insert_job(settings, nodes=2, priority=-2)
    long_ago = time.time() - 1000
    with Session(get_engine(settings.database)) as session:
        session.add(GangSeat(job_id=ended.id, host="b", worker="w@b", node=0, joined_at=long_ago))
        session.add(GangSeat(job_id=stuck.id, host="a", worker="w@a", node=0, joined_at=long_ago))
        session.add(GangSeat(job_id=running.id, host="c", worker="w@c", node=0, joined_at=long_ago))
        session.add(GangSeat(job_id=forming.id, host="d", worker="w@d", node=0))
        session.commit()
    assert take(settings, "b") is None and take(settings, "a") is None  # blocked from every gang by the leaks
    assert reap_stale_seats(settings.database, forming_limit_s=120) == sorted([ended.id, stuck.id])
    assert gang(settings, ended.id) == [] and gang(settings, stuck.id) == []
    assert gang(settings, running.id) == [("c", 0)] and gang(settings, forming.id) == [("d", 0)]
    # the freed hosts sit again: b joins the forming gang (complete), a starts the stuck job's gang afresh
    b, a = take(settings, "b"), take(settings, "a")
    assert b is not None and (b.job_id, b.node) == (forming.id, 1)
    assert a is not None and (a.job_id, a.node) == (stuck.id, 0)
    assert gangs.wait_for_gang(settings.database, b, bound_s=5) is not None
    assert gang(settings, waiting.id) == []


def test_a_reaper_pass_with_nothing_stale_takes_no_lock(settings: Settings) -> None:
    """A reaper pass that finds no seat to drop (a running gang's, a gang forming within its bound) returns while a
    gang claim holds the gangs' lock row: it never takes that lock, so the API's reaper does not queue behind every
    gang claim. A pass that waited for the lock would still be waiting (PostgreSQL) or fail as the database's busy
    timeout ran out (SQLite) when the claim commits."""
    migrate(settings.database)
    running = insert_job(settings, "running", nodes=2)
    forming = insert_job(settings, nodes=2)
    with Session(get_engine(settings.database)) as session:
        session.add(GangSeat(job_id=running.id, host="a", worker="w@a", node=0, joined_at=time.time() - 1000))
        session.add(GangSeat(job_id=forming.id, host="b", worker="w@b", node=0))
        session.commit()
    outcome: list[object] = []

    def reap() -> None:
        try:
            outcome.append(reap_stale_seats(settings.database, forming_limit_s=120))
        except Exception as error:
            outcome.append(error)

    reaper = threading.Thread(target=reap)
    with Session(get_engine(settings.database)) as claim:
        hold(claim, gangs.GANG_LOCK, time.time())  # a gang claim counting seats: the row locked until it commits
        reaper.start()
        reaper.join(timeout=60)
        while_held = list(outcome)
        claim.commit()
    reaper.join()
    assert while_held == [[]], f"the pass took the gangs' lock: {outcome}"
    assert gang(settings, running.id) == [("a", 0)] and gang(settings, forming.id) == [("b", 0)]


def test_a_seat_removal_that_meets_a_database_error_is_retried(settings: Settings) -> None:
    """The removal of a worker's own seat (take_part's end) fails once as an outage would fail it: tried again,
    not left behind."""
    migrate(settings.database)
    job = insert_job(settings, nodes=2)
    engine = get_engine(settings.database)
    removals: list[str] = []

    def fail_first_removal(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.startswith("DELETE FROM gang_seat WHERE gang_seat.id"):
            removals.append(statement)
            if len(removals) == 1:
                raise OperationalError(statement, None, Exception("the database restarts"))

    event.listen(engine, "before_cursor_execute", fail_first_removal)
    stop = threading.Event()
    stop.set()  # the worker is told to stop while it waits: it releases the gang at once, then leaves its seat
    try:
        outcome = take_part(settings, stop, {}, lambda *_: None, lambda *_: None)
    finally:
        event.remove(engine, "before_cursor_execute", fail_first_removal)
    assert outcome == RELEASED
    assert len(removals) == 2  # failed once, then done
    assert gang(settings, job.id) == []
