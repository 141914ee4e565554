"""Test-wide settings and shared runs.

Profiles are cached in a folder of this test session, never in ~/.cache. `finished_run` runs a spec
through torchrun once per session, so tests that only read a run's outputs share it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipebd_core.planning.profiles import CACHE_ENV
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from tests.helpers import run_job


@pytest.fixture(scope="session", autouse=True)
def isolated_profile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("profile-cache")
    saved = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)  # inherited by the CLI and torchrun processes the tests start
    yield folder
    if saved is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = saved


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Spec], RunDir]:
    """Run a spec once per session (keyed by its JSON) and return its run directory; the run must succeed."""
    runs: dict[str, RunDir] = {}

    def run(spec: Spec) -> RunDir:
        key = spec.model_dump_json()
        if key not in runs:
            code, run_dir = run_job(spec, tmp_path_factory.mktemp("shared-run") / "run")
            assert code == 0, run_dir.events.read_text()[-3000:]
            runs[key] = run_dir
        return runs[key]

    return run
