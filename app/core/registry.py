"""The model registry: every model a succeeded job wrote, as a `registered_model` row (app/core/tables.py).

A job's models, by what it ran (every path from `RunDir`; a folder counts as its files):

    teacher    kind train: teacher_model/ (a language model's or a ViT's Hugging Face directory), teacher.pt,
               finetuned_model.pt and its export finetuned_model.pt2 (the same network); no parent
    distilled  a distillation without a search: compressed_model.pt, student.pt, distilled_state.pt,
               distilled_model.pt2 and a Hugging Face directory where the engine writes one; parent: the teacher
    searched   a search (architecture.json written): searched_model.pt, architecture.json, distilled_state.pt,
               distilled_model.pt2, a Hugging Face directory likewise; parent: the teacher
    finetuned  the finetune phase's network: finetuned_model.pt, finetuned_model.pt2, a Hugging Face directory
               likewise; parent: the job's distilled or searched model
    chosen     each choices/<n>/ (a search chosen again, pipebd_core/distill/choose.py): its files; parent: the
               job's searched model

The teacher a distillation was made from is its parent when it is a registered model's files (a spec naming
`{model: N}` is given that model's folder: app/services/models.py), and in any case is recorded by content
(`parent_hash`: the sha256 over its files, so a teacher given as a path is known by what it holds).

`register_job` is idempotent: a model already registered for the job (by its name) is kept, so a resumed or
retried job, or a choice made later, adds only what is new. Plain Python (no torch): the worker registers a
job's models when it succeeds, the API a choice it just made.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.core.model_entries import FileEntry, ModelFigures, figures
from app.core.tables import Job, RegisteredModel
from pipebd_core.documents.architecture import Architecture
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.choice import ChoiceRecord
from pipebd_core.documents.summary import FinetuneReport, Summary
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError, parse_spec

KINDS = ("teacher", "distilled", "searched", "finetuned", "chosen")
# a model's Hugging Face directory per kind, where the engine's RunDir names one (read by name so that
# a directory an engine adds later is registered too)
HF_FOLDERS = {"teacher": "teacher_model", "distilled": "distilled_hf", "searched": "searched_hf"}
HF_FOLDERS["finetuned"] = "finetuned_hf"
CHUNK = 1 << 20  # bytes read at a time while hashing


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def files_of(paths: list[Path]) -> list[Path]:
    """The files among `paths`, a folder standing for every file under it (name order); missing ones left out."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(item for item in path.rglob("*") if item.is_file())
        elif path.is_file():
            found.append(path)
    return found


def file_entries(root: Path, paths: list[Path]) -> list[FileEntry]:
    """{path (relative to `root`), size, sha256} of every file among `paths`."""
    return [
        FileEntry(path=item.relative_to(root).as_posix(), size=item.stat().st_size, sha256=sha256_file(item))
        for item in files_of(paths)
    ]


def content_hash(entries: list[FileEntry]) -> str:
    """One hash for a set of files: sha256 over each one's path and sha256, in path order."""
    text = "".join(f"{entry['path']}\t{entry['sha256']}\n" for entry in sorted(entries, key=lambda e: e["path"]))
    return hashlib.sha256(text.encode()).hexdigest()


def path_hash(path: Path) -> str | None:
    """The content hash of a teacher given as a path (a folder's files relative to it, or one file)."""
    if path.is_dir():
        entries = file_entries(path, [path])
    elif path.is_file():
        entries = file_entries(path.parent, [path])
    else:
        return None
    return content_hash(entries)


def data_fingerprint(spec: Spec) -> str:
    """sha256 of the data section and, for data in a folder, every file's name and size under it."""
    digest = hashlib.sha256(json.dumps(spec.data.model_dump(mode="json"), sort_keys=True).encode())
    root = Path(spec.data.root).expanduser() if spec.data.root else None
    if root is not None and root.is_dir():
        for item in sorted(root.rglob("*")):
            if item.is_file():
                digest.update(f"{item.relative_to(root).as_posix()}\t{item.stat().st_size}\n".encode())
    return digest.hexdigest()


@dataclass
class Planned:
    """One model of a job: its name and kind, its paths, the job's model it was made from (None: the teacher,
    or for kind teacher none) and its figures."""

    name: str
    kind: str
    paths: list[Path]
    parent: str | None = None
    metrics: ModelFigures = field(default_factory=ModelFigures)


def hf_folder(run_dir: RunDir, kind: str) -> list[Path]:
    folder = getattr(run_dir, HF_FOLDERS[kind], None)
    return [folder] if isinstance(folder, Path) else []


def read_summary(run_dir: RunDir) -> Summary | None:
    try:
        return run_dir.load_summary() if run_dir.summary.exists() else None
    except (DocumentError, ValueError):
        return None


def read_architecture(path: Path) -> Architecture | None:
    try:
        return Architecture.from_json(json.loads(path.read_text())) if path.exists() else None
    except (DocumentError, ValueError):
        return None


def architecture_metrics(architecture: Architecture | None) -> ModelFigures:
    """A search's chosen layers' costs, summed over its blocks (where the search measured them)."""
    if architecture is None:
        return ModelFigures()

    def total(values: list[Any]) -> Any:
        return None if not values or any(value is None for value in values) else sum(values)

    blocks = architecture.blocks
    return figures(
        layer_params=total([block.params for block in blocks]),
        kv_cache_bytes_per_token=total([block.kv_cache_bytes for block in blocks]),
        latency_s=total([block.latency_s for block in blocks]),
        reached=architecture.reached,
    )


def finetuned_figures(tuned: FinetuneReport) -> ModelFigures:
    """The fine-tuned network's figures: perplexity or top-1 after fine-tuning, its parameters and FLOPs."""
    return figures(
        perplexity=tuned.perplexity_after, top1=tuned.top1_after, params=tuned.student.params, flops=tuned.student.flops
    )


def planned_models(run_dir: RunDir, spec: Spec) -> list[Planned]:
    """Every model the job's run directory holds now, parents before children."""
    summary = read_summary(run_dir)
    tuned = summary.finetune if summary is not None else None
    finetuned_paths = [run_dir.finetuned_model, run_dir.exported_model]
    if spec.workload.kind == "train":
        metrics = figures() if tuned is None else finetuned_figures(tuned)
        paths = [*hf_folder(run_dir, "teacher"), run_dir.teacher, *finetuned_paths]
        return [Planned("teacher", "teacher", paths, metrics=metrics)]
    distilled = figures(
        perplexity=None if summary is None else summary.student_perplexity,
        top1=None if summary is None else summary.student_top1,
        params=None if tuned is None else tuned.student.params,  # the network fine-tuning started from
        flops=None if tuned is None else tuned.student.flops,
    )
    architecture = read_architecture(run_dir.architecture)
    exports = [run_dir.distilled_state, run_dir.distilled_export]
    if architecture is not None:
        first = Planned("searched", "searched", [run_dir.searched_model, run_dir.architecture, *exports])
        first.paths += hf_folder(run_dir, "searched")
        first.metrics = {**distilled, **architecture_metrics(architecture)}
    else:
        first = Planned("distilled", "distilled", [run_dir.compressed_model, run_dir.student, *exports])
        first.paths += hf_folder(run_dir, "distilled")
        first.metrics = distilled
    models = [first]
    if spec.finetune is not None and tuned is not None:
        paths = finetuned_paths + hf_folder(run_dir, "finetuned")
        models.append(Planned("finetuned", "finetuned", paths, first.name, finetuned_figures(tuned)))
    if architecture is not None and run_dir.choices.is_dir():
        models += chosen_models(run_dir)
    return models


def chosen_models(run_dir: RunDir) -> list[Planned]:
    """Each choices/<n>/ with its choice.json written (the last file a choice writes), in order."""
    models = []
    indices = sorted(int(path.name) for path in run_dir.choices.glob("*") if path.name.isdigit())
    for index in indices:
        folder = run_dir.choice(index)
        try:
            record = ChoiceRecord.from_json(json.loads(folder.record.read_text()))
        except (OSError, DocumentError, ValueError):
            continue  # being written, or not a choice
        metrics = figures(perplexity=record.perplexity) | architecture_metrics(read_architecture(folder.architecture))
        models.append(Planned(f"choice-{index}", "chosen", [folder.root], "searched", metrics))
    return models


def teacher_path(spec: Spec) -> Path | None:
    """The teacher a distillation was given as a path: a model directory, or torchvision-format weights."""
    workload = spec.workload
    if workload.kind == "train":
        return None
    if workload.teacher_directory:  # a language model's or a ViT's model directory
        return Path(workload.teacher).expanduser().resolve()
    if workload.teacher_weights:
        return Path(workload.teacher_weights).expanduser().resolve()
    return None


def model_at(session: Session, path: Path) -> RegisteredModel | None:
    """The registered model whose files `path` is (a file of it, or a folder of its files), if any."""
    candidates = [str(parent) for parent in path.parents]
    rows = session.exec(select(RegisteredModel).where(col(RegisteredModel.run_dir).in_(candidates))).all()
    for model in sorted(rows, key=lambda row: row.id or 0):
        relative = path.relative_to(model.run_dir).as_posix()
        if any(entry["path"] == relative or entry["path"].startswith(relative + "/") for entry in model.files):
            return model
    return None


def teacher_parent(session: Session, spec: Spec) -> tuple[int | None, str | None]:
    """(registered model id, content hash) of the teacher the job was given as a path; (None, None) for a
    teacher of the engine's own (a torchvision name, a config: random weights)."""
    path = teacher_path(spec)
    if path is None:
        return None, None
    model = model_at(session, path)
    if model is not None:
        return model.id, model.content_hash
    return None, path_hash(path)


def job_spec(run_dir: RunDir, job: Job) -> Spec | None:
    try:
        return run_dir.load_spec() if run_dir.spec.exists() else parse_spec(job.spec)
    except (SpecError, ValueError):
        return None


def register_job(session: Session, job: Job, spec_hash: str | None = None) -> list[RegisteredModel]:
    """Register every model of `job` not registered yet (committed); return all of the job's models."""
    assert job.id is not None
    if job.run_dir is None:
        return []
    run_dir = RunDir(Path(job.run_dir).resolve())
    spec = job_spec(run_dir, job)
    if spec is None:
        return []
    query = select(RegisteredModel).where(RegisteredModel.job_id == job.id)
    registered = {model.name: model for model in session.exec(query).all()}
    fingerprint, teacher = data_fingerprint(spec), teacher_parent(session, spec)
    for planned in planned_models(run_dir, spec):
        if planned.name in registered:
            continue
        entries = file_entries(run_dir.root, planned.paths)
        if not entries:
            continue
        parent = registered.get(planned.parent) if planned.parent else None
        parent_id: int | None = None
        parent_hash: str | None = None
        if parent is not None:
            parent_id, parent_hash = parent.id, parent.content_hash
        elif planned.kind != "teacher":
            parent_id, parent_hash = teacher
        model = RegisteredModel(
            job_id=job.id,
            name=planned.name,
            kind=planned.kind,
            parent_id=parent_id,
            parent_hash=parent_hash,
            content_hash=content_hash(entries),
            spec_hash=spec_hash or job.request_hash,
            data_fingerprint=fingerprint,
            run_dir=str(run_dir.root),
            files=entries,
            metrics=planned.metrics,
        )
        session.add(model)
        try:
            session.commit()
        except IntegrityError:  # registered meanwhile by another process (the worker and a choice at once)
            session.rollback()
            model = session.exec(query.where(RegisteredModel.name == planned.name)).one()
        session.refresh(model)
        registered[planned.name] = model
    return sorted(registered.values(), key=lambda model: model.id or 0)
