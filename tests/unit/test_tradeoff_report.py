"""The trade-off record (benchmarks/tradeoff.py) renders as its table: one row per budget with the figures the
record holds, the time to choose again beside the search's, a shared part marked, and another version of the
record refused where it is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebd_core.bench.page import render_file, render_tradeoff
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.bench_record import Load, Machine
from pipebd_core.documents.tradeoff_record import TradeoffJob, TradeoffRecord, TradeoffRow, TradeoffSettings

QUIET = Load(wall_s=10.0, other_cores=0.02, shared=False)


def row(
    budget: dict[str, float] | None, layers: list[str], params: int, kv: int, choose_s: float | None
) -> TradeoffRow:
    return TradeoffRow(
        budget=budget,
        layers=layers,
        perplexity=14.456 if budget is None else 17.5,
        params=params,
        kv_cache_bytes=kv,
        model_params=params + 33_000,
        tokens_per_s=1234.4 if budget is None else 2345.6,
        choose_s=choose_s,
        command_s=None if choose_s is None else choose_s + 6.0,
        load=QUIET,
    )


def record(search_layers: list[str], shared: bool = False) -> TradeoffRecord:
    return TradeoffRecord(
        commit="abc123",
        machine=Machine(cpu_model="Xeon", cores=2, memory_bytes=24 * 2**30, gpus=[], python="3.11.7", torch="2.14.1"),
        settings=TradeoffSettings(
            example="examples/tiny-llama-search.yaml",
            teacher_steps=600,
            search_steps=160,
            prompt_tokens=64,
            new_tokens=64,
            repeats=5,
        ),
        teacher_job=TradeoffJob(wall_s=57.0, phase_s={"finetune": 40.0}, load=QUIET),
        search_job=TradeoffJob(
            wall_s=120.0,
            phase_s={"distill": 90.0, "finalize": 8.0},
            load=Load(wall_s=120.0, other_cores=0.6 if shared else 0.01, shared=shared),
        ),
        search_budget={"params": 0.5},
        search_layers=search_layers,
        rows=[
            row(None, ["keep"] * 2, 1000, 1024, None),
            row({"params": 0.5}, ["ffn_1/2", "noop"], 480, 512, 1.0),
            row({"params": 0.3, "kv_cache": 0.25}, ["noop", "kv_1"], 300, 256, 3.0),
        ],
    )


def test_every_budget_is_a_row_of_its_figures_against_the_teachers() -> None:
    text = render_tradeoff(record(["ffn_1/2", "noop"]))
    lines = text.splitlines()
    table = [line for line in lines if line.startswith("| ")]
    assert table[0].startswith("| budget | layers chosen | held-out perplexity |")
    assert table[1] == "| teacher | keep, keep | 14.46 | 1,000 (100%) | 1024 B (100%) | 34,000 | 1,234 | - |"
    assert table[2] == (
        "| params 0.5 | ffn_1/2, noop | 17.50 | 480 (48%) | 512 B (50%) | 33,480 | 2,346 | 1.00 s (7.0 s) |"
    )
    assert table[3].startswith("| params 0.3, kv_cache 0.25 | noop, kv_1 | 17.50 | 300 (30%) | 256 B (25%) |")
    assert "in 120 s (distill 90 s, finalize 8 s)" in lines[0] and lines[0].endswith("Quiet.")
    # the median of the choices (1 s and 3 s: 2 s; commands 7 s and 9 s: 8 s) beside the search's 120 s
    assert lines[-1].startswith(
        "Choosing again: 2.00 s a choice (median; the command, interpreter start included, 8.0 s)"
    )
    assert "against 120 s for the search job: 15x less." in lines[-1]
    assert lines[-1].endswith("the layers are the same as the search chose.")


def test_a_choice_that_differs_from_the_searchs_own_and_a_shared_part_are_said() -> None:
    text = render_tradeoff(record(["keep", "noop"], shared=True))
    assert "the layers are **not** those the search chose." in text
    assert "**Shared**: some part ran while other processes used more than 0.15 cores." in text
    assert not text.splitlines()[0].endswith("Quiet.")


def test_the_page_renders_a_record_file_by_its_benchmark_and_refuses_another_version(tmp_path: Path) -> None:
    path = tmp_path / "tradeoff.json"
    document = record(["ffn_1/2", "noop"]).to_json()
    path.write_text(json.dumps(document))
    assert render_file(path) == render_tradeoff(record(["ffn_1/2", "noop"]))
    path.write_text(json.dumps({**document, "format_version": 99}))
    with pytest.raises(DocumentError, match=r"trade-off record was written as version 99"):
        render_file(path)
