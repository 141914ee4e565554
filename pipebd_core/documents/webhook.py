"""The body of a webhook delivery: what a receiver gets when a chosen event happens (docs/webhooks.md).

The service builds one per event (app/core/webhooks.py), stores it with the delivery, and sends it as
JSON, signed (`X-PipeBD-Signature: sha256=<hex HMAC-SHA256 of the body>`). `text` is one line a chat
receiver (a Slack or Mattermost incoming webhook) shows as it is; the other fields are for programs.
`job` is set for job and phase events, `phase` for `phase.finished`, `sweep` (and no `job`) for
`sweep.finished` and `sweep.best_changed`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from pipebd_core.documents.base import Document


class WebhookJob(BaseModel):
    """The job an event is about, as it stood when the event happened."""

    model_config = ConfigDict(extra="forbid")

    id: int
    name: str
    state: str  # the lifecycle state (app/core/lifecycle.py)
    phase: str | None  # the phase running then, or the one that ran last
    progress: float  # of the whole job, 0 to 1
    termination_reason: str | None  # why it ended (pipebd_core/job/outcomes.py), for failed and cancelled jobs
    error: str | None  # the start of what went wrong (a rank's traceback is cut)
    url: str | None  # its dashboard page, when the server knows its public address (PIPEBD_PUBLIC_URL)


class WebhookPhase(BaseModel):
    """The phase that ended (pipebd_core/documents/phases.py)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    outcome: str  # succeeded, failed, cancelled or skipped
    reason: str | None  # a termination reason, or why it was skipped
    duration_s: float | None


class WebhookBest(BaseModel):
    """A sweep's best child by its objective, and its value."""

    model_config = ConfigDict(extra="forbid")

    job_id: int
    value: float


class WebhookSweep(BaseModel):
    """The sweep a sweep event is about, as it stood when the event happened."""

    model_config = ConfigDict(extra="forbid")

    id: int
    name: str
    state: str  # queued, running, paused, succeeded, failed or cancelled (app/core/sweeps.py)
    jobs: dict[str, int]  # its children per state (only the states some child is in)
    objective: str | None  # `minimize final_loss`; None for a sweep without one
    best: WebhookBest | None  # its best child now
    previous_best: WebhookBest | None  # for sweep.best_changed: the best child it named before (None: none yet)
    url: str | None  # its dashboard page, when the server knows its public address (PIPEBD_PUBLIC_URL)


class WebhookPayload(Document):
    """One event, as a receiver reads it."""

    NAME = "webhook payload"
    VERSION = 1

    event: str  # job.<state>, phase.finished, sweep.finished or sweep.best_changed (app/core/webhooks.py)
    time: str  # when it happened, ISO 8601 in UTC
    text: str  # one line for people: what a Slack-compatible receiver shows
    job: WebhookJob | None = None
    phase: WebhookPhase | None = None
    sweep: WebhookSweep | None = None

    def linked(self, public_url: str | None) -> WebhookPayload:
        """This payload with its job's (or sweep's) dashboard address, in `job.url` (`sweep.url`) and at the
        end of `text`, when the server knows where its dashboard is reached."""
        if public_url is None:
            return self
        base = public_url.rstrip("/")
        if self.job is not None:
            url = f"{base}/jobs/{self.job.id}"
            return self.model_copy(
                update={"job": self.job.model_copy(update={"url": url}), "text": f"{self.text} {url}"}
            )
        if self.sweep is not None:
            url = f"{base}/sweeps/{self.sweep.id}"
            sweep = self.sweep.model_copy(update={"url": url})
            return self.model_copy(update={"sweep": sweep, "text": f"{self.text} {url}"})
        return self
