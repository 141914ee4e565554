"""Unit tier: the weighted fair-share order (app/core/fairshare.py) and device-hour accounting
(app/core/quotas.py), pure functions on exact small inputs."""

from __future__ import annotations

from collections import Counter

from app.core.fairshare import Share, Waiting, claim_order
from app.core.quotas import HOUR_S, Span, device_hours, frees_in


def jobs(tenant: str, first_id: int, count: int, priority: int = 0, nproc: int = 1, step: int = 1) -> list[Waiting]:
    return [Waiting(first_id + step * n, tenant, priority, nproc) for n in range(count)]


def test_with_one_tenant_the_order_is_priority_then_age() -> None:
    waiting = [Waiting(1, None, 0, 1), Waiting(2, None, 5, 1), Waiting(3, None, 0, 2), Waiting(4, None, 5, 4)]
    assert [job.id for job in claim_order(waiting, {})] == [2, 4, 1, 3]


def test_the_tenant_using_least_per_weight_goes_first_and_ties_go_to_the_oldest_head() -> None:
    waiting = [Waiting(1, "a", 0, 1), Waiting(2, "b", 0, 1)]
    assert claim_order(waiting, {"a": Share(2, 1.0), "b": Share(3, 2.0)})[0].id == 2  # 1.5 per weight < 2
    assert claim_order(waiting, {"a": Share(2, 1.0), "b": Share(4, 2.0)})[0].id == 1  # tie: the older head
    assert claim_order(waiting, {"a": Share(1, 1.0), "b": Share(0, 1.0)}, limit=1)[0].id == 2


def test_starts_follow_the_weights_and_each_tenants_priorities() -> None:
    """a (weight 1) and b (weight 3), each with more jobs than run: of the first 40 starts, b gets 30."""
    waiting = jobs("a", 1, 40, step=2) + jobs("b", 2, 40, step=2)
    waiting[5] = Waiting(waiting[5].id, "a", 9, 1)  # a's 6th job jumps its line, not b's
    order = claim_order(waiting, {"a": Share(0, 1.0), "b": Share(0, 3.0)}, limit=40)
    assert Counter(job.tenant for job in order) == {"a": 10, "b": 30}
    a_order = [job for job in order if job.tenant == "a"]
    assert a_order[0].id == waiting[5].id
    assert [job.id for job in a_order[1:]] == sorted(job.id for job in a_order[1:])


def test_the_devices_a_job_holds_count_not_its_number() -> None:
    """a runs 4-rank jobs, b 1-rank jobs, equal weights: b starts 4 jobs for each of a's."""
    order = claim_order(jobs("a", 1, 10, nproc=4) + jobs("b", 100, 40), {}, limit=25)
    assert Counter(job.tenant for job in order) == {"a": 5, "b": 20}


def test_a_newcomer_is_never_starved_by_a_busy_tenant_with_high_priorities() -> None:
    waiting = [*jobs("busy", 1, 50, priority=100), Waiting(60, "new", 0, 1)]
    assert claim_order(waiting, {"busy": Share(7, 10.0)}, limit=1)[0].tenant == "new"


def test_device_hours_count_the_ranks_times_the_hours_inside_the_window() -> None:
    at = 100 * HOUR_S
    used = [
        Span(at - 30 * HOUR_S, at - 20 * HOUR_S, 2),  # 4 of its 10 hours in a 24-hour window: 8 device-hours
        Span(at - 2 * HOUR_S, at - 1 * HOUR_S, 4),  # 4
        Span(at - 0.5 * HOUR_S, None, 1),  # running: 0.5 so far
    ]
    assert abs(device_hours(used, at, 24 * HOUR_S) - 12.5) < 1e-9


def test_a_spent_budget_frees_when_the_window_rolls_past_enough_use() -> None:
    at = 100 * HOUR_S
    used = [Span(at - 10 * HOUR_S, at - 8 * HOUR_S, 4), Span(at - 3 * HOUR_S, at - 2 * HOUR_S, 2)]  # 8 + 2
    assert frees_in(used, 11.0, at, 24 * HOUR_S) == 0.0
    assert frees_in(used, 10.0, at, 24 * HOUR_S) == 16 * HOUR_S  # the first span has left the window
    assert frees_in([Span(at - HOUR_S, None, 8)], 4.0, at, 24 * HOUR_S) is None  # only its end frees it
