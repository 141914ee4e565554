"""The side-by-side benchmark of the finetune phase: every strategy, the same steps, interleaved and repeated.

`pipebd bench SPEC --phase finetune --modes ddp,gpipe,1f1b,zb,auto` runs, for each strategy, a job of
just the end-to-end training phases (layer profile, plan, finetune) on the spec's network freshly
initialised (speed does not depend on the weights, so no distillation runs first), `repeats` times
with the order rotated so the drifts of a shared machine spread over every strategy. From each run's
own telemetry: the steady step time (the slowest rank's, after STEADY_STATE_SKIP steps), samples/s,
speed-up over ddp, each rank's bubble (the share of its step it waits: receives, sends, idle), the
efficiency against the bubble-free bound (all ranks' compute divided by N), peak memory per rank, and
the planner's predicted step next to it. The layer profile also says what the split backward costs:
(I + W) / B over the network's layers.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from pipebd_core.launch import prepare_run
from pipebd_core.outcomes import SUCCEEDED
from pipebd_core.phases import FINETUNE, PLAN_FINETUNE, PROFILE_FINETUNE
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError, parse_spec
from pipebd_core.supervisor import Supervisor
from pipebd_core.training.plan import TrainPlan

STRATEGIES = ("ddp", "gpipe", "1f1b", "zb", "auto")
STEADY_STATE_SKIP = 2
RUN_TIMEOUT_S = 3600.0
COMPUTE = ("F", "B", "I", "W", "optim")
WAITING = ("recv_wait", "send", "idle")


def bench_spec(spec: Spec, strategy: str, steps: int) -> Spec:
    """`spec` training end to end with `strategy` for exactly `steps` steps, from a fresh network."""
    if spec.finetune is None:
        raise SpecError("bench --phase finetune: the spec has no finetune section; add finetune: {} to it")
    document = spec.model_dump(mode="json")
    document["finetune"].update(strategy=strategy, max_steps=steps, epochs=1_000, profile=True, init="scratch")
    document["finetune"]["stages"] = None if strategy in ("ddp", "auto") else document["finetune"]["stages"]
    return parse_spec(document)


def read_lines(run_dir: RunDir, nproc: int) -> list[list[dict[str, Any]]]:
    lines = []
    for rank in range(nproc):
        path = run_dir.metrics(rank, FINETUNE)
        lines.append([json.loads(line) for line in path.read_text().splitlines() if '"elapsed"' in line])
    return lines


def steady_step_s(lines: list[list[dict[str, Any]]]) -> float:
    """Seconds per step at steady state: each rank's pace between its lines, the slowest rank's."""
    rates = []
    for records in lines:
        ends = [record["time"] for record in records]
        first = min(STEADY_STATE_SKIP, len(ends) - 2)
        rates.append((ends[-1] - ends[first]) / (len(ends) - 1 - first))
    return max(rates)


def run_once(spec: Spec, out: Path) -> dict[str, Any]:
    run_dir = prepare_run(spec, out, phases=[PROFILE_FINETUNE, PLAN_FINETUNE, FINETUNE])
    outcome = Supervisor(run_dir, time_limit_s=RUN_TIMEOUT_S).run()
    if outcome.result != SUCCEEDED:
        raise RuntimeError(
            f"bench: {spec.finetune.strategy if spec.finetune else '?'} {outcome.result}: {outcome.error}"
        )
    plan = TrainPlan.from_json(run_dir.read_json(run_dir.finetune_plan))
    lines = read_lines(run_dir, plan.nproc)
    steady = [records[STEADY_STATE_SKIP:] or records for records in lines]
    per_rank = [
        {k: statistics.median(r["times"][k] for r in records) for k in (*COMPUTE, *WAITING)} for records in steady
    ]
    step = steady_step_s(lines)
    work = sum(sum(times[k] for k in COMPUTE) for times in per_rank)
    profile = run_dir.read_json(run_dir.layer_profile)
    return {
        "strategy": plan.strategy,
        "stages": [list(stage) for stage in plan.stages],
        "measured_step_s": step,
        "predicted_step_s": plan.details.get("predicted_step_s"),
        "bubble": [sum(times[k] for k in WAITING) / step for times in per_rank],
        "bound_step_s": work / plan.nproc,
        "peak_mem_bytes": [max(record["peak_mem"] for record in records) for records in lines],
        "split_cost": split_cost(profile),
    }


def split_cost(profile: dict[str, Any]) -> float:
    """(I + W) / B over every layer at one micro-batch: what splitting the backward costs by itself."""
    layers = profile["layers"]
    split = sum(layer["microbatch"][k]["median"] for layer in layers for k in ("I", "W"))
    whole = sum(layer["microbatch"]["B"]["median"] for layer in layers)
    return split / whole if whole else float("nan")


def summarise(spec: Spec, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    batch = (spec.finetune.batch_size if spec.finetune else None) or spec.data.batch_size
    modes: dict[str, Any] = {}
    for strategy, results in runs.items():
        step = statistics.median(r["measured_step_s"] for r in results)
        modes[strategy] = {
            "strategy": results[0]["strategy"],
            "stages": results[0]["stages"],
            "measured_step_s": step,
            "measured_step_s_runs": [r["measured_step_s"] for r in results],
            "predicted_step_s": results[0]["predicted_step_s"],
            "samples_per_s": batch / step,
            "bubble": [statistics.median(values) for values in zip(*(r["bubble"] for r in results), strict=True)],
            "efficiency": statistics.median(r["bound_step_s"] for r in results) / step,
            "peak_mem_bytes": [
                int(statistics.median(v)) for v in zip(*(r["peak_mem_bytes"] for r in results), strict=True)
            ],
        }
    if "ddp" in modes:
        for entry in modes.values():
            entry["speedup_vs_ddp"] = entry["samples_per_s"] / modes["ddp"]["samples_per_s"]
    return modes


def run_finetune_bench(
    spec: Spec, strategies: list[str], steps: int, repeats: int, out: Path, keep: bool = False
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {strategy: [] for strategy in strategies}
    split = None
    for repeat in range(repeats):
        order = strategies[repeat % len(strategies) :] + strategies[: repeat % len(strategies)]
        for strategy in order:
            folder = out / f"{strategy}-{repeat}"
            result = run_once(bench_spec(spec, strategy, steps), folder)
            runs[strategy].append(result)
            split = result["split_cost"]
            if not keep:
                shutil.rmtree(folder, ignore_errors=True)
    report = {
        "name": spec.name,
        "phase": FINETUNE,
        "nproc": spec.schedule.nproc,
        "steps": steps,
        "repeats": repeats,
        "split_cost": split,
        "modes": summarise(spec, runs),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    return report


def format_table(report: dict[str, Any]) -> str:
    head = f"{'strategy':10} {'samples/s':>10} {'vs ddp':>7} {'eff.':>6} {'pred s':>8} {'meas s':>8} {'err':>6}"
    head += "  bubble/rank  peak MiB/rank"
    lines = [head]
    for name, entry in report["modes"].items():
        predicted, measured = entry["predicted_step_s"], entry["measured_step_s"]
        error = f"{(predicted - measured) / measured:+.0%}" if predicted else "-"
        label = name if name != "auto" else f"auto={entry['strategy']}"
        bubble = ",".join(f"{b:.0%}" for b in entry["bubble"])
        memory = ",".join(f"{b / 2**20:.0f}" for b in entry["peak_mem_bytes"])
        lines.append(
            f"{label:10} {entry['samples_per_s']:10.1f} {entry.get('speedup_vs_ddp', float('nan')):6.2f}x"
            f" {entry['efficiency']:5.0%} {predicted or float('nan'):8.4f} {measured:8.4f} {error:>6}"
            f"  {bubble:11}  {memory}"
        )
    lines.append(f"split backward (I + W) / B over the layers: {report['split_cost']:.2f}")
    return "\n".join(lines)
