"""The transformer workload end to end on a teacher trained here: held-out perplexity of the teacher, the
network distilled from it under a parameter budget, that network fine-tuned with KD, and a network of the
same size trained from scratch for as many steps.

Four `pipebd run` jobs on 2 ranks, on this repository's own docs/ as byte-level text (64-token sequences,
the same held-out tenth for every model):

  teacher    examples/tiny-llama-teacher.yaml: the 4-layer Llama trained from scratch (kind train)
  distilled  examples/tiny-llama-text.yaml with that teacher: every layer searched among keep, ffn_1/2,
             ffn_1/4, no_attention and noop under `budget: {params: 0.5}` (tr_dpu), then fine-tuned with
             kd on the teacher's logits (ddp): its perplexity after distillation, and after fine-tuning
  scratch    kind train of a uniform Llama of the same decoder-layer parameters (FFN width 96: 50.1% of
             the teacher's layers), trained for the distillation's and the fine-tuning's steps together

Per model: held-out perplexity (from each job's summary.json), decoder-layer parameters and KV-cache bytes
per token (architecture.json for the searched network), and forward tokens/s of a batch of 16 x 64
tokens on one thread, measured here. Run it alone:

    ../shared/bin/quiet .venv/bin/python benchmarks/language_model.py

Writes benchmarks/records/language-model.json (`--out`); prints the table docs/benchmarks.md renders from
it. Never asserted: the figures depend on the machine and the docs' text.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipebd_core.bench.conditions import commit, machine, measured_command  # noqa: E402
from pipebd_core.bench.page import render_language_model  # noqa: E402
from pipebd_core.planning.profiles import CACHE_ENV  # noqa: E402
from pipebd_core.rundir import RunDir  # noqa: E402
from pipebd_core.spec import Spec, parse_spec  # noqa: E402
from pipebd_core.workloads.transformer import TokenEmbedding, kv_cache_bytes, language_model_to_train  # noqa: E402

OUT = REPO / "benchmarks" / "records" / "language-model.json"
RUN_TIMEOUT_S = 1800
SEARCH = ["keep", "ffn_1/2", "ffn_1/4", "no_attention", "noop"]
SCRATCH_FFN = 96  # decoder layers of 50.1% of the teacher's parameters (attention kept, FFN 256 -> 96)
TIMED_BATCH, TIMED_REPEATS = 16, 20


def example(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())
    document["data"]["root"] = str(REPO / "docs")
    return document


def specs(teacher_dir: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The teacher's, the distillation's and the scratch network's job documents."""
    teacher = example("tiny-llama-teacher")
    teacher["finetune"]["max_steps"] = args.teacher_steps
    distilled = example("tiny-llama-text")
    config = distilled["workload"].pop("config")
    distilled["name"] = "tiny-llama-distilled"
    distilled["workload"].update(teacher=str(teacher_dir), replacements=SEARCH, budget={"params": 0.5})
    distilled["train"]["max_steps"] = args.distill_steps
    distilled["finetune"] = {
        "strategy": "ddp",
        "loss": "kd",
        "alpha": 0.5,
        "temperature": 2.0,
        "epochs": 4,
        "max_steps": args.finetune_steps,
        "lr": args.finetune_lr,
        "weight_decay": 0.0,
        "profile": False,
    }
    scratch = example("tiny-llama-teacher")
    scratch["name"] = "tiny-llama-scratch"
    scratch["workload"]["config"] = {**config, "intermediate_size": SCRATCH_FFN}
    scratch["finetune"]["max_steps"] = args.distill_steps + args.finetune_steps
    return {"teacher": teacher, "distilled": distilled, "scratch": scratch}


def run(document: dict[str, Any], out: Path, env: dict[str, str]) -> tuple[RunDir, dict[str, Any]]:
    """One job through `pipebd run`; its run directory and the load on the machine meanwhile."""
    path = out.with_suffix(".json")
    path.write_text(json.dumps(document))
    command = [sys.executable, "-m", "pipebd_core.cli", "run", str(path), "--out", str(out)]
    done = measured_command(command, f"language_model: {document['name']}", REPO, env, RUN_TIMEOUT_S)
    return RunDir(out), {"wall_s": done.wall_s, "load": done.load.model_dump()}


def tokens_per_s(network: nn.Module, spec: Spec) -> float:
    """Forward tokens per second of a batch of TIMED_BATCH sequences, one thread, after a warm-up."""
    ids = torch.randint(0, 256, (TIMED_BATCH, spec.data.seq_len))
    network.eval()
    with torch.no_grad():
        network(ids)
        started = time.perf_counter()
        for _ in range(TIMED_REPEATS):
            network(ids)
    return TIMED_BATCH * spec.data.seq_len * TIMED_REPEATS / (time.perf_counter() - started)


def layers_of(network: nn.Sequential) -> list[nn.Module]:
    """The decoder blocks of a network, the embedding and the head left out: a distilled network's block 0
    holds the embedding before its layer; a network trained from a config has the embedding as a layer."""
    blocks = list(network)[:-1]
    first = blocks[0]
    if isinstance(first, TokenEmbedding):
        return blocks[1:]
    return [first[-1] if isinstance(first, nn.Sequential) else first, *blocks[1:]]


def costs(layers: list[nn.Module]) -> dict[str, int]:
    return {
        "params": sum(p.numel() for layer in layers for p in layer.parameters()),
        "kv_cache_bytes": sum(kv_cache_bytes(layer) for layer in layers),
    }


def measure(runs: dict[str, tuple[RunDir, dict[str, Any]]], spec_of: dict[str, Spec]) -> list[dict[str, Any]]:
    """The table's rows: every model's perplexity, costs, tokens/s and training steps."""
    (teacher_dir, teacher_run), (distilled_dir, _), (scratch_dir, _) = (
        runs["teacher"],
        runs["distilled"],
        runs["scratch"],
    )
    teacher_summary = teacher_dir.load_summary().finetune
    distilled_summary = distilled_dir.load_summary()
    scratch_summary = scratch_dir.load_summary().finetune
    assert teacher_summary is not None and scratch_summary is not None and distilled_summary.finetune is not None
    teacher_net = language_model_to_train(spec_of["teacher"])
    teacher_net.load_state_dict(torch.load(teacher_dir.finetuned_model, map_location="cpu", weights_only=True))
    searched: nn.Sequential = torch.load(distilled_dir.searched_model, map_location="cpu", weights_only=False)
    tuned: nn.Sequential = torch.load(distilled_dir.searched_model, map_location="cpu", weights_only=False)
    tuned.load_state_dict(torch.load(distilled_dir.finetuned_model, map_location="cpu", weights_only=True))
    scratch_net = language_model_to_train(spec_of["scratch"])
    architecture = distilled_dir.read_json(distilled_dir.architecture)
    distill_steps, tune = spec_of["distilled"].train.max_steps, spec_of["distilled"].finetune
    assert tune is not None
    rows = [
        ("teacher", teacher_summary.perplexity_after, teacher_net, spec_of["teacher"].finetune, None, teacher_run),
        ("distilled", distilled_summary.student_perplexity, searched, None, distill_steps, runs["distilled"][1]),
        ("fine-tuned", distilled_summary.finetune.perplexity_after, tuned, tune, distill_steps, None),
        (
            "scratch",
            scratch_summary.perplexity_after,
            scratch_net,
            spec_of["scratch"].finetune,
            None,
            runs["scratch"][1],
        ),
    ]
    table = []
    for name, perplexity, network, tuning, distilled_steps, job in rows:
        layers = layers_of(network)
        row: dict[str, Any] = {"model": name, "perplexity": perplexity, **costs(layers)}
        row["distill_steps"] = distilled_steps or 0
        row["end_to_end_steps"] = tuning.max_steps if tuning is not None else 0
        row["tokens_per_s"] = tokens_per_s(network, spec_of["teacher"])
        if job is not None:
            row["job"] = job
        table.append(row)
    table[1]["chosen"] = [block["layers"][0] for block in architecture["blocks"]]
    table[1]["budget"], table[1]["reached"] = architecture["budget"], architecture["reached"]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-steps", type=int, default=600)
    parser.add_argument("--distill-steps", type=int, default=160, help="at most an epoch: about 163 steps")
    parser.add_argument("--finetune-steps", type=int, default=160)
    parser.add_argument("--finetune-lr", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="pipebd-lm-"))
    env = {**os.environ, CACHE_ENV: str(work / "cache"), "OMP_NUM_THREADS": "1"}
    try:
        documents = specs(work / "teacher" / "teacher_model", args)
        runs = {name: run(document, work / name, env) for name, document in documents.items()}
        table = measure(runs, {name: parse_spec(document) for name, document in documents.items()})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {"benchmark": "language_model", "commit": commit(), "machine": machine().model_dump()}
    record |= {"settings": {key: value for key, value in vars(args).items() if key != "out"}, "rows": table}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(render_language_model(record))


if __name__ == "__main__":
    main()
