"""Webhooks, the sending side: the delivery loop the API process runs in the background.

The loop claims the pending deliveries that are due (app/core/webhooks.py stored them with the job's
move), as many as it has idle senders, and sends each on one of `webhook_senders` threads (it claims
again as soon as a sender is free while all are busy, else every `webhook_poll_s`): a POST of the
payload as JSON, with

    Content-Type: application/json
    X-PipeBD-Event: job.succeeded
    X-PipeBD-Delivery: 42                       the delivery's id (the same on every attempt)
    X-PipeBD-Signature: sha256=<hex>            HMAC-SHA256 of the exact body, keyed with the hook's secret

An answer 2xx within `webhook_timeout_s` is a success. Anything else (another status, a refused
connection, no answer in time; redirects are not followed) is a failed attempt: the delivery is due
again after `webhook_backoff_s`, doubled after each further failure up to `webhook_backoff_max_s`, and
is recorded `failed` after `webhook_max_attempts`. A claim is a compare-and-set on the attempt count
that also sets `next_attempt_at` past the attempt's time bound (a lease), so two API processes never
send one attempt twice, and an attempt whose process died is sent again once its lease ends. An answer
the database cannot take at once (it is restarting) is stored again every few seconds for the rest of the
lease, so a delivered attempt is not sent again (the soak found one received and then recorded failed).

Nothing here touches a job: a receiver that is down or slow delays only its own deliveries.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import httpx
from sqlalchemy import update
from sqlmodel import col, select

from app.core.database import persist, session_scope
from app.core.json_types import JsonObject
from app.core.settings import Settings
from app.core.tables import Webhook, WebhookDelivery
from app.core.webhooks import FAILED, PENDING, SUCCEEDED
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.webhook import WebhookPayload

LEASE_MARGIN_S = 30.0  # a claimed attempt is sent again this long after its time bound, if nobody recorded it
ANSWER_CHARS = 200  # the most of a receiver's answer kept as the delivery's last error
USER_AGENT = "PipeBD-Webhooks/1"
log = logging.getLogger("pipebd.webhooks")


def signature(secret: str, body: bytes) -> str:
    """The `X-PipeBD-Signature` value: `sha256=` and the hex HMAC-SHA256 of `body` keyed with `secret`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff_s(attempts: int, settings: Settings) -> float:
    """The wait after the `attempts`-th failed attempt: the base, doubled each time, bounded."""
    return float(min(settings.webhook_backoff_s * 2 ** (attempts - 1), settings.webhook_backoff_max_s))


@dataclass(frozen=True)
class Claimed:
    """One attempt of one delivery, taken by this process."""

    id: int
    attempt: int  # 1 for the first
    url: str
    secret: str
    event: str
    payload: JsonObject  # the body as stored (pipebd_core.documents.webhook), sent as it is


@dataclass(frozen=True)
class Answer:
    status: int | None  # the receiver's HTTP status; None when it did not answer
    error: str | None  # None: delivered

    @property
    def delivered(self) -> bool:
        return self.error is None


def claim_due(settings: Settings, now: float, limit: int) -> list[Claimed]:
    """Take up to `limit` due deliveries, oldest due first, each for one attempt (see the module's claim)."""
    query = (
        select(WebhookDelivery, Webhook)
        .join(Webhook, col(Webhook.id) == col(WebhookDelivery.webhook_id))
        .where(col(WebhookDelivery.state) == PENDING, col(WebhookDelivery.next_attempt_at) <= now)
        .order_by(col(WebhookDelivery.next_attempt_at), col(WebhookDelivery.id))
        .limit(limit)
    )
    lease = now + settings.webhook_timeout_s + LEASE_MARGIN_S
    claimed = []
    with session_scope(settings.database) as session:
        for delivery, hook in session.exec(query).all():
            assert delivery.id is not None
            seen, attempt = delivery.attempts, delivery.attempts + 1  # read before the UPDATE refreshes `delivery`
            taken = (
                update(WebhookDelivery)
                .where(col(WebhookDelivery.id) == delivery.id, col(WebhookDelivery.attempts) == seen)
                .where(col(WebhookDelivery.state) == PENDING)
                .values(attempts=attempt, next_attempt_at=lease)
            )
            if session.execute(taken).rowcount == 1:  # type: ignore[attr-defined]
                claimed.append(Claimed(delivery.id, attempt, hook.url, hook.secret, delivery.event, delivery.payload))
    return claimed


def send(client: httpx.Client, claimed: Claimed, settings: Settings) -> Answer:
    """POST one attempt, signed; what the receiver answered."""
    try:
        payload = WebhookPayload.from_json(claimed.payload).linked(settings.public_url)
    except DocumentError as error:  # stored by another PipeBD version
        return Answer(None, str(error)[:ANSWER_CHARS])
    body = json.dumps(payload.to_json(), separators=(",", ":")).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-PipeBD-Event": claimed.event,
        "X-PipeBD-Delivery": str(claimed.id),
        "X-PipeBD-Signature": signature(claimed.secret, body),
    }
    try:
        response = client.post(claimed.url, content=body, headers=headers, timeout=settings.webhook_timeout_s)
    except httpx.TimeoutException:
        return Answer(None, f"no answer within {settings.webhook_timeout_s:g} s (PIPEBD_WEBHOOK_TIMEOUT_S)")
    except httpx.HTTPError as error:
        return Answer(None, f"{type(error).__name__}: {error}"[:ANSWER_CHARS])
    if response.is_success:
        return Answer(response.status_code, None)
    if response.is_redirect:
        moved = response.headers.get("location", "?")
        return Answer(response.status_code, f"HTTP {response.status_code} to {moved}: redirects are not followed")
    text = response.text.strip()[:ANSWER_CHARS]
    return Answer(response.status_code, f"HTTP {response.status_code}" + (f": {text}" if text else ""))


def record(settings: Settings, claimed: Claimed, answer: Answer, now: float) -> str:
    """Store how the attempt went: succeeded, failed (no attempts left) or pending (due again later)."""
    if answer.delivered:
        state, due, finished = SUCCEEDED, None, now
    elif claimed.attempt >= settings.webhook_max_attempts:
        state, due, finished = FAILED, None, now
    else:
        state, due, finished = PENDING, now + backoff_s(claimed.attempt, settings), None
    outcome = (
        update(WebhookDelivery)
        .where(col(WebhookDelivery.id) == claimed.id, col(WebhookDelivery.attempts) == claimed.attempt)
        .values(
            state=state, next_attempt_at=due, finished_at=finished, last_status=answer.status, last_error=answer.error
        )
    )
    with session_scope(settings.database) as session:
        session.execute(outcome)
    return state


def deliver(client: httpx.Client, claimed: Claimed, settings: Settings, now: float | None = None) -> str:
    """Send one claimed attempt and record it, through a database outage for up to the lease's margin (past
    it, the attempt may be claimed again, and the record's compare on the attempt count keeps it out); the
    delivery's state after it."""
    answer = send(client, claimed, settings)
    if not answer.delivered:
        log.info("webhook delivery %s attempt %s: %s", claimed.id, claimed.attempt, answer.error)
    stamp = time.time() if now is None else now
    return persist(
        lambda: record(settings, claimed, answer, stamp), LEASE_MARGIN_S, f"webhook delivery {claimed.id}'s answer"
    )


def deliver_due(settings: Settings, client: httpx.Client, now: float | None = None, limit: int = 100) -> list[str]:
    """One round, in this thread: claim what is due at `now` and send it; each delivery's state after it."""
    stamp = time.time() if now is None else now
    return [deliver(client, claimed, settings, stamp) for claimed in claim_due(settings, stamp, limit)]


def new_client() -> httpx.Client:
    return httpx.Client(follow_redirects=False, headers={"User-Agent": USER_AGENT})


def run_deliveries(settings: Settings, stop: threading.Event) -> None:
    """The loop, until `stop`: every `webhook_poll_s`, claim as many due deliveries as there are idle
    senders, and again as soon as a sender is free while every sender is busy."""
    sending: set[Future[str]] = set()
    with new_client() as client, ThreadPoolExecutor(settings.webhook_senders, "webhook") as pool:
        while not stop.wait(settings.webhook_poll_s):
            busy = True
            while busy and not stop.is_set():
                sending = forget_done(sending)
                idle = settings.webhook_senders - len(sending)
                try:
                    claimed = claim_due(settings, time.time(), idle) if idle > 0 else []
                except Exception:  # keep delivering after a database hiccup
                    log.exception("the webhook delivery loop failed; retrying")
                    claimed = []
                sending |= {pool.submit(deliver, client, attempt, settings) for attempt in claimed}
                busy = bool(sending) and len(claimed) == idle  # every sender busy: more may be due
                if busy:
                    wait(sending, timeout=settings.webhook_poll_s, return_when=FIRST_COMPLETED)


def forget_done(sending: set[Future[str]]) -> set[Future[str]]:
    """The sends still running; a finished one that raised is logged (its record did not reach the database:
    the attempt is sent again once its claim runs out)."""
    for future in sending:
        if future.done() and future.exception() is not None:
            log.error("a webhook delivery was not recorded: %s", future.exception())
    return {future for future in sending if not future.done()}
