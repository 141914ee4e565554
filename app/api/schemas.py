"""Every response shape of the REST API: what /openapi.json documents.

Each model describes exactly the body its route builds today, so declaring it changes no response:

- `JobPublic`, `JobDetail`, `JobsPublic`: a job in lists, one job, a page of jobs (times as ISO 8601, UTC).

- `MetricsPage` and `MetricPoint`: `GET /jobs/{id}/metrics`, chart points as `app.core.downsample.to_point`
  and `merge` make them (a raw telemetry line has `count` 1; a bucket or rollup stands for `count`
  lines). Rollups stored before `cur_mem` and `gpu_util` existed lack those two keys, and the route
  leaves them out (`response_model_exclude_unset`) rather than adding nulls.
- `Plan`: `GET /jobs/{id}/plan`, the engine's plan.json as written (`pipebd_core.documents.distill_plan.PlanDocument`:
  the schedule and its details, with its `format_version`). Every model of the plan allows extra keys, so a key
  written by another engine version is passed through, never dropped; optional keys that a plan lacks
  stay absent (`response_model_exclude_unset`).
- `SweepPublic`, `SweepDetail`, `SweepsPublic`: a sweep in lists (state, progress, best child), one sweep
  with its children (`SweepChild`: a job with its overrides and objective value), a list of sweeps.
- `LogChunk`, `ArtifactList`, `Health`: the logs, artifact list and `/healthz` bodies.
- `Problem` and `ProblemField`: every error body (app/api/problems.py builds them); `problem`, `SERVER_ERROR`,
  `AUTH_ERRORS` and `job_errors` document them in the routes' `responses=`.

Numbers that the engine writes as integers in some lines and floats in others (samples, GPU
utilisation, times, losses) are `Number`: an int stays an int and a float a float in the body, where
a plain `float` field would turn 10 into 10.0.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_serializer

from app.api.problems import PROBLEM_JSON
from app.core.figures import step_of
from app.core.json_types import JsonObject
from app.core.objectives import Objective
from app.core.plan_summary import PlanSummary
from app.core.states import JobState
from app.core.sweeps import SweepState
from app.core.tables import Job, iso_utc
from app.services.errors import EXCERPT_CHARS

Number = Annotated[int | float, WithJsonSchema({"type": "number"})]


# --- errors -------------------------------------------------------------------------------------------


class ProblemField(BaseModel):
    """One bad field or parameter of a request."""

    loc: list[str | int] = Field(description="where: `body`, `query`, `path` or `header`, then the field's path")
    message: str = Field(description="why the value is refused, and what would work")
    value: str | None = Field(
        default=None, description=f"the value sent (its first {EXCERPT_CHARS} characters); absent for a missing one"
    )


class Problem(BaseModel):
    """Every 4xx and 5xx answer (RFC 9457 problem details, `application/problem+json`)."""

    type: str = Field(description="`about:blank`: the status says what kind of problem it is")
    title: str = Field(description="the status's name, e.g. `Unprocessable Content`")
    status: int = Field(description="the HTTP status code")
    detail: str = Field(description="what went wrong, with the values involved and what would work")
    instance: str = Field(description="the path of the request")
    request_id: str = Field(description="this request's id, also in `X-Request-ID` and in the server's log")
    errors: list[ProblemField] = Field(description="each bad field (empty when the problem is not about one)")


ResponseDoc = dict[int | str, JsonObject]  # OpenAPI response objects by status
PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def problem(description: str) -> JsonObject:
    """An error response for a route's `responses=`: a problem body (app/api/openapi.py adds the models)."""
    return {"description": description, "content": {PROBLEM_JSON: {"schema": PROBLEM_REF}}}


SERVER_ERROR: ResponseDoc = {
    500: problem("the server failed; the body's `request_id` names the failure in the server's log")
}
JSON_BODY_ERRORS: ResponseDoc = {  # a route that takes a JSON body (POST /jobs also takes YAML: its own)
    400: problem("the body is not a JSON document"),
    413: problem("the body is larger than PIPEBD_MAX_BODY_BYTES"),
}
AUTH_ERRORS: ResponseDoc = {
    401: problem("PIPEBD_API_TOKENS is set and no or an unknown bearer token came"),
    403: problem("the token's scope is too low (`read` for a `submit` route)"),
}


def job_errors(not_found: str = "", invalid: str = "", conflict: str = "") -> ResponseDoc:
    """The error responses of a route under /jobs/{job_id}: 404 (no such job, or `not_found`), 422 (a bad
    parameter, or `invalid`), and 409 when `conflict` says when."""
    docs: ResponseDoc = {
        404: problem("no job has this id (it may have been deleted)" + (f", or {not_found}" if not_found else "")),
        422: problem("a path or query parameter is not valid" + (f", or {invalid}" if invalid else "")),
    }
    if conflict:
        docs[409] = problem(conflict)
    return docs


JOB_ERRORS = job_errors()


# --- the event stream ---------------------------------------------------------------------------------

EVENT_KINDS = ("state", "phase", "metrics", "log", "end")
EVENT_DATA = {  # the `data` of every event: a JSON object naming the job (app/api/sse.py builds them)
    "type": "object",
    "required": ["job_id"],
    "properties": {"job_id": {"type": "integer"}, "time": {"type": "number"}},
}
SSE_EVENT = {  # one event as a Server-Sent Events parser reads it
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "enum": list(EVENT_KINDS)},
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "resume after it with Last-Event-ID"},
        "retry": {"type": "integer", "minimum": 0},
        "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": EVENT_DATA},
    },
}
EVENT_STREAM = {  # OpenAPI 3.2's form for a sequential media type: `itemSchema` each event, `schema` the stream
    "description": "Server-Sent Events: `state`, `phase`, `metrics` and `log` events with ids, keep-alive"
    " comments, then `end` (without id) once the job has finished",
    "content": {"text/event-stream": {"schema": {"type": "array", "items": SSE_EVENT}, "itemSchema": SSE_EVENT}},
}


# --- metrics ------------------------------------------------------------------------------------------


class MetricPoint(BaseModel):
    """One chart point of one rank: a telemetry line, or a bucket of consecutive lines merged."""

    rank: int = Field(description="the rank that wrote the line(s)")
    seq: int = Field(description="the rank's line counter (1, 2, ...) of the last line in the point")
    epoch: int | None = Field(description="epoch of the last line")
    step: int | None = Field(description="training step of the last line")
    time: Number | None = Field(description="Unix time (seconds) of the last line")
    blocks: list[int] = Field(description="blocks the last line trained")
    loss: dict[str, Number] = Field(description="loss per block (keyed by block index): the mean over the lines")
    loss_min: dict[str, Number] = Field(description="lowest loss per block over the lines (the loss itself for one)")
    loss_max: dict[str, Number] = Field(description="highest loss per block over the lines (the loss itself for one)")
    phases: dict[str, Number] = Field(
        description="seconds per phase of a step (data, recv_wait, teacher, send, student, allreduce, barrier,"
        " optim): the mean over the lines"
    )
    samples: Number | None = Field(description="rows of the batch per line (mean over the lines)")
    peak_mem: int | None = Field(description="peak memory in bytes (CUDA max allocated, or peak RSS on CPU): maximum")
    cur_mem: int | None = Field(
        default=None,
        description="memory in use in bytes (CUDA allocated, or RSS on CPU): maximum; absent from points of rollups"
        " stored before it was recorded",
    )
    gpu_util: Number | None = Field(
        default=None,
        description="GPU utilisation in percent (NVML), mean over the lines that have it; null on CPU ranks,"
        " absent from points of rollups stored before it was recorded",
    )
    acc: Number | None = Field(
        None, description="finetune: the train accuracy of the batch the line saw (mean over the point's lines)"
    )
    count: int = Field(description="telemetry lines the point stands for (1: not downsampled)")


class Evaluation(BaseModel):
    """A finetune evaluation: top-1 of the whole network on the eval split at an epoch's end."""

    epoch: int = Field(description="epochs done when it was measured")
    step: int = Field(description="the last training step before it")
    top1: Number | None = Field(
        description="top-1 accuracy, 0 to 1 (null where the data has no labels, and for a language model)"
    )
    perplexity: Number | None = Field(
        default=None, description="a language model's held-out perplexity (null for a classifier)"
    )


class MetricsPage(BaseModel):
    """A job's telemetry of one phase for charts: at most `max_points` points per rank, in rank then line
    order, and (finetune) its evaluations."""

    job_id: int = Field(description="the job")
    phase: str = Field(description="the phase the lines belong to: distill or finetune")
    evals: list[Evaluation] = Field(description="finetune: top-1 at each evaluation, in order; distill: empty")
    total: int = Field(description="telemetry lines the points stand for")
    downsampled: bool = Field(description="true when there are fewer points than lines")
    max_points: int = Field(description="points per rank at most, as asked")
    points: list[MetricPoint] = Field(description="per rank (ascending), in line order")


# --- logs ---------------------------------------------------------------------------------------------


class LogChunk(BaseModel):
    """A chunk of a log file, read from a byte offset; poll again from `next_offset` to follow it."""

    job_id: int = Field(description="the job")
    phase: str = Field(description="the phase whose log this is: profile, distill, finalize, ...")
    rank: int | None = Field(description="the rank whose log this is; null for the launcher (torchrun) log")
    node: int | None = Field(None, description="whose launcher log this is: node 0, 1, ...; null for a rank's log")
    file: str = Field(
        description="the log's path in the run directory: `logs/<phase>/launcher.log` (node 0),"
        " `.../launcher-node-<k>.log` (node k of a job on several nodes) or `.../rank-<r>.log`"
    )
    offset: int = Field(description="byte offset the chunk starts at")
    next_offset: int = Field(description="byte offset after the chunk: the `offset` of the next call")
    size: int = Field(description="the file's size in bytes now (0 before it exists)")
    text: str = Field(description="the chunk's bytes as UTF-8 (bytes that are not UTF-8 replaced by U+FFFD)")


# --- artifacts ----------------------------------------------------------------------------------------


class ArtifactEntry(BaseModel):
    """One artifact that can be downloaded now."""

    name: str = Field(description="its name, e.g. `student.pt`, `plan.json`, `metrics.csv`")
    media_type: str = Field(description="the Content-Type of the download")
    size: int | None = Field(description="size in bytes; null for one generated on download (metrics.csv)")
    description: str = Field(description="what it holds")
    url: str = Field(description="the path to download it from")
    sha256_url: str | None = Field(
        default=None,
        description="a folder's archive (`<folder>.tar`, `<folder>.zip`): the path of its sha256 (`sha256sum` line)",
    )


class ArtifactList(BaseModel):
    """What a job has to download now; files appear as the job writes them (weights at the end)."""

    job_id: int = Field(description="the job")
    state: JobState = Field(description="the job's state now")
    data: list[ArtifactEntry] = Field(description="the artifacts, files first, then metrics.csv once there are lines")


# --- plan ---------------------------------------------------------------------------------------------


class PlanStage(BaseModel):
    """A pipeline stage: blocks [start, stop), replicated on `ranks`, each replica with its rows."""

    model_config = ConfigDict(extra="allow")

    start: int = Field(description="first block of the stage")
    stop: int = Field(description="block after the stage's last one")
    replicas: int = Field(description="ranks running the stage")
    ranks: list[int] = Field(description="those ranks, consecutive")
    rows: list[list[int]] = Field(description="per replica, its [start, stop) rows of the global batch")


class PlanRoute(BaseModel):
    """Rows [start, stop) of the batch's activations sent from rank `src` to rank `dst` at a stage boundary."""

    model_config = ConfigDict(extra="allow")

    src: int = Field(description="producing rank")
    dst: int = Field(description="consuming rank")
    boundary: int = Field(description="the block whose input the activations are")
    start: int = Field(description="first row")
    stop: int = Field(description="row after the last")


class PlanRank(BaseModel):
    """What one rank does, in words a dashboard can show."""

    model_config = ConfigDict(extra="allow")

    rank: int = Field(description="the rank")
    blocks: list[int] = Field(description="blocks it trains")
    rows: list[int] = Field(description="[start, stop) rows of the global batch it works on")
    stage: int | None = Field(default=None, description="its stage (pipeline modes only)")
    role: str = Field(description="`stage`, `replica`, `own blocks` (ls) or `all blocks in turn` (dp)")


class PlanStream(BaseModel):
    """A range of sample indices with its own seeded batch order."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="`weights` or `arch`")
    first: int = Field(description="first sample index")
    count: int = Field(description="samples in the range")


class PlanStreams(BaseModel):
    """The sample ranges a job draws its batches from."""

    model_config = ConfigDict(extra="allow")

    weights: PlanStream = Field(description="the batches of the weight updates")
    arch: PlanStream | None = Field(description="NAS: the held-out batches of the architecture updates; null otherwise")


class PlanSearch(BaseModel):
    """When a NAS job's architecture updates run: after each `every`-th weight step from step `from_step`."""

    model_config = ConfigDict(extra="allow")

    from_step: int = Field(description="the first weight step followed by an architecture update")
    every: int = Field(description="weight steps between architecture updates")


class PlanEstimates(BaseModel):
    """The probe's per-block numbers, per sample."""

    model_config = ConfigDict(extra="allow")

    shapes: list[list[int]] = Field(description="activation shape at each block boundary")
    teacher_flops: list[Number] = Field(description="each teacher block's forward FLOPs")
    student_flops: list[Number] = Field(description="each student block's forward FLOPs")
    student_params: list[int] = Field(description="each student block's parameters")
    teacher_params: list[int] = Field(description="each teacher block's parameters")


class PlanStageSpan(BaseModel):
    """A stage as the planner ranks it: blocks [start, stop) on `replicas` ranks."""

    model_config = ConfigDict(extra="allow")

    start: int = Field(description="first block of the stage")
    stop: int = Field(description="block after the stage's last one")
    replicas: int = Field(description="ranks running the stage")


class PlanStageParts(BaseModel):
    """What one stage's predicted step is made of, in seconds."""

    model_config = ConfigDict(extra="allow")

    input_s: Number = Field(description="receiving or loading its input")
    compute_s: Number = Field(description="teacher and student forward and backward")
    allreduce_s: Number = Field(description="averaging the gradients of its replicas")
    overhead_s: Number = Field(description="what a task costs beyond these (calibrated)")


class PlanAlternative(BaseModel):
    """One plan of the planner's ranking."""

    model_config = ConfigDict(extra="allow")

    stages: list[PlanStageSpan] = Field(description="its stages in order")
    step_s: Number = Field(description="its simulated seconds per step")
    bottleneck_stage: int | None = Field(description="the stage that bounds its step; null where none does")
    stage_s: list[Number] = Field(description="each stage's seconds per step")
    stage_parts: list[PlanStageParts] = Field(description="what each stage's seconds are made of")
    memory_bytes: list[int] = Field(description="each stage's peak memory per rank")


class PlanSegment(BaseModel):
    """One span of simulated time on one rank."""

    model_config = ConfigDict(extra="allow")

    rank: int = Field(description="the rank")
    kind: str = Field(description="`data`, `recv_wait`, `recv`, `teacher`, `student`, `allreduce` or `barrier`")
    block: int | None = Field(description="the block it works on; null for data loading and barriers")
    step: int = Field(description="the optimiser step")
    start: Number = Field(description="seconds from the simulation's start")
    end: Number = Field(description="seconds from the simulation's start")
    round: str = Field(default="weights", description="`weights`, or `arch` for a NAS architecture update")


class PlanTimeline(BaseModel):
    """A simulated run of a few steps: its step time and every segment."""

    model_config = ConfigDict(extra="allow")

    step_s: Number = Field(description="simulated seconds per step")
    segments: list[PlanSegment] = Field(description="every span of simulated time")


class PlanNoisyMeasurement(BaseModel):
    """A profile's measurement whose trials still disagree after re-measuring."""

    model_config = ConfigDict(extra="allow")

    what: str = Field(description="`block <i> <teacher|student|...>` or `data loading`")
    block: int | None = Field(description="the block; null for data loading")
    batch: int = Field(description="the batch size it was measured at")
    spread: Number = Field(description="(p90 - p10) / median of its trials")
    remeasured: int = Field(description="times the profiler measured it again")


class PlanCalibrationSource(BaseModel):
    """The run whose measured block times a profile's costs carry."""

    model_config = ConfigDict(extra="allow")

    run: str = Field(description="the run directory's name")
    steps: list[int] = Field(description="[first, last] step measured")
    stages: list[PlanStageSpan] | None = Field(default=None, description="plan.json's stages while they were measured")
    at: Number = Field(description="when it was computed (seconds since the epoch)")


class PlanTrust(BaseModel):
    """How far the profile behind the predictions can be trusted (docs/planning.md)."""

    model_config = ConfigDict(extra="allow")

    trusted: bool = Field(description="no flags")
    flags: list[str] = Field(description="`noisy`, `busy`, `stale`")
    messages: list[str] = Field(description="one per flag, then what else is known")
    noisy: list[PlanNoisyMeasurement] = Field(description="measurements whose trials disagree, widest first")
    other_cpu_cores: Number | None = Field(
        description="other processes' CPU use while it was measured, in cores; null: not recorded"
    )
    age_s: Number | None = Field(description="seconds since it was measured; null: not recorded")
    calibrated_from: PlanCalibrationSource | None = Field(description="the run whose block times the costs carry")


class Plan(BaseModel):
    """The resolved plan (plan.json): stages, routes, what each rank runs, shapes, cost estimates, and
    predictions when the job was profiled. Keys not listed here are passed through as they are."""

    model_config = ConfigDict(extra="allow")

    format_version: int = Field(description="the version of plan.json's format (PipeBD refuses another where it runs)")
    mode: str = Field(description="the schedule: `tr`, `tr_dpu`, `ir`, `hybrid`, `ls` or `dp`")
    nproc: int = Field(description="ranks")
    num_blocks: int = Field(description="blocks of the workload")
    batch_size: int = Field(description="rows of the global batch")
    stages: list[PlanStage] = Field(description="pipeline stages in order; empty for ls and dp")
    routes: list[PlanRoute] = Field(description="activation transfers between stages; empty for ls and dp")
    assignment: list[list[int]] = Field(description="ls: the blocks of each rank; empty otherwise")
    ranks: list[PlanRank] = Field(description="what each rank runs, by rank")
    block_names: list[str] | None = Field(default=None, description="a name per block")
    shapes: list[list[int]] | None = Field(
        default=None, description="activation shape (one sample) at each block boundary"
    )
    num_samples: int | None = Field(default=None, description="training samples per epoch")
    steps_per_epoch: int | None = Field(default=None, description="optimiser steps per epoch")
    total_steps: int | None = Field(default=None, description="optimiser steps of the job")
    streams: PlanStreams | None = Field(
        default=None, description="the sample ranges of the `weights` stream and, for NAS, the `arch` stream"
    )
    search: PlanSearch | None = Field(
        default=None, description="NAS only: `from_step` and `every` of the architecture updates; null otherwise"
    )
    estimates: PlanEstimates | None = Field(
        default=None, description="the probe's per-block FLOPs and parameter counts of teachers and students"
    )
    warnings: list[str] | None = Field(default=None, description="what the workload factory warned about")
    profile_trust: PlanTrust | None = Field(
        default=None, description="profiled jobs: how far the profile behind the predictions can be trusted"
    )
    predicted_step_s: Number | None = Field(default=None, description="profiled jobs: simulated seconds per step")
    ideal_step_s: Number | None = Field(default=None, description="profiled jobs: the lower bound on a step")
    mode_step_s: dict[str, Number] | None = Field(
        default=None, description="profiled jobs: simulated seconds per step of each mode"
    )
    alternatives: list[PlanAlternative] | None = Field(
        default=None, description="profiled jobs: the best plans found, ranked (stages, step_s, memory_bytes, ...)"
    )
    plans_considered: int | None = Field(default=None, description="profiled jobs: plans that fit in memory")
    stages_rejected_for_memory: int | None = Field(
        default=None, description="profiled jobs: stage choices refused because they would not fit"
    )
    simulation: dict[str, PlanTimeline] | None = Field(
        default=None, description="profiled jobs: simulated timelines (`step_s`, `segments`) per mode and `chosen`"
    )


# --- health -------------------------------------------------------------------------------------------


class Health(BaseModel):
    """Whether the database and the broker answer."""

    status: Literal["ok"] = Field(description="`ok`: both answer (otherwise the answer is a 503 problem)")
    database: Literal["ok"] = Field(description="`ok`: the database answers")
    broker: Literal["ok"] = Field(description="`ok`: the broker answers")


# --- jobs ---------------------------------------------------------------------------------------------


def iso(value: float | None) -> str | None:
    return None if value is None else iso_utc(value)


class PhaseState(BaseModel):
    """One phase of a job (pipebd_core.job.phases): where it stands and how it ended."""

    name: str = Field(description="profile, plan, distill or finalize (in that order; later engines add more)")
    runs: str = Field(description="what it runs: `torchrun` (a process per rank), `process` (one) or `local`")
    state: str = Field(description="pending, running or ended")
    outcome: str | None = Field(description="once ended: succeeded, failed, cancelled or skipped")
    reason: str | None = Field(description="why it failed or was cancelled (a termination reason), or was skipped")
    started_at: float | None = Field(description="when it started (ISO 8601, UTC)")
    ended_at: float | None = Field(description="when it ended (ISO 8601, UTC)")
    outputs: list[str] = Field(description="what it writes in the run directory")

    @field_serializer("started_at", "ended_at")
    def _as_iso(self, value: float | None) -> str | None:
        return iso(value)


class AttemptPublic(BaseModel):
    """One run of a job on a worker (app/core/attempts.py)."""

    number: int = Field(description="1 for the first run, then one more for each resume or restart")
    worker: str | None = Field(description="The worker that ran it")
    started_at: float = Field(description="When the worker claimed the job (ISO 8601, UTC)")
    ended_at: float | None = Field(description="When the job left that worker; null while it runs there")
    outcome: str | None = Field(
        description="What the job became: succeeded, failed, cancelled, paused, requeued (it went back to the"
        " queue to resume from its checkpoints after an infrastructure fault) or preempted (its worker was told to"
        " stop: the ranks checkpointed at a step boundary and the job went back to the queue, no restart used) or"
        " grown (an elastic job below its max_nodes took a larger gang: checkpointed and requeued the same way)"
    )
    reason: str | None = Field(description="Why (a termination reason: worker_lost, rank_killed, user_paused, ...)")
    resumed_from: list[int] | None = Field(
        description="Per block, the step it continued from (0: from the start); null when nothing had run before"
    )
    hosts: list[str] | None = Field(
        None, description="The host id of each node it ran on, node 0 first (rank r ran on node r // nproc)"
    )
    nodes: int | None = Field(None, description="The nodes it ran on (an elastic job's may change between attempts)")
    nproc: int | None = Field(None, description="The ranks on each of those nodes")
    plan: str | None = Field(None, description="Its plan's cut: each stage's blocks, e.g. `0-6 | 7-12`")
    note: str | None = Field(
        None,
        description="How it ran differently from the attempt before: 'resumed on 1 node x 2 ranks (was 2 x 2),"
        " plan 0-6 | 7-12' (an elastic job that lost or gained nodes); null when on the same shape",
    )

    @field_serializer("started_at", "ended_at")
    def _as_iso(self, value: float | None) -> str | None:
        return iso(value)


class JobChange(BaseModel):
    """What PATCH /api/v1/jobs/{id} changes: its priority, for its next claim."""

    model_config = ConfigDict(extra="forbid", strict=True)  # `true` is not a priority (schemathesis)
    priority: int = Field(ge=-1000, le=1000, description="Higher runs first, as the spec's priority")


class JobPublic(BaseModel):
    """A job in lists: its state, current phase and progress, never its spec."""

    id: int = Field(description="The job's id, as in /api/v1/jobs/{id}")
    name: str = Field(description="The spec's name")
    state: JobState = Field(
        description="where it is in its lifecycle (succeeded, failed and cancelled are final; failed, cancelled"
        " and paused jobs may be resumed)"
    )
    priority: int = Field(description="Higher runs first; first come first within a priority")
    nproc: int = Field(description="Ranks the job runs on each node: one per GPU, or CPU processes")
    nodes: int = Field(1, description="Machines the job spans (docs/multinode.md): nodes x nproc ranks in all")
    queue: str = Field(description="The broker queue it waits in: workers with at least nproc devices read it")
    created_at: float = Field(description="When it was submitted (ISO 8601, UTC)")
    updated_at: float = Field(description="Its last state or progress change (ISO 8601, UTC)")
    started_at: float | None = Field(description="When a worker claimed it (ISO 8601, UTC)")
    finished_at: float | None = Field(description="When it reached a final state (ISO 8601, UTC)")
    phase: str | None = Field(description="The phase running now, or the one that ran last; null before any")
    phase_progress: float = Field(description="Fraction of the current phase done, 0 to 1")
    progress: float = Field(description="Fraction of the whole job done, 0 to 1 (phases weighted by their work)")
    samples_per_s: float | None = Field(
        description="Samples through every block per second over each rank's latest tasks (docs/api.md: figures)"
    )
    step_s: float | None = Field(
        None,
        description="The measured step: seconds one global batch takes through every block (batch / samples_per_s)",
    )
    busy_share: float | None = Field(
        None,
        description="The busiest rank's share of its time not waiting for other ranks nor idle between tasks, 0 to 1"
        " (distillation only)",
    )
    peak_mem: int | None = Field(None, description="The largest peak memory any rank reported, in bytes")
    termination_reason: str | None = Field(
        description="Why it ended: user_cancelled, exit_code, rank_error, oom, timeout, worker_lost or launch_error"
    )
    worker: str | None = Field(description="The worker that runs or ran it")
    host: str | None = Field(None, description="That worker's host id (on several nodes: node 0's)")
    sweep_id: int | None = Field(None, description="The sweep it is a child of (/api/v1/sweeps/{id}); null for none")

    @field_serializer("created_at", "updated_at", "started_at", "finished_at")
    def _as_iso(self, value: float | None) -> str | None:
        return iso(value)


class GangSeatPublic(BaseModel):
    """One host's part in a job on several nodes (docs/multinode.md)."""

    node: int = Field(description="Its node number: 0 runs the phases and hosts the rendezvous")
    host: str = Field(description="The worker's host id (`pipebd worker --host-id`)")
    worker: str = Field(description="The worker's name")
    endpoint: str | None = Field(None, description="Node 0's address, where the other nodes reach it")
    heartbeat_at: float | None = Field(None, description="The worker's last word while the job runs (ISO 8601, UTC)")

    @field_serializer("heartbeat_at")
    def _heartbeat_iso(self, value: float | None) -> str | None:
        return iso(value)


def job_fields(job: Job) -> JsonObject:
    """A job row's fields as JobPublic and the models built on it take them, with its measured step
    (app/core/figures.py)."""
    return {**job.model_dump(), "step_s": step_of(job)}


class JobDetail(JobPublic):
    """One job: everything in the list entry plus its spec, plan summary, error and why it waits."""

    spec: JsonObject = Field(description="The spec as stored, with its defaults filled in (docs/spec.md)")
    plan_summary: PlanSummary | None = Field(
        description="Mode, stages and predicted step time of the resolved plan; the whole plan is at .../plan"
    )
    error: str | None = Field(description="The failing rank's traceback, or what else went wrong")
    exit_code: int | None = Field(description="torchrun's exit code")
    heartbeat_at: float | None = Field(description="The worker's last heartbeat for this job (ISO 8601, UTC)")
    waiting_reason: str | None = Field(None, description="For a queued job: what it waits for")
    phases: list[PhaseState] = Field(
        default_factory=list, description="Every phase of the job in order; empty until a worker prepared it"
    )
    max_restarts: int = Field(description="Automatic restarts after infrastructure faults it may have in all")
    restarts: int = Field(description="Automatic restarts it has had (a resume starts the count again)")
    attempts: list[AttemptPublic] = Field(default_factory=list, description="Each run of the job, oldest first")
    gang: list[GangSeatPublic] = Field(
        default_factory=list,
        description="A job on several nodes: the hosts seated in its gang now, node 0 first (empty otherwise)",
    )
    queue_position: int | None = Field(
        None,
        description="For a queued job: how many queued jobs start before it if none ends meanwhile (weighted fair"
        " share between tokens, priority then age within one: docs/quotas.md); `waiting_reason` explains it",
    )

    @field_serializer("heartbeat_at")
    def _heartbeat_iso(self, value: float | None) -> str | None:
        return iso(value)


class JobsPublic(BaseModel):
    """A page of jobs, newest first."""

    data: list[JobPublic] = Field(description="At most `limit` jobs")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page; null on the last page")


# --- quota --------------------------------------------------------------------------------------------


class QuotaPublic(BaseModel):
    """A token's fair-share weight, quotas and use now (docs/quotas.md)."""

    name: str = Field(description="how reasons name the tenant: the operator's name, else its fingerprint's start")
    tenant: str = Field(description="the token's fingerprint, as jobs record who submitted them (empty: no token)")
    weight: float = Field(description="its share of the running devices against the other tokens' weights")
    max_running: int | None = Field(description="its jobs launched at once at most; more wait queued (null: none)")
    device_hours: float | None = Field(
        description="ranks x hours its jobs may use per window; past it submissions get 429 (null: none)"
    )
    window_h: float = Field(description="the rolling window of `device_hours`, in hours")
    running_jobs: int = Field(description="its jobs launched now (starting, running, pausing, cancelling)")
    running_devices: int = Field(description="the ranks those jobs hold: its use in the fair-share order")
    used_device_hours: float = Field(description="ranks x hours of its jobs in the window (0 without a token)")


# --- sweeps -------------------------------------------------------------------------------------------


class SweepProgress(BaseModel):
    """How far a sweep's children are."""

    jobs: dict[str, int] = Field(description="children per job state (every state named, 0 included)")
    total: int = Field(description="children in all")
    finished: int = Field(description="children in a final state (succeeded, failed, cancelled)")
    fraction: float = Field(description="0 to 1: the mean of the children's progress, an ended child counting as 1")


class SweepBest(BaseModel):
    """The child with the best objective value so far."""

    job_id: int = Field(description="the child job's id")
    value: Number = Field(description="its value of the objective's metric")


class SweepPublic(BaseModel):
    """A sweep in lists: its search, state, progress and best child, never its children."""

    id: int = Field(description="the sweep's id, as in /api/v1/sweeps/{id}")
    name: str = Field(description="its name (by default the base spec's)")
    state: SweepState = Field(
        description="from its children: queued (all queued), running (one queued or launched after others began),"
        " paused (none queued or launched, one paused), then, once every child ended: failed (one failed),"
        " cancelled (one cancelled) or succeeded"
    )
    created_at: float = Field(description="when it was submitted (ISO 8601, UTC)")
    search: JsonObject = Field(description="the search as sent: `grid`, `list` or `random`")
    max_parallel: int | None = Field(description="children launched at once at most; null: no bound")
    objective: Objective | None = Field(description="`metric` and `goal` (minimize or maximize); null: none")
    progress: SweepProgress = Field(description="the children per state and the overall fraction")
    best: SweepBest | None = Field(description="the child with the best objective value so far; null before any")

    @field_serializer("created_at")
    def _as_iso(self, value: float) -> str | None:
        return iso(value)


class SweepChild(JobPublic):
    """A child of a sweep: the job, the overrides that made it, and its objective value."""

    overrides: JsonObject = Field(description="dotted field path -> the value this child has there")
    objective_value: Number | None = Field(description="its value of the objective's metric now; null: none yet")


class SweepDetail(SweepPublic):
    """One sweep: its base spec and every child, oldest first."""

    spec: JsonObject = Field(description="the base spec as sent")
    jobs: list[SweepChild] = Field(description="its child jobs in order of creation")


class SweepsPublic(BaseModel):
    """Sweeps, newest first."""

    data: list[SweepPublic] = Field(description="at most `limit` sweeps")
