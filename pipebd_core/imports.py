"""Resolve user-supplied `package.module:function` references (custom workloads and datasets)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pipebd_core.spec import SpecError


def resolve_factory(reference: str, field: str) -> Callable[..., Any]:
    """Import `package.module:function` and return the callable; SpecError names `field` on failure."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SpecError(f"{field}: cannot import module {module_name!r} ({error}); is it on PYTHONPATH?") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise SpecError(f"{field}: module {module_name!r} has no callable {attribute!r}")
    return function


def call_factory(reference: str, field: str, options: dict[str, Any]) -> Any:
    """Resolve and call the factory with `options`; a wrong option or a crash is a SpecError naming both fields."""
    factory = resolve_factory(reference, field)
    options_field = field.replace("factory", "options")
    try:
        return factory(**options)
    except TypeError as error:
        raise SpecError(
            f"{options_field}: {reference} does not accept {sorted(options)} ({error}); give the keyword"
            " arguments the factory takes"
        ) from None
    except Exception as error:
        raise SpecError(f"{field}: {reference}(**{options_field}) raised {type(error).__name__}: {error}") from error
