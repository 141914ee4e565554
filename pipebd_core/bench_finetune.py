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

`--partitioners even,pipedream,layerpipe` runs one pipelined strategy (the spec's, or `--modes` with a
single one, else zb) with each partitioner instead, the same way, and reports beside those fields each
partition's stages and moves, every stage's compute per step predicted and measured (the slowest
stage sets the pace), the bytes the moves add to a step, and the speed-up over pipedream.
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
from pipebd_core.training.plan import PIPELINED, TrainPlan

STRATEGIES = ("ddp", "gpipe", "1f1b", "zb", "auto")
STEADY_STATE_SKIP = 2
RUN_TIMEOUT_S = 3600.0
COMPUTE = ("F", "B", "I", "W", "optim")
WAITING = ("recv_wait", "send", "idle")


def bench_spec(spec: Spec, strategy: str, steps: int, partitioner: str | None = None) -> Spec:
    """`spec` training end to end with `strategy` for exactly `steps` steps, from a fresh network (with
    `partitioner`, cut by it rather than by the spec's stages)."""
    if spec.finetune is None:
        raise SpecError("bench --phase finetune: the spec has no finetune section; add finetune: {} to it")
    document = spec.model_dump(mode="json")
    tune = document["finetune"]
    tune.update(strategy=strategy, max_steps=steps, epochs=1_000, profile=True, init="scratch")
    if strategy in ("ddp", "auto") or partitioner is not None:
        tune.update(stages=None, moved=None)
    if partitioner is not None:
        tune["partitioner"] = partitioner
    return parse_spec(document)


def partitioner_strategy(spec: Spec, strategies: list[str]) -> str:
    """The one pipelined strategy a partitioner benchmark runs: --modes', the spec's, or zb."""
    if not strategies:
        tune = spec.finetune
        return tune.strategy if tune is not None and tune.strategy in PIPELINED else "zb"
    if len(strategies) != 1 or strategies[0] not in PIPELINED:
        raise SpecError(
            f"bench --partitioners: runs one pipelined schedule with every partition; give --modes one of"
            f" {', '.join(PIPELINED)}, not {','.join(strategies)}"
        )
    return strategies[0]


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
    computed = [sum(times[k] for k in COMPUTE) for times in per_rank]
    profile = run_dir.read_json(run_dir.layer_profile)
    return {
        "strategy": plan.strategy,
        "stages": [list(stage) for stage in plan.stages],
        "moved": plan.moved,
        "partition": plan.details.get("partition"),
        "measured_step_s": step,
        "predicted_step_s": plan.details.get("predicted_step_s"),
        "measured_stage_s": computed,
        "predicted_stage_s": plan.details.get("predicted_stage_s"),
        "bubble": [sum(times[k] for k in WAITING) / step for times in per_rank],
        "bound_step_s": sum(computed) / plan.nproc,
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
    """Per strategy (or partitioner): the median of its runs, and its speed-up over ddp where ddp ran."""
    batch = (spec.finetune.batch_size if spec.finetune else None) or spec.data.batch_size
    modes: dict[str, Any] = {}
    for name, results in runs.items():
        step = statistics.median(r["measured_step_s"] for r in results)
        modes[name] = {
            "strategy": results[0]["strategy"],
            "stages": results[0]["stages"],
            "measured_step_s": step,
            "measured_step_s_runs": [r["measured_step_s"] for r in results],
            "predicted_step_s": results[0]["predicted_step_s"],
            "samples_per_s": batch / step,
            "bubble": per_rank_median(results, "bubble"),
            "efficiency": statistics.median(r["bound_step_s"] for r in results) / step,
            "peak_mem_bytes": [int(value) for value in per_rank_median(results, "peak_mem_bytes")],
        }
    if "ddp" in modes:
        for entry in modes.values():
            entry["speedup_vs_ddp"] = entry["samples_per_s"] / modes["ddp"]["samples_per_s"]
    return modes


def per_rank_median(results: list[dict[str, Any]], key: str) -> list[float]:
    return [statistics.median(values) for values in zip(*(r[key] for r in results), strict=True)]


def summarise_partitioners(spec: Spec, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """`summarise` per partitioner, with its partition, stage times predicted and measured, and the
    bytes its moves add; speed-up over pipedream where pipedream ran."""
    entries = summarise(spec, runs)
    for name, entry in entries.items():
        first, partition = runs[name][0], runs[name][0]["partition"] or {}
        measured = per_rank_median(runs[name], "measured_stage_s")
        entry.update(
            partitioner=name,
            moved=first["moved"],
            moves=partition.get("moves", []),
            extra_bytes_per_step=partition.get("extra_bytes_per_step", 0),
            predicted_stage_s=first["predicted_stage_s"],
            measured_stage_s=measured,
            predicted_slowest_stage_s=max(first["predicted_stage_s"] or [float("nan")]),
            measured_slowest_stage_s=max(measured),
        )
    if "pipedream" in entries:
        for entry in entries.values():
            entry["speedup_vs_pipedream"] = entry["samples_per_s"] / entries["pipedream"]["samples_per_s"]
    return entries


def run_variants(variants: dict[str, Spec], repeats: int, out: Path, keep: bool) -> dict[str, list[dict[str, Any]]]:
    """Every variant `repeats` times, the order rotated each round."""
    names = list(variants)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            folder = out / f"{name}-{repeat}"
            runs[name].append(run_once(variants[name], folder))
            if not keep:
                shutil.rmtree(folder, ignore_errors=True)
    return runs


def run_finetune_bench(
    spec: Spec,
    strategies: list[str],
    steps: int,
    repeats: int,
    out: Path,
    keep: bool = False,
    partitioners: list[str] | None = None,
) -> dict[str, Any]:
    """Strategies side by side, or (`partitioners`) one pipelined strategy on each partitioner's cut."""
    report: dict[str, Any] = {"name": spec.name, "phase": FINETUNE, "nproc": spec.schedule.nproc, "steps": steps}
    if partitioners:
        strategy = partitioner_strategy(spec, strategies)
        runs = run_variants({p: bench_spec(spec, strategy, steps, p) for p in partitioners}, repeats, out, keep)
        report.update(strategy=strategy, partitioners=summarise_partitioners(spec, runs))
    else:
        runs = run_variants({s: bench_spec(spec, s, steps) for s in strategies}, repeats, out, keep)
        report["modes"] = summarise(spec, runs)
    report.update(repeats=repeats, split_cost=next(iter(runs.values()))[-1]["split_cost"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    return report


def format_table(report: dict[str, Any]) -> str:
    if "partitioners" in report:
        return format_partitioners(report)
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


def format_partitioners(report: dict[str, Any]) -> str:
    head = f"{report['strategy']} on {report['nproc']} ranks"
    head += f"\n{'partitioner':11} {'stages':>14} {'moved':>7} {'samples/s':>10} {'vs pd':>6} {'pred s':>8}"
    head += f" {'meas s':>8} {'err':>6}  slowest stage pred/meas s  bubble/rank  extra KiB/step"
    lines = [head]
    for name, entry in report["partitioners"].items():
        predicted, measured = entry["predicted_step_s"], entry["measured_step_s"]
        error = f"{(predicted - measured) / measured:+.0%}" if predicted else "-"
        stages = ",".join(str(start) for start, _ in entry["stages"])
        moved = ",".join(str(k) for k in entry["moved"]) or "-"
        bubble = ",".join(f"{b:.0%}" for b in entry["bubble"])
        slowest = f"{entry['predicted_slowest_stage_s']:.4f} / {entry['measured_slowest_stage_s']:.4f}"
        lines.append(
            f"{name:11} {stages:>14} {moved:>7} {entry['samples_per_s']:10.1f}"
            f" {entry.get('speedup_vs_pipedream', float('nan')):5.2f}x {predicted or float('nan'):8.4f}"
            f" {measured:8.4f} {error:>6}  {slowest:>25}  {bubble:11}  {entry['extra_bytes_per_step'] / 1024:.1f}"
        )
    lines.append(f"split backward (I + W) / B over the layers: {report['split_cost']:.2f}")
    return "\n".join(lines)
