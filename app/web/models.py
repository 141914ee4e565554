"""The model pages: `/models` lists the registered models (app/core/registry.py), each that can be a teacher with
its "Compress further" and "Fine-tune" links, and `/models/{id}` shows one: its
chain (the root teacher down to it, then what was made from it), its figures beside its parent's, its files
(each a link to its job's artifact download where it is one), and "Compress further" and "Fine-tune" links
that open the New job editor filled with a spec naming the model (`workload.teacher: {model: N}`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

import yaml
from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse
from sqlmodel import Session

from app.api.deps import SessionDep
from app.core.model_entries import ModelFigures
from app.core.tables import DB_INT_MAX, Job, RegisteredModel
from app.services import models as service
from app.web.access import ViewerDep
from app.web.routing import PageError, PageRoute
from app.web.templating import render

LISTED = 100  # models on the list page, newest first
FigureKey = Literal["perplexity", "top1", "params", "layer_params", "kv_cache_bytes_per_token", "latency_s", "flops"]
FIGURES: tuple[tuple[FigureKey, str, str], ...] = (  # (figure, label, format) in the order the model page shows them
    ("perplexity", "held-out perplexity", "{:.2f}"),
    ("top1", "top-1", "{:.2%}"),
    ("params", "parameters", "{:,}"),
    ("layer_params", "chosen layers' parameters", "{:,}"),
    ("kv_cache_bytes_per_token", "KV-cache bytes per token", "{:,}"),
    ("latency_s", "layers' forward (s)", "{:.4g}"),
    ("flops", "FLOPs per sample", "{:.4g}"),
)

router = APIRouter(route_class=PageRoute)
ModelId = Annotated[int, Path(ge=1, le=DB_INT_MAX)]


def figure(metrics: ModelFigures, key: FigureKey, form: str) -> str:
    value = metrics.get(key)
    return "—" if value is None else form.format(value)


@dataclass
class FigureRow:
    key: str
    label: str
    mine: str
    parent: str


def figure_rows(model: RegisteredModel, parent: RegisteredModel | None) -> list[FigureRow]:
    """The figures either model has, the model's beside its parent's."""
    theirs = parent.metrics if parent is not None else ModelFigures()
    return [
        FigureRow(key, label, figure(model.metrics, key, form), figure(theirs, key, form))
        for key, label, form in FIGURES
        if model.metrics.get(key) is not None or theirs.get(key) is not None
    ]


def spec_text(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=None)


def next_specs(session: Session, model: RegisteredModel) -> dict[str, str]:
    """The New job editor's addresses for "compress further" and "fine-tune", where the model can be a teacher:
    a language model's directory (a transformer job), or a classifier trained here."""
    job = session.get(Job, model.job_id)
    if job is None or service.missing_files(model) or service.remote_code_problem(model) is not None:
        return {}
    data = job.spec.get("data") or {}
    workload = job.spec.get("workload") or {}
    vision = (workload.get("config") or {}).get("model_type") == "vision_transformer"
    if service.model_folder(model) is not None or vision:
        kind = "transformer"
    elif model.kind == "teacher" and str(workload.get("teacher", "")).startswith("vgg"):
        kind = "compression"
    else:
        return {}
    base: dict[str, Any] = {
        "workload": {"kind": kind, "teacher": {"model": model.id}},
        "data": data,
        "train": {"epochs": 1},
        "schedule": {"nproc": (job.spec.get("schedule") or {}).get("nproc", 1)},
    }
    compress = {"name": f"compress-model-{model.id}", **base}
    if kind == "transformer":
        compress["workload"]["replacements"] = ["ffn_1/2"]
    tune = {"name": f"finetune-model-{model.id}", **base, "workload": {**base["workload"]}}
    if kind == "transformer":  # every layer kept (the model's own weights), then trained end to end
        tune["workload"]["replacements"] = ["keep"]
    tune["finetune"] = {"strategy": "ddp", "epochs": 1}
    return {
        "compress": "/jobs/new?" + urlencode({"spec": spec_text(compress)}),
        "finetune": "/jobs/new?" + urlencode({"spec": spec_text(tune)}),
    }


def page_model(session: Session, model_id: int) -> RegisteredModel:
    model = session.get(RegisteredModel, model_id)
    if model is None:
        raise PageError(404, "No such model", f"Model {model_id} is not registered; the models page lists them.")
    return model


@router.get("/models", response_class=HTMLResponse)
def models_page(request: Request, viewer: ViewerDep, session: SessionDep) -> HTMLResponse:
    models, _ = service.list_models(session, limit=LISTED, cursor=None)
    starts = {model.id: next_specs(session, model) for model in models}  # each row's Compress further, Fine-tune
    return render(request, "models/list.html", {"models": models, "figure": figure, "next": starts})


@router.get("/models/{model_id}", response_class=HTMLResponse)
def model_page(request: Request, model_id: ModelId, viewer: ViewerDep, session: SessionDep) -> HTMLResponse:
    model = page_model(session, model_id)
    found = service.lineage(session, model)
    parent = found.chain[-2] if len(found.chain) > 1 else None
    files = [{**entry, "artifact": service.artifact_name(entry)} for entry in model.files]
    context = {
        "model": model,
        "chain": found.chain,
        "descendants": found.descendants,
        "parent": parent,
        "figures": figure_rows(model, parent),
        "files": files,
        "missing": service.missing_files(model),
        "next": next_specs(session, model),
        "architecture": service.architecture_of(model),
    }
    return render(request, "models/detail.html", context)
