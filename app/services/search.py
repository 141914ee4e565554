"""A sweep's search: the request body of `POST /api/v1/sweeps`, and the children it makes.

A sweep is a base spec and one search over its fields, each field named by its dotted path (`train.lr`,
`schedule.mode`, `workload.options.width`):

- `grid`: a list of values per field; one child per combination, the first field varying slowest;
- `list`: the children's overrides, one mapping per child;
- `random`: `count` children whose fields are drawn with `random.Random(seed)`: from a list of values, or
  from a range `{"min": a, "max": b}` (uniform; `"log": true` for log-uniform; whole numbers when both
  bounds are).

`children` turns a request into each child's overrides and spec document, in order. Pure Python: the
same request always makes the same children. Checking each child as a whole spec is app/services/sweeps.py's.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.json_types import JsonObject
from app.core.objectives import Objective
from pipebd_core.spec import SpecError, set_field

MAX_CHILDREN = 1000  # children of one sweep at most (the server's queue bound applies too)
PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")  # a dotted field path
PATH_TEXT = "a dotted field path such as `train.lr` (docs/spec.md lists every field)"
SEARCHES = ("grid", "list", "random")
Values = Annotated[list[Any], Field(min_length=1)]  # a field's values to search: at least one


class Range(BaseModel):
    """Values drawn uniformly between two bounds (log-uniformly with `log`; whole numbers when both are)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    min: int | float = Field(description="the lowest value")
    max: int | float = Field(description="the highest value")
    log: bool = Field(False, description="draw log-uniformly (both bounds above 0), e.g. for learning rates")

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}; give min <= max")
        if self.log and self.min <= 0:
            raise ValueError(f"a log range needs min > 0, got {self.min}")
        return self


class RandomSearch(BaseModel):
    """`count` children, each field drawn from its list of values or its range, seeded."""

    model_config = ConfigDict(extra="forbid", strict=True)

    count: int = Field(ge=1, le=MAX_CHILDREN, description="children to draw")
    seed: int = Field(0, description="the seed of the draws: the same seed draws the same children")
    fields: dict[str, Values | Range] = Field(
        min_length=1, description="per dotted field path: a list of values to choose from, or a range"
    )


class SweepRequest(BaseModel):
    """`POST /api/v1/sweeps`: a base spec and exactly one search over its fields."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str | None = Field(None, min_length=1, max_length=100, description="the sweep's name (default: the spec's)")
    spec: JsonObject = Field(description="the base spec (docs/spec.md); every child is it with its overrides")
    grid: dict[str, Values] | None = Field(
        None, min_length=1, description="per dotted field path, its values: one child per combination"
    )
    overrides: list[JsonObject] | None = Field(
        None, alias="list", min_length=1, max_length=MAX_CHILDREN, description="one mapping of overrides per child"
    )
    random: RandomSearch | None = Field(None, description="children drawn at random, seeded")
    max_parallel: int | None = Field(None, ge=1, description="children launched at once at most (default: no bound)")
    objective: Objective | None = Field(None, description="the metric that names the best child")

    @model_validator(mode="after")
    def _one_search(self) -> SweepRequest:
        searches = (self.grid, self.overrides, self.random)
        given = [name for name, value in zip(SEARCHES, searches, strict=True) if value is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one search of {', '.join(SEARCHES)}; got {', '.join(given) or 'none'}")
        if self.grid is not None:
            size = math.prod(len(values) for values in self.grid.values())
            if size > MAX_CHILDREN:
                raise ValueError(f"the grid makes {size} children; at most {MAX_CHILDREN} in one sweep")
        return self

    @property
    def kind(self) -> str:
        return "grid" if self.grid is not None else "list" if self.overrides is not None else "random"

    def search(self) -> JsonObject:
        """The search as stored on the sweep: `{"grid": {...}}`, `{"list": [...]}` or `{"random": {...}}`."""
        dumped = self.model_dump(mode="json", by_alias=True, include={"grid", "overrides", "random"})
        return {self.kind: dumped[self.kind]}


@dataclass(frozen=True)
class Child:
    """One child of a sweep: its number (0, 1, ...), its overrides by dotted path, and its spec document."""

    index: int
    overrides: JsonObject  # dotted path -> the child's value there (any JSON)
    document: JsonObject


class SearchError(ValueError):
    """An override that cannot be applied: `loc` is where in the request (`["grid", "train.lr"]`)."""

    def __init__(self, loc: list[str | int], message: str) -> None:
        super().__init__(message)
        self.loc = loc


def drawn(rng: random.Random, space: Values | Range) -> Any:
    if isinstance(space, list):
        return rng.choice(space)
    if isinstance(space.min, int) and isinstance(space.max, int) and not space.log:
        return rng.randint(space.min, space.max)
    if space.log:
        return math.exp(rng.uniform(math.log(space.min), math.log(space.max)))
    return rng.uniform(space.min, space.max)


def overrides_of(request: SweepRequest) -> list[JsonObject]:
    """Each child's overrides, in order."""
    if request.grid is not None:
        paths = list(request.grid)
        return [dict(zip(paths, values, strict=True)) for values in itertools.product(*request.grid.values())]
    if request.overrides is not None:
        return [dict(item) for item in request.overrides]
    assert request.random is not None
    rng = random.Random(request.random.seed)
    fields = request.random.fields
    return [{path: drawn(rng, space) for path, space in fields.items()} for _ in range(request.random.count)]


def override_loc(request: SweepRequest, index: int, path: str) -> list[str | int]:
    """Where in the request an override was given: `["grid", path]`, `["list", index, path]` or
    `["random", "fields", path]`."""
    if request.kind == "grid":
        return ["grid", path]
    if request.kind == "list":
        return ["list", index, path]
    return ["random", "fields", path]


def children(request: SweepRequest) -> list[Child]:
    """The children of the request, each the base spec with its overrides; SearchError for a path that is
    not one (no dotted path, or one through a field that is not a section)."""
    made = []
    for index, overrides in enumerate(overrides_of(request)):
        document = json.loads(json.dumps(request.spec))
        for path, value in overrides.items():
            loc = override_loc(request, index, path)
            if not PATH.match(path):
                raise SearchError(loc, f"{path!r} is not {PATH_TEXT}")
            try:
                set_field(document, path, value)
            except SpecError as error:
                raise SearchError(loc, f"{path}: {error} in the base spec; override a field inside it") from None
        made.append(Child(index, overrides, document))
    return made
