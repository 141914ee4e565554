"""The engine's part of the `pipebd` command line: `run`, `profile`, `plan` and `bench` on this machine.

The parser imports nothing heavy: each command's handler lives in commands.py (torch, the supervisor,
the planners) and is imported only when that command runs, so `pipebd api` and the other service
commands (app/cli) share this one parser without loading torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

HANDLERS = "pipebd_core.commands"  # the module holding command_<name> for every engine command


def fail(message: str) -> int:
    """Print a command's error line; the exit code of a refused command."""
    print(f"pipebd: error: {message}", file=sys.stderr)
    return 2


def engine_handler(name: str) -> Callable[[argparse.Namespace], int]:
    """A handler resolved on use: `engine_handler("run")` runs commands.command_run."""

    def handle(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(HANDLERS), f"command_{name}")(args))

    handle.__name__ = f"command_{name}"
    return handle


def comma_list(text: str | None) -> list[str]:
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", nargs="?", help="job spec, YAML or JSON")
    parser.add_argument("--nproc", type=int, help="number of ranks (overrides schedule.nproc)")
    parser.add_argument("--mode", help="execution mode (overrides schedule.mode)")
    parser.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a spec field, value parsed as YAML"
    )


def add_engine_commands(commands: Any) -> None:
    """Add `run`, `profile`, `plan` and `bench` to a `pipebd` parser's subcommands."""
    run = commands.add_parser("run", help="run a job on this machine with torchrun")
    add_spec_arguments(run)
    run.add_argument("--out", help="run directory (default runs/<name>-<timestamp>)")
    run.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    nodes = run.add_argument_group("several nodes (docs/multinode.md): --out is the run directory every node shares")
    nodes.add_argument("--nnodes", type=int, default=1, help="nodes of the job (sets schedule.nodes)")
    nodes.add_argument("--node-rank", type=int, default=0, help="this node: 0 runs the phases, others follow")
    nodes.add_argument("--rdzv-endpoint", metavar="HOST[:PORT]", help="node 0's address (and port) for the rendezvous")
    nodes.add_argument("--rdzv-id", help="the same on every node of one run (a new one for each run)")
    nodes.add_argument("--local-addr", help="the address the other nodes reach this one at (default: torchrun's guess)")
    run.set_defaults(handler=engine_handler("run"))

    profile = commands.add_parser("profile", help="measure every block on this node (cached)")
    add_spec_arguments(profile)
    profile.add_argument("--refresh", action="store_true", help="measure again even if a profile is cached")
    profile.add_argument("--trials", type=int, default=5, help="timed trials per measurement")
    profile.add_argument("--json", action="store_true", help="print the profile as JSON")
    profile.set_defaults(handler=engine_handler("profile"))

    plan = commands.add_parser("plan", help="rank every plan and predict every mode from the profile")
    add_spec_arguments(plan)
    plan.add_argument("--json", action="store_true", help="print the ranked plans as JSON")
    what_if = plan.add_argument_group("what if (docs/multinode.md): plan for several nodes from a profile of one")
    what_if.add_argument("--nodes", type=int, help="nodes of --nproc ranks each (default: the spec's)")
    what_if.add_argument("--link-gbps", type=float, help="the link between nodes, in Gbit/s")
    what_if.add_argument("--link-latency-ms", type=float, help="its one-way latency (default: the node's, measured)")
    plan.set_defaults(handler=engine_handler("plan"))

    add_bench_command(commands)


def add_bench_command(commands: Any) -> None:
    """`pipebd bench`: modes or strategies side by side, resumable, fitted to minutes, checked from records."""
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
    bench.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every arm (3: an interval)")
    bench.add_argument(
        "--minutes",
        type=float,
        help="choose the steps (up to --steps) and repeats (at least --repeats) that fit this many minutes"
        " (a short probe run first measures start-up and step)",
    )
    bench.add_argument(
        "--resume", metavar="RECORD", help="continue the bench whose record (bench.json) this is, where it stopped"
    )
    bench.add_argument(
        "--again-shared",
        action="store_true",
        help="with --resume: measure again every run of the record measured shared, then the runs left",
    )
    bench.add_argument(
        "--reprofile",
        action="store_true",
        help="distillation: measure the profile every arm plans from now, not the cached one (which is refused"
        " when it was measured on a busy machine)",
    )
    bench.add_argument("--out", help="folder for the runs and bench.json (default runs/bench/<name>-<time>)")
    bench.add_argument("--keep", action="store_true", help="keep every run's directory")
    bench.add_argument(
        "--replan",
        action="store_true",
        help="auto from a profile taken under load, with and without re-planning, next to a clean profile",
    )
    bench.add_argument(
        "--accuracy",
        action="store_true",
        help="run every candidate plan (each mode's, the planner's top five, five drawn) and check the predictions",
    )
    bench.add_argument("--seed", type=int, default=0, help="--accuracy: draws the five other plans")
    bench.add_argument("--load-cores", type=int, default=1, help="--replan: cores kept busy while profiling")
    bench.add_argument("--trials", type=int, default=5, help="--replan: timed trials per profiled measurement")
    bench.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.add_argument(
        "--report", nargs="+", metavar="FILE", help="render the markdown tables of these records (bench.json), no run"
    )
    bench.add_argument(
        "--check",
        action="store_true",
        help="with --report: recompute every prediction from the frozen profile committed beside each record",
    )
    bench.add_argument(
        "--repredict",
        action="store_true",
        help="with --report: make every prediction again from the frozen profile committed beside each record"
        " (after a cost model change) and write it into the record; nothing is measured",
    )
    bench.add_argument(
        "--update-page",
        metavar="PAGE",
        help="render every generated section of PAGE (docs/benchmarks.md) again from the records it names, no run",
    )
    bench.set_defaults(handler=engine_handler("bench"))


def build_parser() -> argparse.ArgumentParser:
    """The engine's commands alone (`python -m pipebd_core.cli`); `pipebd` adds the service's (app/cli)."""
    parser = argparse.ArgumentParser(prog="pipebd", description="Pipelined blockwise knowledge distillation")
    add_engine_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
