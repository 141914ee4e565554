"""Test-wide settings: profiles are cached in a folder of this test session, never in ~/.cache."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipebd_core.profiles import CACHE_ENV


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
