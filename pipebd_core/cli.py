"""The `pipebd` command line: run, profile, plan and bench a spec on this machine.

`pipebd run` prepares a run directory and hands it to the supervisor (supervisor.py), the same one
the service's workers use; its watcher here draws a progress line and turns Ctrl-C or SIGTERM into a
cancel.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from pipebd_core import bench_finetune, bench_replan
from pipebd_core.bench import format_table, run_bench
from pipebd_core.checkpoint import resume_steps
from pipebd_core.launch import default_run_dir, prepare_run
from pipebd_core.outcomes import CANCELLED, SUCCEEDED
from pipebd_core.phases import FINETUNE, PLAN, PhaseRecord
from pipebd_core.plan import Plan, PlanError
from pipebd_core.planning.planner import search
from pipebd_core.planning.profiles import ProfileError
from pipebd_core.planning.resolve import cost_model, mode_plans
from pipebd_core.planning.simulate import simulate
from pipebd_core.planning.trust import assess
from pipebd_core.profiling import obtain_profile
from pipebd_core.progress import MetricsFollower
from pipebd_core.rundir import DISTILL, RunDir
from pipebd_core.spec import MODES, PARTITIONERS, Spec, SpecError, load_spec, parse_spec
from pipebd_core.supervisor import Outcome, Supervisor, Watcher
from pipebd_core.telemetry import append_event

QUIET_PRINT_S = 5.0  # without a terminal, print progress this often
TRAINING = (DISTILL, FINETUNE)  # the phases whose ranks write telemetry lines to follow


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


class ProgressLine(Watcher):
    """The terminal's view of a job: a line per phase change and a progress line while ranks train."""

    def __init__(self, run_dir: RunDir, spec: Spec) -> None:
        self.run_dir, self.spec = run_dir, spec
        self.follower: MetricsFollower | None = None
        self.training = DISTILL  # the phase the follower reads
        self.interactive = sys.stderr.isatty()
        self.last_print = 0.0
        self.said: dict[str, str] = {}

    def phases_changed(self, records: list[PhaseRecord]) -> None:
        for record in records:
            status = record.outcome or record.state
            if record.state == "pending" or self.said.get(record.name) == status:
                continue
            self.said[record.name] = status
            took = f" in {record.duration_s:.1f} s" if record.outcome and record.duration_s is not None else ""
            why = f" ({record.reason})" if record.reason else ""
            self.say(f"pipebd: {record.name}: {status}{took}{why}")
            if record.name == PLAN and record.outcome == SUCCEEDED:
                for warning in self.run_dir.read_json(self.run_dir.plan).get("warnings") or []:
                    self.say(f"pipebd: warning: {warning}")

    def replanned(self, entry: dict[str, Any]) -> None:
        before, after = (stages_line(entry[key]) for key in ("from", "to"))
        self.say(
            f"pipebd: distill: re-planned at step {entry['resumed_at_step']}: {before} -> {after}"
            f" (measured {entry['measured_before_s'] * 1e3:.1f} ms a step, planned"
            f" {entry['predicted_before_s'] * 1e3:.1f} ms; the new plan: {entry['predicted_after_s'] * 1e3:.1f} ms)"
        )

    def tick(self, phase: str) -> None:
        if phase not in TRAINING:
            return
        self.follow(phase)
        if self.interactive or time.time() - self.last_print > QUIET_PRINT_S:
            self.print_progress("\r" if self.interactive else "\n")

    def drain(self, phase: str) -> None:
        if phase in TRAINING:
            self.follow(phase)
            self.print_progress("\n")
            self.follower = None  # the next training phase has its own ranks and steps

    def follow(self, phase: str) -> None:
        if self.follower is None:
            self.follower = MetricsFollower(self.run_dir, phase)
            self.training = phase
        self.follower.poll()

    def print_progress(self, end: str) -> None:
        assert self.follower is not None
        tune = self.spec.finetune
        how = tune.strategy if self.training == FINETUNE and tune is not None else self.spec.schedule.mode
        head = f"[{self.spec.name} {how} x{self.spec.schedule.nproc}]"
        print(f"{head} {self.follower.progress.describe()}", end=end, file=sys.stderr, flush=True)
        self.last_print = time.time()

    def say(self, line: str) -> None:
        if self.interactive and self.follower is not None:
            line = "\n" + line
        print(line, file=sys.stderr, flush=True)


def stages_line(stages: list[dict[str, Any]]) -> str:
    """`0-2 x1 | 3-7 x1`: each stage's blocks and replicas, as `pipebd plan` writes them."""
    return " | ".join(f"{s['start']}-{s['stop'] - 1} x{s['replicas']}" for s in stages)


def interrupt_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def supervise(run_dir: RunDir, spec: Spec) -> int:
    """Run the job's phases with a progress line; report the outcome as an exit code."""
    previous = signal.signal(signal.SIGTERM, interrupt_on_sigterm)  # a kill is a cancel, like Ctrl-C
    try:
        outcome = Supervisor(run_dir, ProgressLine(run_dir, spec)).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return report(run_dir, outcome)


def report(run_dir: RunDir, outcome: Outcome) -> int:
    if outcome.result == CANCELLED:
        print(f"pipebd: cancelled during {outcome.phase}; every process was stopped", file=sys.stderr)
        return 130
    if outcome.result != SUCCEEDED:
        print(f"pipebd: the {outcome.phase} phase failed ({outcome.reason}): {outcome.error}", file=sys.stderr)
        return 1
    summary = run_dir.read_json(run_dir.summary)
    print(f"pipebd: done: {run_dir.root}")
    for key in ("student_top1", "teacher_top1"):
        if summary.get(key) is not None:
            print(f"  {key}: {summary[key]:.4f}")
    return 0


def describe_resume(run_dir: RunDir) -> str:
    """Where each block picks up, as the ranks will compute it (pipelined plans resume at one common step)."""
    if not run_dir.plan.exists():
        return "the run had not been planned yet, so it starts again from its first unfinished phase"
    plan = Plan.from_json(run_dir.read_json(run_dir.plan))
    starts = resume_steps(run_dir.checkpoints, plan.num_blocks, common=plan.is_pipeline)
    total = plan.step_plan.total
    if not any(starts):
        return f"no checkpoint to resume from, so every block starts again from step 0 of {total}"
    return ", ".join(f"block {block} at step {step}/{total}" for block, step in enumerate(starts))


def command_run(args: argparse.Namespace) -> int:
    try:
        if args.resume:
            run_dir = RunDir(Path(args.resume))
            if not run_dir.spec.exists() or not run_dir.phases.exists():
                return fail(f"--resume {args.resume}: no spec.json and phases.json there; is it a run directory?")
            spec = parse_spec(run_dir.read_json(run_dir.spec))
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
    return supervise(run_dir, spec)


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
    trust = assess(profile)
    print("profile: " + ("trusted" if trust["trusted"] else ", ".join(trust["flags"]).upper()))
    for message in trust["messages"]:
        print(f"  {message}")
    return 0


def command_plan(args: argparse.Namespace) -> int:
    try:
        spec = load_run_spec(args)
        profile = obtain_profile(spec)[0]
        model = cost_model(spec, profile)
        result = search(model)
        modes = {mode: simulate(plan, model)[0] for mode, plan in mode_plans(model).items()}
    except (SpecError, PlanError, ProfileError) as error:
        return fail(str(error))
    report_ = {
        "plans": [plan.to_json() for plan in result.plans],
        "plans_considered": result.considered,
        "stages_rejected_for_memory": result.rejected_for_memory,
        "mode_step_s": modes,
        "ideal_step_s": model.ideal_step(),
    }
    trust = assess(profile)
    report_["profile_trust"] = trust
    if args.json:
        print(json.dumps(report_, indent=1))
        return 0
    print("profile: " + ("trusted" if trust["trusted"] else ", ".join(trust["flags"]).upper()))
    for message in trust["messages"]:
        print(f"  {message}")
    print(f"{result.considered} plans fit in memory; the best {len(result.plans)}:")
    for rank, plan in enumerate(result.plans, start=1):
        stages = stages_line([{"start": s.start, "stop": s.stop, "replicas": s.replicas} for s in plan.stages])
        print(f"{rank:3}. {plan.step_s * 1e3:9.2f} ms/step  bottleneck stage {plan.bottleneck}  [{stages}]")
    print("predicted ms per global step: " + ", ".join(f"{m} {t * 1e3:.1f}" for m, t in modes.items()))
    print(f"ideal bound: {model.ideal_step() * 1e3:.1f} ms")
    return 0


def command_bench(args: argparse.Namespace) -> int:
    finetune = args.phase == "finetune"
    known = bench_finetune.STRATEGIES if finetune else MODES
    partitioners = comma_list(args.partitioners)
    modes = comma_list(args.modes or ("" if partitioners else ",".join(known)))
    unknown = [mode for mode in modes if mode not in known]
    if unknown:
        return fail(f"--modes: unknown {', '.join(unknown)}; for --phase {args.phase} choose from {', '.join(known)}")
    wrong = [name for name in partitioners if name not in PARTITIONERS]
    if wrong or (partitioners and not finetune):
        return fail(
            f"--partitioners: {'unknown ' + ', '.join(wrong) if wrong else 'compares end-to-end training'};"
            f" give --phase finetune and some of {', '.join(PARTITIONERS)}"
        )
    try:
        spec = load_run_spec(args)
        out = Path(args.out) if args.out else default_run_dir(spec, Path("runs") / "bench")
        if args.replan:
            report = bench_replan.run_replan_bench(
                spec, args.steps, args.repeats, out, args.load_cores, args.trials, keep=args.keep
            )
            table = bench_replan.format_table(report)
        elif finetune:
            report = bench_finetune.run_finetune_bench(
                spec, modes, args.steps, args.repeats, out, keep=args.keep, partitioners=partitioners
            )
            table = bench_finetune.format_table(report)
        else:
            report = run_bench(spec, modes, args.steps, args.repeats, out, keep=args.keep)
            table = format_table(report)
    except (SpecError, PlanError, ProfileError, RuntimeError) as error:
        return fail(str(error))
    print(json.dumps(report, indent=1) if args.json else table)
    return 0


def comma_list(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


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

    bench = commands.add_parser("bench", help="run modes (or strategies) side by side and report measured ratios")
    add_spec_arguments(bench)
    bench.add_argument("--phase", choices=("distill", "finetune"), default="distill", help="what to benchmark")
    bench.add_argument(
        "--modes", help="comma-separated modes (distill: dp,ls,ir,tr,tr_dpu,auto) or strategies (finetune)"
    )
    bench.add_argument(
        "--partitioners", help="finetune: comma-separated partitioners (even,pipedream,layerpipe,auto), one schedule"
    )
    bench.add_argument("--steps", type=int, default=20, help="optimiser steps (per block, for distill) each run")
    bench.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every mode")
    bench.add_argument("--out", help="folder for the runs and bench.json (default runs/bench/<name>-<time>)")
    bench.add_argument("--keep", action="store_true", help="keep every run's directory")
    bench.add_argument(
        "--replan",
        action="store_true",
        help="auto from a profile taken under load, with and without re-planning, next to a clean profile",
    )
    bench.add_argument("--load-cores", type=int, default=1, help="--replan: cores kept busy while profiling")
    bench.add_argument("--trials", type=int, default=5, help="--replan: timed trials per profiled measurement")
    bench.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.set_defaults(handler=command_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
