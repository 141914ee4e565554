"""The services' own errors: what a refusal says, with no HTTP types.

A `ServiceError` carries everything an answer needs: its status (the HTTP status it will be, as the
number every caller of these services agrees on), a sentence saying what is wrong and what would work
(`detail`), the bad fields (`errors`: each a `FieldProblem`, its `loc`, why, and a bounded excerpt of the
value sent) and headers such as `Retry-After`. app/api/problems.py turns it into a problem body; nothing
here knows of requests or responses.

Nothing here repeats more than `EXCERPT_CHARS` of a value or `MESSAGE_CHARS` of a message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NotRequired, TypedDict

EXCERPT_CHARS = 120  # the most of an offending value (its repr) a problem repeats
MESSAGE_CHARS = 2000  # the most of one message (engine messages may quote a user's exception)

ABSENT = object()  # a field problem without a value to quote (a missing field)
# what would work, for FastAPI's and pydantic's messages that only say what is wrong
REMEDIES = {
    "missing": "required: give a value",
    "extra_forbidden": "not a field here: remove it (docs/spec.md lists every field)",
}


class FieldProblem(TypedDict):
    """One bad field: where (`body`, `query`, `path` or `header`, then the path), why, and what was sent."""

    loc: list[str | int]
    message: str
    value: NotRequired[str]


def excerpt(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def field_problem(loc: Sequence[str | int], message: str, value: object = ABSENT) -> FieldProblem:
    """One bad field: where, why, and (unless ABSENT) a bounded excerpt of what was sent."""
    item: FieldProblem = {"loc": list(loc), "message": excerpt(message, MESSAGE_CHARS)}
    if value is not ABSENT:
        item["value"] = excerpt(value if isinstance(value, str) else repr(value), EXCERPT_CHARS)
    return item


def where(item: FieldProblem) -> str:
    """`train.epochs` for loc ["body", "train", "epochs"]: the field as a reader names it."""
    loc = [str(part) for part in item["loc"]]
    return ".".join(loc[1:]) or (loc[0] if loc else "")


def summary(errors: Sequence[FieldProblem]) -> str:
    """`field: message` of the first problem, and how many there are."""
    first = f"{where(errors[0])}: {errors[0]['message']}" if errors else "the request is not valid"
    return first if len(errors) <= 1 else f"{len(errors)} problems; the first: {first}"


def pydantic_problems(
    errors: Iterable[Mapping[str, Any]],
    prefix: Sequence[str | int] = (),
    explain: Callable[[Mapping[str, Any]], str | None] | None = None,
) -> list[FieldProblem]:
    """Pydantic's (and so FastAPI's) validation errors as field problems: the message with what would
    work, and a bounded excerpt of the value; `prefix` goes before each location (`body` for a spec);
    `explain` gives a model's own sentence for an error (None: the generic one)."""
    items = []
    for item in errors:
        own = explain(item) if explain is not None else None
        message = own or REMEDIES.get(item["type"]) or str(item["msg"]).removeprefix("Value error, ")
        value = ABSENT if item["type"] == "missing" else item.get("input", ABSENT)
        items.append(field_problem([*prefix, *item["loc"]], message, value))
    return items


class ServiceError(Exception):
    """A refusal: its status, a sentence saying what is wrong and what would work, the bad fields, and
    headers the answer carries (`Retry-After` of a refusal that passes)."""

    def __init__(
        self,
        status: int,
        detail: str,
        errors: Iterable[FieldProblem] = (),
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = list(errors)
        self.headers = dict(headers) if headers else {}


def invalid(loc: Sequence[str | int], message: str, value: object = ABSENT) -> ServiceError:
    """A 422 for one bad parameter or field."""
    item = field_problem(loc, message, value)
    return ServiceError(422, f"{where(item)}: {item['message']}", [item])
