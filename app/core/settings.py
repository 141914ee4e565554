"""Service settings, read from `PIPEBD_*` environment variables (pydantic-settings).

The embedded default needs nothing set: the database (SQLite), the Celery broker (kombu's SQLite
transport) and every job's run directory live under one data folder, `PIPEBD_DATA_DIR`. Production
sets `PIPEBD_DATABASE_URL` (PostgreSQL) and `PIPEBD_BROKER_URL` (Redis). The API and the workers
read the same settings, so a worker enqueued by the API finds the same database and runs folder.
"""

from __future__ import annotations

import functools
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Scope = Literal["read", "submit"]
# The checkout's folders the bundled examples read without a PIPEBD_DATA_ROOTS: docs/ (the language-model
# examples' text) and runs/ (where `pipebd run --out runs/<name>` writes a teacher a later example names)
CHECKOUT = Path(__file__).resolve().parents[2]
BUNDLED_DATA_FOLDERS = ("docs", "runs")
MIN_TOKEN_LENGTH = 16  # shorter tokens are guessable; refuse them rather than run half-protected
PLACEHOLDER_TOKENS = {"changeme", "changethis", "secret", "token", "password"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PIPEBD_", extra="ignore")

    data_dir: Path = Path(".pipebd")  # the embedded default keeps everything here
    database_url: str | None = None  # default: sqlite:///<data_dir>/pipebd.db
    broker_url: str | None = None  # default: sqla+sqlite:///<data_dir>/broker.db
    runs_dir: Path | None = None  # default: <data_dir>/runs; shared storage when API and workers differ
    # "TOKEN=scope,TOKEN=scope" with scope read or submit (submit may also read); empty: no auth
    api_tokens: str = ""
    # Folders that spec paths (data.root, data.tokenizer, workload.teacher_weights, a transformer's
    # workload.teacher directory) must lie under, besides this server's runs folder; comma-separated
    data_roots: str = ""  # default: <data_dir>/datasets and the checkout's docs/ and runs/ (the examples' data)
    # Modules that spec factories may import: "pkg.mod:fn" is allowed when pkg.mod is or lies under one
    factory_allowlist: str = "pipebd_core.workloads"
    worker_name: str = Field(default_factory=socket.gethostname)  # shown on jobs and heartbeats
    worker_devices: int | None = Field(None, ge=1)  # devices advertised; default: GPUs, else CPU cores
    worker_slots: int = Field(1, ge=1)  # jobs a worker runs at once
    # Jobs on several nodes (docs/multinode.md): the host a worker stands for in gang claims (one seat per host
    # in a gang), the address the other nodes reach it at, and how long a seated worker waits for its gang
    host_id: str = Field(default_factory=socket.gethostname, min_length=1, max_length=200)
    node_address: str | None = None  # default: the address the host name resolves to
    gang_bound_s: float = Field(60.0, gt=0)
    heartbeat_s: float = Field(2.0, gt=0)  # how often a worker says a job is still alive
    stale_after_s: float = Field(30.0, gt=0)  # a running job without heartbeat this long is worker_lost
    reaper_interval_s: float = Field(5.0, gt=0)  # how often the API looks for lost jobs
    rewake_after_s: float = Field(60.0, gt=0)  # a job queued this long beside a worker with room is published again
    poll_s: float = Field(0.25, gt=0)  # worker: telemetry, logs and cancellation polling period
    kill_grace_s: float = Field(5.0, ge=0)  # cancel: SIGTERM, then SIGKILL survivors after this
    # a worker told to stop (SIGTERM: a spot reclaim, a drain) waits this long for its ranks to checkpoint at a
    # step boundary before it stops them at once (docs/lifecycle.md "Preemption")
    preempt_grace_s: float = Field(30.0, gt=0)
    job_timeout_s: float = Field(24 * 3600.0, gt=0)  # wall-clock limit per job (a job past it fails: timeout)
    max_restarts: int = Field(2, ge=0)  # automatic restarts after infrastructure faults, for specs that give none
    outage_patience_s: float = Field(600.0, gt=0)  # a worker retries recording a job's end this long (database down)
    sse_poll_s: float = Field(0.25, gt=0)  # how often an event stream looks for new events
    sse_keepalive_s: float = Field(15.0, gt=0)  # comment lines that keep proxies from closing streams
    page_limit_max: int = Field(200, ge=1)  # the largest `limit` a list request may ask for
    # Limits on what one client can ask of the API (docs/limits.md: "Limits")
    max_body_bytes: int = Field(1 << 20, ge=1024)  # largest request body (a spec is a few kB); 413 beyond
    spec_check_timeout_s: float = Field(30.0, gt=0)  # time bound on checking a spec (parse, build its workload)
    spec_checkers: int = Field(2, ge=1)  # helper processes that build workloads to check specs (each loads torch)
    spec_checker_idle_s: float = Field(60.0, gt=0)  # a helper exits after this long without a spec to check
    max_queued_jobs: int = Field(100, ge=1)  # a submission while this many jobs are queued gets 429
    submissions_per_minute: int = Field(30, ge=1)  # per token (per client address without tokens); 429 beyond
    max_epochs: int = Field(1000, ge=1)  # the largest train.epochs a spec may ask for
    max_num_samples: int = Field(1_000_000, ge=1)  # the largest data.num_samples (synthetic data) a spec may ask for
    # Webhooks (docs/webhooks.md): delivered by the API process, off the request path
    webhook_timeout_s: float = Field(10.0, gt=0)  # a receiver slower than this to connect or answer: a failed attempt
    webhook_max_attempts: int = Field(8, ge=1)  # attempts per delivery before it is recorded as failed
    webhook_backoff_s: float = Field(10.0, gt=0)  # wait before the 2nd attempt; doubled before each later one
    webhook_backoff_max_s: float = Field(3600.0, gt=0)  # the longest wait between two attempts
    webhook_poll_s: float = Field(1.0, gt=0)  # how often an idle delivery loop looks for deliveries that are due
    webhook_senders: int = Field(4, ge=1)  # deliveries sent at once (a slow receiver holds one sender)
    # Tracking export (docs/tracking.md): with an MLflow tracking server's URI, every job a worker runs is an
    # MLflow run, kept up to date off the job's path; MLflow is the optional extra `pipebd[tracking]`
    mlflow_uri: str | None = None  # e.g. http://mlflow.internal:5000; unset: no MLflow export
    mlflow_experiment: str = "pipebd"  # the experiment the runs go to (created when missing)
    mlflow_timeout_s: int = Field(10, ge=1)  # each request to the tracking server
    mlflow_retries: int = Field(3, ge=0)  # a job's last export is tried again this often, backing off, then given up
    mlflow_wait_s: float = Field(15.0, ge=0)  # a worker waits this long for a job's last export before its next job
    # where users reach this server (https://pipebd.example.org): links in webhook payloads and in MLflow runs
    public_url: str | None = None

    @field_validator("api_tokens")
    @classmethod
    def _tokens_are_real(cls, value: str) -> str:
        parse_tokens(value)
        return value

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'pipebd.db').resolve()}"

    @property
    def broker(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{(self.data_dir / 'broker.db').resolve()}"

    @property
    def runs(self) -> Path:
        return (self.runs_dir or self.data_dir / "runs").resolve()

    @property
    def address(self) -> str:
        """Where the other nodes of a job reach this worker's host (node 0's rendezvous)."""
        if self.node_address:
            return self.node_address
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:  # a host name nothing resolves
            return "127.0.0.1"

    @property
    def roots(self) -> list[Path]:
        """Where spec paths may point: PIPEBD_DATA_ROOTS (default: <data_dir>/datasets and the bundled
        examples' folders of the checkout), and always this server's runs folder, so that what one job
        wrote (a teacher.pt, a teacher_model/) is the next job's teacher without copying."""
        entries = [part.strip() for part in self.data_roots.split(",") if part.strip()]
        given = [Path(entry).resolve() for entry in entries]
        bundled = [(CHECKOUT / name).resolve() for name in BUNDLED_DATA_FOLDERS]
        return [*(given or [(self.data_dir / "datasets").resolve(), *bundled]), self.runs]

    @property
    def allowed_modules(self) -> list[str]:
        return [part.strip() for part in self.factory_allowlist.split(",") if part.strip()]

    @property
    def tokens(self) -> dict[str, Scope]:
        return parse_tokens(self.api_tokens)

    def prepare_folders(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.runs.mkdir(parents=True, exist_ok=True)


def parse_tokens(value: str) -> dict[str, Scope]:
    """`"TOKEN=read,TOKEN2=submit"` -> {token: scope}; refuses short or placeholder tokens."""
    tokens: dict[str, Scope] = {}
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        token, _, scope = entry.partition("=")
        if scope not in ("read", "submit"):
            raise ValueError(
                f"PIPEBD_API_TOKENS: entry {token[:4]}...: scope must be 'read' or 'submit', got {scope!r}"
            )
        if len(token) < MIN_TOKEN_LENGTH or token.lower() in PLACEHOLDER_TOKENS:
            raise ValueError(
                f"PIPEBD_API_TOKENS: a token must be at least {MIN_TOKEN_LENGTH} random characters"
                " (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(24))'`)"
            )
        tokens[token] = scope  # type: ignore[assignment]
    return tokens


@functools.lru_cache
def get_settings() -> Settings:
    """The process-wide settings (tests build their own `Settings` and pass them explicitly)."""
    return Settings()
