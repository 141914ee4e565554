"""The chaos tier: jobs interrupted by real faults (a worker or a rank killed with SIGKILL, a pause, a
worker shutting down) and resumed from their checkpoints, each compared with one uninterrupted run of
the same spec. Every test here is marked `chaos` (`pytest -m chaos` runs only them)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/chaos/" in str(item.path):
            item.add_marker(pytest.mark.chaos)
