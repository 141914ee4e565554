"""A soak record (`"benchmark": "soak"`, `pipebd soak --out FILE`) as a generated section of a page
(docs/reliability.md; the dispatch is page.py's `render_file`): jobs submitted and finished per kind, faults per
kind, user actions, SSE followers and their reconnects, webhook deliveries and their retries, API latency
percentiles, resident memory from start to end, each invariant's verdict, then
the machine and every segment's wall time and load, quiet or **shared**. A record written before a field
existed renders "not recorded" in its place."""

from __future__ import annotations

from pipebd_core.documents.bench_record import Machine
from pipebd_core.documents.soak_record import FollowerCounts, SoakRecord, SoakSegment, WebhookCounts

NOT_RECORDED = "not recorded"


def render_soak(record: SoakRecord) -> str:
    """The record's summary table, then its segments' table."""
    commit = f"`{record.commit}`" if record.commit else NOT_RECORDED
    machine = machine_text(record.machine)
    lines = [
        f"Seed {record.seed}, {record.minutes:g} minutes of mix; commit {commit}; machine: {machine}.",
        "",
        "| | |",
        "| --- | --- |",
        f"| jobs submitted (finished) | {jobs_text(record)} |",
        f"| faults | {counts_text(record.faults)} |",
        f"| user actions (requests) | {counts_text(record.actions) if record.actions is not None else NOT_RECORDED} |",
        f"| SSE followers | {followers_text(record.followers)} |",
        f"| webhook deliveries | {webhooks_text(record.webhooks)} |",
        f"| API latency | {latency_text(record.api_latency_ms)} |",
        f"| resident memory, start to end | {memory_text(record)} |",
        f"| invariants | {invariants_text(record)} |",
        "",
    ]
    lines += segments_lines(record.segments)
    return "\n".join(lines) + "\n"


def machine_text(machine: Machine | None) -> str:
    if machine is None:
        return NOT_RECORDED
    gpus = ", ".join(machine.gpus) if machine.gpus else "no GPU"
    return (
        f"{machine.cores} x {machine.cpu_model}, {gpus}, {machine.memory_bytes / 2**30:.0f} GiB,"
        f" Python {machine.python}, torch {machine.torch}"
    )


def counts_text(counts: dict[str, int]) -> str:
    """`total: kind n, kind n, ...`"""
    return f"{sum(counts.values()):,}: " + ", ".join(f"{kind} {n:,}" for kind, n in counts.items())


def jobs_text(record: SoakRecord) -> str:
    submitted, finished = record.jobs.submitted, record.jobs.finished
    each = ", ".join(f"{kind} {n:,} ({finished.get(kind, 0):,})" for kind, n in submitted.items())
    return f"{sum(submitted.values()):,} ({sum(finished.values()):,}): {each}"


def followers_text(counts: FollowerCounts | None) -> str:
    if counts is None:
        return NOT_RECORDED
    return (
        f"{counts.followers:,}, {counts.reconnects:,} reconnects with Last-Event-ID,"
        f" {counts.events:,} events sent to them"
    )


def webhooks_text(counts: WebhookCounts | None) -> str:
    if counts is None:
        return NOT_RECORDED
    return (
        f"{counts.deliveries:,}: succeeded {counts.succeeded:,}, failed {counts.failed:,} (after their retries);"
        f" {counts.retries:,} retries; {counts.received:,} received"
    )


def latency_text(latency_ms: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:,.0f} ms" for name, value in latency_ms.items())


def memory_text(record: SoakRecord) -> str:
    start, end = record.memory.start, record.memory.end
    return ", ".join(f"{name} {start[name]:,.1f} to {end.get(name, start[name]):,.1f} MiB" for name in start)


def invariants_text(record: SoakRecord) -> str:
    """`all N held`, or how many held and each violated one with its first violation."""
    verdicts = record.invariants
    violated = {name: outcome.detail for name, outcome in verdicts.items() if not outcome.held}
    if not violated:
        return f"all {len(verdicts)} held"
    each = "; ".join(f"**`{name}` violated**: {detail or 'no detail'}" for name, detail in violated.items())
    return f"{len(verdicts) - len(violated)} of {len(verdicts)} held; {each}"


def segments_lines(segments: list[SoakSegment] | None) -> list[str]:
    if segments is None:
        return [f"Segments, their wall time and the load on the machine: {NOT_RECORDED}."]
    lines = [
        "| segment | minutes of mix | wall | other processes | soak's own outside its tree | load |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    return lines + [segment_row(segment) for segment in segments]


def segment_row(segment: SoakSegment) -> str:
    head = f"| {segment.index} | {segment.minutes:g} |"
    if segment.load is None:
        return f"{head} {NOT_RECORDED} | {NOT_RECORDED} | {NOT_RECORDED} | {NOT_RECORDED} |"
    outside = NOT_RECORDED if segment.outside_tree_cpu_s is None else f"{segment.outside_tree_cpu_s:,.0f} CPU s"
    load = "**shared**" if segment.load.shared else "quiet"
    return f"{head} {segment.load.wall_s:,.0f} s | {segment.load.other_cores:.3f} cores | {outside} | {load} |"
