"""The response shapes of `/api/v1/models` and of choosing again (docs/api.md#models); the jobs' are
app/api/schemas.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from app.api.schemas import iso

ModelKind = Literal["teacher", "distilled", "searched", "finetuned", "chosen"]  # app.core.registry.KINDS


class ModelFile(BaseModel):
    """One file of a model, in its job's run directory."""

    path: str = Field(description="relative to the job's run directory (`teacher_model/config.json`)")
    size: int = Field(description="bytes")
    sha256: str = Field(description="its content's SHA-256, hex")
    url: str | None = Field(
        None, description="its download (GET /api/v1/jobs/{id}/artifacts/{name}) where it is one of the job's artifacts"
    )


class ModelMetrics(BaseModel):
    """A model's figures, where its job measured them."""

    model_config = ConfigDict(extra="allow")

    perplexity: float | None = Field(None, description="held-out perplexity (a language model)")
    top1: float | None = Field(None, description="top-1 accuracy on the eval split (a classifier with labels)")
    params: int | None = Field(None, description="the whole network's parameters")
    flops: float | None = Field(None, description="forward FLOPs per sample")
    layer_params: int | None = Field(None, description="a search: its chosen layers' parameters")
    kv_cache_bytes_per_token: int | None = Field(None, description="a search: its layers' KV-cache bytes per token")
    latency_s: float | None = Field(None, description="a search: its layers' forward seconds as profiled")
    reached: dict[str, float] | None = Field(None, description="a search: its costs as fractions of the teacher's")


class ModelPublic(BaseModel):
    """A registered model version: what a job wrote, what it was made from, and its figures."""

    id: int = Field(description="the model's id, as in /api/v1/models/{id} and a spec's `{model: id}`")
    job_id: int = Field(description="the job that wrote it")
    name: str = Field(description="which of the job's models: teacher, distilled, searched, finetuned, choice-<n>")
    kind: ModelKind = Field(description="teacher (trained here), distilled, searched, finetuned or chosen")
    parent_id: int | None = Field(description="the registered model it was made from; null for a root")
    parent_hash: str | None = Field(
        description="the content hash of what it was made from (a registered parent's, or a teacher given as a"
        " path); null for a teacher trained here or a random one"
    )
    content_hash: str = Field(description="SHA-256 over its files' paths and SHA-256s")
    spec_hash: str | None = Field(description="the hash of its job's resolved spec")
    data_fingerprint: str | None = Field(
        description="SHA-256 of the job's data section and, for data in a folder, its files' names and sizes"
    )
    files: list[ModelFile] = Field(description="its files")
    files_present: bool = Field(description="false once any of its files is gone (its job deleted)")
    metrics: ModelMetrics = Field(description="its figures")
    mlflow_version: str | None = Field(None, description="`name/version` in MLflow's Model Registry, once there")
    created_at: float = Field(description="when it was registered (ISO 8601, UTC)")

    @field_serializer("created_at")
    def _as_iso(self, value: float) -> str | None:
        return iso(value)


class ModelDetail(ModelPublic):
    """One model, with a searched or chosen model's architecture."""

    architecture: dict[str, Any] | None = Field(
        None, description="a searched or chosen model: its architecture.json, as it is (docs/transformers.md)"
    )


class ModelsPublic(BaseModel):
    """A page of registered models, newest first."""

    data: list[ModelPublic] = Field(description="at most `limit` models")
    next_cursor: str | None = Field(description="pass as `cursor` for the next (older) page; null on the last page")


class Lineage(BaseModel):
    """A model's place in its family: the chain it comes from and what was made from it."""

    model: ModelPublic = Field(description="the model asked for")
    chain: list[ModelPublic] = Field(
        description="from the root (a teacher trained here, or the first model made from an unregistered"
        " teacher) down to the model itself, each the parent of the next"
    )
    descendants: list[ModelPublic] = Field(
        description="every model made from it, directly or through others, breadth first (each names its parent)"
    )


class ChooseBudget(BaseModel):
    """A budget: the chosen network's cost as fractions of the teacher's decoder layers'."""

    model_config = ConfigDict(extra="forbid")

    params: float | None = Field(None, gt=0, le=1, description="parameters, a fraction of the teacher's layers'")
    kv_cache: float | None = Field(None, ge=0, le=1, description="KV-cache bytes per token, likewise")
    latency: float | None = Field(None, gt=0, le=1, description="forward time as profiled, likewise")


class ChooseRequest(BaseModel):
    """Choose a finished search's network again for another budget."""

    model_config = ConfigDict(extra="forbid")

    budget: ChooseBudget | None = Field(
        None, description="the bounds; absent or empty: the lowest loss (as a search without a budget chooses)"
    )
