"""Checkpoints and `pipebd run --resume`: an interrupted run ends with the uninterrupted weights.

Tier: 2-rank gloo runs through torchrun.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebd_core.rundir import CheckpointFolder
from tests.helpers import assert_same_weights, load_students, pipebd, plain_loop, run_job, tiny_spec


@pytest.mark.parametrize("mode", ["tr_dpu", "dp"])
def test_resume_after_a_crash_matches_an_uninterrupted_run(tmp_path: Path, mode: str) -> None:
    spec = tiny_spec(schedule={"mode": mode, "nproc": 2})  # 2 epochs of 4 steps
    code, run_dir = run_job(spec, tmp_path / "run", env={"PIPEBD_INJECT_FAULT": "1:6"})
    assert code != 0
    crashed_block = 0 if mode == "dp" else 3  # dp crashes while training block 0; tr_dpu on rank 1's blocks
    assert run_dir.checkpoints.saved_steps(crashed_block) == [4]  # epoch 1's end was saved before the crash
    assert not run_dir.student.exists()

    result = pipebd("run", "--resume", str(run_dir.root))
    assert result.returncode == 0, result.stderr
    expected = (
        "block 0 at step 4/8, block 1 at step 0/8" if mode == "dp" else "block 0 at step 4/8, block 1 at step 4/8"
    )
    assert f"pipebd: resuming: {expected}" in result.stderr
    assert_same_weights(load_students(run_dir), plain_loop(spec))
    started = [json.loads(line) for line in run_dir.events.read_text().splitlines()]
    resumed_at = [e["start_steps"] for e in started if e["event"] == "rank_started"][-1]
    assert resumed_at[0] == 4  # dp resumes block 0 mid-way; tr_dpu resumes every block at step 4
    assert resumed_at == ([4, 0, 0, 0] if mode == "dp" else [4, 4, 4, 4])


def test_pipelined_modes_resume_every_block_from_one_common_step(tmp_path: Path) -> None:
    from pipebd_core.rank.checkpoint import save_block

    folder = CheckpointFolder(tmp_path)
    for block, steps in enumerate([[4, 8], [4, 8], [4]]):
        for step in steps:
            save_block(folder, block, step, {"student": {}})
    assert folder.resume_steps(3, common=True) == [4, 4, 4]
    assert folder.resume_steps(3, common=False) == [8, 8, 4]
    assert folder.resume_steps(4, common=True) == [0, 0, 0, 0]


def test_pruning_keeps_the_step_the_slowest_block_needs(tmp_path: Path) -> None:
    from pipebd_core.rank.checkpoint import save_block

    folder = CheckpointFolder(tmp_path)
    for step in range(1, 9):  # an upstream stage with checkpoint_every 1 runs ahead of block 1
        save_block(folder, 0, step, {"student": {}}, num_blocks=2)
    save_block(folder, 1, 2, {"student": {}}, num_blocks=2)
    assert folder.resume_steps(2, common=True) == [2, 2]
    save_block(folder, 0, 9, {"student": {}}, num_blocks=2)  # now prunes down to block 1's newest step
    assert folder.saved_steps(0) == [2, 3, 4, 5, 6, 7, 8, 9]
    save_block(folder, 1, 8, {"student": {}}, num_blocks=2)
    save_block(folder, 0, 10, {"student": {}}, num_blocks=2)
    assert folder.saved_steps(0) == [8, 9, 10] and folder.resume_steps(2, common=True) == [8, 8]


def test_every_epoch_is_checkpointed_whatever_the_interval() -> None:
    from pipebd_core.rank.checkpoint import should_checkpoint

    saved = [step for step in range(1, 13) if should_checkpoint(step, 4, 12, every=5)]
    assert saved == [4, 5, 8, 10, 12]


def test_finalize_names_the_blocks_without_a_final_checkpoint(tmp_path: Path) -> None:
    from pipebd_core.distill.finalize import check_final_checkpoints
    from pipebd_core.rank.checkpoint import save_block
    from pipebd_core.rundir import RunDir

    run_dir = RunDir(tmp_path)
    for block in (0, 1):
        save_block(run_dir.checkpoints, block, 8, {"student": {}})
    check_final_checkpoints(run_dir, 2, 8)
    with pytest.raises(RuntimeError, match=r"blocks \[2\] have no final checkpoint \(step 8\)"):
        check_final_checkpoints(run_dir, 3, 8)
