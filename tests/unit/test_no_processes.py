"""The pure-logic tier's guard (tests/unit/conftest.py) refuses every way of starting a process.

Tier: pure logic. Each case would start a process if the guard did not stop it, and the guard's error
names the way in.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from tests.unit.conftest import ProcessStarted


def test_a_subprocess_is_refused() -> None:
    with pytest.raises(ProcessStarted, match=r"subprocess\.Popen"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_a_fork_is_refused() -> None:
    with pytest.raises(ProcessStarted, match=r"os\.fork"):
        os.fork()


def test_a_spawn_is_refused() -> None:
    with pytest.raises(ProcessStarted, match=r"os\.posix_spawn"):
        os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], dict(os.environ))


def test_a_multiprocessing_process_is_refused() -> None:
    with pytest.raises(ProcessStarted, match=r"multiprocessing"):
        multiprocessing.get_context("spawn").Process(target=print).start()
