"""The environment of a job's processes (pipebd_core/job/processes.py): what they inherit of the
launcher's, and the allocator settings every rank runs with."""

from __future__ import annotations

import pytest

from pipebd_core.job.processes import rank_environment
from pipebd_core.spec import parse_spec
from tests.helpers import tiny_document

SPEC = parse_spec(tiny_document())


def test_ranks_keep_the_memory_they_free_unless_the_launcher_says_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    env = rank_environment(SPEC)
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(32 * 2**20) and env["MALLOC_TRIM_THRESHOLD_"] == str(4 * 2**30)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert rank_environment(SPEC)["MALLOC_TRIM_THRESHOLD_"] == "131072"


def test_service_secrets_stay_out_of_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEBD_DATABASE_URL", "postgresql://secret@db/pipebd")
    monkeypatch.setenv("PIPEBD_CACHE_DIR", "/tmp/cache")
    env = rank_environment(SPEC, {"EXTRA": "1"})
    assert "PIPEBD_DATABASE_URL" not in env and env["PIPEBD_CACHE_DIR"] == "/tmp/cache" and env["EXTRA"] == "1"
    assert env["OMP_NUM_THREADS"] == str(SPEC.schedule.threads_per_rank)
