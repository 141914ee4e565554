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
