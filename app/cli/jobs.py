"""The commands that read jobs from a server: `pipebd jobs` (a page of jobs, or every page), `pipebd show ID`,
`pipebd logs ID` (a log, or --follow it until the job ends) and `pipebd download ID [NAME]` (every
artifact into job-ID/, a model folder unpacked into job-ID/<folder>/ after its sha256 is checked). Each prints
compact tables, or with --json the server's JSON; a refusal or an unreachable server is one error line
and exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.cli.client import ClientError, download, get_json, get_text, paged
from app.cli.output import fields, mebibytes, millis, percent, print_json, share, table
from app.cli.responses import ArtifactJson, ArtifactListJson, JobJson, LogChunkJson
from pipebd_core.cli import fail

JOBS = "/api/v1/jobs"
LOG_CHUNK = 1 << 20  # bytes per logs request: the API's largest
LOG_POLL_S = 0.5  # --follow: how often an idle log is read again


def refused(args: argparse.Namespace, error: ClientError) -> int:
    """`COMMAND [model|job ID]: error`, naming what the command was about."""
    about = [
        f" {noun} {value}" for noun in ("model", "job") if (value := getattr(args, f"{noun}_id", None)) is not None
    ]
    return fail(f"{args.command}{about[0] if about else ''}: {error}")


def handles_refusals(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The command, its ClientError printed as one line (exit code 2) instead of a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except ClientError as error:
            return refused(args, error)

    return run


# --- pipebd jobs --------------------------------------------------------------------------------------


def ranks(job: JobJson) -> str:
    """A job's ranks as a user counts them: `4`, or `2 x 2` on several nodes (nodes x ranks per node)."""
    nodes = job.get("nodes", 1)
    return str(job["nproc"]) if nodes == 1 else f"{nodes} x {job['nproc']}"


def hosts_of(job: JobJson) -> str | None:
    """The host of each node of a job on several nodes in its newest attempt, node 0 first."""
    attempts = job.get("attempts") or []
    hosts = attempts[-1].get("hosts") if attempts else None
    return ", ".join(hosts) if hosts and job.get("nodes", 1) > 1 else None


def job_row(job: JobJson) -> list[Any]:
    return [
        job["id"],
        job["name"],
        job["state"],
        job["phase"],
        percent(job["progress"]),
        ranks(job),
        job["priority"],
        job["created_at"],
        job["termination_reason"],
    ]


@handles_refusals
def command_jobs(args: argparse.Namespace) -> int:
    query = {"state": args.state, "limit": args.limit}
    jobs, next_cursor = paged(args.server, args.token, JOBS, query, args.cursor, args.all)
    if args.json:
        print_json({"data": jobs, "next_cursor": next_cursor})
        return 0
    headers = ["id", "name", "state", "phase", "progress", "ranks", "priority", "created", "reason"]
    print(table(headers, [job_row(job) for job in jobs]) if jobs else "no jobs", flush=True)
    if next_cursor is not None:
        print(f"pipebd: more jobs: pipebd jobs --cursor {next_cursor} (or --all)", file=sys.stderr)
    return 0


# --- pipebd show --------------------------------------------------------------------------------------


def describe(job: JobJson) -> str:
    summary = job.get("plan_summary") or {}
    lines = [
        fields(
            [
                ("job", f"{job['id']} {job['name']}"),
                ("state", job["state"]),
                ("reason", job["termination_reason"]),
                ("phase", job["phase"] and f"{job['phase']} ({percent(job['phase_progress'])})"),
                ("progress", percent(job["progress"])),
                ("samples/s", job["samples_per_s"]),
                ("step", millis(job.get("step_s"))),
                ("busy", share(job.get("busy_share"))),
                ("peak memory", mebibytes(job.get("peak_mem"))),
                ("ranks", ranks(job)),
                ("hosts", hosts_of(job)),
                ("mode", summary.get("mode")),
                ("priority", job["priority"]),
                ("restarts", f"{job['restarts']} of {job['max_restarts']}"),
                ("queue", job["waiting_reason"] and f"{job['queue_position']} ahead; {job['waiting_reason']}"),
                ("worker", job["worker"]),
                ("created", job["created_at"]),
                ("started", job["started_at"]),
                ("finished", job["finished_at"]),
                ("exit code", job["exit_code"]),
            ]
        )
    ]
    if job["phases"]:
        rows = [
            [p["name"], p["state"], p["outcome"], p["reason"], p["started_at"], p["ended_at"]] for p in job["phases"]
        ]
        lines += ["", table(["phase", "state", "outcome", "reason", "started", "ended"], rows)]
    if job["attempts"]:
        attempts: list[list[Any]] = [
            [a["number"], a["worker"], a["started_at"], a["ended_at"], a["outcome"], a["reason"]]
            for a in job["attempts"]
        ]
        lines += ["", table(["attempt", "worker", "started", "ended", "outcome", "reason"], attempts)]
    if job["error"]:
        lines += ["", "error:", job["error"].rstrip()]
    return "\n".join(lines)


@handles_refusals
def command_show(args: argparse.Namespace) -> int:
    job: JobJson = get_json(args.server, args.token, f"{JOBS}/{args.job_id}")
    if args.json:
        print_json(job)
    else:
        print(describe(job), flush=True)
    return 0


# --- pipebd logs --------------------------------------------------------------------------------------


def logged_reached(job: JobJson) -> list[str]:
    """The job's phases that write logs, in order, up to the one it is in (or ended in)."""
    from app.api.routes.logs import LOGGED_PHASES

    names = [phase["name"] for phase in job["phases"] if phase["name"] in LOGGED_PHASES]
    return names[: names.index(job["phase"]) + 1] if job["phase"] in names else []


class LogReader:
    """Reads one job's log (a phase's launcher log, or one rank's) chunk by chunk from where it stopped."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.phase: str | None = args.phase  # None: the server's newest phase with this log, then each next one
        self.offset = 0
        self.path = f"{JOBS}/{args.job_id}/logs"

    def read(self) -> LogChunkJson | None:
        """The next chunk (its text empty at the end of the file so far); None while the job has no logs."""
        args = self.args
        params = {"phase": self.phase, "rank": args.rank, "node": args.node, "offset": self.offset, "limit": LOG_CHUNK}
        try:
            chunk: LogChunkJson = get_json(self.args.server, self.args.token, f"{JOBS}/{self.args.job_id}/logs", params)
        except ClientError as error:
            if error.status == 404 and self.args.follow:
                return None  # no run directory yet (an unknown job is told by the job's own 404)
            raise
        self.phase, self.offset = chunk["phase"], chunk["next_offset"]
        return chunk

    def start(self, job: JobJson) -> None:
        """--follow without --phase: begin at the first phase with logs that the job has reached, so that
        every phase's log is printed in order (a finished job's too), not only the newest one."""
        if self.args.phase is None and self.phase is None and (reached := logged_reached(job)):
            self.phase = reached[0]

    def next_phase(self, job: JobJson) -> bool:
        """Without --phase: move on to the next phase with logs that the job has reached; False if none."""
        if self.args.phase is not None or self.phase is None:
            return False
        reached = logged_reached(job)
        later = reached[reached.index(self.phase) + 1 :] if self.phase in reached else []
        if not later:
            return False
        self.phase, self.offset = later[0], 0
        return True


def emitter(args: argparse.Namespace) -> Callable[[LogChunkJson], None]:
    """Print a chunk: as a JSON line (--json), else its text, with a line on stderr when the phase changes."""
    shown: list[str] = []

    def emit(chunk: LogChunkJson) -> None:
        if args.json:
            print(json.dumps(chunk), flush=True)
            return
        if shown and shown[-1] != chunk["phase"]:
            print(f"pipebd: -- {chunk['file']} --", file=sys.stderr, flush=True)
        shown.append(chunk["phase"])
        sys.stdout.write(chunk["text"])
        sys.stdout.flush()

    return emit


def follow_log(args: argparse.Namespace, reader: LogReader, emit: Callable[[LogChunkJson], None]) -> str:
    """Emit the log as it grows until the job is at rest and everything it wrote is read; its state."""
    from app.core.states import AT_REST  # no worker will write more

    ending = False
    reader.start(get_json(args.server, args.token, f"{JOBS}/{args.job_id}"))
    while True:
        chunk = reader.read()
        if chunk is not None and chunk["text"]:
            emit(chunk)
            continue
        job: JobJson = get_json(args.server, args.token, f"{JOBS}/{args.job_id}")
        chunk = reader.read()  # what was written before the job moved on (or came to rest) is read first
        if chunk is not None and chunk["text"]:
            emit(chunk)
            continue
        if reader.next_phase(job):
            continue
        if ending:
            return str(job["state"])
        ending = job["state"] in AT_REST  # read once more: lines written before it came to rest
        if not ending:
            time.sleep(LOG_POLL_S)


@handles_refusals
def command_logs(args: argparse.Namespace) -> int:
    reader, emit = LogReader(args), emitter(args)
    if args.follow:
        final = follow_log(args, reader, emit)
        if not args.json:
            print(f"pipebd: job {args.job_id} {final}", file=sys.stderr)
        return 0
    while (chunk := reader.read()) is not None:
        if chunk["text"] or chunk["offset"] == 0:  # an empty log still answers once with --json
            emit(chunk)
        if not chunk["text"]:
            break
    return 0


# --- pipebd download ----------------------------------------------------------------------------------


def targets(args: argparse.Namespace, names: list[str]) -> dict[str, Path]:
    """Where each artifact goes: NAME to -o (default job-ID-NAME here); all of them into the folder -o
    (default job-ID), each under its own name."""
    if args.name is not None:
        return {args.name: Path(args.output or f"job-{args.job_id}-{args.name}")}
    folder = Path(args.output or f"job-{args.job_id}")
    folder.mkdir(parents=True, exist_ok=True)
    return {name: folder / name for name in names}


def unpack(args: argparse.Namespace, entry: ArtifactJson, target: Path) -> Path:
    """A folder's archive: downloaded beside `target`, checked against its sha256, unpacked into the folder
    that `target` names without `.tar` (the archive holds its files under that name); the folder."""
    archive = target.with_name(target.name + ".download")
    assert entry["sha256_url"] is not None, f"{entry['name']} is a file, not a folder's archive"
    try:
        download(args.server, args.token, entry["url"], archive)
        expected = get_text(args.server, args.token, entry["sha256_url"]).split()[0]
        digest = hashlib.sha256()
        with archive.open("rb") as handle:
            while data := handle.read(1 << 20):
                digest.update(data)
        if digest.hexdigest() != expected:
            raise ClientError(f"{entry['name']}: sha256 {digest.hexdigest()} differs from the server's {expected}")
        folder = target.with_name(target.name.removesuffix(".tar"))
        shutil.rmtree(folder, ignore_errors=True)
        with tarfile.open(archive) as tar:
            tar.extractall(target.parent, filter="data")  # nothing outside the folder, no links out
        return folder
    finally:
        archive.unlink(missing_ok=True)


def is_folder_zip(name: str, entry: ArtifactJson) -> bool:
    return bool(entry.get("sha256_url")) and name.endswith(".zip")


@handles_refusals
def command_download(args: argparse.Namespace) -> int:
    listing: ArtifactListJson = get_json(args.server, args.token, f"{JOBS}/{args.job_id}/artifacts")
    entries = {artifact["name"]: artifact for artifact in listing["data"]}
    if args.name is None:  # a folder comes once, unpacked from its .tar; its .zip holds the same files
        entries = {name: entry for name, entry in entries.items() if not is_folder_zip(name, entry)}
    if args.name is None and not entries:
        return fail(f"download job {args.job_id}: the job ({listing['state']}) has no artifacts yet")
    written = []
    for name, target in targets(args, list(entries)).items():
        entry = entries.get(name)
        if args.name is None and entry is not None and entry.get("sha256_url"):  # a folder: into job-ID/<folder>/
            folder = unpack(args, entry, target)
            size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
            written.append({"name": name, "path": f"{folder}/", "size": size})
            continue
        size = download(args.server, args.token, f"{JOBS}/{args.job_id}/artifacts/{name}", target)
        written.append({"name": name, "path": str(target), "size": size})
    if args.json:
        print_json(written)
    else:
        print(table(["artifact", "size", "path"], [[w["name"], w["size"], w["path"]] for w in written]), flush=True)
    return 0
