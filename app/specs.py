"""Turning a request body into a spec the service agrees to run.

Three gates, each with an error that names the field and what would work:
1. the body parses (JSON, or YAML with a YAML content type) into a mapping;
2. the engine's own validation (`parse_spec`), then this server's policy: paths under the configured
   data roots, factories from allowlisted modules only (user code runs on the workers);
3. a preflight that the engine does before any launch: the data set exists, the workload builds and
   the plan resolves (without profiling, which is the worker's job).
Nothing is stored unless all three pass.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from app.core.settings import Settings
from pipebd_core.launch import preflight
from pipebd_core.plan import PlanError
from pipebd_core.spec import Spec, SpecError, parse_spec

JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


class BodyError(ValueError):
    """The request body is not a document at all (status 400), or of a type we do not read (415)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def parse_body(body: bytes, content_type: str) -> dict[str, Any]:
    """The spec document from a JSON or YAML body."""
    kind = content_type.split(";")[0].strip().lower() or "application/json"
    if kind not in JSON_TYPES + YAML_TYPES:
        accepted = ", ".join(JSON_TYPES + YAML_TYPES)
        raise BodyError(f"Content-Type {kind!r} is not accepted; send the spec as one of: {accepted}", 415)
    try:
        text = body.decode("utf-8")
        document = json.loads(text) if kind in JSON_TYPES else yaml.safe_load(text)
    except UnicodeDecodeError:
        raise BodyError("the body is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise BodyError(f"malformed JSON at line {error.lineno} column {error.colno}: {error.msg}") from None
    except yaml.YAMLError as error:
        raise BodyError(f"malformed YAML: {error}".replace("\n", " ")) from None
    if not isinstance(document, dict):
        raise BodyError(f"a spec must be a JSON/YAML object of sections, got {type(document).__name__}")
    return document


def _under_roots(value: str, roots: list[Path]) -> bool:
    path = Path(value).expanduser().resolve()
    return any(path == root or path.is_relative_to(root) for root in roots)


def policy_problems(spec: Spec, settings: Settings) -> list[str]:
    """What this server refuses to run: paths outside the data roots, factories outside the allowlist."""
    problems = []
    roots = settings.roots
    for field, value in (("data.root", spec.data.root), ("workload.teacher_weights", spec.workload.teacher_weights)):
        if value and not _under_roots(value, roots):
            where = ", ".join(str(root) for root in roots)
            problems.append(f"{field}: {value!r} is outside the data roots of this server; use a path under {where}")
    allowed = settings.allowed_modules
    for field, value in (("workload.factory", spec.workload.factory), ("data.factory", spec.data.factory)):
        module = (value or "").partition(":")[0]
        if value and not any(module == entry or module.startswith(entry + ".") for entry in allowed):
            names = ", ".join(allowed) or "(none: PIPEBD_FACTORY_ALLOWLIST is empty)"
            problems.append(
                f"{field}: module {module!r} is not in this server's factory allowlist; allowed: {names}"
                " (an operator can extend PIPEBD_FACTORY_ALLOWLIST)"
            )
    return problems


def validate_document(document: dict[str, Any], settings: Settings) -> Spec:
    """Spec, policy and preflight; raises SpecError whose lines are `field.path: reason`."""
    spec = parse_spec(document)
    problems = policy_problems(spec, settings)
    if problems:
        raise SpecError("\n".join(problems))
    try:
        preflight(spec)
    except PlanError as error:
        raise SpecError(f"schedule: {error}") from None
    return spec


def spec_hash(spec: Spec) -> str:
    """Equal for equal specs however they were written (JSON or YAML, key order, defaults spelt out)."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
