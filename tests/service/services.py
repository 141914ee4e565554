"""Real Redis and PostgreSQL for the service tests: the ones running here, or throw-away instances.

If 127.0.0.1:6379 (Redis) or 127.0.0.1:5432 (PostgreSQL, trust auth, database `test`) answers, the
tests use it. Otherwise they start a private instance from Debian's `redis-server` / `postgresql`
binaries in a temporary folder and stop it afterwards. When neither is possible the caller skips
with the reason returned here: a test is never passed silently without its component.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field

import psycopg
import redis

REDIS_DEFAULT = "redis://127.0.0.1:6379"
POSTGRES_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    url: str | None  # None: unavailable, see `reason`
    reason: str = ""
    stop_commands: list[list[str]] = field(default_factory=list)
    folder: str | None = None
    halt_commands: list[list[str]] = field(default_factory=list)  # a throw-away instance: stop it, keep its data
    start_commands: list[list[str]] = field(default_factory=list)  # and start it again

    def halt(self) -> None:
        """Stop the server as a crash would (its data stays); `start` brings it back."""
        assert self.halt_commands, "only a throw-away instance of this session may be stopped"
        for command in self.halt_commands:
            subprocess.run(command, check=False, capture_output=True, timeout=60)

    def start(self) -> None:
        for command in self.start_commands:
            subprocess.run(command, check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        for command in self.stop_commands:
            subprocess.run(command, check=False, capture_output=True, timeout=60)
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def start_redis(own: bool = False) -> Service:
    """The machine's Redis when it runs (unless `own`), else a throw-away server of this session."""
    if not own and redis_answers(REDIS_DEFAULT):
        return Service(REDIS_DEFAULT)
    binary = shutil.which("redis-server")
    if binary is None:
        return Service(
            None,
            "Redis is not running on 127.0.0.1:6379 and redis-server is not installed (apt-get install redis-server)",
        )
    folder, port = tempfile.mkdtemp(prefix="pipebd-redis-"), free_port()
    start = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        folder,
        "--daemonize",
        "yes",
        "--pidfile",
        f"{folder}/redis.pid",
    ]
    subprocess.run(start, check=False, timeout=30)
    url = f"redis://127.0.0.1:{port}"
    for _ in range(50):
        if redis_answers(url):
            stop = [["redis-cli", "-p", str(port), "shutdown", "nosave"]]
            wait = ["sh", "-c", f"until redis-cli -p {port} ping >/dev/null 2>&1; do sleep 0.1; done"]
            return Service(url, stop_commands=stop, folder=folder, halt_commands=stop, start_commands=[start, wait])
        time.sleep(0.1)
    return Service(None, f"could not start a throw-away redis-server on port {port}", folder=folder)


def postgres_answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2):
            return True
    except psycopg.Error:
        return False


def postgres_binary(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def start_postgres(own: bool = False) -> Service:
    """The machine's PostgreSQL when it runs (unless `own`), else a throw-away server of this session."""
    if not own and postgres_answers(POSTGRES_DEFAULT):
        return Service(POSTGRES_DEFAULT)
    initdb, pg_ctl = postgres_binary("initdb"), postgres_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        return Service(
            None, "PostgreSQL is not running on 127.0.0.1:5432 and is not installed (apt-get install postgresql)"
        )
    folder, port = tempfile.mkdtemp(prefix="pipebd-pg-"), free_port()
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the throw-away server as the postgres user
        shutil.chown(folder, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = f"{folder}/data"
    subprocess.run(
        [*as_user, initdb, "-D", data, "-U", "postgres", "--auth=trust"], check=False, capture_output=True, timeout=120
    )
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    start = [*as_user, pg_ctl, "-D", data, "-o", options, "-l", f"{folder}/log", "-w", "start"]
    subprocess.run(start, check=False, capture_output=True, timeout=120)
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    if not postgres_answers(url):
        return Service(None, f"could not start a throw-away PostgreSQL with {initdb}", folder=folder)
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE DATABASE test")
    stop = [[*as_user, pg_ctl, "-D", data, "-m", "immediate", "stop"]]
    url = f"postgresql://postgres@127.0.0.1:{port}/test"
    return Service(url, stop_commands=stop, folder=folder, halt_commands=stop, start_commands=[start])


def create_database(server_url: str) -> str:
    """A fresh, empty database on the server; returns its SQLAlchemy URL."""
    name = f"pipebd_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    base = server_url.rsplit("/", 1)[0]
    return f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{name}"


def drop_database(server_url: str, database_url: str) -> None:
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
