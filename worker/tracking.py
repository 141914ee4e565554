"""A job as an MLflow run (PIPEBD_MLFLOW_URI): opened when a worker starts the job, brought up to date on
every phase change and when the job ends, all by a thread of its own, so that neither a slow nor a down
tracking server holds up or fails the job.

What the run holds:

    tags       pipebd.job_id and pipebd.run_dir (how a resumed job finds its run again), pipebd.state,
               pipebd.phase.<phase> (its outcome, and why), pipebd.exported.<phase> (the newest telemetry
               point sent), mlflow.parentRunId (a child of a parent run, e.g. a sweep's), and a note
               (mlflow.note.content) listing the job's outputs with their download links
    params     the resolved spec, flattened to dotted paths (train.lr, schedule.mode, workload.kind, ...)
    metrics    each training phase's series (pipebd_core/tracking/scalars.py: loss per block and step,
               samples/s, memory per rank, finetune loss, accuracy and top-1) once the phase ends;
               phase/<phase>/duration_s; job/<figure> (samples_per_s, step_s, busy_share, peak_mem: the
               figures the dashboard shows, app/core/figures.py) as a phase ends; summary/<field> from
               summary.json (final losses, top-1, ...)
    artifacts  the job's small documents (summary.json, spec.json, plan.json, ...) under pipebd/, once it ends
    status     RUNNING while a worker runs it, SCHEDULED when it waits (queued again, paused), FINISHED,
               FAILED or KILLED (cancelled) when it ends
    models     once a succeeded job's models are registered (app/core/registry.py), each one is also a version
               of the registered model `<job name>-<kind>` in MLflow's Model Registry, its source the run
               (`runs:/<run id>/pipebd`), tagged with its PipeBD id, files and content hash; the row records
               `name/version`, so a retried job registers none twice (app/core/model_versions.py)

A sync compares the run with the run directory and sends what is missing, so a sync that failed (the
server was down) is simply made again at the next phase change; the last one, when the job ends, is
tried `mlflow_retries` more times, backing off, then given up with a warning in the worker's log.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from app.core.database import session_scope
from app.core.figures import step_of
from app.core.json_types import JsonObject
from app.core.model_versions import JOB_TAG, RUN_DIR_TAG
from app.core.settings import Settings
from app.core.states import CANCELLED, FAILED, PAUSED, QUEUED, RUNNING, SUCCEEDED
from app.core.tables import Job
from pipebd_core.documents.phases import ENDED, TRAINING_PHASES, PhaseRecord
from pipebd_core.rundir import OUTPUTS, RunDir
from pipebd_core.tracking.scalars import Scalar, run_scalars

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger("pipebd.worker")

STATUS = {SUCCEEDED: "FINISHED", FAILED: "FAILED", CANCELLED: "KILLED", QUEUED: "SCHEDULED", PAUSED: "SCHEDULED"}
TERMINAL = ("FINISHED", "FAILED", "KILLED")
METRICS_PER_REQUEST = 1000  # MLflow's limit on one log_batch
PARAMS_PER_REQUEST = 100  # likewise
MAX_PARAM_CHARS = 6000  # MLflow's longest parameter value
DOCUMENTS = ("summary.json", "spec.json", "plan.json", "finetune_plan.json", "phases.json", "architecture.json")
BACKOFF_S = 1.0  # the last sync's first retry waits this long, each next one twice as long
PARENT_TAG = "mlflow.parentRunId"
SWEEP_TAG = "pipebd.sweep_id"  # a sweep's parent run
EXPORTED_TAG = "pipebd.exported."


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A JSON value as MLflow parameters: nested objects by dotted path, anything else as its JSON text."""
    if isinstance(value, dict) and value:
        flat: dict[str, str] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}{key}."))
        return flat
    text = value if isinstance(value, str) else json.dumps(value)
    return {prefix.rstrip("."): text[:MAX_PARAM_CHARS]}


def summary_metrics(summary: JsonObject) -> dict[str, float]:
    """The numbers of summary.json as `summary/<dotted path>` metrics (top-1s, final losses, phase seconds)."""
    numbers = {}
    for key, text in flatten({k: v for k, v in summary.items() if k != "format_version"}).items():
        try:
            value = float(text)
        except ValueError:  # a name, a list, a note: not a metric
            continue
        if math.isfinite(value) and text not in ("true", "false"):
            numbers[f"summary/{key.replace('.', '/')}"] = value
    return numbers


def job_metrics(database: str, job_id: int) -> dict[str, float]:
    """The job's figures as its row holds them (app/core/figures.py, the ones every page shows), as
    `job/<figure>` metrics: samples_per_s, step_s, busy_share, peak_mem (bytes); those not known left out."""
    with session_scope(database) as session:
        job = session.get(Job, job_id)
        if job is None:
            return {}
        values = {
            "samples_per_s": job.samples_per_s,
            "step_s": step_of(job),
            "busy_share": job.busy_share,
            "peak_mem": job.peak_mem,
        }
    return {f"job/{name}": float(value) for name, value in values.items() if value is not None}


def phase_changes(ended: list[PhaseRecord]) -> tuple[dict[str, float], dict[str, str]]:
    """Metrics and tags of ended phases: each one's duration, and its outcome with the reason."""
    metrics = {f"phase/{record.name}/duration_s": record.duration_s or 0.0 for record in ended}
    tags = {
        f"pipebd.phase.{record.name}": f"{record.outcome}" + (f": {record.reason}" if record.reason else "")
        for record in ended
    }
    return metrics, tags


def outputs_note(run_dir: RunDir, job_id: int, public_url: str | None) -> str:
    """The run's description: the job's outputs, each linked to its download where the API's URL is known."""
    lines = [f"PipeBD job {job_id}, run directory `{run_dir.root}`.", "", "| output | what it is |", "|---|---|"]
    for output in OUTPUTS:
        if not run_dir.output(output.name).exists():
            continue
        name = output.name
        if public_url:
            name = f"[{name}]({public_url.rstrip('/')}/api/v1/jobs/{job_id}/artifacts/{name})"
        lines.append(f"| {name} | {output.description} |")
    return "\n".join(lines)


class MlflowExport:
    """One job's MLflow run, kept up to date by a thread of its own: `update` on every phase change, `close`
    when the job ends (it waits at most `mlflow_wait_s`). `sync` is the whole work, callable directly."""

    def __init__(self, settings: Settings, job_id: int, run_dir: RunDir, parent: dict[str, str] | None = None):
        assert settings.mlflow_uri is not None
        self.uri, self.experiment = settings.mlflow_uri, settings.mlflow_experiment
        self.retries, self.wait_s = settings.mlflow_retries, settings.mlflow_wait_s
        self.public_url = settings.public_url
        # MLflow's client reads these at each request; it does not retry (a sync is made again instead)
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(settings.mlflow_timeout_s)
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        self.job_id, self.run_dir, self.parent = job_id, run_dir, parent
        self.state = RUNNING
        self.final = False
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"mlflow-job-{job_id}", daemon=True)
        self.run_id: str | None = None
        self.exported: dict[str, float] = {}  # per training phase: the time of the newest point sent
        self.phase_ends: dict[str, float | None] = {}  # per phase: the end whose duration and outcome were sent
        self.series_ends: dict[str, float | None] = {}  # per training phase: the end whose series were sent
        self.summary_mtime: float | None = None
        self.documents_sent = False
        self.failing = False
        self.database = settings.database
        self.models: list[int] = []  # registered models of the job to add to MLflow's registry at the end

    def start(self) -> MlflowExport:
        self.thread.start()
        self.update()
        return self

    def update(self) -> None:
        """Bring the run up to date soon (the caller never waits)."""
        self.wake.set()

    def register_models(self, model_ids: list[int]) -> None:
        """The job's registered models: the last sync adds each one to MLflow's Model Registry."""
        self.models = list(model_ids)

    def close(self, state: str) -> None:
        """The job ended this run in `state`: a last sync (retried), waited for at most `mlflow_wait_s`."""
        self.state, self.final = state, True
        self.wake.set()
        self.thread.join(self.wait_s)
        if self.thread.is_alive():
            log.warning("job %s: its MLflow run is still being updated; the worker goes on", self.job_id)

    def _loop(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            final = self.final
            tries = 1 + (self.retries if final else 0)
            for attempt in range(tries):
                try:
                    self.sync()
                    break
                except Exception as error:  # whatever the server or the client raised: the job goes on
                    self._failed(error, last=final and attempt == tries - 1)
                    if attempt < tries - 1:
                        time.sleep(BACKOFF_S * 2**attempt)
            if final:
                return

    def _failed(self, error: Exception, last: bool) -> None:
        what = f"{type(error).__name__}: {str(error)[:300]}"
        if last:
            log.warning("job %s: MLflow export to %s given up: %s", self.job_id, self.uri, what)
        elif not self.failing:
            log.warning("job %s: MLflow export to %s failed (%s); made again later", self.job_id, self.uri, what)
        self.failing = True

    def sync(self) -> None:
        """Send the run what it lacks: open it (params, tags), the ended phases' series and durations, the
        summary, the documents once the job ended, and its status."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        run_id = self.run_id or self._open(client)
        records = self.run_dir.load_phases()
        self._send_series(client, run_id, records)
        ends = {record.name: record.ended_at for record in records if record.state == ENDED}
        ends = {name: end for name, end in ends.items() if self.phase_ends.get(name) != end}
        metrics, tags = phase_changes([record for record in records if record.name in ends])
        if ends:
            metrics.update(job_metrics(self.database, self.job_id))
        tags["pipebd.state"] = self.state
        tags["mlflow.note.content"] = outputs_note(self.run_dir, self.job_id, self.public_url)
        summary = self.run_dir.summary
        mtime = summary.stat().st_mtime if summary.exists() else None
        if mtime != self.summary_mtime:
            metrics.update(summary_metrics(self.run_dir.read_json(summary)))
        self._log(client, run_id, [(key, value, 0, time.time()) for key, value in metrics.items()], tags)
        self.phase_ends.update(ends)
        self.summary_mtime = mtime
        status = STATUS.get(self.state, "RUNNING")
        if self.final and status in TERMINAL and not self.documents_sent:
            for name in DOCUMENTS:
                if self.run_dir.output(name).exists():
                    client.log_artifact(run_id, str(self.run_dir.output(name)), artifact_path="pipebd")
            self.documents_sent = True
        if status in TERMINAL:
            client.set_terminated(run_id, status)
            if self.models:
                from app.core.model_versions import register_versions

                register_versions(client, self.database, run_id, self.models)
        else:
            client.update_run(run_id, status=status)
        self.failing = False

    def _open(self, client: MlflowClient) -> str:
        """The job's run: the one an earlier attempt opened (found by its tags), else a new one."""
        experiment = self._experiment(client)
        found = [
            run
            for run in client.search_runs([experiment], f"tags.`{JOB_TAG}` = '{self.job_id}'")
            if run.data.tags.get(RUN_DIR_TAG) == str(self.run_dir.root)
        ]
        if found:
            run = found[0]
            self.exported = {
                key.removeprefix(EXPORTED_TAG): float(value)
                for key, value in run.data.tags.items()
                if key.startswith(EXPORTED_TAG)
            }
        else:
            spec = self.run_dir.read_json(self.run_dir.spec)
            tags = {JOB_TAG: str(self.job_id), RUN_DIR_TAG: str(self.run_dir.root)}
            if self.parent is not None:
                tags[PARENT_TAG] = self._parent(client, experiment, self.parent)
            run = client.create_run(experiment, tags=tags, run_name=f"{spec.get('name', 'job')}-{self.job_id}")
            from mlflow.entities import Param

            params = [Param(key, value) for key, value in flatten(spec).items()]
            for start in range(0, len(params), PARAMS_PER_REQUEST):
                client.log_batch(run.info.run_id, params=params[start : start + PARAMS_PER_REQUEST])
        self.run_id = run.info.run_id
        return self.run_id

    def _experiment(self, client: MlflowClient) -> str:
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is not None:
            return str(experiment.experiment_id)
        try:
            return str(client.create_experiment(self.experiment))
        except Exception:  # another worker created it meanwhile
            experiment = client.get_experiment_by_name(self.experiment)
            if experiment is None:
                raise
            return str(experiment.experiment_id)

    @staticmethod
    def _parent(client: MlflowClient, experiment: str, tags: dict[str, str]) -> str:
        """The run tagged `tags` (a sweep's: {"pipebd.sweep_id": "3"}), opened by the first child that asks."""
        query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
        found = client.search_runs([experiment], query, max_results=1)
        if found:
            return str(found[0].info.run_id)
        return str(client.create_run(experiment, tags=tags).info.run_id)

    def _send_series(self, client: MlflowClient, run_id: str, records: list[PhaseRecord]) -> None:
        """Every point of each ended training phase newer than what was sent; then the newest sent, as a tag."""
        for record in records:
            ended = record.state == ENDED and self.series_ends.get(record.name) != record.ended_at
            if record.name not in TRAINING_PHASES or not ended:
                continue
            if not self.run_dir.metrics(0, record.name).parent.exists():
                continue
            sent = self.exported.get(record.name, -math.inf)
            fresh: list[Scalar] = [point for point in run_scalars(self.run_dir, record.name) if point.time > sent]
            if fresh:
                newest = max(point.time for point in fresh)
                points = [(point.tag, point.value, point.step, point.time) for point in fresh]
                self._log(client, run_id, points, {f"{EXPORTED_TAG}{record.name}": repr(newest)})
                self.exported[record.name] = newest
            self.series_ends[record.name] = record.ended_at

    @staticmethod
    def _log(
        client: MlflowClient, run_id: str, points: list[tuple[str, float, int, float]], tags: dict[str, str]
    ) -> None:
        """log_batch in requests MLflow accepts: (key, value, step, time in seconds) points, then the tags."""
        from mlflow.entities import Metric, RunTag

        metrics = [Metric(key, value, int(moment * 1000), step) for key, value, step, moment in points]
        for start in range(0, len(metrics), METRICS_PER_REQUEST):
            client.log_batch(run_id, metrics=metrics[start : start + METRICS_PER_REQUEST])
        run_tags = [RunTag(key, value) for key, value in tags.items()]
        for start in range(0, len(run_tags), PARAMS_PER_REQUEST):
            client.log_batch(run_id, tags=run_tags[start : start + PARAMS_PER_REQUEST])


def start_export(settings: Settings, job_id: int, run_dir: RunDir, sweep_id: int | None = None) -> MlflowExport | None:
    """The job's MLflow export, started (a sweep's child under the sweep's parent run); None without
    PIPEBD_MLFLOW_URI, or without MLflow installed (said)."""
    if settings.mlflow_uri is None:
        return None
    if importlib.util.find_spec("mlflow") is None:
        log.error("PIPEBD_MLFLOW_URI is set but MLflow is not installed: pip install 'pipebd[tracking]'")
        return None
    parent = None if sweep_id is None else {SWEEP_TAG: str(sweep_id)}
    return MlflowExport(settings, job_id, run_dir, parent).start()
