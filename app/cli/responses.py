"""The API's answers as the command line reads them: the fields of app/api/schemas.py's (and
app/api/webhook_schemas.py's) JSON that `pipebd` prints. A newer server may send more; the CLI reads these.
Times are ISO 8601 strings in JSON."""

from __future__ import annotations

from typing import Generic, NotRequired, TypedDict, TypeVar

from app.core.json_types import JsonObject

Item = TypeVar("Item")


class PhaseJson(TypedDict):
    name: str
    state: str
    outcome: str | None
    reason: str | None
    started_at: str | None
    ended_at: str | None


class AttemptJson(TypedDict):
    number: int
    worker: str | None
    started_at: str
    ended_at: str | None
    outcome: str | None
    reason: str | None
    hosts: NotRequired[list[str] | None]


class PlanSummaryJson(TypedDict, total=False):
    mode: str


class JobJson(TypedDict):
    """A job (JobPublic in lists; JobDetail, with the NotRequired fields, when read alone)."""

    id: int
    name: str
    state: str
    priority: int
    nproc: int
    nodes: NotRequired[int]
    created_at: str
    started_at: str | None
    finished_at: str | None
    phase: str | None
    phase_progress: float
    progress: float
    samples_per_s: float | None  # the job's figures (app/core/figures.py), as every page shows them
    step_s: NotRequired[float | None]
    busy_share: NotRequired[float | None]
    peak_mem: NotRequired[int | None]
    termination_reason: str | None
    worker: str | None
    plan_summary: NotRequired[PlanSummaryJson | None]
    error: NotRequired[str | None]
    exit_code: NotRequired[int | None]
    waiting_reason: NotRequired[str | None]
    queue_position: NotRequired[int | None]
    phases: NotRequired[list[PhaseJson]]
    restarts: NotRequired[int]
    max_restarts: NotRequired[int]
    attempts: NotRequired[list[AttemptJson]]


class SweepChildJson(TypedDict):
    id: int
    state: str
    overrides: JsonObject  # dotted path -> the child's value there (any JSON)


class SweepJson(TypedDict):
    id: int
    name: str
    state: str
    jobs: list[SweepChildJson]


class LogChunkJson(TypedDict):
    """A piece of a job's log (GET /api/v1/jobs/{id}/logs)."""

    phase: str
    file: str
    offset: int
    next_offset: int
    text: str


class DeliveryCountsJson(TypedDict):
    pending: int
    succeeded: int
    failed: int


class WebhookJson(TypedDict):
    id: int
    url: str
    events: list[str]
    scope: str
    job_id: int | None
    sweep_id: int | None
    deliveries: DeliveryCountsJson


class DeliveryJson(TypedDict):
    id: int
    event: str
    job_id: int | None
    state: str
    attempts: int
    max_attempts: int
    last_status: int | None
    last_error: str | None
    created_at: str


class ArtifactJson(TypedDict):
    """One entry of a job's artifact list (GET /api/v1/jobs/{id}/artifacts)."""

    name: str
    media_type: str
    size: int
    description: str
    url: str
    sha256_url: str | None  # a folder's archive: where its sha256 line is


class ArtifactListJson(TypedDict):
    job_id: int
    state: str
    data: list[ArtifactJson]


class ModelFileJson(TypedDict):
    path: str
    size: int
    sha256: str
    url: str | None


class ModelMetricsJson(TypedDict, total=False):
    """A registered model's figures (ModelMetrics): each null or absent where its job did not measure it."""

    perplexity: float | None
    top1: float | None
    params: int | None
    reached: dict[str, float] | None


class ArchitectureBlockJson(TypedDict):
    block: int
    layers: list[str]


class ArchitectureJson(TypedDict):
    """A searched or chosen model's architecture.json, as the server serves it (the fields the CLI prints)."""

    blocks: list[ArchitectureBlockJson]


class ModelJson(TypedDict):
    """A registered model (ModelPublic in lists; ModelDetail, with its architecture, when read alone)."""

    id: int
    job_id: int
    name: str
    kind: str
    parent_id: int | None
    parent_hash: str | None
    content_hash: str
    spec_hash: str | None
    data_fingerprint: str | None
    files: list[ModelFileJson]
    files_present: bool
    metrics: ModelMetricsJson
    mlflow_version: NotRequired[str | None]
    created_at: str
    architecture: NotRequired[ArchitectureJson | None]


class LineageJson(TypedDict):
    model: ModelJson
    chain: list[ModelJson]
    descendants: list[ModelJson]


class PageJson(TypedDict, Generic[Item]):
    """A cursor-paged list."""

    data: list[Item]
    next_cursor: str | None


class EventJson(TypedDict, total=False):
    """The data of one event of a job's stream (GET /api/v1/jobs/{id}/events): `state` and `end` carry the
    state, `phase` the phase and progress, `metrics` the progress, throughput and the telemetry lines."""

    job_id: int
    state: str
    phase: str
    progress: float
    samples_per_s: float | None
    records: list[JsonObject]  # telemetry lines as the ranks wrote them: pipebd_core.documents.telemetry reads them


class SweepBody(TypedDict, total=False):
    """What `pipebd sweep` sends to POST /api/v1/sweeps."""

    spec: JsonObject
    grid: JsonObject
    random: RandomSearchBody
    objective: ObjectiveBody
    name: str
    max_parallel: int


class RandomSearchBody(TypedDict):
    count: int
    seed: int | None
    fields: JsonObject


class ObjectiveBody(TypedDict):
    metric: str
    goal: str


class ProblemFieldJson(TypedDict, total=False):
    loc: list[str | int]
    message: str


class ProblemJson(TypedDict, total=False):
    """A problem body (every 4xx and 5xx)."""

    detail: str
    errors: list[ProblemFieldJson]
