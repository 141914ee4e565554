"""The benchmarks page's generated sections: each is the report of committed benchmark records.

A section of docs/benchmarks.md that comes from records sits between two markers:

    <!-- pipebd bench --report benchmarks/records/vgg16-dsconv.json -->
    ...the report of those records, exactly as `pipebd bench --report` prints it...
    <!-- end of report -->

`regenerate` replaces what is between every pair with the report of the records its opening marker names
(paths relative to the repository root; `<!-- pipebd bench --machines FILE... -->` opens the table of
which of those records shared a machine, machines.py; `<!-- pipebd bench --accuracy FILE... -->` the
accuracy tables over those accuracy records, one a phase, accuracy_table.py), leaving the rest of the page
as it is: a `pipebd bench` record (bench.json) renders as `pipebd bench --report` prints it, a service
benchmark's result file (`"benchmark": "compare"`, from benchmarks/compare_500.py) as its latency table, a
shaped-link result (`"benchmark": "shaped_link"`, benchmarks/shaped_link.py) as its
predicted-against-measured table, a language model result (`"benchmark": "language_model"`,
benchmarks/language_model.py) as its perplexity table, a search library's trade-off record (`"benchmark":
"tradeoff"`, benchmarks/tradeoff.py) as its table of budgets, a recovery record (`"benchmark": "recovery"`,
benchmarks/recovery.py) as its table of times to training again; `pipebd bench --update-page
docs/benchmarks.md` writes it back, and the suite checks that the page equals its regeneration, so no
figure of a generated section is ever typed.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from pipebd_core.bench.accuracy_table import accuracy_tables
from pipebd_core.bench.machines import machines_table
from pipebd_core.bench.recovery import RecoveryRecord, render_recovery
from pipebd_core.bench.report import load_record, render
from pipebd_core.bench.soak_page import machine_text, render_soak
from pipebd_core.documents.bench_record import Load, Machine
from pipebd_core.documents.soak_record import SoakRecord
from pipebd_core.documents.tradeoff_record import TradeoffRecord, TradeoffRow

SECTION = re.compile(
    r"(?P<open><!-- pipebd bench --(?P<kind>report|machines|accuracy) (?P<paths>[^>]+?) -->\n)(?P<body>.*?)"
    r"(?P<close><!-- end of report -->)",
    re.DOTALL,
)


def record_paths(page: str) -> list[list[str]]:
    """The record files each generated section of the page names, in page order."""
    return [match["paths"].split() for match in SECTION.finditer(page)]


def regenerate(page: str, root: Path) -> str:
    """The page with every generated section rendered again from its records under `root`."""

    def rendered(match: re.Match[str]) -> str:
        paths = match["paths"].split()
        if match["kind"] == "machines":
            reports = machines_table([(path, load_record(root / path)) for path in paths])
        elif match["kind"] == "accuracy":
            reports = accuracy_tables([(path, load_record(root / path)) for path in paths])
        else:
            reports = "\n".join(render_file(root / path) for path in paths)
        return match["open"] + "\n" + reports + "\n" + match["close"]

    return SECTION.sub(rendered, page)


def render_file(path: Path) -> str:
    """The report of one result file: a comparison benchmark's table, or a `pipebd bench` record's."""
    data = json.loads(path.read_text())
    if isinstance(data, dict) and data.get("benchmark") == "compare":
        return render_compare(data)
    if isinstance(data, dict) and data.get("benchmark") == "shaped_link":
        return render_shaped_link(data)
    if isinstance(data, dict) and data.get("benchmark") == "language_model":
        return render_language_model(data)
    if isinstance(data, dict) and data.get("benchmark") == "tradeoff":
        return render_tradeoff(TradeoffRecord.from_json(data))
    if isinstance(data, dict) and data.get("benchmark") == "recovery":
        return render_recovery(RecoveryRecord.model_validate(data))
    if isinstance(data, dict) and data.get("benchmark") == "soak":
        return render_soak(SoakRecord.model_validate(data))
    return render([load_record(path)])


def render_compare(record: dict[str, Any]) -> str:
    """benchmarks/compare_500.py's result: p50 / p95 of each request it timed (the compare API, the page, the
    sorts done outside SQL), per database."""
    results = record["results"]
    first = results[0]
    machine = Machine.model_validate(record["machine"]) if "cpu_model" in record.get("machine", {}) else None
    lines = [
        f"Commit `{record['commit']}`; machine: {machine_text(machine)}; {first['jobs']} jobs,"
        f" {first['api']['requests']} requests of each. {compare_load_text(results)}.",
        "",
        "| request | " + " | ".join(f"{result['database']} p50 / p95" for result in results) + " |",
        "|---|" + "---|" * len(results),
    ]
    for key in [key for key, value in first.items() if isinstance(value, dict) and "path" in value]:
        cells = [f"{result[key]['p50_ms']:.1f} / {result[key]['p95_ms']:.1f} ms" for result in results]
        lines.append(f"| `{first[key]['path']}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compare_load_text(results: list[dict[str, Any]]) -> str:
    """Per database, the cores other processes used while its requests were timed, and the verdict."""
    if not all("load" in result for result in results):
        return "Other processes' load: not recorded"
    loads = [(result["database"], Load.model_validate(result["load"])) for result in results]
    each = [f"{name} {load.other_cores:.3f} cores ({'**shared**' if load.shared else 'quiet'})" for name, load in loads]
    return "Other processes: " + ", ".join(each)


def render_shaped_link(record: dict[str, Any]) -> str:
    """benchmarks/shaped_link.py's result: per mode, a 2-node job's plan predicted against measured on the
    shaped link, and the what-if's prediction from a profile of one node."""
    arms = record["arms"]
    link = arms[0]["link"]
    lines = [
        f"Commit `{record['commit']}`; 2 nodes x 1 rank (network namespaces), link shaped to {record['gbit']:g} Gbit/s;"
        f" the profile measured {link['gbit_per_s']:.3f} Gbit/s and {link['latency_s'] * 1e3:.3f} ms latency"
        f" ({link['points']} sends).",
        "",
        "| mode | plan (stages) | sends between nodes | predicted | measured | error | what-if (one node's profile) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        stages = " \\| ".join(f"{a}-{b - 1} x{k}" for a, b, k in arm["stages"]) or "—"
        predicted, measured, what_if = arm["predicted_step_s"], arm["measured_step_s"], arm["what_if_step_s"]
        error = f"{(predicted - measured) / measured:+.0%}" if predicted else "—"
        shared = " (shared)" if arm["load"]["shared"] else ""
        lines.append(
            f"| {arm['mode']} | {stages} | {arm['crossing_routes']} | {predicted * 1e3:.1f} ms |"
            f" {measured * 1e3:.1f} ms{shared} | {error} | {what_if * 1e3:.1f} ms |"
        )
    return "\n".join(lines) + "\n"


def render_language_model(record: dict[str, Any]) -> str:
    """benchmarks/language_model.py's result: per model, held-out perplexity, decoder-layer costs against the
    teacher's, forward tokens/s and the steps it trained."""
    rows = record["rows"]
    teacher, searched = rows[0], rows[1]
    reached = ", ".join(f"{name} {value:.1%}" for name, value in searched["reached"].items())
    jobs = [row["job"] for row in rows if "job" in row]
    walls = " / ".join(f"{job['wall_s']:.0f} s" for job in jobs)
    load = "**shared**" if any(job["load"]["shared"] for job in jobs) else "quiet"
    lines = [
        f"Commit `{record['commit']}`; budget {searched['budget']}, reached {reached}; layers chosen:"
        f" {', '.join(searched['chosen'])}. Jobs {walls} (teacher / distillation and fine-tuning / scratch), {load}.",
        "",
        "| model | held-out perplexity | decoder-layer parameters | KV cache per token | forward tokens/s |"
        " steps trained |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        params = f"{row['params']:,} ({row['params'] / teacher['params']:.0%})"
        kv = f"{row['kv_cache_bytes']} B ({row['kv_cache_bytes'] / teacher['kv_cache_bytes']:.0%})"
        parts = [f"{row['distill_steps']} blockwise", f"{row['end_to_end_steps']} end to end"]
        steps = " + ".join(part for part in parts if not part.startswith("0 "))
        lines.append(
            f"| {row['model']} | {row['perplexity']:.2f} | {params} | {kv} | {row['tokens_per_s']:,.0f} | {steps} |"
        )
    return "\n".join(lines) + "\n"


def render_tradeoff(record: TradeoffRecord) -> str:
    """benchmarks/tradeoff.py's record: per budget chosen again from one search library, the chosen layers,
    held-out perplexity, costs against the teacher's, tokens/s of the exported directory under `transformers`
    and the time to choose; then the time to choose again beside the search's."""
    machine, settings, search = record.machine, record.settings, record.search_job
    teacher = record.rows[0]
    phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in search.phase_s.items())
    load = "**Shared**: some part ran while other processes used more than 0.15 cores" if record.shared else "Quiet"
    lines = [
        f"Commit `{record.commit or 'unknown'}`; {machine_text(machine)}. Teacher trained"
        f" {settings.teacher_steps} steps ({record.teacher_job.wall_s:.0f} s); the search (`{settings.example}`,"
        f" {settings.search_steps} steps) chose {', '.join(record.search_layers)} for"
        f" {budget_text(record.search_budget)} in {search.wall_s:.0f} s ({phases}). tokens/s: greedy `generate()`"
        f" with the KV cache, {settings.prompt_tokens}-token prompt, {settings.new_tokens} new tokens, one thread,"
        f" median of {settings.repeats}. {load}.",
        "",
        "| budget | layers chosen | held-out perplexity | decoder-layer parameters | KV cache per token |"
        " directory parameters | tokens/s | time to choose (command) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [tradeoff_row(row, teacher) for row in record.rows]
    lines += ["", choosing_line(record)]
    return "\n".join(lines) + "\n"


def budget_text(budget: dict[str, float] | None) -> str:
    return "teacher" if budget is None else ", ".join(f"{name} {value:g}" for name, value in budget.items())


def tradeoff_row(row: TradeoffRow, teacher: TradeoffRow) -> str:
    params = f"{row.params:,} ({row.params / teacher.params:.0%})"
    kv = "-"
    if teacher.kv_cache_bytes:
        kv = f"{row.kv_cache_bytes} B ({row.kv_cache_bytes / teacher.kv_cache_bytes:.0%})"
    chose = "-" if row.choose_s is None else f"{row.choose_s:.2f} s ({row.command_s or 0:.1f} s)"
    return (
        f"| {budget_text(row.budget)} | {', '.join(row.layers)} | {row.perplexity:.2f} | {params} | {kv} |"
        f" {row.model_params:,} | {row.tokens_per_s:,.0f} | {chose} |"
    )


def choosing_line(record: TradeoffRecord) -> str:
    """The time to choose again (median over the choices) beside the search job's, and whether the choice
    for the search's own budget chose what the search chose."""
    choices = [row for row in record.rows if row.budget is not None]
    own = statistics.median(row.choose_s or 0.0 for row in choices)
    command = statistics.median(row.command_s or 0.0 for row in choices)
    wall = record.search_job.wall_s
    line = (
        f"Choosing again: {own:.2f} s a choice (median; the command, interpreter start included, {command:.1f} s),"
        f" against {wall:.0f} s for the search job: {wall / command:.0f}x less."
    )
    same = [row for row in choices if row.budget == record.search_budget]
    if same:
        agrees = "the same as" if same[0].layers == record.search_layers else "**not** those"
        line += f" Chosen again for the search's own budget, the layers are {agrees} the search chose."
    return line
