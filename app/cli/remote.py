"""The commands that change jobs on a running server: `pipebd submit` (send a spec; --follow draws its
progress from the event stream), `pipebd sweep` (a spec and a search over its fields), `pipebd cancel ID`,
`pipebd pause ID` and `pipebd resume ID`. The server's URL and token come from --server and --token, or
PIPEBD_SERVER and PIPEBD_TOKEN; --json prints what the server answered. The commands that read jobs are
in app/cli/jobs.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from pipebd_core.cli import fail
from pipebd_core.spec import SpecError, apply_overrides, load_document

if TYPE_CHECKING:
    from app.cli.responses import JobJson, SweepBody, SweepJson
    from app.core.json_types import JsonObject


def announce(args: argparse.Namespace, job: JobJson) -> None:
    """The job as the server answered: its JSON (--json), else a line with its state and URL."""
    if args.json:
        from app.cli.output import print_json

        print_json(job)
    else:
        print(f"pipebd: job {job['id']} {job['state']}: {args.server}/api/v1/jobs/{job['id']}", flush=True)


def spec_document(args: argparse.Namespace) -> JsonObject:
    """The spec file with --set, --nproc and --mode applied."""
    document = apply_overrides(load_document(args.spec), list(args.set or []))
    if args.nproc is not None:
        document = apply_overrides(document, [f"schedule.nproc={args.nproc}"])
    if args.mode is not None:
        document = apply_overrides(document, [f"schedule.mode={args.mode}"])
    return document


def parse_values(option: str) -> tuple[str, list[Any]]:
    """`train.lr=0.01,0.05` -> ("train.lr", [0.01, 0.05]): each value parsed as YAML, as --set's."""
    path, sep, raw = option.partition("=")
    if not sep or not path or not raw:
        raise SpecError(f"--grid {option!r}: expected dotted.path=value,value, e.g. train.lr=0.01,0.05")
    try:
        return path, [yaml.safe_load(value) for value in raw.split(",")]
    except yaml.YAMLError as error:
        raise SpecError(f"--grid {path}: a value is not valid YAML: {error}") from None


def sweep_body(args: argparse.Namespace) -> SweepBody:
    """The body of POST /api/v1/sweeps from `pipebd sweep`'s arguments."""
    if not args.grid:
        raise SpecError("give the fields to sweep with --grid PATH=V1,V2 (repeat it per field)")
    grid = dict(parse_values(option) for option in args.grid)
    body: SweepBody = {"spec": spec_document(args)}
    if args.random is not None:
        body["random"] = {"count": args.random, "seed": args.seed, "fields": grid}
    else:
        body["grid"] = grid
    if args.objective is not None:
        metric, sep, goal = args.objective.partition(":")
        if not sep:
            raise SpecError(f"--objective {args.objective!r}: expected METRIC:GOAL, e.g. final_loss:minimize")
        body["objective"] = {"metric": metric, "goal": goal}
    if args.name is not None:
        body["name"] = args.name
    if args.max_parallel is not None:
        body["max_parallel"] = args.max_parallel
    return body


SWEEP_ENDED = ("succeeded", "failed", "cancelled")  # every child ended (a paused sweep may resume)
SWEEP_POLL_S = 0.5  # --follow: how often the sweep is read again


def follow_sweep(args: argparse.Namespace, sweep: SweepJson) -> SweepJson:
    """Read the sweep until every child ended, printing a line per child state change (stderr with --json)."""
    from app.cli.client import get_json

    seen = {job["id"]: job["state"] for job in sweep["jobs"]}
    out = sys.stderr if args.json else sys.stdout
    while sweep["state"] not in SWEEP_ENDED:
        time.sleep(SWEEP_POLL_S)
        sweep = get_json(args.server, args.token, f"/api/v1/sweeps/{sweep['id']}")
        for job in sweep["jobs"]:
            if seen.get(job["id"]) != job["state"]:
                seen[job["id"]] = job["state"]
                print(f"  job {job['id']} {job['state']}", file=out, flush=True)
    return sweep


def print_sweep(args: argparse.Namespace, sweep: SweepJson) -> None:
    print(f"pipebd: sweep {sweep['id']} {sweep['state']}: {args.server}/sweeps/{sweep['id']}", flush=True)
    for job in sweep["jobs"]:
        overrides = ", ".join(f"{path}={json.dumps(value)}" for path, value in job["overrides"].items())
        print(f"  job {job['id']} {job['state']}: {overrides}", flush=True)


def command_sweep(args: argparse.Namespace) -> int:
    """`pipebd sweep SPEC --grid train.lr=0.01,0.05 ...`: the sweep and its children, or the refusal; with
    --follow, each child's state changes until the sweep ends, then the sweep again (exit 1 unless it
    succeeded)."""
    from app.cli.client import ClientError, create_sweep

    try:
        sweep = create_sweep(args.server, args.token, sweep_body(args))
        if not args.json:
            print_sweep(args, sweep)
        if args.follow:
            sweep = follow_sweep(args, sweep)
            if not args.json:
                print_sweep(args, sweep)
    except (SpecError, ClientError, httpx.TransportError) as error:
        return fail(str(error))
    if args.json:
        from app.cli.output import print_json

        print_json(sweep)
    return 0 if not args.follow or sweep["state"] == "succeeded" else 1


def command_submit(args: argparse.Namespace) -> int:
    from app.cli.client import ClientError, follow, submit

    try:
        document = spec_document(args)
        job = submit(args.server, args.token, document, args.idempotency_key)
        announce(args, job)
        if not args.follow:
            return 0
        final = follow(args.server, args.token, job["id"])
    except (SpecError, ClientError, httpx.TransportError) as error:
        return fail(str(error))
    print(f"pipebd: job {job['id']} {final}", file=sys.stderr if args.json else sys.stdout)
    return 0 if final == "succeeded" else 1


def command_job_action(args: argparse.Namespace) -> int:
    """`pipebd cancel ID`, `pause ID` and `resume ID`: the server's answer, or its refusal (409 says why)."""
    from app.cli.client import ClientError, act, follow

    try:
        job = act(args.server, args.token, args.job_id, args.command)
        announce(args, job)
        if not getattr(args, "follow", False):
            return 0
        final = follow(args.server, args.token, job["id"])
    except (ClientError, httpx.TransportError) as error:
        return fail(f"{args.command} job {args.job_id}: {error}")
    print(f"pipebd: job {job['id']} {final}", file=sys.stderr if args.json else sys.stdout)
    return 0 if final == "succeeded" else 1
