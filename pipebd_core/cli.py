"""The `pipebd` command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pipebd_core.bench import format_table, run_bench
from pipebd_core.checkpoint import resume_steps
from pipebd_core.launch import Steps, cost_model, default_run_dir, prepare_run, start_ranks
from pipebd_core.plan import Plan, PlanError
from pipebd_core.planning.planner import search
from pipebd_core.planning.profiles import ProfileError, obtain_profile
from pipebd_core.planning.resolve import mode_plans
from pipebd_core.planning.simulate import simulate
from pipebd_core.processes import stop_process_tree
from pipebd_core.progress import MetricsFollower
from pipebd_core.rundir import RunDir
from pipebd_core.spec import MODES, Spec, SpecError, load_spec, parse_spec
from pipebd_core.telemetry import append_event


def fail(message: str) -> int:
    print(f"pipebd: error: {message}", file=sys.stderr)
    return 2


def load_run_spec(args: argparse.Namespace) -> Spec:
    overrides = list(args.set or [])
    if args.nproc is not None:
        overrides.append(f"schedule.nproc={args.nproc}")
    if args.mode is not None:
        overrides.append(f"schedule.mode={args.mode}")
    return load_spec(args.spec, overrides)


def print_failure(run_dir: RunDir, returncode: int) -> None:
    errors = run_dir.rank_errors()
    if errors:
        first = errors[0]
        print(f"\npipebd: rank {first['rank']} failed: {first['type']}: {first['message']}", file=sys.stderr)
        print(first["traceback"], file=sys.stderr)
        return
    log = run_dir.root / "logs" / "launcher.log"
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    print(f"\npipebd: the ranks exited with code {returncode}; launcher log:\n{tail}", file=sys.stderr)


def follow(run_dir: RunDir, spec: Spec) -> int:
    """Launch the ranks, draw a progress line until they exit, report the outcome."""
    plan = Plan.from_json(run_dir.read_json(run_dir.plan))
    process = start_ranks(spec, run_dir)
    follower = MetricsFollower(run_dir, plan)
    interactive = sys.stderr.isatty()
    last_print = 0.0
    try:
        while process.poll() is None:
            time.sleep(0.25)
            follower.poll()
            if interactive or time.time() - last_print > 5:
                end = "\r" if interactive else "\n"
                print(
                    f"[{spec.name} {spec.schedule.mode} x{spec.schedule.nproc}] {follower.progress.describe()}",
                    end=end,
                    file=sys.stderr,
                    flush=True,
                )
                last_print = time.time()
    except KeyboardInterrupt:
        stop_process_tree(process)
        append_event(run_dir.events, "cancelled", reason="keyboard interrupt")
        print("\npipebd: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    follower.poll()
    print(f"[{spec.name}] {follower.progress.describe()}", file=sys.stderr)
    if process.returncode != 0:
        append_event(run_dir.events, "failed", returncode=process.returncode)
        print_failure(run_dir, process.returncode)
        return 1
    append_event(run_dir.events, "finished")
    summary = run_dir.read_json(run_dir.summary)
    print(f"pipebd: done: {run_dir.root}")
    for key in ("student_top1", "teacher_top1"):
        if summary.get(key) is not None:
            print(f"  {key}: {summary[key]:.4f}")
    return 0


def describe_resume(run_dir: RunDir) -> str:
    """Where each block picks up, as the ranks will compute it (pipelined plans resume at one common step)."""
    plan = Plan.from_json(run_dir.read_json(run_dir.plan))
    starts = resume_steps(run_dir.checkpoints, plan.num_blocks, common=plan.is_pipeline)
    total = plan.details["total_steps"]
    if not any(starts):
        return f"no checkpoint to resume from, so every block starts again from step 0 of {total}"
    return ", ".join(f"block {block} at step {step}/{total}" for block, step in enumerate(starts))


def command_run(args: argparse.Namespace) -> int:
    try:
        if args.resume:
            run_dir = RunDir(Path(args.resume))
            if not run_dir.spec.exists():
                return fail(f"--resume {args.resume}: no spec.json there; is it a run directory?")
            spec = parse_spec(run_dir.read_json(run_dir.spec))
            run_dir.clear_errors()  # the errors of the interrupted attempt are not this attempt's
            append_event(run_dir.events, "resumed")
            print(f"pipebd: resuming: {describe_resume(run_dir)}", file=sys.stderr)
        else:
            if args.spec is None:
                return fail("give a spec file, or --resume DIR")
            spec = load_run_spec(args)
            run_dir = prepare_run(spec, Path(args.out) if args.out else None)
    except (SpecError, PlanError, ProfileError) as error:
        return fail(str(error))
    print(f"pipebd: run directory {run_dir.root}", file=sys.stderr)
    for warning in run_dir.read_json(run_dir.plan).get("warnings") or []:
        print(f"pipebd: warning: {warning}", file=sys.stderr)
    return follow(run_dir, spec)


def command_profile(args: argparse.Namespace) -> int:
    try:
        spec = load_run_spec(args)
        profile, cached = obtain_profile(spec, refresh=args.refresh, trials=args.trials)
    except (SpecError, ProfileError) as error:
        return fail(str(error))
    if args.json:
        print(json.dumps(profile, indent=1))
        return 0
    print(
        f"profile of {spec.name} on {spec.schedule.nproc} x {profile['device']} ({'cached' if cached else 'measured'})"
    )
    print(f"{'block':>5} {'batch':>5} {'teacher ms':>11} {'student ms':>11} {'spread':>7}")
    for index, block in enumerate(profile["blocks"]):
        for batch in profile["batch_sizes"]:
            teacher, student = block["teacher_s"][str(batch)], block["student_s"][str(batch)]
            spread = max(teacher["spread"], student["spread"])
            print(f"{index:5} {batch:5} {teacher['median'] * 1e3:11.2f} {student['median'] * 1e3:11.2f} {spread:7.0%}")
    return 0


def command_plan(args: argparse.Namespace) -> int:
    try:
        spec = load_run_spec(args)
        model, _ = cost_model(spec, Steps.of(spec))
        result = search(model)
        modes = {mode: simulate(plan, model)[0] for mode, plan in mode_plans(model).items()}
    except (SpecError, PlanError, ProfileError) as error:
        return fail(str(error))
    report = {
        "plans": [plan.to_json() for plan in result.plans],
        "plans_considered": result.considered,
        "stages_rejected_for_memory": result.rejected_for_memory,
        "mode_step_s": modes,
        "ideal_step_s": model.ideal_step(),
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{result.considered} plans fit in memory; the best {len(result.plans)}:")
    for rank, plan in enumerate(result.plans, start=1):
        stages = " | ".join(f"{s.start}-{s.stop - 1} x{s.replicas}" for s in plan.stages)
        print(f"{rank:3}. {plan.step_s * 1e3:9.2f} ms/step  bottleneck stage {plan.bottleneck}  [{stages}]")
    print("predicted ms per global step: " + ", ".join(f"{m} {t * 1e3:.1f}" for m, t in modes.items()))
    print(f"ideal bound: {model.ideal_step() * 1e3:.1f} ms")
    return 0


def command_bench(args: argparse.Namespace) -> int:
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        return fail(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}")
    try:
        spec = load_run_spec(args)
        out = Path(args.out) if args.out else default_run_dir(spec, Path("runs") / "bench")
        report = run_bench(spec, modes, args.steps, args.repeats, out, keep=args.keep)
    except (SpecError, PlanError, ProfileError, RuntimeError) as error:
        return fail(str(error))
    print(json.dumps(report, indent=1) if args.json else format_table(report))
    return 0


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="job spec, YAML or JSON")
    parser.add_argument("--nproc", type=int, help="number of ranks (overrides schedule.nproc)")
    parser.add_argument("--mode", help="execution mode (overrides schedule.mode)")
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a spec field, value parsed as YAML"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipebd", description="Pipelined blockwise knowledge distillation")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a job on this machine with torchrun")
    add_spec_arguments(run)
    run.add_argument("--out", help="run directory (default runs/<name>-<timestamp>)")
    run.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    run.set_defaults(handler=command_run)

    profile = commands.add_parser("profile", help="measure every block on this node (cached)")
    add_spec_arguments(profile)
    profile.add_argument("--refresh", action="store_true", help="measure again even if a profile is cached")
    profile.add_argument("--trials", type=int, default=5, help="timed trials per measurement")
    profile.add_argument("--json", action="store_true", help="print the profile as JSON")
    profile.set_defaults(handler=command_profile)

    plan = commands.add_parser("plan", help="rank every plan and predict every mode from the profile")
    add_spec_arguments(plan)
    plan.add_argument("--json", action="store_true", help="print the ranked plans as JSON")
    plan.set_defaults(handler=command_plan)

    bench = commands.add_parser("bench", help="run modes side by side and report measured ratios")
    add_spec_arguments(bench)
    bench.add_argument("--modes", default="dp,ls,ir,tr,tr_dpu,auto", help="comma-separated modes")
    bench.add_argument("--steps", type=int, default=20, help="optimiser steps per block in each run")
    bench.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every mode")
    bench.add_argument("--out", help="folder for the runs and bench.json (default runs/bench/<name>-<time>)")
    bench.add_argument("--keep", action="store_true", help="keep every run's directory")
    bench.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.set_defaults(handler=command_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
