"""The OpenAPI schema the app serves at /openapi.json: FastAPI's, plus what the server accepts exactly.

FastAPI documents the routes and their response models (app/api/schemas.py). This adds the models of
the error body (`Problem`, `ProblemField`) and the spec body (`Spec` and its sections, from the
engine's pydantic model: unknown fields refused, enums, ranges), tightened by this server's policy
(a spec names its workload; `train.epochs`, `data.num_samples` and the list's `limit` at most this
server's settings), so a client generated from the schema sends what the server takes; with tokens
configured, the bearer scheme every route but /healthz needs.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from app.api.schemas import Problem, ProblemField
from app.core.json_types import JsonObject
from app.core.settings import Settings
from pipebd_core.spec import Spec

REF_TEMPLATE = "#/components/schemas/{model}"
BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "a PIPEBD_API_TOKENS token: `read` looks, `submit` also submits, cancels and deletes"
    " (the dashboard's pages send it as the `pipebd_token` cookie instead)",
}


def model_components(model: type[BaseModel]) -> JsonObject:
    """`model` and every model it refers to, as OpenAPI components."""
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    components: JsonObject = schema.pop("$defs", {})
    components[model.__name__] = schema
    return components


def spec_components(settings: Settings) -> JsonObject:
    """The spec's models with this server's policy: workload.kind required, epochs and num_samples bounded."""
    components = model_components(Spec)
    components["Spec"]["required"] = ["workload"]
    components["WorkloadSpec"]["required"] = ["kind"]
    components["TrainSpec"]["properties"]["epochs"]["maximum"] = settings.max_epochs
    components["DataSpec"]["properties"]["num_samples"]["maximum"] = settings.max_num_samples
    teacher = components["WorkloadSpec"]["properties"]["teacher"]  # or a registered model (app/services/models.py)
    reference: JsonObject = {"type": "object", "required": ["model"], "additionalProperties": False}
    reference["properties"] = {"model": {"type": "integer", "minimum": 1}}
    components["WorkloadSpec"]["properties"]["teacher"] = {**teacher, "anyOf": [{"type": "string"}, reference]}
    components["WorkloadSpec"]["properties"]["teacher"].pop("type", None)
    return components


PAGED = ("/api/v1/jobs", "/api/v1/webhooks/{webhook_id}/deliveries", "/api/v1/models")  # lists with a `limit` query


def limit_list_pages(document: JsonObject, settings: Settings) -> None:
    for path in PAGED:
        for parameter in document["paths"][path]["get"]["parameters"]:
            if parameter["name"] == "limit":
                parameter["schema"]["maximum"] = settings.page_limit_max


def require_tokens(document: JsonObject) -> None:
    """Every operation needs a bearer token, but /healthz."""
    document["components"]["securitySchemes"] = {"bearerToken": BEARER}
    document["security"] = [{"bearerToken": []}]
    document["paths"]["/healthz"]["get"]["security"] = []


def build_schema(app: FastAPI, settings: Settings) -> JsonObject:
    document = get_openapi(
        title=app.title, version=app.version, summary=app.summary, description=app.description, routes=app.routes
    )
    components = document.setdefault("components", {}).setdefault("schemas", {})
    components.update(model_components(Problem))
    components.update(model_components(ProblemField))
    components.update(spec_components(settings))
    limit_list_pages(document, settings)
    if settings.tokens:
        require_tokens(document)
    return document


def install(app: FastAPI, settings: Settings) -> None:
    """Serve `build_schema` as the app's schema (built once, on first use)."""

    def openapi() -> JsonObject:
        if app.openapi_schema is None:
            app.openapi_schema = build_schema(app, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
