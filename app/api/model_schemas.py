"""The response shapes of `/api/v1/models` and of choosing again (docs/api.md#models); the jobs' are
app/api/schemas.py."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_serializer, model_serializer

from app.api.schemas import Number, iso

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


class AsWritten(BaseModel):
    """A document served as its file has it: the keys it has (a field it lacks stays absent, not null) and any
    key this server does not know, passed through."""

    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler):  # no return type: the schema stays the model's
        data = handler(self)
        present = self.model_fields_set | set(self.model_extra or {})
        return {key: value for key, value in data.items() if key in present}


class ArchitectureChoice(AsWritten):
    """A search's choice for one block: the candidate chosen in each of its searchable layers."""

    block: int = Field(description="the block")
    layers: list[str] = Field(description="the candidate chosen in each searchable layer")
    loss: Number | None = Field(None, description="a transformer search: the chosen candidate's held-out loss")
    params: int | None = Field(None, description="and its parameters")
    kv_cache_bytes: int | None = Field(None, description="and the bytes it adds to the KV cache per token")
    latency_s: Number | None = Field(None, description="and its forward as the profile measured it")


class ArchitectureCandidate(AsWritten):
    """One candidate of one block of a transformer search, as it was measured on held-out sequences."""

    block: int = Field(description="the block")
    name: str = Field(description="its replacement (docs/transformers.md)")
    loss: Number = Field(description="its held-out loss")
    params: int = Field(description="its parameters")
    kv_cache_bytes: int | None = Field(None, description="KV-cache bytes per token (0: no attention cache)")
    latency_s: Number | None = Field(None, description="its forward at the global batch, as profiled")


class ModelArchitecture(AsWritten):
    """A searched or chosen model's architecture.json, as it is (docs/transformers.md)."""

    format_version: int | None = Field(None, description="the version of architecture.json's format")
    blocks: list[ArchitectureChoice] = Field(description="the choice in every block")
    candidates: list[ArchitectureCandidate] | None = Field(
        None, description="a transformer search: every candidate of every block"
    )
    chosen_by: str | None = Field(None, description="the rule the choice followed")
    teacher_params: int | None = Field(None, description="the teacher's layers' parameters (what fractions are of)")
    teacher_kv_cache_bytes: int | None = Field(None, description="the teacher's layers' KV-cache bytes per token")
    teacher_latency_s: Number | None = Field(None, description="the teacher's layers' summed forward, as profiled")
    budget: dict[str, Number] | None = Field(None, description="the budget: a fraction of the teacher's, per cost")
    reached: dict[str, Number] | None = Field(None, description="the choice's costs as the same fractions")


class ModelDetail(ModelPublic):
    """One model, with a searched or chosen model's architecture."""

    architecture: ModelArchitecture | None = Field(
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
