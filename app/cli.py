"""The `pipebd` command line: the engine's commands plus the service's `up`, `api`, `worker`, `submit`.

pipebd up       the embedded default: migrations, the API and one worker, sharing one data folder; a
                worker that dies is started again (app/keeper.py)
pipebd api      the API server alone (refuses a non-loopback address without tokens unless --insecure)
pipebd worker   one worker for this node's devices
pipebd pause ID, pipebd resume ID   pause a job, or resume a failed, cancelled or paused one
pipebd submit   send a spec to a server; --follow draws its progress from the event stream

`pipebd api` and `pipebd up` are parsed without the engine's commands: the engine's CLI imports torch,
and the API process (and `pipebd up`'s own) must not hold it (app/preflight.py checks specs instead).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx

from pipebd_core.spec import SpecError, apply_overrides, load_document

STARTUP_TIMEOUT_S = 120  # `pipebd up` waits this long for the API to answer
STOP_TIMEOUT_S = 30  # and this long for each child to stop before killing it
SERVER_COMMANDS = ("api", "up")  # long-running processes: parsed without the engine's CLI (torch)


def fail(message: str) -> int:
    """The engine CLI's error line and exit code (as `pipebd_core.cli.fail`), without importing that CLI."""
    print(f"pipebd: error: {message}", file=sys.stderr)
    return 2


def _environment(args: argparse.Namespace) -> None:
    """Command-line options become PIPEBD_* settings for this process and its children."""
    for option, variable in (
        ("data_dir", "PIPEBD_DATA_DIR"),
        ("devices", "PIPEBD_WORKER_DEVICES"),
        ("slots", "PIPEBD_WORKER_SLOTS"),
        ("name", "PIPEBD_WORKER_NAME"),
    ):
        value = getattr(args, option, None)
        if value is not None:
            os.environ[variable] = str(value)


def command_api(args: argparse.Namespace) -> int:
    import uvicorn

    from app.auth import check_bind
    from app.core.settings import get_settings
    from app.main import create_app

    _environment(args)
    try:
        check_bind(args.host, get_settings(), args.insecure)
    except ValueError as error:
        return fail(str(error))
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    return 0


def command_worker(args: argparse.Namespace) -> int:
    _environment(args)
    from worker.service import serve

    return serve()


def _wait_healthy(url: str, children: list[subprocess.Popen[bytes]]) -> bool:
    deadline = time.time() + STARTUP_TIMEOUT_S
    while time.time() < deadline:
        if any(child.poll() is not None for child in children):
            return False
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    return False


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def command_up(args: argparse.Namespace) -> int:
    from app.auth import check_bind
    from app.core.database import migrate
    from app.core.settings import get_settings

    _environment(args)
    settings = get_settings()
    try:
        check_bind(args.host, settings, args.insecure)
    except ValueError as error:
        return fail(str(error))
    settings.prepare_folders()
    migrate(settings.database)
    from app.keeper import WorkerKeeper

    api_command = [sys.executable, "-m", "app.cli", "api", "--host", args.host, "--port", str(args.port)]
    # Own sessions: a terminal's Ctrl-C reaches only this process, which stops each child exactly once.
    api = subprocess.Popen([*api_command, *(["--insecure"] if args.insecure else [])], start_new_session=True)
    keeper = WorkerKeeper([sys.executable, "-m", "app.cli", "worker"])
    signal.signal(signal.SIGTERM, _interrupt)
    url = f"http://{args.host}:{args.port}"
    try:
        if not _wait_healthy(url, [api]):
            return fail(f"the API did not come up on {url}; see the output above")
        print(
            f"pipebd: dashboard and API at {url}  (API docs: {url}/docs; data in {settings.data_dir}); Ctrl-C stops",
            flush=True,
        )
        while api.poll() is None:
            keeper.check()
            time.sleep(0.5)
        return fail("the API stopped unexpectedly; stopping the worker")
    except KeyboardInterrupt:
        # the worker's running jobs are checkpointed and requeued, its queued ones stay queued (worker/launcher.py)
        print("pipebd: stopping the API and the worker", flush=True)
        return 0
    finally:
        _stop([api, keeper.process])


def command_submit(args: argparse.Namespace) -> int:
    from app.client import ClientError, follow, submit

    try:
        document = apply_overrides(load_document(args.spec), list(args.set or []))
        if args.nproc is not None:
            document = apply_overrides(document, [f"schedule.nproc={args.nproc}"])
        if args.mode is not None:
            document = apply_overrides(document, [f"schedule.mode={args.mode}"])
        job = submit(args.server, args.token, document, args.idempotency_key)
        print(f"pipebd: job {job['id']} {job['state']}: {args.server}/api/v1/jobs/{job['id']}", flush=True)
        if not args.follow:
            return 0
        final = follow(args.server, args.token, job["id"])
    except (SpecError, ClientError, httpx.TransportError) as error:
        return fail(str(error))
    print(f"pipebd: job {job['id']} {final}")
    return 0 if final == "succeeded" else 1


def command_job_action(args: argparse.Namespace) -> int:
    """`pipebd pause ID` and `pipebd resume ID`: the server's answer, or its refusal (409 says why)."""
    from app.client import ClientError, act, follow

    try:
        job = act(args.server, args.token, args.job_id, args.command)
        print(f"pipebd: job {job['id']} {job['state']}: {args.server}/api/v1/jobs/{job['id']}", flush=True)
        if not getattr(args, "follow", False):
            return 0
        final = follow(args.server, args.token, job["id"])
    except (ClientError, httpx.TransportError) as error:
        return fail(f"{args.command} job {args.job_id}: {error}")
    print(f"pipebd: job {job['id']} {final}")
    return 0 if final == "succeeded" else 1


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
    from pipebd_core.cli import add_spec_arguments

    add_server_commands(commands)
    worker = commands.add_parser("worker", help="run a worker that launches jobs on this node")
    worker.add_argument("--devices", type=int, help="devices to advertise (default: GPUs, else CPU cores)")
    worker.add_argument("--slots", type=int, help="jobs at once (default 1)")
    worker.add_argument("--name", help="worker name (default: host name)")
    worker.add_argument("--data-dir", help="data folder (PIPEBD_DATA_DIR, default .pipebd)")
    worker.set_defaults(handler=command_worker)

    submit = commands.add_parser("submit", help="submit a spec to a server")
    add_spec_arguments(submit)
    submit.add_argument("--server", default=os.environ.get("PIPEBD_SERVER", "http://127.0.0.1:8000"))
    submit.add_argument("--token", default=os.environ.get("PIPEBD_TOKEN"), help="bearer token (or PIPEBD_TOKEN)")
    submit.add_argument("--follow", action="store_true", help="follow the job's progress until it ends")
    submit.add_argument("--idempotency-key", help="resubmitting with the same key returns the same job")
    submit.set_defaults(handler=command_submit)

    actions = {
        "pause": "pause a job: a running one saves every block at its next step and stops; a queued one waits",
        "resume": "put a failed, cancelled or paused job back in the queue, to continue from its checkpoints",
    }
    for name, description in actions.items():
        action = commands.add_parser(name, help=description)
        action.add_argument("job_id", type=int, metavar="ID", help="the job's id")
        action.add_argument("--server", default=os.environ.get("PIPEBD_SERVER", "http://127.0.0.1:8000"))
        action.add_argument("--token", default=os.environ.get("PIPEBD_TOKEN"), help="bearer token (or PIPEBD_TOKEN)")
        if name == "resume":
            action.add_argument("--follow", action="store_true", help="follow the job's progress until it ends")
        action.set_defaults(handler=command_job_action)


def build_parser() -> argparse.ArgumentParser:
    from pipebd_core.cli import build_parser as build_engine_parser

    parser = build_engine_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    add_service_commands(commands)
    return parser


def build_server_parser() -> argparse.ArgumentParser:
    """`pipebd api` and `pipebd up` alone (their options are the service's own)."""
    parser = argparse.ArgumentParser(prog="pipebd")
    add_server_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    server = bool(argv) and argv[0] in SERVER_COMMANDS
    args = (build_server_parser() if server else build_parser()).parse_args(argv)
    if getattr(args, "handler", None) in (command_submit,) and args.spec is None:
        return fail("give a spec file to submit")
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
