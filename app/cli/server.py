"""The service's processes: `pipebd api` (the API server), `pipebd worker` (one worker for this node's
devices) and `pipebd up` (the embedded default: migrations, the API and one worker sharing one data
folder; a worker that dies is started again, app/cli/keeper.py).

`pipebd api` refuses a non-loopback address without tokens unless --insecure. Neither the API process
nor `pipebd up`'s own ever imports torch (app/services/preflight.py checks specs in helper processes).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import httpx

from pipebd_core.cli import fail

STARTUP_TIMEOUT_S = 120  # `pipebd up` waits this long for the API to answer
STOP_TIMEOUT_S = 30  # and this long for each child to stop before killing it


def _environment(args: argparse.Namespace) -> None:
    """Command-line options become PIPEBD_* settings for this process and its children."""
    for option, variable in (
        ("data_dir", "PIPEBD_DATA_DIR"),
        ("devices", "PIPEBD_WORKER_DEVICES"),
        ("slots", "PIPEBD_WORKER_SLOTS"),
        ("name", "PIPEBD_WORKER_NAME"),
        ("host_id", "PIPEBD_HOST_ID"),
        ("node_address", "PIPEBD_NODE_ADDRESS"),
    ):
        value = getattr(args, option, None)
        if value is not None:
            os.environ[variable] = str(value)


def command_api(args: argparse.Namespace) -> int:
    import uvicorn

    from app.api.auth import check_bind
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
    from app.api.auth import check_bind
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
    from app.cli.keeper import WorkerKeeper

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
            f"pipebd: dashboard and API at {url}  (API docs: {url}/docs; data in {settings.data_dir});"
            " Ctrl-C or SIGTERM stops",
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
