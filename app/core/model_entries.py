"""What the registered_model table keeps of a model (`RegisteredModel.files`, `.metrics`): each file with its
size and sha256, and the figures its job measured. app/core/registry.py writes them; the API, the dashboard
and the specs that name a model read them.
"""

from __future__ import annotations

from typing import cast

from typing_extensions import TypedDict  # pydantic reads TypedDicts from typing_extensions on 3.11


class FileEntry(TypedDict):
    """One file of a model, relative to its run directory."""

    path: str  # `teacher_model/config.json`
    size: int  # bytes
    sha256: str  # its content's SHA-256, hex


class ModelFigures(TypedDict, total=False):
    """A model's figures, those its job measured (a figure not measured is absent)."""

    perplexity: float  # held-out perplexity (a language model)
    top1: float  # top-1 on the eval split (a classifier)
    params: int  # the whole network's parameters
    flops: float  # forward FLOPs per sample
    layer_params: int  # a search: its chosen layers' parameters (architecture.json)
    kv_cache_bytes_per_token: int  # a search: its layers' KV-cache bytes per token
    latency_s: float  # a search: its layers' forward seconds as profiled
    reached: dict[str, float]  # a search: its costs as fractions of the teacher's layers'


def figures(
    *,
    perplexity: float | None = None,
    top1: float | None = None,
    params: int | None = None,
    flops: float | None = None,
    layer_params: int | None = None,
    kv_cache_bytes_per_token: int | None = None,
    latency_s: float | None = None,
    reached: dict[str, float] | None = None,
) -> ModelFigures:
    """The figures given, those that are None left out."""
    given = {
        "perplexity": perplexity,
        "top1": top1,
        "params": params,
        "flops": flops,
        "layer_params": layer_params,
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token,
        "latency_s": latency_s,
        "reached": reached,
    }
    return cast(ModelFigures, {name: value for name, value in given.items() if value is not None})
