"""The pure-logic tier starts no process: every test here runs with process creation refused.

`subprocess.Popen` (its `_execute_child`), `os.fork`, `os.posix_spawn`/`posix_spawnp` and
`multiprocessing`'s process start raise `ProcessStarted` for the whole test, so a test that would
start a process (a CLI subprocess, a torchrun launch, a spec-check helper) fails here, naming what it
tried to start, instead of making the inner loop slow. `tests/unit/test_no_processes.py` proves the
guard catches each way in.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


class ProcessStarted(AssertionError):
    """A pure-logic test tried to start a process."""


def refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise ProcessStarted(f"the pure-logic tier starts no process; this test called {what}{args[:2]!r}")

    return refused


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse("subprocess.Popen"))
    monkeypatch.setattr(os, "fork", refuse("os.fork"))
    monkeypatch.setattr(os, "posix_spawn", refuse("os.posix_spawn"))
    monkeypatch.setattr(os, "posix_spawnp", refuse("os.posix_spawnp"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse("multiprocessing start"))
    yield
