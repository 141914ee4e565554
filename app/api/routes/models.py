"""Registered models: list (cursor pages, by job, kind and parent), read, lineage; and choosing a finished
search again for another budget (`POST /jobs/{id}/choose`), which registers the choice."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status

from app.api.deps import Cursor, JobDep, PageSize, ReadAccess, SessionDep, SettingsDep, SubmitAccess
from app.api.model_schemas import (
    ChooseRequest,
    Lineage,
    ModelArchitecture,
    ModelDetail,
    ModelFile,
    ModelKind,
    ModelMetrics,
    ModelPublic,
    ModelsPublic,
)
from app.api.schemas import AUTH_ERRORS, JSON_BODY_ERRORS, ResponseDoc, job_errors, problem
from app.core.tables import DB_INT_MAX, RegisteredModel
from app.services import models as service
from app.services.errors import ServiceError, invalid

router = APIRouter(prefix="/models", tags=["models"], responses=AUTH_ERRORS)
choose_router = APIRouter(prefix="/jobs/{job_id}", tags=["models"], responses=AUTH_ERRORS)

ModelId = Annotated[int, Path(ge=1, le=DB_INT_MAX, description="the model's id (1, 2, ...)")]
MODEL_ERRORS: ResponseDoc = {
    404: problem("no registered model has this id"),
    422: problem("a path or query parameter is not valid"),
}


def get_registered(model_id: ModelId, session: SessionDep) -> RegisteredModel:
    try:
        return service.get_model(session, model_id)
    except service.ModelNotFound as error:
        raise ServiceError(404, str(error)) from None


ModelDep = Annotated[RegisteredModel, Depends(get_registered)]


def public(request: Request, model: RegisteredModel) -> ModelPublic:
    """The model with its files' download links, and whether they are there."""
    files = []
    for entry in model.files:
        name = service.artifact_name(entry)
        url = str(request.url_for("read_artifact", job_id=model.job_id, name=name).path) if name else None
        files.append(ModelFile(**entry, url=url))
    return ModelPublic(
        **model.model_dump(exclude={"files", "metrics", "run_dir"}),
        files=files,
        files_present=not service.missing_files(model),
        metrics=ModelMetrics(**model.metrics),
    )


def detail(request: Request, model: RegisteredModel) -> ModelDetail:
    architecture = service.architecture_of(model)
    written = ModelArchitecture.model_validate(architecture.to_json()) if architecture else None
    return ModelDetail(**dict(public(request, model)), architecture=written)


@router.get(
    "",
    response_model=ModelsPublic,
    dependencies=[ReadAccess],
    responses={422: problem("an unknown `kind`, an id out of range, a `limit` too large, a bad `cursor`")},
)
def read_models(
    request: Request,
    session: SessionDep,
    limit: PageSize,
    job_id: Annotated[int | None, Query(ge=1, le=DB_INT_MAX, description="only the models of this job")] = None,
    kind: Annotated[ModelKind | None, Query(description="only models of this kind")] = None,
    parent_id: Annotated[int | None, Query(ge=1, le=DB_INT_MAX, description="only models made from this model")] = None,
    cursor: Cursor = None,
) -> ModelsPublic:
    """Registered models, newest first, one page at a time."""
    try:
        models, next_cursor = service.list_models(
            session, limit=limit, cursor=cursor, job_id=job_id, kind=kind, parent_id=parent_id
        )
    except ValueError as error:
        raise invalid(["query", "cursor"], str(error)) from None
    return ModelsPublic(data=[public(request, model) for model in models], next_cursor=next_cursor)


@router.get("/{model_id}", response_model=ModelDetail, dependencies=[ReadAccess], responses=MODEL_ERRORS)
def read_model(request: Request, model: ModelDep) -> ModelDetail:
    """One model: its job, kind, parent, files, figures, and a search's architecture."""
    return detail(request, model)


@router.get("/{model_id}/lineage", response_model=Lineage, dependencies=[ReadAccess], responses=MODEL_ERRORS)
def read_lineage(request: Request, model: ModelDep, session: SessionDep) -> Lineage:
    """The chain from the root teacher down to the model, and every model made from it."""
    found = service.lineage(session, model)
    return Lineage(
        model=public(request, found.model),
        chain=[public(request, item) for item in found.chain],
        descendants=[public(request, item) for item in found.descendants],
    )


@choose_router.post(
    "/choose",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelDetail,
    dependencies=[SubmitAccess],
    responses={
        201: {"description": "the choice, registered (kind chosen, its parent the search's model)"},
        **JSON_BODY_ERRORS,
        **job_errors(
            invalid="the job is not a transformer search, the budget is one no choice meets (the smallest fraction"
            " the candidates reach is named) or names a cost the search did not measure, or choosing overran",
            conflict="the job has not succeeded (only a finished search keeps its candidate library)",
        ),
    },
)
def choose(
    request: Request, response: Response, body: ChooseRequest, job: JobDep, session: SessionDep, settings: SettingsDep
) -> ModelDetail:
    """Choose a finished search's network again for another budget, from the candidates it trained: no rank
    is launched; seconds. The new network is a registered model (kind chosen)."""
    budget = {} if body.budget is None else body.budget.model_dump(exclude_none=True)
    try:
        model = service.choose_again(session, job, budget, settings)
    except service.ChooseConflict as error:
        raise ServiceError(status.HTTP_409_CONFLICT, str(error)) from None
    except service.ChooseRefused as error:
        raise ServiceError(422, str(error)) from None
    response.headers["Location"] = str(request.url_for("read_model", model_id=model.id).path)
    return detail(request, model)
