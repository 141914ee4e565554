"""The recovery benchmark: `auto` planned from a profile taken under load, with and without re-planning,
next to `auto` planned from a clean profile, side by side in one run.

`pipebd bench SPEC --replan` measures two profiles of the spec first: a clean one, and one taken while
`--load-cores` processes keep cores busy (loadgen.py; stopped before any training). Then, `repeats`
times with the order rotated, it runs the same steps three ways, each from a fresh copy of its
profile in a cache of its own (so no run's calibration reaches another):

    loaded      the loaded profile, schedule.replan false: what a job did before calibration
    replanned   the loaded profile, schedule.replan true: calibrates and re-plans mid-run
    clean       the clean profile, schedule.replan false

Each run reports its steady step (the slowest rank's pace after STEADY_STATE_SKIP steps of its last
launch: the plan it ended with), the plans it ran, its re-plans, and its last calibration's predicted
step for the plan it ran next to the measured one. The report gives replanned / clean (target: within
5%) and the calibrated prediction's error (target: within 10%).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipebd_core.bench import bench_spec
from pipebd_core.launch import prepare_run
from pipebd_core.loadgen import busy_cores
from pipebd_core.outcomes import SUCCEEDED
from pipebd_core.planning import profiles
from pipebd_core.planning.trust import assess
from pipebd_core.profiling import obtain_profile
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.supervisor import Supervisor

VARIANTS = ("loaded", "replanned", "clean")
STEADY_STATE_SKIP = 2
RUN_TIMEOUT_S = 3600.0


@contextmanager
def profile_cache(folder: Path) -> Iterator[Path]:
    """Point the profile cache at `folder` while the block runs (the phases' processes inherit it)."""
    before = os.environ.get(profiles.CACHE_ENV)
    os.environ[profiles.CACHE_ENV] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop(profiles.CACHE_ENV, None)
        else:
            os.environ[profiles.CACHE_ENV] = before


def measure_profiles(spec: Spec, out: Path, load_cores: int, trials: int) -> dict[str, dict[str, Any]]:
    """The clean profile, then the one taken under load."""
    with profile_cache(out / "cache-clean"):
        clean, _ = obtain_profile(spec, refresh=True, trials=trials)
    with profile_cache(out / "cache-loaded"), busy_cores(load_cores):
        loaded, _ = obtain_profile(spec, refresh=True, trials=trials)
    return {"clean": clean, "loaded": loaded}


def variant_spec(spec: Spec, variant: str, steps: int) -> Spec:
    document = bench_spec(spec, "auto", steps).model_dump(mode="json")
    document["schedule"]["replan"] = variant == "replanned"
    return Spec.model_validate(document)


def last_launch_lines(run_dir: RunDir, nproc: int, since: float) -> list[list[dict[str, Any]]]:
    """Each rank's weight-round lines written after `since` (the last launch's start)."""
    lines = []
    for rank in range(nproc):
        records = [json.loads(line) for line in run_dir.metrics(rank).read_text().splitlines()]
        lines.append([r for r in records if r.get("round") == "weights" and r["time"] >= since])
    return lines


def steady_step_s(lines: list[list[dict[str, Any]]]) -> float:
    rates = []
    for records in lines:
        first = min(STEADY_STATE_SKIP, len(records) - 2)
        start, end = records[first], records[-1]
        rates.append((end["time"] - start["time"]) / max(1, end["step"] - start["step"]))
    return max(rates)


def run_variant(spec: Spec, profile: dict[str, Any], out: Path) -> dict[str, Any]:
    """One run from a fresh copy of `profile` in a cache of its own."""
    with profile_cache(out / "cache"):
        profiles.store(spec, copy.deepcopy(profile))
        run_dir = prepare_run(spec, out / "run")
        outcome = Supervisor(run_dir, time_limit_s=RUN_TIMEOUT_S).run()
    if outcome.result != SUCCEEDED:
        raise RuntimeError(f"bench --replan: a run {outcome.result} in {outcome.phase}: {outcome.error}")
    events = [json.loads(line) for line in run_dir.events.read_text().splitlines()]
    distill_start = next(e["time"] for e in events if e["event"] == "phase_started" and e["phase"] == "distill")
    since = max([distill_start, *(e["time"] for e in events if e["event"] == "replanned")])
    plan = run_dir.read_json(run_dir.plan)
    calibrations = [e for e in events if e["event"] == "calibrated" and e["time"] >= since]
    last = calibrations[-1] if calibrations else {}
    result = {
        "measured_step_s": steady_step_s(last_launch_lines(run_dir, plan["nproc"], since)),
        "predicted_step_s": plan["predicted_step_s"],
        "calibrated_step_s": last.get("calibrated_step_s"),
        "calibration_measured_step_s": last.get("measured_step_s"),
        "stages": [[s["start"], s["stop"], s["replicas"]] for s in plan["stages"]],
        "replans": plan.get("replans", []),
        "declined": [e["reason"] for e in events if e["event"] == "replan_declined"],
    }
    (out / "run" / "compressed_model.pt").unlink(missing_ok=True)
    return result


def run_replan_bench(
    spec: Spec, steps: int, repeats: int, out: Path, load_cores: int = 1, trials: int = 5, keep: bool = False
) -> dict[str, Any]:
    """Measure both profiles, run every variant `repeats` times interleaved; the report (out/bench.json)."""
    measured = measure_profiles(spec, out, load_cores, trials)
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    for repeat in range(repeats):
        order = VARIANTS[repeat % 3 :] + VARIANTS[: repeat % 3]
        for variant in order:
            folder = out / f"{variant}-{repeat}"
            source = measured["clean" if variant == "clean" else "loaded"]
            runs[variant].append(run_variant(variant_spec(spec, variant, steps), source, folder))
            if not keep:
                shutil.rmtree(folder, ignore_errors=True)
    variants = {variant: summarise(results) for variant, results in runs.items()}
    clean = variants["clean"]["measured_step_s"]
    report: dict[str, Any] = {
        "name": spec.name,
        "nproc": spec.schedule.nproc,
        "steps": steps,
        "repeats": repeats,
        "load_cores": load_cores,
        "profiles": {name: assess(profile) for name, profile in measured.items()},
        "variants": variants,
        "replanned_vs_clean": variants["replanned"]["measured_step_s"] / clean,
        "loaded_vs_clean": variants["loaded"]["measured_step_s"] / clean,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    return report


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    step = statistics.median(r["measured_step_s"] for r in results)
    calibrated = [r for r in results if r["calibrated_step_s"] and r["calibration_measured_step_s"]]
    errors = [r["calibrated_step_s"] / r["calibration_measured_step_s"] - 1 for r in calibrated]
    return {
        "measured_step_s": step,
        "measured_step_s_runs": [r["measured_step_s"] for r in results],
        "predicted_step_s": results[0]["predicted_step_s"],
        "calibrated_prediction_error": statistics.median(errors) if errors else None,
        "stages": [r["stages"] for r in results],
        "replans": [len(r["replans"]) for r in results],
        "declined": [r["declined"] for r in results],
    }


def format_table(report: dict[str, Any]) -> str:
    head = f"{'variant':10} {'step ms':>8} {'vs clean':>9} {'planned ms':>11} {'calib. err':>10} {'re-plans':>8}"
    lines = [f"{head}  final stages"]
    clean = report["variants"]["clean"]["measured_step_s"]
    for variant, entry in report["variants"].items():
        error = entry["calibrated_prediction_error"]
        lines.append(
            f"{variant:10} {entry['measured_step_s'] * 1e3:8.1f} {entry['measured_step_s'] / clean:8.2f}x"
            f" {entry['predicted_step_s'] * 1e3:11.1f} {'-' if error is None else f'{error:+.0%}':>10}"
            f" {','.join(map(str, entry['replans'])):>8}  {entry['stages'][-1]}"
        )
    for variant, entry in report["variants"].items():
        for reasons in entry["declined"]:
            lines.extend(f"{variant}: no re-plan: {reason}" for reason in reasons[-1:])
    for name, trust in report["profiles"].items():
        lines.append(f"{name} profile: {'trusted' if trust['trusted'] else ', '.join(trust['flags'])}")
        lines.extend(f"  {message}" for message in trust["messages"])
    return "\n".join(lines)
