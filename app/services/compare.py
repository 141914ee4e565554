"""Comparing any number of jobs: a selection (ids, a sweep, a state or a name), sorted and paged in SQL,
the spec fields that differ across the whole selection, and summary columns for the page's rows.

Queries per request, whatever the selection's size: one count, one read of the selection's specs (to find
the fields that differ: every spec is flattened to dotted paths), one page of jobs (sorted, offset, limit),
and one aggregate of the page's telemetry (each block's lowest and highest loss). The final loss per block
the top-1 and a language model's perplexity come from each page row's summary.json (files, at most `limit`
of them).

A sort on a column of the job table is SQL's. A sort on a spec field (`spec.train.lr`), on the final loss
(the mean of the blocks' final losses, as a sweep's `final_loss` objective), the top-1 or the perplexity is
done here, over the whole selection: its specs are read anyway, and these sorts read every selected job's
summary.json (`final_loss`, `top1`, `perplexity`), so they cost a file per job (docs/benchmarks.md has the
500-job figures).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Mapped
from sqlmodel import Session, col, func, select

from app.core.json_types import JsonObject
from app.core.objectives import final_loss
from app.core.summaries import read_summary, summary_in
from app.core.tables import DB_INT_MAX, EVAL_SEQ, Job, JobMetric
from app.services.errors import EXCERPT_CHARS, excerpt
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.summary import Summary

MAX_IDS = 1000  # ids in one `ids` list at most (a sweep or a filter selects any number)
MAX_BLOCKS = 64  # blocks whose loss is summarized at most
SORTS: dict[str, Mapped[Any]] = {  # what `sort` accepts (`-` before it: descending); ties go by id
    "id": col(Job.id),
    "name": col(Job.name),
    "state": col(Job.state),
    "priority": col(Job.priority),
    "created_at": col(Job.created_at),
    "finished_at": col(Job.finished_at),
    "progress": col(Job.progress),
    "samples_per_s": col(Job.samples_per_s),
}
SPEC_SORT = "spec."  # `spec.<dotted field>`: by that spec field


class CompareError(ValueError):
    """A bad query parameter: which, why and what would work, and the value sent."""

    def __init__(self, parameter: str, message: str, value: str) -> None:
        super().__init__(message)
        self.parameter, self.value = parameter, value


@dataclass(frozen=True)
class Selection:
    """Which jobs: every condition given must hold (none given: every job)."""

    ids: list[int] | None = None
    sweep_id: int | None = None
    state: str | None = None
    name: str | None = None  # a part of the name


@dataclass
class Stat:
    min: float | None = None
    max: float | None = None
    final: float | None = None


@dataclass
class Row:
    job: Job
    fields: JsonObject  # dotted path -> value, only the columns shown
    loss: dict[str, Stat] = field(default_factory=dict)  # per block (its index as text)
    top1: float | None = None
    perplexity: float | None = None


@dataclass
class Comparison:
    total: int
    rows: list[Row]
    fields: list[str]  # the spec columns shown, in order
    differing: list[str]  # the spec fields that differ across the whole selection
    sort: str
    offset: int
    limit: int
    all_fields: bool

    @property
    def next_offset(self) -> int | None:
        end = self.offset + len(self.rows)
        return end if end < self.total else None


def is_job_id(value: str) -> bool:
    """Digits of an id within the database's range (never more digits than int() converts quickly)."""
    return value.isascii() and value.isdigit() and len(value) <= len(str(DB_INT_MAX)) and 0 < int(value) <= DB_INT_MAX


def parse_ids(text: str) -> list[int]:
    """Distinct job ids from `3,4,7` in the order given; CompareError naming the first bad one."""
    raw = [part.strip() for part in text.split(",") if part.strip()]
    bad = [value for value in raw if not is_job_id(value)]
    if bad:
        shown = excerpt(repr(bad[0]), EXCERPT_CHARS)
        raise CompareError("ids", f"{shown} is not a job id; give job ids separated by commas, e.g. 3,4", text)
    found = list(dict.fromkeys(int(value) for value in raw))
    if not found:
        raise CompareError("ids", "no job id; give job ids separated by commas, e.g. 3,4, or leave `ids` out", text)
    if len(found) > MAX_IDS:
        raise CompareError(
            "ids", f"at most {MAX_IDS} ids, got {len(found)}; select a sweep (`sweep_id`) or filter instead", text
        )
    return found


def parse_sort(text: str) -> tuple[str, bool]:
    """(`column`, descending) of `-column`; CompareError listing the columns otherwise."""
    name = text.removeprefix("-")
    if name not in SORTS and name not in SUMMARY_SORTS and not (name.startswith(SPEC_SORT) and name != SPEC_SORT):
        shown = excerpt(repr(text), EXCERPT_CHARS)
        raise CompareError("sort", f"{shown} is not a sort column; one of {SORT_NAMES}, with `-` for descending", text)
    return name, text.startswith("-")


def top1(summary: Summary) -> float | None:
    """The top-1 a comparison shows: after finetuning, else the compressed student's."""
    return summary.finetune.top1_after if summary.finetune is not None else summary.student_top1


def perplexity(summary: Summary) -> float | None:
    """A language model's held-out perplexity: after fine-tuning where it was, else the distilled (or
    searched) network's."""
    if summary.finetune is not None and summary.finetune.perplexity_after is not None:
        return summary.finetune.perplexity_after
    return summary.student_perplexity


SUMMARY_VALUES: dict[str, Callable[[Summary], float | None]] = {
    "final_loss": final_loss,
    "top1": top1,
    "perplexity": perplexity,
}
SUMMARY_SORTS = tuple(SUMMARY_VALUES)  # by a value of each job's summary.json
SORT_NAMES = ", ".join([*SORTS, *SUMMARY_SORTS, "spec.<field> (e.g. spec.train.lr)"])


def sort_key(value: Any) -> tuple[int, Any] | None:
    """An order over spec values of any type: numbers, then text, then the rest (lists, objects) by their JSON;
    None (absent, or not a finite number) sorts last either way."""
    if isinstance(value, bool | str):
        return (1, str(value))
    if isinstance(value, int | float):
        return (0, float(value)) if math.isfinite(value) else None
    return None if value is None else (2, json.dumps(value, sort_keys=True))


Selected = list[tuple[int, Mapping[str, Any], str | None]]  # every selected job's id, spec and run directory


def computed_order(jobs: Selected, name: str, descending: bool) -> list[int]:
    """The selection's ids sorted by a spec field or a summary value (`jobs`: id, spec, run_dir), as SQL sorts
    a column: ties and the jobs without a value (last) by id, descending with the sort."""
    keys: dict[int, tuple[int, Any] | None] = {}
    for job_id, spec, run_dir in jobs:
        if name.startswith(SPEC_SORT):
            keys[job_id] = sort_key(flatten(spec).get(name.removeprefix(SPEC_SORT)))
        else:
            summary = summary_in(run_dir)
            value = None if summary is None else SUMMARY_VALUES[name](summary)
            keys[job_id] = sort_key(value)
    known = sorted(((key, job_id) for job_id, key in keys.items() if key is not None), reverse=descending)
    unknown = sorted((job_id for job_id, key in keys.items() if key is None), reverse=descending)
    return [job_id for _, job_id in known] + unknown


def conditions(selection: Selection) -> list[Any]:
    if selection.name is not None and "\x00" in selection.name:  # PostgreSQL refuses NUL in text
        raise CompareError("name", "a name never contains NUL (\\x00): remove it", selection.name)
    found: list[Any] = []
    if selection.ids is not None:
        found.append(col(Job.id).in_(selection.ids))
    if selection.sweep_id is not None:
        found.append(col(Job.sweep_id) == selection.sweep_id)
    if selection.state is not None:
        found.append(col(Job.state) == selection.state)
    if selection.name:
        found.append(col(Job.name).contains(selection.name, autoescape=True))
    return found


def flatten(value: Any, prefix: str = "") -> JsonObject:
    """`{"train": {"lr": 0.1}}` as `{"train.lr": 0.1}`; lists and scalars are leaves (an empty object is one too)."""
    if isinstance(value, Mapping) and value:
        flat: JsonObject = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def differing_fields(specs: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """(every field of any spec, the fields whose value is not the same in every spec: absent counts as a value),
    both sorted."""
    first: JsonObject | None = None
    seen: set[str] = set()
    differ: set[str] = set()
    for spec in specs:
        flat = flatten(spec)
        if first is None:
            first = flat
        else:
            differ.update(key for key in flat.keys() ^ first.keys())
            differ.update(key for key in flat.keys() & first.keys() if flat[key] != first[key])
        seen.update(flat)
    return sorted(seen), sorted(differ)


def finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def loss_ranges(session: Session, job_ids: list[int], blocks: int) -> dict[int, dict[str, Stat]]:
    """Per job of the page, per block, the lowest and highest loss its distillation telemetry recorded (one query)."""
    if not job_ids or blocks < 1:
        return {}
    columns: list[Any] = [col(JobMetric.job_id)]
    for block in range(blocks):
        loss = JobMetric.record[("loss", str(block))].as_float()  # type: ignore[index]
        columns += [func.min(loss), func.max(loss)]
    query = (
        select(*columns)
        .where(col(JobMetric.job_id).in_(job_ids), col(JobMetric.phase) == DISTILL, col(JobMetric.seq) != EVAL_SEQ)
        .group_by(col(JobMetric.job_id))
    )
    found: dict[int, dict[str, Stat]] = {}
    for row in session.exec(query).all():
        stats = {
            str(block): Stat(finite(row[1 + 2 * block]), finite(row[2 + 2 * block]))
            for block in range(blocks)
            if row[1 + 2 * block] is not None
        }
        found[int(row[0])] = stats
    return found


def block_count(job: Job) -> int:
    plan = job.plan_summary or {}
    value = plan.get("num_blocks")
    return min(int(value), MAX_BLOCKS) if isinstance(value, int) and value > 0 else 0


def summary_columns(session: Session, jobs: list[Job]) -> list[Row]:
    """The page's rows with their loss per block (lowest, highest, final), top-1 (after finetuning, else the
    compressed student's) and perplexity."""
    summaries = {job.id: read_summary(job) for job in jobs}
    blocks = max([block_count(job) for job in jobs] + [0])
    for summary in summaries.values():
        if summary is not None and summary.final_loss:
            blocks = max(blocks, min(max(summary.final_loss) + 1, MAX_BLOCKS))
    ranges = loss_ranges(session, [job.id for job in jobs if job.id is not None], blocks)
    rows = []
    for job in jobs:
        loss = ranges.get(job.id or 0, {})
        summary = summaries[job.id]
        if summary is not None:
            for block, value in (summary.final_loss or {}).items():
                if 0 <= block < MAX_BLOCKS:
                    loss.setdefault(str(block), Stat()).final = finite(value)
        accuracy = None if summary is None else top1(summary)
        text = None if summary is None else perplexity(summary)
        losses = dict(sorted(loss.items(), key=lambda item: int(item[0])))
        rows.append(Row(job, {}, losses, finite(accuracy), finite(text)))
    return rows


def compare(
    session: Session,
    selection: Selection,
    *,
    sort: str = "id",
    limit: int = 50,
    offset: int = 0,
    all_fields: bool = False,
) -> Comparison:
    """One page of the selection's comparison; CompareError for a bad `sort`, or a spec field that no selected
    job has."""
    where = conditions(selection)
    name, descending = parse_sort(sort)
    total = int(session.exec(select(func.count()).select_from(Job).where(*where)).one())
    selected: Selected = [
        (job_id, spec, run_dir)
        for job_id, spec, run_dir in session.exec(select(Job.id, Job.spec, Job.run_dir).where(*where)).all()
        if job_id is not None
    ]
    every, differing = differing_fields(spec for _, spec, _ in selected)
    if name in SORTS:
        order = (SORTS[name].desc() if descending else SORTS[name].asc()).nulls_last()  # one order on every database
        tie = col(Job.id).desc() if descending else col(Job.id).asc()
        page = list(session.exec(select(Job).where(*where).order_by(order, tie).offset(offset).limit(limit)).all())
    else:
        if name.startswith(SPEC_SORT) and name.removeprefix(SPEC_SORT) not in every and selected:
            shown_name = excerpt(repr(name), EXCERPT_CHARS)
            raise CompareError(
                "sort", f"{shown_name} is no field of the selected jobs' specs (docs/spec.md lists them)", sort
            )
        ids = computed_order(selected, name, descending)[offset : offset + limit]
        found = {job.id: job for job in session.exec(select(Job).where(col(Job.id).in_(ids))).all()}
        page = [found[job_id] for job_id in ids if job_id in found]
    shown = every if all_fields else differing
    rows = summary_columns(session, page)
    for row in rows:
        flat = flatten(row.job.spec)
        row.fields = {key: flat.get(key) for key in shown}
    return Comparison(total, rows, shown, differing, sort, offset, limit, all_fields)
