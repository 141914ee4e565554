"""Every command, path, route, spec and link the README and docs/ show is still true. Tier: pure logic.

Nothing is run and no server is started: a `pipebd` command (in a shell block, or a usage in a code
span such as `pipebd resume ID [--follow]`, its placeholders given sample values) is parsed by the one
parser, `app.cli.main.build_parser()`, and the spec file it names validated with its overrides; a
`make` target is looked up in the Makefile; a `curl` URL and an endpoint (`GET /api/v1/jobs/{id}`) are
matched against the routes of `app.main.create_app` (method and path, and their query names against
its OpenAPI document); a YAML block validates as a spec, a JSON block as a problem body or a webhook
payload; a repository path, a module and a `file.py:name` exist; a link reaches its page and heading;
every page of docs/ is linked from the README. A shell command of any other kind fails the test until it is taught here,
so nothing a page shows goes unchecked. Torch is never imported.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.routing import Match

from app.api.schemas import Problem
from app.cli.main import build_parser
from app.core.settings import Settings
from app.main import create_app
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.webhook import WebhookPayload
from pipebd_core.spec import Spec, SpecError, load_spec, parse_spec
from tests.unit.doc_pages import REPO, SHELL, Command, Where, anchors, blocks, commands, links, pages, spans

PIPEBD = ("pipebd", ".venv/bin/pipebd")
PYTHON = ".venv/bin/python"
SAMPLES = {  # a usage's placeholders, and the values a check gives them
    "SPEC": "examples/tiny-custom.yaml",
    "ID": "1",
    "N": "2",
    "R": "2",
    "M": "dp",
    "DIR": "runs/example",
    "OUT": "runs/example",
    "dotted.key=value": "train.epochs=1",
    "{id}": "1",
    "{name}": "student.pt",
}
PATH = re.compile(
    r"(?<![\w/.-])((?:pipebd_core|app|worker|tests|examples|scripts|benchmarks|docs|templates|migrations)"
    r"/[\w./*-]*)(?::([A-Za-z_]\w*))?"
)
MODULE = re.compile(r"^((?:pipebd_core|app|worker)(?:\.\w+)+)(?::(\w+))?$")
ENDPOINT = re.compile(r"^(GET|POST|PUT|PATCH|DELETE) (/\S*)$")
ROUTE_PATH = re.compile(r"^/[\w/{}.?=&,-]*$")
ENV_ASSIGNMENT = re.compile(r"^PIPEBD_(\w+)=")  # a setting given to one command
FILESYSTEM = ("/proc/", "/usr/", "/tmp/", "/etc/", "/dev/", "/sys/", "/opt/", "/var/", "/home/")  # not routes


def shell_commands() -> list[Command]:
    return [
        command for page in pages() for block in blocks(page) if block.language in SHELL for command in commands(block)
    ]


def usages() -> list[Command]:
    """The `pipebd ...` code spans of the prose, as commands: options in brackets taken, placeholders filled."""
    found = []
    for where, span in (item for page in pages() for item in spans(page)):
        if span.split(" ", 1)[0] in PIPEBD and " " in span:
            words = span.replace("[", " ").replace("]", " ").split()
            found.append(Command(where, [SAMPLES.get(word, word) for word in words if word != "..."]))
    return found


def kind(command: Command) -> str:
    program = command.argv[0]
    if ENV_ASSIGNMENT.match(program):
        return "env"
    if program in PIPEBD:
        return "pipebd"
    if program == PYTHON and command.argv[1:3] == ["-m", "pytest"]:
        return "pytest"
    if program == PYTHON and len(command.argv) > 1 and command.argv[1].endswith(".py"):
        return "script"
    if program.startswith("scripts/"):
        return "script"
    if program == ".venv/bin/pip" and command.argv[1:2] == ["install"]:
        return "pip"
    if program == ".venv/bin/tensorboard":
        return "tensorboard"
    return program if program in ("make", "curl") else "unknown"


def problems_of(items: list[Command], check: Callable[[Command], str | None]) -> list[str]:
    return [f"{item.where}: {item}: {problem}" for item in items if (problem := check(item))]


def none(problems: list[str]) -> None:
    """Fail with every problem on a line of its own: where, what is shown, what is wrong."""
    assert not problems, "what the pages show is no longer true:\n" + "\n".join(problems)


# ---- pipebd ----------------------------------------------------------------------------------------


def parse_problem(command: Command) -> str | None:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = build_parser().parse_args(command.argv[1:])
    except SystemExit:
        return "the pipebd parser refuses it: " + stderr.getvalue().strip().splitlines()[-1]
    return spec_problem(args)


def spec_problem(args: argparse.Namespace) -> str | None:
    """The spec a command names, with its --set, --nproc and --mode, must validate (commands.py does the same)."""
    if getattr(args, "spec", None) is None:
        return None  # a command without a spec, or a usage that names none (`pipebd submit`)
    overrides = list(args.set or [])
    overrides += [f"schedule.nproc={args.nproc}"] if args.nproc is not None else []
    overrides += [f"schedule.mode={args.mode}"] if args.mode is not None else []
    try:
        load_spec(REPO / args.spec, overrides)
    except SpecError as error:
        return f"its spec does not validate: {error}"
    return None


def test_every_pipebd_command_parses_and_its_spec_validates() -> None:
    checked = [command for command in shell_commands() if kind(command) == "pipebd"] + usages()
    assert len(checked) >= 30, "the pages show far fewer pipebd commands than they did: is the extraction broken?"
    none(problems_of(checked, parse_problem))


# ---- make, pytest, scripts ---------------------------------------------------------------------------


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", (REPO / "Makefile").read_text(), re.MULTILINE))


def make_problem(command: Command) -> str | None:
    missing = [target for target in command.argv[1:] if not target.startswith("-") and target not in make_targets()]
    return f"no such Makefile target: {', '.join(missing)}" if missing else None


def pytest_problem(command: Command) -> str | None:
    markers = {entry.split(":", 1)[0] for entry in pytest_settings()["markers"]}
    words = iter(command.argv[3:])
    for word in words:
        if word == "-m" and (marker := next(words, "")) not in markers:
            return f"marker {marker!r} is not declared in pyproject.toml (declared: {', '.join(sorted(markers))})"
        if word in ("-n", "-k", "-p"):
            next(words, None)
        elif not word.startswith("-") and not (REPO / word.split("::")[0]).exists():
            return f"no such test path: {word}"
    return None


def pytest_settings() -> dict[str, list[str]]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def script_problem(command: Command) -> str | None:
    script = REPO / (command.argv[1] if command.argv[0] == PYTHON else command.argv[0])
    if not script.is_file():
        return f"no such script: {script.relative_to(REPO)}"
    if command.argv[0] != PYTHON and not script.stat().st_mode & 0o111:
        return "the script is not executable"
    return None


def project() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def pip_problem(command: Command) -> str | None:
    """`pip install -e '.[extra]'`: each extra must be one of pyproject.toml's optional dependencies."""
    extras = set(project()["optional-dependencies"])
    named = [extra for word in command.argv[2:] for extra in re.findall(r"^\.\[([\w,]+)\]$", word)]
    missing = [extra for group in named for extra in group.split(",") if extra not in extras]
    return f"no such extra in pyproject.toml: {', '.join(missing)}" if missing or not named else None


def tensorboard_problem(command: Command) -> str | None:
    """`tensorboard --logdir DIR`: TensorBoard is a pinned dependency, and given a log folder."""
    if not any(requirement.startswith("tensorboard==") for requirement in project()["dependencies"]):
        return "tensorboard is not a pinned dependency in pyproject.toml"
    return None if command.argv[1:2] == ["--logdir"] and len(command.argv) == 3 else "expected --logdir DIR"


def env_problem(command: Command) -> str | None:
    """`PIPEBD_NAME=value ... COMMAND`: each variable names a service setting, and COMMAND passes its own check."""
    words = list(command.argv)
    while words and (assignment := ENV_ASSIGNMENT.match(words[0])):
        if assignment.group(1).lower() not in Settings.model_fields:
            return f"{assignment.group(0)} names no setting of app/core/settings.py"
        words.pop(0)
    rest = Command(command.where, words)
    if kind(rest) == "pipebd":
        return parse_problem(rest)
    return CHECKS[kind(rest)](rest) if kind(rest) in CHECKS else f"no check for {rest}"


CHECKS: dict[str, Callable[[Command], str | None]] = {
    "make": make_problem,
    "pytest": pytest_problem,
    "script": script_problem,
    "pip": pip_problem,
    "tensorboard": tensorboard_problem,
    "env": env_problem,
}


def test_every_make_target_pytest_run_and_script_exists() -> None:
    shown = [command for command in shell_commands() if kind(command) in CHECKS]
    assert {"make", "pytest", "script"} <= {kind(command) for command in shown}
    none(problems_of(shown, lambda command: CHECKS[kind(command)](command)))


def test_every_shell_command_is_one_this_test_checks() -> None:
    unknown = [command for command in shell_commands() if kind(command) == "unknown"]
    none([f"{c.where}: {c}: no check for this command; teach tests/unit/test_docs.py" for c in unknown])


# ---- routes -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("docs-app"), api_tokens=""), run_migrations=False)


def route_problem(app: FastAPI, method: str, url: str) -> str | None:
    parts = urlsplit(url)
    path = "/".join(SAMPLES.get(part, part) for part in parts.path.split("/"))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "app": app,
        "headers": [],
        "query_string": b"",
    }
    found = max((route.matches(scope)[0] for route in app.router.routes), key=lambda match: match.value)
    if found is Match.NONE:
        return f"no route of the app matches {path}"
    if found is Match.PARTIAL:
        return f"{path} has a route, but not for {method}"
    known = query_names(app, method, path)
    unknown = set(parse_qs(parts.query, keep_blank_values=True)) - known if known is not None else set()
    return f"not query parameters of {method} {path}: {', '.join(sorted(unknown))}" if unknown else None


def query_names(app: FastAPI, method: str, path: str) -> set[str] | None:
    """The query parameters the OpenAPI document gives the operation; None for the dashboard's pages and
    the schema's own routes, which the document leaves out."""
    for template, operations in app.openapi()["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path) and method.lower() in operations:
            parameters = operations[method.lower()].get("parameters", [])
            return {parameter["name"] for parameter in parameters if parameter["in"] == "query"}
    return None


def curl_request(command: Command) -> tuple[str, str]:
    argv = command.argv
    url = next(word for word in argv if word.startswith("http"))
    if "-X" in argv:
        return argv[argv.index("-X") + 1], url
    sends = any(word in ("-d", "--data", "--data-binary", "--data-raw", "-F") for word in argv)
    return ("POST" if sends else "GET"), url


def endpoints() -> Iterator[tuple[Where, str, str]]:
    """`METHOD /path` code spans, and bare `/path` spans (pages and endpoints a browser GETs)."""
    for where, span in (item for page in pages() for item in spans(page)):
        if match := ENDPOINT.match(span):
            yield where, match.group(1), match.group(2)
        elif ROUTE_PATH.match(span) and not span.startswith(FILESYSTEM):
            yield where, "GET", span


def test_every_curl_url_is_a_route_of_the_app(app: FastAPI) -> None:
    curls = [command for command in shell_commands() if kind(command) == "curl"]
    assert len(curls) >= 3
    none(problems_of(curls, lambda command: route_problem(app, *curl_request(command))))


def test_every_endpoint_shown_is_a_route_of_the_app(app: FastAPI) -> None:
    shown = list(endpoints())
    assert len(shown) >= 20
    problems = [
        f"{where}: {method} {url}: {problem}"
        for where, method, url in shown
        if (problem := route_problem(app, method, url))
    ]
    none(problems)


# ---- documents --------------------------------------------------------------------------------------


def block_problem(language: str, text: str) -> str | None:
    if language == "yaml":
        document = yaml.safe_load(text)
        if not isinstance(document, dict) or not set(document) <= set(Spec.model_fields):
            return f"not a spec (sections {sorted(Spec.model_fields)}); teach tests/unit/test_docs.py what it is"
        try:
            parse_spec(document)
        except SpecError as error:
            return f"does not validate as a spec: {error}"
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return f"not JSON: {error}"
    if isinstance(value, dict) and "event" in value:
        try:
            WebhookPayload.from_json(value)
        except DocumentError as error:
            return f"not a webhook payload (pipebd_core/documents/webhook.py): {error}"
        return None
    try:
        Problem.model_validate(value)
    except ValidationError as error:
        return f"not a problem body (app/api/schemas.py:Problem): {error}"
    return None


def test_every_yaml_block_is_a_valid_spec_and_every_json_block_a_problem_body_or_webhook_payload() -> None:
    shown = [block for page in pages() for block in blocks(page) if block.language in ("yaml", "json")]
    assert {"yaml", "json"} <= {block.language for block in shown}
    problems = [
        f"{block.where}: {problem}" for block in shown if (problem := block_problem(block.language, block.text))
    ]
    none(problems)


# ---- paths, modules, links ----------------------------------------------------------------------------


def path_problem(path: str, name: str | None) -> str | None:
    path = path.rstrip(".")
    if not any(REPO.glob(path)):
        return f"no such file or folder: {path}"
    if name and path.endswith(".py") and not defines(REPO / path, name):
        return f"{path} defines no {name}"
    return None


def defines(source: Path, name: str) -> bool:
    pattern = rf"^(?:async\s+)?(?:def|class)\s+{name}\b|^{name}\s*[:=]"
    return re.search(pattern, source.read_text(), re.MULTILINE) is not None


def module_problem(module: str, name: str | None) -> str | None:
    base = REPO / module.replace(".", "/")
    source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    if not source.is_file():
        return f"no such module: {module}"
    return f"{module} defines no {name}" if name and not defines(source, name) else None


def mentions() -> Iterator[tuple[Where, str, str | None]]:
    for page in pages():
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in PATH.finditer(line):
                yield Where(page, number), match.group(1), match.group(2)


def test_every_repository_path_and_module_mentioned_exists() -> None:
    paths = list(mentions())
    modules = [
        (where, match) for where, span in (i for p in pages() for i in spans(p)) if (match := MODULE.match(span))
    ]
    assert len(paths) >= 100 and len(modules) >= 5
    problems = [f"{where}: {problem}" for where, path, name in paths if (problem := path_problem(path, name))]
    problems += [f"{where}: {problem}" for where, match in modules if (problem := module_problem(*match.groups()))]
    none(problems)


def link_problem(page: Path, target: str) -> str | None:
    if re.match(r"^[a-z]+:", target):
        return None  # http:, https:, mailto:
    path, _, anchor = target.partition("#")
    linked = (page.parent / path).resolve() if path else page
    if not linked.exists():
        return f"links to {path}, which does not exist"
    if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
        return f"links to #{anchor}, which is no heading of {linked.relative_to(REPO)}"
    return None


def test_every_link_reaches_its_page_and_heading() -> None:
    shown = [(where, target) for page in pages() for where, target in links(page)]
    assert len(shown) >= 30
    none([f"{where}: {problem}" for where, target in shown if (problem := link_problem(where.page, target))])


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = REPO / "README.md"
    linked = {(readme.parent / target.partition("#")[0]).resolve() for _, target in links(readme)}
    none([f"README.md links no {page.relative_to(REPO)}" for page in pages()[1:] if page not in linked])
