"""Webhooks' pure logic: the signature, the back-off schedule, which phases ended between two records,
the events and scopes the API offers, and the payload's text and link."""

from __future__ import annotations

from typing import get_args

from app.cli.webhooks import SCOPES as CLI_SCOPES
from app.core.deliveries import backoff_s, signature
from app.core.objectives import Best, Objective
from app.core.settings import Settings
from app.core.states import STATES
from app.core.sweep_events import best_changed_text, finished_text
from app.core.tables import Job, Sweep
from app.core.webhooks import DELIVERY_STATES, SCOPES, finished_phases, phase_text, state_text
from app.services.webhook_schemas import EVENTS, DeliveryState, Scope
from pipebd_core.documents.phases import PhaseRecord
from pipebd_core.documents.webhook import WebhookBest, WebhookJob, WebhookPayload, WebhookPhase, WebhookSweep


def test_the_signature_is_the_hex_hmac_sha256_of_the_body() -> None:
    # GitHub's published example of the same header (docs: "Validating webhook deliveries")
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert signature("It's a Secret to Everybody", b"Hello, World!") == expected


def test_the_back_off_doubles_from_the_base_up_to_its_bound() -> None:
    settings = Settings(webhook_backoff_s=10.0, webhook_backoff_max_s=100.0)
    assert [backoff_s(attempt, settings) for attempt in range(1, 7)] == [10.0, 20.0, 40.0, 80.0, 100.0, 100.0]


def record(name: str, state: str = "pending", outcome: str | None = None, ended_at: float | None = None) -> PhaseRecord:
    return PhaseRecord.model_validate(
        {"name": name, "runs": "local", "state": state, "outcome": outcome, "started_at": 1.0, "ended_at": ended_at}
    )


def test_a_phase_finishes_once_per_run() -> None:
    running = [record("plan", "running"), record("distill")]
    planned = [record("plan", "ended", "succeeded", 2.0), record("distill", "running")]
    assert finished_phases(None, running) == []
    assert [r.name for r in finished_phases([r.to_json() for r in running], planned)] == ["plan"]
    assert finished_phases([r.to_json() for r in planned], planned) == []  # stored again: nothing new
    skipped = [record("profile", "ended", "skipped", 1.0), record("plan", "running")]
    assert [r.name for r in finished_phases(None, skipped)] == ["profile"]  # a resumed job's first record
    rerun = [record("plan", "ended", "succeeded", 2.0), record("distill", "ended", "failed", 5.0)]
    again = [record("plan", "ended", "succeeded", 2.0), record("distill", "ended", "succeeded", 9.0)]
    assert [r.name for r in finished_phases([r.to_json() for r in rerun], again)] == ["distill"]


def test_the_api_offers_every_state_s_event_and_the_core_s_scopes_and_delivery_states() -> None:
    assert (*(f"job.{state}" for state in STATES), "phase.finished", "sweep.finished", "sweep.best_changed") == EVENTS
    assert get_args(Scope) == SCOPES == CLI_SCOPES
    assert get_args(DeliveryState) == DELIVERY_STATES


def test_the_text_says_what_happened_in_one_line() -> None:
    job = Job(id=3, name="tiny", state="failed", nproc=1, queue="q", spec={}, termination_reason="rank_error")
    job.error = "rank 1 raised ValueError: bad block\nTraceback (most recent call last):\n  ..."
    assert state_text(job) == "PipeBD job 3 (tiny): failed (rank_error: rank 1 raised ValueError: bad block)"
    phase = WebhookPhase(name="distill", outcome="succeeded", reason=None, duration_s=12.25)
    assert phase_text(job, phase) == "PipeBD job 3 (tiny): phase distill succeeded in 12.2 s"
    cached = WebhookPhase(name="profile", outcome="skipped", reason="cached profile p-1", duration_s=0.0)
    assert phase_text(job, cached) == "PipeBD job 3 (tiny): phase profile skipped (cached profile p-1)"


def test_a_payload_links_its_job_when_the_server_knows_its_address() -> None:
    job = WebhookJob(
        id=3, name="t", state="succeeded", phase=None, progress=1.0, termination_reason=None, error=None, url=None
    )
    payload = WebhookPayload(event="job.succeeded", time="2026-12-02T08:00:00Z", text="PipeBD job 3 (t): ok", job=job)
    assert payload.linked(None) == payload
    linked = payload.linked("https://pipebd.example.com/")
    assert linked.job is not None and linked.job.url == "https://pipebd.example.com/jobs/3"
    assert linked.text == "PipeBD job 3 (t): ok https://pipebd.example.com/jobs/3"


def test_a_sweep_s_text_names_its_end_and_its_best_and_its_payload_links_the_sweep() -> None:
    sweep = Sweep(id=4, name="lr", spec={}, search={}, objective={"metric": "final_loss", "goal": "minimize"})
    counts = {"succeeded": 3, "failed": 1}
    assert finished_text(sweep, "failed", counts, Best(12, 0.30125)) == (
        "PipeBD sweep 4 (lr): failed, 4 jobs (3 succeeded, 1 failed); best job 12 (final_loss 0.3013)"
    )
    assert finished_text(sweep, "failed", counts, None).endswith("; best none yet")
    no_objective = Sweep(id=5, name="n", spec={}, search={})
    assert finished_text(no_objective, "succeeded", {"succeeded": 1}, None) == (
        "PipeBD sweep 5 (n): succeeded, 1 job (1 succeeded)"
    )
    objective = Objective(metric="final_loss", goal="minimize")
    assert best_changed_text(sweep, Best(12, 0.3), Best(9, 0.5), objective) == (
        "PipeBD sweep 4 (lr): the best is now job 12 (final_loss 0.3, minimize); before: job 9 (final_loss 0.5)"
    )
    assert best_changed_text(sweep, Best(12, 0.3), None, objective).endswith("; before: none")

    shown = WebhookSweep(
        id=4,
        name="lr",
        state="running",
        jobs={"running": 1},
        objective="minimize final_loss",
        best=WebhookBest(job_id=12, value=0.3),
        previous_best=None,
        url=None,
    )
    payload = WebhookPayload(event="sweep.best_changed", time="2026-12-03T08:00:00Z", text="t", sweep=shown)
    linked = payload.linked("https://pipebd.example.com")
    assert linked.sweep is not None and linked.sweep.url == "https://pipebd.example.com/sweeps/4"
    assert linked.text == "t https://pipebd.example.com/sweeps/4" and linked.job is None
    assert WebhookPayload.from_json(linked.to_json()) == linked
