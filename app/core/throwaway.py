"""Throw-away Redis and PostgreSQL servers: private instances started from Debian's `redis-server` and
`postgresql` binaries in a folder of their own, on a free loopback port, that a caller may stop as a crash would
(`halt`: the data stays), start again, and finally stop for good. The chaos tests start them to restart them
under a job; the soak (app/soak/) runs its service on them and restarts them as faults. Never the machine's
own servers: those are not ours to stop."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import redis

START_TIMEOUT_S = 120  # initdb, or a server's start, ends within this


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    url: str | None  # None: unavailable, see `reason`
    reason: str = ""
    stop_commands: list[list[str]] = field(default_factory=list)
    folder: str | None = None  # removed by `stop` (unless `keep`)
    halt_commands: list[list[str]] = field(default_factory=list)  # a throw-away instance: stop it, keep its data
    start_commands: list[list[str]] = field(default_factory=list)  # and start it again
    keep: bool = False  # `stop` leaves the folder (a soak resumed later starts the same data again)

    def halt(self) -> None:
        """Stop the server as a crash would (its data stays); `start` brings it back."""
        if not self.halt_commands:
            raise RuntimeError("only a throw-away instance of this session may be stopped")
        for command in self.halt_commands:
            subprocess.run(command, check=False, capture_output=True, timeout=60)

    def start(self) -> None:
        for command in self.start_commands:
            subprocess.run(command, check=True, capture_output=True, timeout=START_TIMEOUT_S)

    def stop(self) -> None:
        for command in self.stop_commands:
            subprocess.run(command, check=False, capture_output=True, timeout=60)
        if self.folder and not self.keep:
            shutil.rmtree(self.folder, ignore_errors=True)


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def throwaway_redis(folder: Path | None = None) -> Server:
    """A private redis-server keeping nothing on disk (a restart comes back empty), in `folder` (default: a new
    temporary one, removed by `stop`)."""
    binary = shutil.which("redis-server")
    if binary is None:
        return Server(None, "redis-server is not installed (apt-get install redis-server)")
    keep = folder is not None
    where = str(folder) if folder is not None else tempfile.mkdtemp(prefix="pipebd-redis-")
    Path(where).mkdir(parents=True, exist_ok=True)
    port = free_port()
    start = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    start += ["--dir", where, "--daemonize", "yes", "--pidfile", f"{where}/redis.pid"]
    subprocess.run(start, check=False, timeout=30)
    url = f"redis://127.0.0.1:{port}"
    for _ in range(50):
        if redis_answers(url):
            stop = [["redis-cli", "-p", str(port), "shutdown", "nosave"]]
            wait = ["sh", "-c", f"until redis-cli -p {port} ping >/dev/null 2>&1; do sleep 0.1; done"]
            return Server(url, "", stop, where, stop, [start, wait], keep)
        time.sleep(0.1)
    return Server(None, f"could not start a throw-away redis-server on port {port}", folder=where, keep=keep)


def postgres_answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def postgres_binary(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def throwaway_postgres(folder: Path | None = None) -> Server:
    """A private PostgreSQL (trust auth, fsync off) with a database `test`, in `folder` (default: a new temporary
    one, removed by `stop`). A folder that already holds a cluster is started again as it is, on a new port."""
    initdb, pg_ctl = postgres_binary("initdb"), postgres_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        return Server(None, "PostgreSQL is not installed (apt-get install postgresql)")
    keep = folder is not None
    where = str(folder) if folder is not None else tempfile.mkdtemp(prefix="pipebd-pg-")
    Path(where).mkdir(parents=True, exist_ok=True)
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the throw-away server as the postgres user
        shutil.chown(where, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = f"{where}/data", free_port()
    fresh = not Path(data).exists()
    if fresh:
        initdb_command = [*as_user, initdb, "-D", data, "-U", "postgres", "--auth=trust"]
        subprocess.run(initdb_command, check=False, capture_output=True, timeout=START_TIMEOUT_S)
    options = f"-p {port} -k {where} -c listen_addresses=127.0.0.1 -c fsync=off"
    start = [*as_user, pg_ctl, "-D", data, "-o", options, "-l", f"{where}/log", "-w", "start"]
    subprocess.run(start, check=False, capture_output=True, timeout=START_TIMEOUT_S)
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    if not postgres_answers(url):
        return Server(None, f"could not start a throw-away PostgreSQL with {initdb}", folder=where, keep=keep)
    if fresh:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("CREATE DATABASE test")
    stop = [[*as_user, pg_ctl, "-D", data, "-m", "immediate", "stop"]]
    url = f"postgresql://postgres@127.0.0.1:{port}/test"
    return Server(url, "", stop, where, stop, [start], keep)
