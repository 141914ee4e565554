"""`pipebd soak --minutes M --seed S --out FILE`: a real service driven by a seeded mix of jobs, user actions and
faults (app/soak/), its history checked against the invariants; the result document goes to FILE, the history
beside it. Exits 1 naming the first invariant violated. `--resume` runs one more segment of the soak whose history
is named (its service, its webhook): an hour measured as segments, the record and the invariants over them all."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipebd_core.cli import fail


def add_soak_command(commands: Any) -> None:
    soak = commands.add_parser("soak", help="drive a throw-away service with jobs, user actions and faults; check")
    soak.add_argument("--minutes", type=float, required=True, help="how long the mix runs (then it drains)")
    soak.add_argument("--seed", type=int, default=0, help="the seed of the mix (default 0)")
    soak.add_argument("--out", required=True, help="the result document (JSON)")
    soak.add_argument("--history", help="the history (JSON lines; default: FILE with .history.jsonl)")
    soak.add_argument(
        "--max-active", type=int, default=12, help="no submission while this many jobs are not at rest (default 12)"
    )
    soak.add_argument(
        "--fault-every",
        type=float,
        default=20.0,
        help="a fault every this many seconds on average (default 20: about 30 of each kind an hour)",
    )
    soak.add_argument("--folder", help="the service's data folder and logs (default: a new temporary folder)")
    soak.add_argument(
        "--resume",
        action="store_true",
        help="continue the soak of the history: the same service, minutes added, every invariant over all of it",
    )
    soak.add_argument(
        "--reruns",
        type=int,
        help="at most this many succeeded jobs rerun undisturbed to compare weights (default: one per kind)",
    )
    soak.add_argument(
        "--embedded",
        action="store_true",
        help="run the service on SQLite and its SQLite broker (default: PostgreSQL and Redis of its own, restarted"
        " as faults)",
    )
    soak.set_defaults(handler=command_soak)


def command_soak(args: argparse.Namespace) -> int:
    from app.soak.driver import Soak, SoakError, SoakOptions
    from app.soak.invariants import first_violated
    from app.soak.record import write_record

    if args.minutes <= 0:
        return fail(f"--minutes {args.minutes:g}: give a positive number of minutes, e.g. --minutes 2")
    if args.max_active < 1:
        return fail(f"--max-active {args.max_active}: give at least 1 (jobs not at rest before submissions wait)")
    if args.fault_every <= 0:
        return fail(f"--fault-every {args.fault_every:g}: give seconds above 0 (the mean gap between two faults)")
    out = Path(args.out)
    history = Path(args.history) if args.history else out.with_suffix(".history.jsonl")
    if args.reruns is not None and args.reruns < 0:
        return fail(f"--reruns {args.reruns}: give 0 or more (succeeded jobs rerun to compare their weights)")
    if args.resume and not history.exists():
        return fail(f"--resume: no history at {history}; run `pipebd soak` once without --resume first")
    if args.resume and args.folder:
        return fail("--resume takes the service's folder from the history: leave --folder out")
    fresh = not (args.folder or args.resume)  # a resumed soak's folder is its history's
    folder = Path(tempfile.mkdtemp(prefix="pipebd-soak-")) if fresh else Path(args.folder or ".")
    options = SoakOptions(
        args.minutes,
        args.seed,
        folder.resolve(),
        history,
        args.max_active,
        args.embedded,
        args.resume,
        args.reruns,
        args.fault_every,
    )
    try:
        result = Soak(options).run()
    except SoakError as error:
        return fail(str(error))
    write_record(out, result.record)
    print(json.dumps({"jobs": result.record.jobs.to_json(), "faults": result.record.faults}), flush=True)
    violated = first_violated(result.verdicts)
    if violated is not None:
        print(f"pipebd: soak: invariant {violated} violated: {result.verdicts[violated].detail}", file=sys.stderr)
        return 1
    print(f"pipebd: soak: every invariant held; the record is in {out}, the history in {history}")
    return 0
