"""One search library, chosen again at several budgets: the trade-off table of the bundled tiny Llama search.

Two `pipebd run` jobs on 2 ranks, on this repository's own docs/ as byte-level text, then no rank at all:

  teacher  examples/tiny-llama-teacher.yaml: the 4-layer Llama trained from scratch (kind train)
  search   examples/tiny-llama-search.yaml with that teacher: every layer's seven candidates (keep, ffn_1/2,
           ffn_1/4, kv_1, linear_attention, no_attention, noop) trained side by side under tr_dpu, the
           search's own choice made for `budget: {params: 0.5}`
  choices  for every budget of --budgets, `python -m pipebd_core.distill.choose --run-dir SEARCH ...` (what
           `pipebd choose` and POST /api/v1/jobs/{id}/choose run): the choice solved again from the kept
           library, its network assembled from the trained candidates, evaluated, written with its Hugging
           Face directory (choices/<n>/searched_hf/)

Per row (the teacher's directory first): the chosen layers, held-out perplexity, decoder-layer parameters
and KV-cache bytes per token, the whole directory's parameters, and tokens/s of the directory under
`transformers` (AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True), greedy generate() with
the KV cache, a fixed prompt and length, one thread, the median of --repeats after a warm-up); and the time to
choose again (the choice's own seconds and the command's wall time) beside the search job's. Run it alone:

    ../shared/bin/quiet --idle-wait 120 .venv/bin/python benchmarks/tradeoff.py

Writes benchmarks/records/tiny-llama-tradeoff.json (`--out`, a TradeoffRecord); prints the table that
docs/benchmarks.md renders from it. Never asserted: the figures depend on the machine and the docs' text.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipebd_core.bench.conditions import LoadMeter, commit, machine, measured_command  # noqa: E402
from pipebd_core.bench.page import render_tradeoff  # noqa: E402
from pipebd_core.documents.architecture import Architecture  # noqa: E402
from pipebd_core.documents.choice import ChoiceRecord  # noqa: E402
from pipebd_core.documents.tradeoff_record import (  # noqa: E402
    TradeoffJob,
    TradeoffRecord,
    TradeoffRow,
    TradeoffSettings,
)
from pipebd_core.planning.profiles import CACHE_ENV  # noqa: E402
from pipebd_core.rundir import RunDir  # noqa: E402

OUT = REPO / "benchmarks" / "records" / "tiny-llama-tradeoff.json"
EXAMPLE = "examples/tiny-llama-search.yaml"
RUN_TIMEOUT_S = 900
BUDGETS = "params=0.3 params=0.5 params=0.7 params=0.9 kv_cache=0.25 params=0.5,kv_cache=0.5"
PROMPT = "Blockwise distillation trains every student block against its teacher block's output, so that"


def example(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / name).read_text())
    document["data"]["root"] = str(REPO / "docs")
    return document


def specs(teacher_dir: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The teacher's and the search's job documents."""
    teacher = example("examples/tiny-llama-teacher.yaml")
    teacher["finetune"]["max_steps"] = args.teacher_steps
    search = example(EXAMPLE)
    search["workload"].pop("config")
    search["workload"]["teacher"] = str(teacher_dir)
    search["train"]["max_steps"] = args.search_steps
    search["schedule"]["profile"] = True  # measured latencies (the example skips profiling to stay cheap)
    return {"teacher": teacher, "search": search}


def run(document: dict[str, Any], out: Path, env: dict[str, str]) -> tuple[RunDir, TradeoffJob]:
    """One job through `pipebd run`; its run directory, its wall and phase times and the load meanwhile."""
    path = out.with_suffix(".json")
    path.write_text(json.dumps(document))
    command = [sys.executable, "-m", "pipebd_core.cli", "run", str(path), "--out", str(out)]
    done = measured_command(command, f"tradeoff: {document['name']}", REPO, env, RUN_TIMEOUT_S)
    run_dir = RunDir(out)
    phases = {p.name: p.duration_s for p in run_dir.load_phases() if p.duration_s is not None and p.done}
    return run_dir, TradeoffJob(wall_s=done.wall_s, phase_s=phases, load=done.load)


def parse_budget(text: str) -> dict[str, float]:
    """`params=0.5,kv_cache=0.25` as {"params": 0.5, "kv_cache": 0.25}."""
    pairs = [part.split("=", 1) for part in text.split(",")]
    return {name.strip(): float(value) for name, value in pairs}


def choose(search: RunDir, budget: dict[str, float], env: dict[str, str]) -> tuple[ChoiceRecord, float]:
    """The choice made again for `budget` by the engine's command, and the command's wall time."""
    options = [item for name, value in budget.items() for item in (f"--{name.replace('_', '-')}", str(value))]
    command = [sys.executable, "-m", "pipebd_core.distill.choose", "--run-dir", str(search.root), *options]
    done = measured_command(command, f"tradeoff: choosing {budget}", REPO, env, RUN_TIMEOUT_S)
    return ChoiceRecord.from_json(json.loads(done.stdout)), done.wall_s


def generation(folder: Path, args: argparse.Namespace) -> tuple[float, int]:
    """New tokens per second of greedy generate() with the KV cache on the directory (median of the
    repeats, after a warm-up), and the directory's parameters."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, local_files_only=True).eval()
    ids = torch.tensor([list(PROMPT.encode())[: args.prompt_tokens]])  # byte-level: byte b is token b
    fixed = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}
    seconds = []
    with torch.no_grad():
        for repeat in range(args.repeats + 1):
            started = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), use_cache=True, **fixed)
            if repeat:  # the first is the warm-up
                seconds.append(time.perf_counter() - started)
            assert out.shape[1] == ids.shape[1] + args.new_tokens, "generate() stopped early"
    return args.new_tokens / statistics.median(seconds), model.num_parameters()


def costs(architecture: Architecture) -> tuple[int, int]:
    """The chosen decoder layers' parameters and KV-cache bytes per token."""
    params = sum(block.params or 0 for block in architecture.blocks)
    return params, sum(block.kv_cache_bytes or 0 for block in architecture.blocks)


def teacher_row(teacher: RunDir, search: RunDir, args: argparse.Namespace) -> TradeoffRow:
    meter = LoadMeter.open()
    architecture = Architecture.from_json(search.read_json(search.architecture))
    perplexity = search.load_summary().teacher_perplexity
    assert perplexity is not None and architecture.teacher_params is not None
    tokens_per_s, model_params = generation(teacher.teacher_model, args)
    return TradeoffRow(
        budget=None,
        layers=["keep"] * len(architecture.blocks),
        perplexity=perplexity,
        params=architecture.teacher_params,
        kv_cache_bytes=architecture.teacher_kv_cache_bytes or 0,
        model_params=model_params,
        tokens_per_s=tokens_per_s,
        choose_s=None,
        command_s=None,
        load=meter.load(),
    )


def choice_row(search: RunDir, budget: dict[str, float], env: dict[str, str], args: argparse.Namespace) -> TradeoffRow:
    meter = LoadMeter.open()
    record, command_s = choose(search, budget, env)
    folder = search.choice(record.index)
    params, kv_cache_bytes = costs(Architecture.from_json(search.read_json(folder.architecture)))
    tokens_per_s, model_params = generation(folder.searched_hf, args)
    assert record.perplexity is not None, "a language model's choice is evaluated"
    return TradeoffRow(
        budget=budget,
        layers=record.layers,
        perplexity=record.perplexity,
        params=params,
        kv_cache_bytes=kv_cache_bytes,
        model_params=model_params,
        tokens_per_s=tokens_per_s,
        choose_s=record.seconds,
        command_s=command_s,
        load=meter.load(),
    )


def measure(args: argparse.Namespace, work: Path) -> TradeoffRecord:
    env = {**os.environ, CACHE_ENV: str(work / "cache"), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    documents = specs(work / "teacher" / "teacher_model", args)
    teacher, teacher_job = run(documents["teacher"], work / "teacher", env)
    search, search_job = run(documents["search"], work / "search", env)
    searched = Architecture.from_json(search.read_json(search.architecture))
    rows = [teacher_row(teacher, search, args)]
    rows += [choice_row(search, parse_budget(text), env, args) for text in args.budgets.split()]
    settings = TradeoffSettings(
        example=EXAMPLE,
        teacher_steps=args.teacher_steps,
        search_steps=args.search_steps,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
    )
    return TradeoffRecord(
        commit=commit(),
        machine=machine(),
        settings=settings,
        teacher_job=teacher_job,
        search_job=search_job,
        search_budget=searched.budget or {},
        search_layers=[block.layers[0] for block in searched.blocks],
        rows=rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-steps", type=int, default=600)
    parser.add_argument("--search-steps", type=int, default=160, help="at most an epoch: about 163 steps")
    parser.add_argument("--budgets", default=BUDGETS, help="space-separated, each NAME=FRACTION[,NAME=FRACTION]")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="pipebd-tradeoff-"))
    try:
        record = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(json.dumps(record.to_json(), indent=1) + "\n")
    print(render_tradeoff(record))


if __name__ == "__main__":
    main()
