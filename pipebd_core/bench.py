"""The side-by-side benchmark: every mode, the same steps, repeated and interleaved, in one run.

Each repeat runs every mode once, rotating the order so slow drifts of a shared machine spread
over all modes. A run's time per global step comes from its own telemetry, so process start-up is
excluded: pipelined plans are timed at steady state (after two steps), dp and ls over the whole
training span (every block's steps). Samples/s, speed-up over dp, efficiency against the ideal
bound, peak memory per rank and predicted vs measured step time are reported per mode.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

from pipebd_core.launch import prepare_run
from pipebd_core.outcomes import SUCCEEDED
from pipebd_core.plan import Plan
from pipebd_core.planning.profiles import ProfileError, load_cached
from pipebd_core.planning.resolve import cost_model, step_plan
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError
from pipebd_core.supervisor import Supervisor

STEADY_STATE_SKIP = 2  # steps of a pipeline excluded as warm-up and fill
RUN_TIMEOUT_S = 3600.0


def bench_spec(spec: Spec, mode: str, steps: int) -> Spec:
    """The spec with `mode`, exactly `steps` optimiser steps per block, and no explicit stages unless hybrid."""
    per_epoch = step_plan(spec).per_epoch
    document = spec.model_dump(mode="json")
    document["schedule"].update({"mode": mode, "profile": True})
    if mode != "hybrid":
        document["schedule"]["stages"] = None
    elif not document["schedule"]["stages"]:
        raise SpecError("bench: mode 'hybrid' needs schedule.stages in the spec (or use 'auto')")
    document["train"].update({"max_steps": steps, "epochs": math.ceil(steps / per_epoch)})
    return Spec.model_validate(document)


def read_metrics(run_dir: RunDir, nproc: int) -> list[list[dict[str, Any]]]:
    return [[json.loads(line) for line in run_dir.metrics(rank).read_text().splitlines()] for rank in range(nproc)]


def measured_step_s(plan: Plan, metrics: list[list[dict[str, Any]]], steps: int) -> float:
    """Seconds per global step, from the ranks' own timestamps (each line is written as a task ends)."""
    ranks = [records for records in metrics if records]
    if plan.is_pipeline:
        rates = []
        for records in ranks:
            ends = {record["step"]: record["time"] for record in records}  # a step ends with its last round
            first = min(min(ends) + STEADY_STATE_SKIP, max(ends) - 1)
            rates.append((ends[max(ends)] - ends[first]) / (max(ends) - first))
        return max(rates)
    start = min(records[0]["time"] - sum(records[0]["phases"].values()) for records in ranks)
    end = max(records[-1]["time"] for records in ranks)
    return (end - start) / steps


def run_once(spec: Spec, out: Path) -> dict[str, Any]:
    run_dir = prepare_run(spec, out)
    outcome = Supervisor(run_dir, time_limit_s=RUN_TIMEOUT_S).run()
    if outcome.result != SUCCEEDED:
        raise RuntimeError(f"bench: mode {spec.schedule.mode} {outcome.result} in {outcome.phase}: {outcome.error}")
    plan = Plan.from_json(run_dir.read_json(run_dir.plan))
    metrics = read_metrics(run_dir, plan.nproc)
    run_dir.compressed_model.unlink(missing_ok=True)  # hundreds of MB nobody reads here
    return {
        "measured_step_s": measured_step_s(plan, metrics, plan.step_plan.total),
        "peak_mem_bytes": [max(record["peak_mem"] for record in records) for records in metrics],
        "predicted_step_s": plan.details.get("predicted_step_s"),
        "stages": [{"start": s.start, "stop": s.stop, "replicas": s.replicas} for s in plan.stages],
    }


def summarise(spec: Spec, runs: dict[str, list[dict[str, Any]]], ideal_step_s: float) -> dict[str, Any]:
    batch = spec.data.batch_size
    modes: dict[str, Any] = {}
    for mode, results in runs.items():
        step = statistics.median(r["measured_step_s"] for r in results)
        memory = [
            int(statistics.median(values)) for values in zip(*(r["peak_mem_bytes"] for r in results), strict=True)
        ]
        modes[mode] = {
            "samples_per_s": batch / step,
            "measured_step_s": step,
            "measured_step_s_runs": [r["measured_step_s"] for r in results],
            "predicted_step_s": results[0]["predicted_step_s"],
            "efficiency": ideal_step_s / step,
            "peak_mem_bytes": memory,
            "stages": results[0]["stages"],
        }
    if "dp" in modes:
        dp = modes["dp"]
        for entry in modes.values():
            entry["speedup_vs_dp"] = entry["samples_per_s"] / dp["samples_per_s"]
            entry["peak_mem_overhead_vs_dp"] = max(entry["peak_mem_bytes"]) / max(dp["peak_mem_bytes"]) - 1
    return modes


def run_bench(spec: Spec, modes: list[str], steps: int, repeats: int, out: Path, keep: bool = False) -> dict[str, Any]:
    """Run every mode `repeats` times, interleaved; returns the report (also written to out/bench.json)."""
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for repeat in range(repeats):
        order = modes[repeat % len(modes) :] + modes[: repeat % len(modes)]
        for mode in order:
            folder = out / f"{mode}-{repeat}"
            runs[mode].append(run_once(bench_spec(spec, mode, steps), folder))
            if not keep:
                shutil.rmtree(folder, ignore_errors=True)
    first = bench_spec(spec, modes[0], steps)
    profile = load_cached(first)  # the first run profiled (or found the cache); every run planned from it
    if profile is None:
        raise ProfileError(f"bench: no cached profile of {spec.name} after the runs; was the cache removed?")
    model = cost_model(first, profile)
    report = {
        "name": spec.name,
        "nproc": spec.schedule.nproc,
        "batch_size": spec.data.batch_size,
        "steps": steps,
        "repeats": repeats,
        "device": profile["device"],
        "ideal_step_s": model.ideal_step(),
        "modes": summarise(spec, runs, model.ideal_step()),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    return report


def format_table(report: dict[str, Any]) -> str:
    head = (
        f"{'mode':8} {'samples/s':>10} {'vs dp':>7} {'eff.':>6} {'pred s':>8} {'meas s':>8} {'err':>6}  peak MiB/rank"
    )
    lines = [head]
    for mode, entry in report["modes"].items():
        predicted, measured = entry["predicted_step_s"], entry["measured_step_s"]
        error = f"{(predicted - measured) / measured:+.0%}" if predicted else "-"
        memory = ",".join(f"{b / 2**20:.0f}" for b in entry["peak_mem_bytes"])
        lines.append(
            f"{mode:8} {entry['samples_per_s']:10.1f} {entry.get('speedup_vs_dp', float('nan')):6.2f}x"
            f" {entry['efficiency']:5.0%} {predicted or float('nan'):8.3f} {measured:8.3f} {error:>6}  {memory}"
        )
    lines.append(f"ideal step {report['ideal_step_s']:.3f}s on {report['nproc']} x {report['device']}")
    return "\n".join(lines)
