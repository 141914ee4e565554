"""The batch loader with worker processes gives the rows the in-process loader gives.

Tier: processes (DataLoader workers), so not in the pure-logic tier; the check itself is
tests/unit/test_data.py's, run here with `data.num_workers: 2`.
"""

from __future__ import annotations

from tests.unit.test_data import test_row_slices_concatenate_to_the_full_batch as rows_concatenate


def test_row_slices_concatenate_to_the_full_batch_with_two_loader_workers() -> None:
    rows_concatenate(workers=2)
