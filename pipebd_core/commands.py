"""The engine's commands (`pipebd run`, `profile`, `plan`, `bench`): what each does once parsed.

`pipebd run` prepares a run directory and hands it to the supervisor (job/supervisor.py), the same one
the service's workers use; its watcher here draws a progress line and turns Ctrl-C or SIGTERM into a
cancel. The parser is cli.py's (torch-free); this module is imported when one of these commands runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from pipebd_core.bench import accuracy as bench_accuracy
from pipebd_core.bench import check as bench_check
from pipebd_core.bench import finetune as bench_finetune
from pipebd_core.bench import finetune_accuracy as bench_finetune_accuracy
from pipebd_core.bench import page as bench_page
from pipebd_core.bench import progress as bench_progress
from pipebd_core.bench import replan as bench_replan
from pipebd_core.bench import report as bench_report
from pipebd_core.bench import repredict as bench_repredict
from pipebd_core.bench.arms import RECORD
from pipebd_core.bench.distill import run_bench
from pipebd_core.cli import comma_list, fail
from pipebd_core.distill.plan import Plan
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.bench_record import BenchRecord
from pipebd_core.documents.distill_plan import Replan, stages_line
from pipebd_core.documents.errors import PlanError
from pipebd_core.documents.phases import DISTILL, FINETUNE, PLAN, TRAINING_PHASES, PhaseRecord
from pipebd_core.documents.profile import Profile
from pipebd_core.job.launch import default_run_dir, prepare_run
from pipebd_core.job.nodes import NodeError, NodeLink, NodeRole
from pipebd_core.job.outcomes import CANCELLED, SUCCEEDED
from pipebd_core.job.profiling import obtain_profile
from pipebd_core.job.progress import MetricsFollower
from pipebd_core.job.supervisor import Outcome, Supervisor, Watcher
from pipebd_core.planning.distill_costmodel import CostModel, chain_factors
from pipebd_core.planning.distill_planner import mode_plans
from pipebd_core.planning.distill_search import search
from pipebd_core.planning.distill_simulate import simulate
from pipebd_core.planning.profiles import ProfileError
from pipebd_core.planning.topology import Topology
from pipebd_core.planning.trust import assess
from pipebd_core.rundir import RunDir
from pipebd_core.spec import MODES, PARTITIONERS, Spec, SpecError, load_spec, parse_spec
from pipebd_core.what_if import Machines, distill_what_if, finetune_report, finetune_what_if

QUIET_PRINT_S = 5.0  # without a terminal, print progress this often


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
                for warning in self.run_dir.load_plan().details.warnings or []:
                    self.say(f"pipebd: warning: {warning}")

    def replanned(self, entry: Replan) -> None:
        after_s = f"{entry.predicted_after_s * 1e3:.1f} ms" if entry.predicted_after_s is not None else "no prediction"
        self.say(
            f"pipebd: distill: re-planned at step {entry.resumed_at_step}: {stages_line(entry.from_)}"
            f" -> {stages_line(entry.to)} (measured {entry.measured_before_s * 1e3:.1f} ms a step, planned"
            f" {entry.predicted_before_s * 1e3:.1f} ms; the new plan: {after_s})"
        )

    def tick(self, phase: str) -> None:
        if phase not in TRAINING_PHASES:
            return
        self.follow(phase)
        if self.interactive or time.time() - self.last_print > QUIET_PRINT_S:
            self.print_progress("\r" if self.interactive else "\n")

    def drain(self, phase: str) -> None:
        if phase in TRAINING_PHASES:
            self.follow(phase)
            self.print_progress("\n")
            assert self.follower is not None
            if self.follower.refused:  # lines an earlier PipeBD wrote into this run directory
                print(f"pipebd: telemetry lines passed over: {self.follower.refused}", file=sys.stderr, flush=True)
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


def interrupt_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def kill_is_cancel() -> Iterator[None]:
    """While inside, a SIGTERM is a Ctrl-C: the supervisor running a job cancels it and stops its processes."""
    previous = signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def supervise(run_dir: RunDir, spec: Spec, node: NodeRole | None = None) -> int:
    """Run the job's phases with a progress line (node 0's part on several nodes); the outcome as an exit code."""
    with kill_is_cancel():
        outcome = Supervisor(run_dir, ProgressLine(run_dir, spec), node=node).run()
    return report(run_dir, outcome)


def report(run_dir: RunDir, outcome: Outcome) -> int:
    if outcome.result == CANCELLED:
        print(f"pipebd: cancelled during {outcome.phase}; every process was stopped", file=sys.stderr)
        return 130
    if outcome.result != SUCCEEDED:
        print(f"pipebd: the {outcome.phase} phase failed ({outcome.reason}): {outcome.error}", file=sys.stderr)
        return 1
    summary = run_dir.load_summary()
    print(f"pipebd: done: {run_dir.root}")
    for key, top1 in (("student_top1", summary.student_top1), ("teacher_top1", summary.teacher_top1)):
        if top1 is not None:
            print(f"  {key}: {top1:.4f}")
    return 0


def describe_resume(run_dir: RunDir) -> str:
    """Where each block picks up, as the ranks will compute it (pipelined plans resume at one common step)."""
    if not run_dir.plan.exists():
        return "the run had not been planned yet, so it starts again from its first unfinished phase"
    plan = Plan.from_document(run_dir.load_plan())
    starts = run_dir.checkpoints.resume_steps(plan.num_blocks, common=plan.is_pipeline)
    total = plan.step_plan.total
    if not any(starts):
        return f"no checkpoint to resume from, so every block starts again from step 0 of {total}"
    return ", ".join(f"block {block} at step {step}/{total}" for block, step in enumerate(starts))


def node_role(args: argparse.Namespace) -> NodeRole | None:
    """This node's part from `--nnodes`, `--node-rank`, `--rdzv-endpoint` and `--rdzv-id` (None on one node)."""
    if getattr(args, "nnodes", 1) <= 1:  # callers that build their own Namespace run on one node
        return None
    if not (args.rdzv_endpoint and args.rdzv_id and args.out):
        needs = "--rdzv-endpoint, --rdzv-id and --out (the run directory every node shares)"
        raise SpecError(f"--nnodes {args.nnodes}: a run on several nodes needs {needs}")
    host, _, port = args.rdzv_endpoint.partition(":")
    try:
        port_number = int(port) if port else None
        local = getattr(args, "local_addr", None)
        return NodeRole(args.nnodes, args.node_rank, args.rdzv_id, host=host, port=port_number, local_addr=local)
    except ValueError as error:
        raise SpecError(f"--node-rank, --rdzv-endpoint: {error}") from None


def command_follow(role: NodeRole, out: Path) -> int:
    """Node k > 0 of `pipebd run --nnodes`: wait for node 0 in the shared run directory, then follow it."""
    run_dir = RunDir(out)
    print(f"pipebd: node {role.node} of {role.nnodes} following node 0 in {run_dir.root}", file=sys.stderr)
    try:
        NodeLink(run_dir, role).check_shared()  # node 0 writes its token once the run directory is prepared
    except NodeError as error:
        return fail(str(error))
    with kill_is_cancel():
        outcome = Supervisor(run_dir, node=role).follow()
    if outcome.result != SUCCEEDED:
        print(f"pipebd: node {role.node}: {outcome.result} ({outcome.reason}): {outcome.error}", file=sys.stderr)
        return 1
    return 0


def command_run(args: argparse.Namespace) -> int:
    try:
        role = node_role(args)
        if role is not None and role.node > 0:
            return command_follow(role, Path(args.out))
        if role is not None:
            args.set = [*(args.set or []), f"schedule.nodes={role.nnodes}"]
        if args.resume:
            run_dir = RunDir(Path(args.resume))
            if not run_dir.spec.exists() or not run_dir.phases.exists():
                return fail(f"--resume {args.resume}: no spec.json and phases.json there; is it a run directory?")
            spec = run_dir.load_spec()
            run_dir.append_event("resumed")
            print(f"pipebd: resuming: {describe_resume(run_dir)}", file=sys.stderr)
        else:
            if args.spec is None:
                return fail("give a spec file, or --resume DIR")
            spec = load_run_spec(args)
            run_dir = prepare_run(spec, Path(args.out) if args.out else None)
    except (SpecError, PlanError, ProfileError, DocumentError) as error:  # DocumentError: an older run directory
        return fail(str(error))
    print(f"pipebd: run directory {run_dir.root}", file=sys.stderr)
    return supervise(run_dir, spec, role)


def command_profile(args: argparse.Namespace) -> int:
    try:
        spec = load_run_spec(args)
        profile, cached = obtain_profile(spec, refresh=args.refresh, trials=args.trials)
    except (SpecError, ProfileError) as error:
        return fail(str(error))
    if args.json:
        print(json.dumps(profile.to_json(), indent=1))
        return 0
    print(f"profile of {spec.name} on {spec.schedule.nproc} x {profile.device} ({'cached' if cached else 'measured'})")
    print(f"{'block':>5} {'batch':>5} {'teacher ms':>11} {'student ms':>11} {'spread':>7}")
    for index, block in enumerate(profile.blocks):
        for batch in profile.batch_sizes:
            teacher, student = block.teacher_s[batch], block.student_s[batch]
            spread = max(teacher.spread, student.spread)
            print(f"{index:5} {batch:5} {teacher.median * 1e3:11.2f} {student.median * 1e3:11.2f} {spread:7.0%}")
    for batch, factor in sorted(chain_factors(profile).items()):
        print(f"blocks one after another at batch {batch}: {factor:.2f}x the sum of each timed alone")
    trust = assess(profile)
    print("profile: " + ("trusted" if trust.trusted else ", ".join(trust.flags).upper()))
    for message in trust.messages:
        print(f"  {message}")
    return 0


def machines_line(topology: Topology, measured: bool) -> str:
    """`2 nodes x 2 ranks, 1.0 Gbit/s and 0.05 ms between nodes (stated)`."""
    line = f"{topology.nodes} node{'s' if topology.nodes > 1 else ''} x {topology.per_node} ranks"
    link = topology.inter
    if topology.nodes > 1 and link is not None:
        source = "measured" if measured else "stated: a what-if from a profile of one node"
        line += f", {link.gbit_per_s:.2f} Gbit/s and {link.latency_s * 1e3:.3f} ms between nodes ({source})"
    return line


def distill_lines(model: CostModel, profile: Profile, report: dict[str, Any]) -> list[str]:
    """Distillation's ranked plans and every mode's step on `model`'s machines: into `report` (--json), and as the
    lines `pipebd plan` prints."""
    result = search(model)
    plans = mode_plans(model)
    modes = {mode: simulate(plan, model)[0] for mode, plan in plans.items()}
    crossing = [route for route in plans["hybrid"].document().routes if route.crosses_nodes]
    trust = assess(profile)
    report.update(
        {
            "plans": [plan.entry().to_json() for plan in result.plans],
            "plans_considered": result.considered,
            "stages_rejected_for_memory": result.rejected_for_memory,
            "mode_step_s": modes,
            "ideal_step_s": model.ideal_step(),
            "crossing_routes": [route.to_json() for route in crossing],  # the best plan's sends between nodes
            "profile_trust": trust.model_dump(mode="json"),
        }
    )
    lines = ["profile: " + ("trusted" if trust.trusted else ", ".join(trust.flags).upper())]
    lines += [f"  {message}" for message in trust.messages]
    lines.append(f"{result.considered} plans fit in memory; the best {len(result.plans)}:")
    for rank, plan in enumerate(result.plans, start=1):
        stages = stages_line(plan.entry().stages)
        lines.append(f"{rank:3}. {plan.step_s * 1e3:9.2f} ms/step  bottleneck stage {plan.bottleneck}  [{stages}]")
    if model.topology.nodes > 1:
        hops = ", ".join(f"rank {r.src} -> {r.dst} at boundary {r.boundary}" for r in crossing) or "none"
        lines.append(f"the best plan's sends between nodes: {hops}")
    lines.append("predicted ms per global step: " + ", ".join(f"{m} {t * 1e3:.1f}" for m, t in modes.items()))
    lines.append(
        f"the profile's even split of all the work: {model.ideal_step() * 1e3:.1f} ms (a prediction, not a bound)"
    )
    return lines


def finetune_lines(report: dict[str, Any]) -> list[str]:
    """The finetune phase's strategy, cut and every strategy's step, as `pipebd plan` prints them."""
    cut = " | ".join(f"{start}-{stop - 1}" for start, stop in report["stages"])
    step = report["predicted_step_s"]
    chosen = "chosen by auto" if report["requested_strategy"] == "auto" else "the spec's"
    lines = [f"finetune: {report['strategy']} ({chosen}), layers {cut}, predicted {step * 1e3:.1f} ms a step"]
    for entry in report["strategies"]:
        said = f"{entry['step_s'] * 1e3:.1f} ms" if entry.get("step_s") is not None else "-"
        lines.append(f"  {entry['strategy']:6} {said}" + ("" if entry["fits"] else f"  (not run: {entry['reason']})"))
    trust = report.get("profile_trust")
    if trust is not None:
        lines.append("layer profile: " + ("trusted" if trust["trusted"] else ", ".join(trust["flags"]).upper()))
        lines += [f"  {message}" for message in trust["messages"]]
    return lines


def command_plan(args: argparse.Namespace) -> int:
    """`pipebd plan`: distillation's ranked plans and every mode's step, and on several nodes (or for a train
    workload) the finetune phase's strategy and cut, on the spec's machines or a what-if's (what_if.py)."""
    try:
        spec = load_run_spec(args)
        machines = Machines.of(spec, args)
        report: dict[str, Any] = {}
        lines: list[str] = []
        intra = None
        if spec.workload.kind != "train":  # a train workload only fine-tunes: no distillation to plan
            model, profile = distill_what_if(spec, machines)
            report["machines"] = machines_line(model.topology, measured=not machines.stated)
            lines = distill_lines(model, profile, report)
            intra = profile.links.get("intra")
        if spec.finetune is not None and (machines.nodes > 1 or spec.workload.kind == "train"):
            plan, topology = finetune_what_if(spec, machines, intra)
            report.setdefault("machines", machines_line(topology, measured=not machines.stated))
            report["finetune"] = finetune_report(plan)
            lines += finetune_lines(report["finetune"])
    except (SpecError, PlanError, ProfileError) as error:
        return fail(str(error))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print("\n".join([f"machines: {report['machines']}", *lines]))
    return 0


def command_report(paths: list[str], check: bool = False, again: bool = False) -> int:
    """`pipebd bench --report FILE...`: the benchmarks page's tables from benchmark records; with `check`,
    every prediction recomputed from the profile committed beside its record (a difference fails); with
    `again` (--repredict), every prediction made again from it and written into the record."""
    records = []
    for path in paths:
        try:
            records.append(bench_report.load_record(Path(path)))
        except (OSError, ValueError) as error:  # DocumentError and JSONDecodeError are ValueErrors
            return fail(f"--report {path}: not a benchmark record (bench.json of `pipebd bench`): {error}")
    if check and again:
        return fail("--check compares a record's predictions, --repredict rewrites them: give one of them")
    if check:
        return command_check(paths, records)
    if again:
        return command_repredict(paths, records)
    print(bench_report.render(records), end="")
    return 0


def command_check(paths: list[str], records: list[BenchRecord]) -> int:
    """`pipebd bench --report --check FILE...`: each record's predictions against its committed profile."""
    failed = 0
    for path, record in zip(paths, records, strict=True):
        try:
            differences = bench_check.check(Path(path), record)
        except (OSError, ValueError, SpecError, PlanError) as error:
            print(f"pipebd: --check {path}: its profile cannot be read or planned from: {error}", file=sys.stderr)
            failed += 1
            continue
        for difference in differences:
            print(f"pipebd: --check {path}: {difference.text()}", file=sys.stderr)
        failed += bool(differences)
        print(f"{path}: {'DIFFERS' if differences else 'every prediction recomputed from its profile'}")
    return 1 if failed else 0


def command_repredict(paths: list[str], records: list[BenchRecord]) -> int:
    """`pipebd bench --report --repredict FILE...`: each record's predictions made again from its committed
    profile and written back (every record is checked before any is written)."""
    updated = []
    for path, record in zip(paths, records, strict=True):
        try:
            updated.append(bench_repredict.repredict(Path(path), record))
        except (OSError, ValueError, SpecError, PlanError) as error:
            return fail(str(error) if isinstance(error, SpecError) else f"--repredict {path}: {error}")
    for path, record in zip(paths, updated, strict=True):
        Path(path).write_text(record.model_dump_json(indent=1))  # as the bench writes it (progress.py)
        print(f"{path}: every prediction made again from its profile")
    return 0


def command_update_page(path: str) -> int:
    """`pipebd bench --update-page PAGE`: the page's generated sections rendered again from their records."""
    page = Path(path)
    try:
        text = page.read_text()
        updated = bench_page.regenerate(text, Path.cwd())
    except (OSError, ValueError) as error:
        return fail(f"--update-page {path}: {error}; run it from the repository root, where the records it names are")
    if not bench_page.record_paths(text):
        return fail(f"--update-page {path}: no generated section (<!-- pipebd bench --report FILE... -->) in it")
    page.write_text(updated)
    print(f"pipebd: {path}: {len(bench_page.record_paths(text))} sections rendered from their records")
    return 0


def command_bench(args: argparse.Namespace) -> int:
    if args.update_page:
        if args.spec is not None or args.report:
            return fail("--update-page renders the page's records; give no spec and no --report")
        return command_update_page(args.update_page)
    if args.report:
        if args.spec is not None:
            return fail("--report renders records already measured; give record files, not a spec")
        return command_report(args.report, args.check, args.repredict)
    if args.repredict:
        return fail("--repredict makes the predictions of records again: give it with --report FILE...")
    if args.again_shared and not args.resume:
        return fail("--again-shared measures again the shared runs of a record: give it with --resume RECORD")
    if args.check:
        return fail("--check recomputes the predictions of records: give it with --report FILE...")
    if args.resume:
        if args.spec is not None or args.modes or args.partitioners or args.accuracy or args.replan or args.minutes:
            return fail("--resume continues the bench its record describes; give no spec, modes, kind or --minutes")
        if args.reprofile:
            return fail("--resume plans from the profile its bench froze; --reprofile starts a bench afresh")
        return command_resume(args)
    if args.spec is None:
        return fail("give a spec file to benchmark, or --report FILE... to render records")
    finetune = args.phase == "finetune"
    if args.reprofile and (finetune or args.replan):
        return fail("--reprofile measures the block profile of a distillation bench (--replan measures its own)")
    if args.accuracy and (args.modes or args.partitioners or args.replan):
        return fail(
            "--accuracy chooses its own plans (distillation: every mode's, the planner's top five, five drawn;"
            " --phase finetune: every strategy on every partitioner's cut); give it no --modes, --partitioners"
            " or --replan"
        )
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
        with kill_is_cancel():  # a killed bench stops the arm that runs, as a killed run does
            report, table = bench_runs(args, spec, out, modes, partitioners)
        print(f"pipebd: benchmark record {out / RECORD}", file=sys.stderr)
    except (SpecError, PlanError, ProfileError, RuntimeError) as error:
        return fail(str(error))
    print(json.dumps(report, indent=1) if args.json else table)
    return 0


def command_resume(args: argparse.Namespace) -> int:
    """`pipebd bench --resume RECORD`: the runs its record does not hold yet, then the whole record."""
    path = Path(args.resume)
    try:
        record = bench_progress.read_record(path, args.again_shared)
        with kill_is_cancel():
            record = resumed(record, path.parent, args.keep)
        print(f"pipebd: benchmark record {path}", file=sys.stderr)
    except (SpecError, PlanError, ProfileError, RuntimeError, ValueError) as error:
        return fail(str(error))
    print(json.dumps(record.to_json(), indent=1) if args.json else bench_report.render([record]))
    return 0


def resumed(record: BenchRecord, out: Path, keep: bool) -> BenchRecord:
    """The bench `record` describes, continued in `out` (its spec, arms, steps and repeats)."""
    spec = parse_spec(record.spec)
    arms = [arm.name for arm in record.arms]
    steps, repeats = record.steps, record.repeats
    if record.compares == "plans" and record.phase == "finetune":
        return bench_finetune_accuracy.run_finetune_accuracy_bench(spec, steps, repeats, out, keep, resume=record)
    if record.compares == "plans":
        return bench_accuracy.run_accuracy_bench(spec, steps, repeats, out, keep, record.seed or 0, resume=record)
    if record.compares == "partitioners":
        strategies = [record.strategy] if record.strategy else []
        return bench_finetune.run_finetune_bench(spec, strategies, steps, repeats, out, keep, arms, resume=record)
    if record.phase == "finetune":
        return bench_finetune.run_finetune_bench(spec, arms, steps, repeats, out, keep, resume=record)
    return run_bench(spec, arms, steps, repeats, out, keep, resume=record)


def bench_runs(
    args: argparse.Namespace, spec: Spec, out: Path, modes: list[str], partitioners: list[str]
) -> tuple[object, str]:
    """The benchmark the arguments ask for, run: its record's JSON and its report."""
    finetune = args.phase == "finetune"
    if args.replan and args.minutes is not None:
        raise SpecError("--minutes fits the side-by-side and accuracy benches; --replan runs its own steps")
    if args.replan:
        replanned = bench_replan.run_replan_bench(
            spec, args.steps, args.repeats, out, args.load_cores, args.trials, keep=args.keep
        )
        return replanned.to_json(), bench_replan.format_table(replanned)
    if args.accuracy and finetune:
        record = bench_finetune_accuracy.run_finetune_accuracy_bench(
            spec, args.steps, args.repeats, out, keep=args.keep, minutes=args.minutes
        )
    elif args.accuracy:
        record = bench_accuracy.run_accuracy_bench(
            spec,
            args.steps,
            args.repeats,
            out,
            keep=args.keep,
            seed=args.seed,
            minutes=args.minutes,
            reprofile=args.reprofile,
        )
    elif finetune:
        record = bench_finetune.run_finetune_bench(
            spec, modes, args.steps, args.repeats, out, keep=args.keep, partitioners=partitioners, minutes=args.minutes
        )
    else:
        record = run_bench(
            spec, modes, args.steps, args.repeats, out, keep=args.keep, minutes=args.minutes, reprofile=args.reprofile
        )
    return record.to_json(), bench_report.render([record])
