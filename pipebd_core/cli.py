"""The `pipebd` command line."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipebd_core.launch import prepare_run, start_ranks, stop_process_tree
from pipebd_core.plan import Plan, PlanError
from pipebd_core.progress import MetricsFollower
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError, load_spec, parse_spec
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


def command_run(args: argparse.Namespace) -> int:
    try:
        if args.resume:
            run_dir = RunDir(Path(args.resume))
            if not run_dir.spec.exists():
                return fail(f"--resume {args.resume}: no spec.json there; is it a run directory?")
            spec = parse_spec(run_dir.read_json(run_dir.spec))
            run_dir.clear_errors()  # the errors of the interrupted attempt are not this attempt's
            append_event(run_dir.events, "resumed")
        else:
            if args.spec is None:
                return fail("give a spec file, or --resume DIR")
            spec = load_run_spec(args)
            run_dir = prepare_run(spec, Path(args.out) if args.out else None)
    except (SpecError, PlanError) as error:
        return fail(str(error))
    print(f"pipebd: run directory {run_dir.root}", file=sys.stderr)
    return follow(run_dir, spec)


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
