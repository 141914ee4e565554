"""A sweep's own events: `sweep.finished` when its last child ends, `sweep.best_changed` when a child's end
makes another child its best by the objective (app/core/objectives.py).

Both are decided in the transaction of a child's move to a final state (app/core/lifecycle.py `transition`),
so an event is stored exactly when the move is, as a job's own events are (app/core/webhooks.py):

- the move first locks the sweep's row (app/core/sweeps.py `lock_sweep_of`, before the child's own row, as a
  claim does), so the ends of two children are decided one after the other and each sees the other's state:
  of two last children ending at once, exactly one finds every child ended;
- `sweep.best_changed` compares the best child now with the one the sweep last named (`Sweep.best_job_id`),
  so a best child is named once, however many children end after it. The objective is read when a child ends:
  with `samples_per_s` a running child may lead, and it is named at the next child's end.

A sweep whose children are resumed after it finished finishes, and is notified, again.
"""

from __future__ import annotations

from collections import Counter

from sqlalchemy import update
from sqlmodel import Session, col, select

from app.core.objectives import Best, Objective, best_of, metric_value
from app.core.states import FINAL
from app.core.sweeps import SweepState, sweep_state
from app.core.tables import Job, Sweep, iso_utc
from app.core.webhooks import SWEEP_BEST_CHANGED, SWEEP_FINISHED, enqueue
from pipebd_core.documents.webhook import WebhookBest, WebhookPayload, WebhookSweep


def best_text(best: Best | None, objective: Objective) -> str:
    return "none yet" if best is None else f"job {best.job_id} ({objective.metric} {best.value:.4g})"


def finished_text(sweep: Sweep, state: SweepState, counts: dict[str, int], best: Best | None) -> str:
    """`PipeBD sweep 4 (lr): succeeded, 4 jobs (3 succeeded, 1 failed); best job 12 (final_loss 0.3)`."""
    jobs = ", ".join(f"{count} {name}" for name, count in counts.items())
    total = sum(counts.values())
    text = f"PipeBD sweep {sweep.id} ({sweep.name}): {state}, {total} job{'s' if total != 1 else ''} ({jobs})"
    if sweep.objective is not None:
        text += f"; best {best_text(best, Objective.model_validate(sweep.objective))}"
    return text


def best_changed_text(sweep: Sweep, best: Best, previous: Best | None, objective: Objective) -> str:
    """`PipeBD sweep 4 (lr): the best job is now job 12 (final_loss 0.3, minimize); before: job 9 (...)`."""
    now_best = best_text(best, objective).removesuffix(")") + f", {objective.goal})"
    before = "none" if previous is None else best_text(previous, objective)
    return f"PipeBD sweep {sweep.id} ({sweep.name}): the best is now {now_best}; before: {before}"


def as_best(best: Best | None) -> WebhookBest | None:
    return None if best is None else WebhookBest(job_id=best.job_id, value=best.value)


def notify_sweep(session: Session, job_id: int, stamp: float) -> int:
    """Enqueue the sweep events that child `job_id`'s move to a final state raises (in the caller's
    transaction, which locked the sweep's row before the move); how many deliveries."""
    job = session.get(Job, job_id)
    if job is None or job.sweep_id is None or job.state not in FINAL:
        return 0
    sweep = session.get(Sweep, job.sweep_id, populate_existing=True)
    if sweep is None:
        return 0
    children = list(session.exec(select(Job).where(Job.sweep_id == sweep.id).order_by(col(Job.id))).all())
    for child in children:
        session.refresh(child)  # as this transaction sees them now, after the moves it waited for
    objective = Objective.model_validate(sweep.objective) if sweep.objective else None
    values = {} if objective is None else {c.id: metric_value(c, objective.metric) for c in children if c.id}
    best = None if objective is None else best_of(values, objective)
    state = sweep_state([child.state for child in children])
    counts = dict(Counter(child.state for child in children))

    def payload(event: str, text: str, previous: Best | None) -> WebhookPayload:
        assert sweep is not None and sweep.id is not None
        shown = WebhookSweep(
            id=sweep.id,
            name=sweep.name,
            state=state,
            jobs=counts,
            objective=None if objective is None else f"{objective.goal} {objective.metric}",
            best=as_best(best),
            previous_best=as_best(previous),
            url=None,
        )
        return WebhookPayload(event=event, time=iso_utc(stamp), text=text, sweep=shown)

    delivered = 0
    if objective is not None and best is not None and best.job_id != sweep.best_job_id:
        previous_value = None if sweep.best_job_id is None else values.get(sweep.best_job_id)
        previous = (
            None if previous_value is None or sweep.best_job_id is None else Best(sweep.best_job_id, previous_value)
        )
        session.execute(update(Sweep).where(col(Sweep.id) == sweep.id).values(best_job_id=best.job_id))
        text = best_changed_text(sweep, best, previous, objective)
        delivered += enqueue(session, job, payload(SWEEP_BEST_CHANGED, text, previous))
    if state in FINAL:
        delivered += enqueue(session, job, payload(SWEEP_FINISHED, finished_text(sweep, state, counts, best), None))
    return delivered
