"""A job's registered models as versions in MLflow's Model Registry (PIPEBD_MLFLOW_URI), each linked to the
job's run. Called by the job's MLflow export (worker/tracking.py) once the run has ended, and by the API for a
search chosen again (`register_choice`: the choice's version links to the search job's run, found by its tags).

A model of kind K from job J named N is a version of the registered model `N-K` (created on first use), its
source the run's documents (`runs:/<run id>/pipebd`: MLflow refuses a local path outside the run's
artifacts, and weights of hundreds of MB are not copied), tagged `pipebd.model_id`, `pipebd.job_id`,
`pipebd.kind`, `pipebd.parent_id`, `pipebd.content_hash` and `pipebd.files` (the files with their sha256, in
the run directory `pipebd.run_dir`). `registered_model.mlflow_version` records `name/version`: a model that
has one is not sent again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from typing import TYPE_CHECKING

from app.core.database import session_scope
from app.core.settings import Settings
from app.core.tables import Job, RegisteredModel

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

MAX_TAG_CHARS = 5000  # MLflow's longest tag value
JOB_TAG, RUN_DIR_TAG = "pipebd.job_id", "pipebd.run_dir"  # how a job's run is found again (worker/tracking.py)
log = logging.getLogger("pipebd.api")


def mlflow_name(job_name: str, kind: str) -> str:
    """`<job name>-<kind>`, in the characters MLflow's registry accepts everywhere."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{job_name}-{kind}").strip("-") or kind


def register_versions(client: MlflowClient, database: str, run_id: str, model_ids: list[int]) -> None:
    """Add each model not yet in MLflow's registry as a version linked to `run_id`; record where it went."""
    from mlflow.exceptions import MlflowException

    for model_id in model_ids:
        with session_scope(database) as session:
            model = session.get(RegisteredModel, model_id)
            if model is None or model.mlflow_version is not None:
                continue
            job = session.get(Job, model.job_id)
            name = mlflow_name(job.name if job is not None else f"job-{model.job_id}", model.kind)
            tags = {
                "pipebd.model_id": str(model.id),
                "pipebd.job_id": str(model.job_id),
                "pipebd.kind": model.kind,
                "pipebd.parent_id": "" if model.parent_id is None else str(model.parent_id),
                "pipebd.content_hash": model.content_hash,
                "pipebd.run_dir": model.run_dir,
                "pipebd.files": json.dumps(model.files)[:MAX_TAG_CHARS],
            }
            with contextlib.suppress(MlflowException):  # it exists already (an earlier job's, another worker's)
                client.create_registered_model(name)
            version = client.create_model_version(name, f"runs:/{run_id}/pipebd", run_id=run_id, tags=tags)
            model.mlflow_version = f"{name}/{version.version}"
            session.add(model)


def register_choice(settings: Settings, job: Job, model_ids: list[int]) -> None:
    """Models of a search chosen again (kind chosen) as versions linked to the search job's MLflow run, as the
    job's own models are. Nothing without PIPEBD_MLFLOW_URI or where the job has no run there; a tracking server
    that fails leaves the models without a version (logged, `mlflow_version` stays null), never the choice."""
    if settings.mlflow_uri is None or not model_ids:
        return
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(settings.mlflow_timeout_s))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # a request that fails is not held up retrying
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=settings.mlflow_uri)
        experiment = client.get_experiment_by_name(settings.mlflow_experiment)
        if experiment is None:
            return
        runs = client.search_runs([experiment.experiment_id], f"tags.`{JOB_TAG}` = '{job.id}'")
        found = [run for run in runs if run.data.tags.get(RUN_DIR_TAG) == job.run_dir]
        if found:
            register_versions(client, settings.database, found[0].info.run_id, model_ids)
    except Exception as error:  # the server is down or refuses: the choice stands without its version
        log.warning("job %s: registering chosen models %s in MLflow failed (%s)", job.id, model_ids, error)
