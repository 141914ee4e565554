"""The `pipebd` command line: one parser for the engine's commands and the service's.

pipebd run | profile | plan | bench    a job on this machine (pipebd_core/cli.py)
pipebd up       the embedded default: migrations, the API and one worker, sharing one data folder
pipebd api      the API server alone
pipebd worker   one worker for this node's devices
pipebd submit   send a spec to a server; --follow draws its progress from the event stream
pipebd sweep    send a spec and a grid or random search over its fields: one job per child
pipebd jobs, pipebd show ID   list jobs (filters, pages), or show one
pipebd cancel ID, pipebd pause ID, pipebd resume ID   cancel or pause a job, or resume a failed, cancelled or paused one
pipebd logs ID, pipebd download ID [NAME]   print (or --follow) a job's log; download its artifacts
pipebd webhooks list | create | delete | deliveries   a server's webhooks and their delivery logs
pipebd quotas   set or list each token's fair-share weight and quotas (on the server's database)
pipebd models [ID], pipebd choose ID   a server's registered models and their lineage; a search chosen again
pipebd soak     a throw-away service driven by a seeded mix of jobs and faults, its history checked (app/soak/)

Parsing imports nothing heavy: every handler imports what it needs when it runs, so `pipebd api` and
`pipebd up` never load torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from app.cli.jobs import command_download, command_jobs, command_logs, command_show
from app.cli.models import add_model_commands
from app.cli.quotas import add_quota_commands
from app.cli.remote import command_job_action, command_submit, command_sweep
from app.cli.server import command_api, command_up, command_worker
from app.cli.soak import add_soak_command
from app.cli.webhooks import add_webhook_commands
from pipebd_core.cli import add_engine_commands, add_spec_arguments, fail


def add_server_commands(commands: Any) -> None:
    up = commands.add_parser("up", help="run the embedded service: API and one worker, one data folder")
    api = commands.add_parser("api", help="run the API server")
    for parser in (up, api):
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
        parser.add_argument("--insecure", action="store_true", help="serve an open API beyond loopback without tokens")
        parser.add_argument("--data-dir", help="data folder (PIPEBD_DATA_DIR, default .pipebd)")
    up.set_defaults(handler=command_up)
    api.set_defaults(handler=command_api)


def add_service_commands(commands: Any) -> None:
    add_server_commands(commands)
    worker = commands.add_parser("worker", help="run a worker that launches jobs on this node")
    worker.add_argument("--devices", type=int, help="devices to advertise (default: GPUs, else CPU cores)")
    worker.add_argument("--slots", type=int, help="jobs at once (default 1)")
    worker.add_argument("--name", help="worker name (default: host name)")
    worker.add_argument(
        "--host-id", help="the host this worker stands for in jobs on several nodes (default: host name)"
    )
    worker.add_argument(
        "--node-address", help="the address other nodes reach this host at (default: the host name's address)"
    )
    worker.add_argument("--data-dir", help="data folder (PIPEBD_DATA_DIR, default .pipebd)")
    worker.set_defaults(handler=command_worker)

    submit = commands.add_parser("submit", help="submit a spec to a server")
    add_spec_arguments(submit)
    add_server_options(submit)
    submit.add_argument("--follow", action="store_true", help="follow the job's progress until it ends")
    submit.add_argument("--idempotency-key", help="resubmitting with the same key returns the same job")
    submit.set_defaults(handler=command_submit)
    add_sweep_command(commands)
    add_job_commands(commands)
    add_quota_commands(commands)
    add_webhook_commands(commands, add_server_options)
    add_model_commands(commands, add_server_options)
    add_soak_command(commands)


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """Where the server is and who asks: every command that talks to one takes these."""
    parser.add_argument(
        "--server",
        default=os.environ.get("PIPEBD_SERVER", "http://127.0.0.1:8000"),
        help="the server's URL (or PIPEBD_SERVER; default http://127.0.0.1:8000)",
    )
    parser.add_argument("--token", default=os.environ.get("PIPEBD_TOKEN"), help="bearer token (or PIPEBD_TOKEN)")
    parser.add_argument("--json", action="store_true", help="print the server's JSON instead of tables")


def add_job_commands(commands: Any) -> None:
    """The commands on jobs a server holds: list, show, cancel, pause, resume, logs, download."""
    jobs = commands.add_parser("jobs", help="list a server's jobs, newest first")
    add_server_options(jobs)
    jobs.add_argument("--state", help="only jobs in this state: queued, running, succeeded, failed, ...")
    jobs.add_argument("--limit", type=int, default=50, help="jobs per page (default 50, at most the server's maximum)")
    jobs.add_argument("--cursor", help="the page after the one that printed this cursor")
    jobs.add_argument("--all", action="store_true", help="every page, not only the first")
    jobs.set_defaults(handler=command_jobs)

    actions = {
        "show": "show a job: state, phases, progress, attempts, error",
        "cancel": "cancel a job: a queued or paused one at once, a running one's processes are stopped",
        "pause": "pause a job: a running one saves every block at its next step and stops; a queued one waits",
        "resume": "put a failed, cancelled or paused job back in the queue, to continue from its checkpoints",
        "logs": "print a job's log: a phase's launcher log, or one rank's",
        "download": "download a job's artifacts: one by NAME, or every one into a folder",
    }
    parsers = {}
    for name, description in actions.items():
        parsers[name] = commands.add_parser(name, help=description)
        parsers[name].add_argument("job_id", type=int, metavar="ID", help="the job's id")
        add_server_options(parsers[name])
        parsers[name].set_defaults(handler=command_job_action)
    parsers["show"].set_defaults(handler=command_show)
    parsers["resume"].add_argument("--follow", action="store_true", help="follow the job's progress until it ends")
    logs = parsers["logs"]
    logs.add_argument("--phase", help="the phase whose log to print (default: the newest one so far)")
    logs.add_argument("--rank", type=int, help="a rank's log (default: the launcher's, torchrun)")
    logs.add_argument("--node", type=int, help="node K's launcher log (a job on several nodes; default: node 0's)")
    logs.add_argument("--follow", action="store_true", help="print the log as it grows, until the job ends")
    logs.set_defaults(handler=command_logs)
    download = parsers["download"]
    download.add_argument("name", nargs="?", metavar="NAME", help="the artifact (default: every one)")
    download.add_argument("-o", "--output", help="file for NAME (default job-ID-NAME), else folder (default job-ID)")
    download.set_defaults(handler=command_download)


def add_sweep_command(commands: Any) -> None:
    sweep = commands.add_parser("sweep", help="submit a sweep: one spec, a job per point of a grid or random search")
    add_spec_arguments(sweep)  # the base spec, with --set, --nproc and --mode as for submit
    sweep.add_argument(
        "--grid", action="append", metavar="PATH=V1,V2", help="a field and its values (YAML each); repeat per field"
    )
    sweep.add_argument("--random", type=int, metavar="COUNT", help="draw COUNT children from the --grid values")
    sweep.add_argument("--seed", type=int, default=0, help="the seed of --random's draws (default 0)")
    sweep.add_argument("--max-parallel", type=int, metavar="N", help="children launched at once at most")
    sweep.add_argument(
        "--objective", metavar="METRIC:GOAL", help="e.g. final_loss:minimize; names the best child (docs/sweeps.md)"
    )
    sweep.add_argument("--name", help="the sweep's name (default: the spec's)")
    sweep.add_argument("--follow", action="store_true", help="print each child's state changes until the sweep ends")
    add_server_options(sweep)
    sweep.set_defaults(handler=command_sweep)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pipebd", description="Pipelined blockwise knowledge distillation")
    commands = parser.add_subparsers(dest="command", required=True)
    add_engine_commands(commands)
    add_service_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.handler in (command_submit, command_sweep) and args.spec is None:
        return fail(f"give a spec file to {args.command}")
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
