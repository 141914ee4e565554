"""Turning a request body into a spec the service agrees to run.

Three gates, each refusing with problems that name the field and say what would work:
1. the body parses (JSON, or YAML with a YAML content type) into a mapping of at most `MAX_VALUES`
   finite values (YAML aliases count each time they are used, so an alias bomb is refused);
2. the engine's own model (`pipebd_core.spec.Spec`, strictly: a JSON type for each field as the schema
   says, so `"2"` is not an integer and `0` not a boolean), then this server's policy: a spec names its
   workload (`workload.kind`), `train.epochs` and `data.num_samples` stay within the server's bounds,
   paths lie under the configured data roots, factories come from allowlisted modules only (user code
   runs on the workers);
3. the engine's preflight (data set, workload, a plan without a profile), run by app/services/preflight.py in a
   helper process so that this process never imports torch; its messages are the engine's own, and
   `preflight_problems` only splits them into fields.
Nothing is stored unless all three pass. Gates 1 and 2 are plain Python (no torch), run off the event
loop by app/services/submissions.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from app.core.json_types import JsonObject
from app.core.settings import Settings
from app.services.errors import ABSENT, FieldProblem, ServiceError, field_problem, pydantic_problems, summary
from pipebd_core.spec import WORKLOAD_KINDS, Spec, spec_message

JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
MAX_VALUES = 10_000  # values in one spec document at most (a real spec has a few dozen)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it
REQUIRED = f"a spec names its workload: `workload: {{kind: {' | '.join(WORKLOAD_KINDS)}, ...}}` (see examples/)"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")  # `meta-llama/Llama-3.2-1B`, as the hub names models


def body_error(message: str, status: int = 400) -> ServiceError:
    """The body is not a document at all (400), or of a type we do not read (415)."""
    return ServiceError(status, message)


def parse_body(body: bytes, content_type: str) -> JsonObject:
    """The spec document from a JSON or YAML body; an empty body is an empty document."""
    kind = content_type.split(";")[0].strip().lower() or "application/json"
    if kind not in JSON_TYPES + YAML_TYPES:
        accepted = ", ".join(JSON_TYPES + YAML_TYPES)
        raise body_error(f"Content-Type {kind!r} is not accepted; send the spec as one of: {accepted}", 415)
    try:
        text = body.decode("utf-8")
        if not text.strip():
            return {}
        document = json.loads(text, parse_constant=_no_constant) if kind in JSON_TYPES else yaml.load(text, YAML_LOADER)
    except UnicodeDecodeError:
        raise body_error("the body is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise body_error(f"malformed JSON at line {error.lineno} column {error.colno}: {error.msg}") from None
    except yaml.YAMLError as error:
        raise body_error(f"malformed YAML: {error}".replace("\n", " ")) from None
    except RecursionError:
        raise body_error(
            "the document is nested too deeply; a spec has sections of fields, a few levels deep"
        ) from None
    if not isinstance(document, dict):
        raise body_error(f"a spec must be a JSON/YAML object of sections, got {type(document).__name__}")
    check_values(document)
    return document


def _no_constant(name: str) -> None:
    """JSON has no NaN or Infinity (Python's reader takes them): refuse them as the malformed JSON they are."""
    raise body_error(f"malformed JSON: {name} is not a JSON number; use a finite number")


def check_values(document: JsonObject) -> None:
    """At most MAX_VALUES values, every number finite (YAML's .inf and .nan are refused where they stand)."""
    stack: list[tuple[list[str | int], Any]] = [([], document)]
    count = 0
    while stack:
        path, value = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise body_error(
                f"the document has more than {MAX_VALUES} values (YAML aliases count each time they are used);"
                " a spec has a few dozen"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ServiceError(422, f"{'.'.join(map(str, path))}: must be a finite number", [
                field_problem(["body", *path], "must be a finite number", value)
            ])  # fmt: skip
        if isinstance(value, dict):
            stack.extend(([*path, key if isinstance(key, int) else str(key)], item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend(([*path, index], item) for index, item in enumerate(value))


def _under_roots(value: str, roots: list[Path]) -> bool:
    path = Path(value).expanduser().resolve()
    return any(path == root or path.is_relative_to(root) for root in roots)


def required_problems(document: JsonObject) -> list[FieldProblem]:
    """A spec must name its workload: without one the engine's defaults would start a VGG-16 job."""
    workload = document.get("workload")
    if not isinstance(workload, dict):
        return [field_problem(["body", "workload"], f"required: {REQUIRED}", workload if workload else ABSENT)]
    if "kind" not in workload:
        return [field_problem(["body", "workload", "kind"], f"required: {REQUIRED}")]
    return []


def bound_problems(spec: Spec, settings: Settings) -> list[FieldProblem]:
    """The sizes this server runs at most (an operator raises them with the PIPEBD_* setting named)."""
    bounds = (
        (["train", "epochs"], spec.train.epochs, settings.max_epochs, "PIPEBD_MAX_EPOCHS"),
        (["data", "num_samples"], spec.data.num_samples, settings.max_num_samples, "PIPEBD_MAX_NUM_SAMPLES"),
    )
    return [
        field_problem(["body", *loc], f"at most {most} on this server ({setting}); ask for fewer", value)
        for loc, value, most, setting in bounds
        if value > most
    ]


def policy_problems(spec: Spec, settings: Settings, resolved: Sequence[Path] = ()) -> list[FieldProblem]:
    """What this server refuses to run: paths outside the data roots (but `resolved`: a registered model's files
    a reference was resolved to, app/services/models.py), factories outside the allowlist."""
    problems = []
    roots = settings.roots
    exact = {path.expanduser().resolve() for path in resolved}
    for loc, value in (
        (["data", "root"], spec.data.root),
        (["workload", "teacher_weights"], spec.workload.teacher_weights),
        (["workload", "teacher"], spec.workload.teacher if spec.workload.teacher_directory else None),
        (["data", "tokenizer"], spec.data.tokenizer),
    ):
        if value and not _under_roots(value, roots) and Path(value).expanduser().resolve() not in exact:
            where = ", ".join(str(root) for root in roots)
            message = f"{value!r} is outside the data roots of this server; use a path under {where}"
            if loc[-1] == "teacher" and HUB_ID.match(value) and not Path(value).exists():
                message = (
                    f"{value!r} is a Hugging Face hub id; models are not downloaded: give a local directory"
                    f" (config.json and safetensors, e.g. from `huggingface-cli download`) under {where}"
                )
            problems.append(field_problem(["body", *loc], message, value))
    allowed = settings.allowed_modules
    for loc, value in ((["workload", "factory"], spec.workload.factory), (["data", "factory"], spec.data.factory)):
        module = (value or "").partition(":")[0]
        if value and not any(module == entry or module.startswith(entry + ".") for entry in allowed):
            names = ", ".join(allowed) or "(none: PIPEBD_FACTORY_ALLOWLIST is empty)"
            message = (
                f"module {module!r} is not in this server's factory allowlist; allowed: {names}"
                " (an operator can extend PIPEBD_FACTORY_ALLOWLIST)"
            )
            problems.append(field_problem(["body", *loc], message, value))
    return problems


def validate_document(document: JsonObject, settings: Settings, allowed: Sequence[Path] = ()) -> Spec:
    """Gate 2: the engine's model, then the server's policy; raises a 422 ServiceError listing every problem.
    `allowed`: paths outside the data roots this spec may name (a registered model's, resolved)."""
    problems = required_problems(document)
    try:
        spec = Spec.model_validate(document, strict=True)  # as the schema says: no "1" for 1, no 0 for false
    except ValidationError as error:
        problems += pydantic_problems(error.errors(), prefix=["body"], explain=spec_message)
        raise ServiceError(422, summary(problems), problems) from None
    problems += bound_problems(spec, settings) + policy_problems(spec, settings, allowed)
    if problems:
        raise ServiceError(422, summary(problems), problems)
    return spec


def preflight_problems(text: str) -> list[FieldProblem]:
    """The engine's `field.path: reason` lines as field problems (a line without a field path is the spec's)."""
    items = []
    for line in text.splitlines():
        path, sep, reason = line.partition(": ")
        fielded = sep and " " not in path
        items.append(field_problem(["body", *path.split(".")] if fielded else ["body"], reason if fielded else line))
    return items


def spec_hash(spec: Spec) -> str:
    """Equal for equal specs however they were written (JSON or YAML, key order, defaults spelt out)."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
