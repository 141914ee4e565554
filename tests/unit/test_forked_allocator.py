"""The allocator settings a phase process forked warm (pipebd_core/job/forked.py) sets by hand: those a fresh
interpreter's glibc reads from the environment (pipebd_core/job/processes.py RANK_ALLOCATOR)."""

from __future__ import annotations

from pipebd_core.job import forked
from pipebd_core.job.processes import RANK_ALLOCATOR


def test_the_ranks_allocator_settings_reach_mallopt_within_a_c_int() -> None:
    # mallopt takes a C int: the 4 GiB trim threshold passed as it is wrapped to 0 (trim at every free)
    assert sorted(forked.allocator_options(RANK_ALLOCATOR)) == [(-3, 32 * 2**20), (-1, 2**31 - 1)]
    assert forked.allocator_options({"MALLOC_MMAP_THRESHOLD_": "4096", "OTHER": "1"}) == [(-3, 4096)]
    assert forked.allocator_options({}) == []
