"""Registered models (app/core/registry.py): pages of them, one with its lineage, a spec that starts from one,
and a search chosen again for another budget. Plain Python: errors are this module's own, the API turns
them into problem details.

A spec starts from a registered model with `workload.teacher: {model: N}`: before the spec is validated,
`resolve_models` replaces it with the model's files, a path inside the runs folder (a Hugging Face model
directory where the model has one, else a trained classifier's `teacher.pt` as `teacher_weights`, with the
network its job trained; the spec's own `config` and `teacher_weights` are dropped: the model is the whole
teacher), and names that path as allowed beyond the data roots for this spec only. A directory
of PipeBD's own layers (a search's) is taken where its version is one this PipeBD reads back
(workloads/remote_format.py); the job builds it with PipeBD's own modeling code, without trust_remote_code.

Choosing again runs `python -m pipebd_core.distill.choose` in a child process (this process never imports
torch), bounded by `CHOOSE_TIMEOUT_S`, then registers the choice (kind chosen, parent: the search's model), in
MLflow's registry too where the server exports to one (app/core/model_versions.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from app.core.model_entries import FileEntry
from app.core.model_versions import register_choice
from app.core.registry import read_architecture, register_job
from app.core.settings import Settings
from app.core.states import SUCCEEDED
from app.core.tables import Job, RegisteredModel
from app.services.jobs import decode_cursor, encode_cursor
from app.services.preflight import REPO
from pipebd_core.documents.architecture import Architecture
from pipebd_core.rundir import OUTPUTS, RunDir
from pipebd_core.workloads.remote_format import is_pipebd_config, pipebd_config_problem

CHOOSE_TIMEOUT_S = 300.0  # choosing again loads the search's checkpoints and evaluates one network: seconds
LINEAGE_MAX = 1000  # models at most in one lineage answer (a chain, and the descendants breadth first)
ARTIFACTS = {output.name for output in OUTPUTS}  # a model file with one of these names downloads as an artifact
REFUSAL = "pipebd choose: "  # how the engine's command starts the message of a choice it refuses
BUDGET_OPTIONS = {"params": "--params", "kv_cache": "--kv-cache", "latency": "--latency"}


class ModelNotFound(Exception):
    """No registered model has this id."""


class ModelRefused(Exception):
    """A spec's reference to a registered model cannot be used: `loc` names the field."""

    def __init__(self, loc: list[str | int], message: str, value: Any) -> None:
        super().__init__(message)
        self.loc, self.message, self.value = loc, message, value


class ChooseConflict(Exception):
    """The job cannot be chosen from yet (not finished, no run directory): 409."""


class ChooseRefused(Exception):
    """The engine refused the choice (not a search, an infeasible budget: its message), or it overran: 422."""


# --- reading ------------------------------------------------------------------------------------------


def list_models(
    session: Session,
    *,
    limit: int,
    cursor: str | None,
    job_id: int | None = None,
    kind: str | None = None,
    parent_id: int | None = None,
) -> tuple[list[RegisteredModel], str | None]:
    """Newest first, `limit` at a time, filtered; the cursor is the id of the last model of the previous page."""
    query = select(RegisteredModel).order_by(col(RegisteredModel.id).desc()).limit(limit + 1)
    if job_id is not None:
        query = query.where(RegisteredModel.job_id == job_id)
    if kind is not None:
        query = query.where(RegisteredModel.kind == kind)
    if parent_id is not None:
        query = query.where(RegisteredModel.parent_id == parent_id)
    if cursor is not None:
        query = query.where(col(RegisteredModel.id) < decode_cursor(cursor, "model"))
    models = list(session.exec(query).all())
    more = len(models) > limit
    models = models[:limit]
    return models, (encode_cursor(models[-1].id, "model") if more and models[-1].id is not None else None)


def get_model(session: Session, model_id: int) -> RegisteredModel:
    model = session.get(RegisteredModel, model_id)
    if model is None:
        raise ModelNotFound(f"registered model {model_id} does not exist; GET /api/v1/models lists them")
    return model


@dataclass
class Lineage:
    model: RegisteredModel
    chain: list[RegisteredModel]  # from the root (a teacher, or a model made from an unregistered one) down to it
    descendants: list[RegisteredModel]  # every model made from it, directly or not, breadth first


def lineage(session: Session, model: RegisteredModel) -> Lineage:
    chain, seen = [model], {model.id}
    while chain[0].parent_id is not None and chain[0].parent_id not in seen and len(chain) < LINEAGE_MAX:
        parent = session.get(RegisteredModel, chain[0].parent_id)
        if parent is None:
            break
        chain.insert(0, parent)
        seen.add(parent.id)
    descendants: list[RegisteredModel] = []
    frontier = [model.id]
    while frontier and len(descendants) < LINEAGE_MAX:
        children = session.exec(
            select(RegisteredModel)
            .where(col(RegisteredModel.parent_id).in_(frontier))
            .order_by(col(RegisteredModel.id))
            .limit(LINEAGE_MAX)
        ).all()
        fresh = [child for child in children if child.id not in seen]
        seen.update(child.id for child in fresh)
        descendants += fresh
        frontier = [child.id for child in fresh]
    return Lineage(model, chain, descendants[:LINEAGE_MAX])


def missing_files(model: RegisteredModel) -> list[str]:
    """The model's files that are gone (its job deleted, its run directory moved)."""
    root = Path(model.run_dir)
    return [entry["path"] for entry in model.files if not (root / entry["path"]).is_file()]


def artifact_name(entry: FileEntry) -> str | None:
    """The artifact a model file downloads as (GET /jobs/{id}/artifacts/{name}), if it is a top-level output."""
    return entry["path"] if entry["path"] in ARTIFACTS else None


def architecture_of(model: RegisteredModel) -> Architecture | None:
    """A searched or chosen model's architecture.json (None: it has none, or it is gone or unreadable)."""
    for entry in model.files:
        if entry["path"].rsplit("/", 1)[-1] == "architecture.json":
            return read_architecture(Path(model.run_dir) / entry["path"])
    return None


# --- a spec starting from a registered model ----------------------------------------------------------


def model_folder(model: RegisteredModel) -> str | None:
    """The model's Hugging Face directory (the folder of its `config.json`), relative to its run directory."""
    folders = [entry["path"].rsplit("/", 1)[0] for entry in model.files if entry["path"].endswith("/config.json")]
    return min(folders, key=len) if folders else None


def remote_code_problem(model: RegisteredModel) -> str | None:
    """Why the model's Hugging Face directory, one of PipeBD's own layers (`model_type: pipebd`: layers that
    differ), cannot be a job's teacher (not PipeBD's auto_map, a version this PipeBD does not read); None where
    it can, or where the directory is a family's."""
    folder = model_folder(model)
    if folder is None:
        return None
    try:
        config = json.loads((Path(model.run_dir) / folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not is_pipebd_config(config):
        return None
    return pipebd_config_problem(config)


def teacher_fields(session: Session, model: RegisteredModel, loc: list[str | int]) -> dict[str, Any]:
    """What `workload.teacher: {model: N}` stands for: {teacher: folder}, or for a trained classifier
    {teacher or config of its job, teacher_weights: its teacher.pt}."""
    root = Path(model.run_dir)
    gone = missing_files(model)
    if gone:
        raise ModelRefused(
            loc,
            f"registered model {model.id} (job {model.job_id}, {model.kind}) has lost its files ({', '.join(gone[:3])}"
            f"{', ...' if len(gone) > 3 else ''} missing under {root}): its job was deleted or its run directory"
            " moved; name another model",
            {"model": model.id},
        )
    folder = model_folder(model)
    problem = remote_code_problem(model)
    if folder is not None and problem is not None:
        raise ModelRefused(
            loc,
            f"registered model {model.id} ({model.kind}) is a network of PipeBD's own layers ({folder}/ has model_type"
            f" pipebd), but {problem}",
            {"model": model.id},
        )
    if folder is not None:
        return {"teacher": str(root / folder)}
    job = session.get(Job, model.job_id)
    trained = (job.spec.get("workload") or {}) if job is not None else {}
    weights = [entry["path"] for entry in model.files if entry["path"] == "teacher.pt"]
    if model.kind != "teacher" or not weights or not (trained.get("teacher") or trained.get("config")):
        raise ModelRefused(
            loc,
            f"registered model {model.id} is a {model.kind} model without a Hugging Face model directory: a teacher"
            " is a language model's directory or a classifier trained here (kind train); name such a model",
            {"model": model.id},
        )
    fields: dict[str, Any] = {"teacher_weights": str(root / weights[0])}
    if trained.get("config") is not None:
        fields["config"] = trained["config"]
    else:
        fields["teacher"] = trained["teacher"]
    return fields


TEACHER_FIELDS = ("teacher", "config", "teacher_weights")  # what a `{model: N}` reference replaces


def names_a_model(document: dict[str, Any]) -> bool:
    """Whether the spec document names a registered model (`workload.teacher` is an object)."""
    workload = document.get("workload")
    return isinstance(workload, dict) and isinstance(workload.get("teacher"), dict)


def resolve_models(session: Session, document: dict[str, Any]) -> tuple[dict[str, Any], list[Path]]:
    """The spec document with `workload.teacher: {model: N}` replaced by the model's files, and the paths it
    put in (allowed beyond the data roots for this spec only). A document without a reference comes back as
    it is. ModelRefused names the field: an unknown id, a bad reference, a model whose files are gone."""
    if not names_a_model(document):
        return document, []
    workload = document["workload"]
    loc: list[str | int] = ["workload", "teacher"]
    reference = workload["teacher"]
    model_id = reference.get("model")
    if set(reference) != {"model"} or not isinstance(model_id, int) or isinstance(model_id, bool) or model_id < 1:
        raise ModelRefused(
            loc, "a registered model is named as {model: N}, N a model id (GET /api/v1/models)", reference
        )
    model = session.get(RegisteredModel, model_id) if model_id < 2**31 else None
    if model is None:
        raise ModelRefused(
            loc, f"registered model {model_id} does not exist; GET /api/v1/models lists the models", reference
        )
    fields = teacher_fields(session, model, loc)
    # the model is the whole teacher: a random teacher's config or weights the spec also gave are dropped
    resolved = {key: value for key, value in workload.items() if key not in TEACHER_FIELDS}
    resolved.update(fields)
    paths = [Path(fields[key]) for key in ("teacher", "teacher_weights") if key in fields]
    return {**document, "workload": resolved}, paths


# --- choosing again -----------------------------------------------------------------------------------


def choose_command(run_dir: str, budget: dict[str, float]) -> list[str]:
    command = [sys.executable, "-m", "pipebd_core.distill.choose", "--run-dir", run_dir]
    for name, value in budget.items():
        command += [BUDGET_OPTIONS[name], repr(float(value))]
    return command


def choose_again(
    session: Session,
    job: Job,
    budget: dict[str, float],
    settings: Settings | None = None,
    timeout_s: float = CHOOSE_TIMEOUT_S,
) -> RegisteredModel:
    """Choose a finished search's network again for `budget` (fractions by cost), in a child process; the
    registered model of the choice (kind chosen, parent: the search's model), also a version in MLflow's
    registry linked to the search's run where `settings` sets PIPEBD_MLFLOW_URI."""
    if job.state != SUCCEEDED or job.run_dir is None:
        raise ChooseConflict(
            f"job {job.id} is {job.state}: only a succeeded search is chosen from again (its finalize phase"
            " writes the candidate library)"
        )
    run_dir = RunDir(Path(job.run_dir))
    if not run_dir.root.is_dir():
        raise ChooseConflict(f"job {job.id}'s run directory {run_dir.root} is gone")
    try:
        done = subprocess.run(
            choose_command(str(run_dir.root), budget),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=REPO,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ChooseRefused(f"choosing again took longer than {timeout_s:g} s and was stopped") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        if last.startswith(REFUSAL):  # the engine's refusal: not a search, a budget no choice meets
            raise ChooseRefused(last.removeprefix(REFUSAL))
        raise RuntimeError(f"choosing again failed (exit code {done.returncode}): {last or 'no output'}")
    index = json.loads(done.stdout.strip().splitlines()[-1])["index"]
    models = {model.name: model for model in register_job(session, job)}
    chosen = models.get(f"choice-{index}")
    if chosen is None:
        raise ChooseRefused(f"choice {index} was written but holds no files to register")
    if settings is not None and settings.mlflow_uri is not None and chosen.id is not None:
        register_choice(settings, job, [chosen.id])
        session.refresh(chosen)  # its mlflow_version, written in a session of its own
    return chosen
