"""What the plan documents share: models some of whose parts are written flat, and the step counts.

plan.json and finetune_plan.json keep every key at the top level (a user reads `predicted_step_s`,
not `details.predictions.predicted_step_s`), while the code groups them: a `Flat` model names the
fields whose keys are written beside its own (`FLAT`), gathers them back when it reads, and leaves
out the keys of `OMIT_NONE` that hold None and of `OMIT_EMPTY` that hold an empty list, so a plan without
predictions has no prediction keys.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer, model_validator


class Part(BaseModel):
    """A piece of a document: its keys are exactly these fields."""

    model_config = ConfigDict(extra="forbid")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class Flat(BaseModel):
    """A model whose FLAT fields (each a `Flat` or `Part` model, or None) are written as their keys."""

    FLAT: ClassVar[tuple[str, ...]] = ()  # fields written flat
    OMIT_NONE: ClassVar[tuple[str, ...]] = ()  # keys left out when None
    OMIT_EMPTY: ClassVar[tuple[str, ...]] = ()  # keys left out when an empty list

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def json_keys(cls) -> set[str]:
        """Every top-level key this model reads, those of its flat parts included."""
        keys = {field.alias or name for name, field in cls.model_fields.items() if name not in cls.FLAT}
        for name in cls.FLAT:
            keys |= _json_keys(_model_of(cls, name))
        return keys

    @model_validator(mode="before")
    @classmethod
    def _gather(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name in cls.FLAT:
            if name in data:
                continue
            keys = _json_keys(_model_of(cls, name))
            found = {key: data.pop(key) for key in list(data) if key in keys}
            if found:
                data[name] = found
        return data

    @model_serializer(mode="wrap")
    def _spread(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in self.FLAT:
            part = data.pop(name, None)
            if part:
                data.update(part)
        for key in self.OMIT_NONE:
            if key in data and data[key] is None:
                del data[key]
        for key in self.OMIT_EMPTY:
            if data.get(key) == []:
                del data[key]
        return data


def _model_of(cls: type[Flat], name: str) -> type[BaseModel]:
    annotation = cls.model_fields[name].annotation
    kinds = [kind for kind in getattr(annotation, "__args__", (annotation,)) if isinstance(kind, type)]
    models = [kind for kind in kinds if issubclass(kind, BaseModel)]
    assert len(models) == 1, f"{cls.__name__}.{name} must be one model (or None) to be written flat"
    return models[0]


def _json_keys(model: type[BaseModel]) -> set[str]:
    if issubclass(model, Flat):
        return model.json_keys()
    return {field.alias or name for name, field in model.model_fields.items()}


class StreamEntry(Part):
    """A range of sample indices with its own seeded batch order (pipebd_core.data.streams.Stream)."""

    name: str
    first: int
    count: int


class Streams(Part):
    weights: StreamEntry
    arch: StreamEntry | None  # nas: the held-out batches of architecture updates


class SearchEntry(Part):
    """When architecture updates run (nas): after each `every`-th weight step from step `from_step`."""

    from_step: int
    every: int


class StepCounts(Part):
    """How a spec's data turns into optimiser steps (pipebd_core.data.streams.StepPlan), written flat."""

    total_steps: int
    steps_per_epoch: int
    num_samples: int
    streams: Streams
    search: SearchEntry | None
