"""Service tier (static): docker-compose.yml and the Dockerfile parse, and what they run exists.

No Docker engine runs here, so the files are checked against the code: every command is a valid
`pipebd` command line, every PIPEBD_* variable is a setting, every COPY source is in the repository.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from app.cli.main import build_parser
from app.cli.server import command_api, command_worker
from app.core.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return document


def dockerfile() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_compose_has_the_four_services_sharing_runs() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "postgres", "api", "worker"}
    assert services["redis"]["command"][0] == "redis-server"
    assert "runs:/data" in services["api"]["volumes"] and "runs:/data" in services["worker"]["volumes"]
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_compose_commands_are_pipebd_command_lines() -> None:
    services = compose()["services"]
    handlers = {"api": command_api, "worker": command_worker}
    for name, handler in handlers.items():
        command = services[name]["command"]
        assert command[0] == "pipebd"
        assert build_parser().parse_args(command[1:]).handler is handler
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["pipebd"] == "app.cli:main"


def test_compose_environment_names_real_settings() -> None:
    for name in ("api", "worker"):
        for variable in compose()["services"][name]["environment"]:
            assert variable.startswith("PIPEBD_")
            assert variable.removeprefix("PIPEBD_").lower() in Settings.model_fields, variable
    url = compose()["services"]["api"]["environment"]["PIPEBD_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://")  # the driver installed by pyproject.toml


def test_dockerfile_copies_what_exists_and_runs_the_api() -> None:
    instructions = dockerfile()
    assert instructions[0][0] == "FROM" and instructions[0][1].startswith("python:3.11")
    for kind, argument in instructions:
        if kind == "COPY":
            *sources, _ = argument.split()
            for source in sources:
                assert (REPO / source).exists(), source
    assert any(kind == "RUN" and "pip install" in argument for kind, argument in instructions)
    cmd = next(argument for kind, argument in instructions if kind == "CMD")
    command = yaml.safe_load(cmd)
    assert command[0] == "pipebd" and build_parser().parse_args(command[1:]).handler is command_api
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".git", "runs"} <= set(ignored)
    assert not re.search(r"PIPEBD_API_TOKENS=\S", (REPO / "Dockerfile").read_text())  # no baked-in secret
