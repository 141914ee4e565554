"""The bundled examples run through the `pipebd` CLI, and modes run at 4 ranks.

Every mode runs at 2 and 3 ranks in test_equivalence.py; here the three schedule shapes (blocks in
turn, blocks per rank, pipelined with replicated stages) run at 4 ranks to keep the suite short.

Tier: `pipebd run` as a subprocess with gloo ranks through torchrun.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.test_failures import ROOT, pipebd

HYBRID_4 = "schedule.stages=[{start: 0, stop: 1, replicas: 2}, {start: 1, stop: 4, replicas: 2}]"


def test_vgg16_example_runs_and_assembles_the_compressed_network(tmp_path: Path) -> None:
    run = tmp_path / "run"
    example = ROOT / "examples" / "vgg16-dsconv.yaml"
    overrides = ["--set", "train.max_steps=2", "--set", "schedule.profile=false"]
    result = pipebd("run", str(example), "--out", str(run), *overrides, timeout=300)
    assert result.returncode == 0, result.stderr
    students = torch.load(run / "student.pt", weights_only=True)
    assert {key.split(".")[1] for key in students} == {str(i) for i in range(13)}
    compressed = torch.load(run / "compressed_model.pt", weights_only=False)
    assert compressed(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert "samples/s" in result.stderr


@pytest.mark.parametrize("mode", ["dp", "ls", "hybrid"])
def test_modes_run_the_tiny_example_on_four_ranks(tmp_path: Path, mode: str) -> None:
    example = ROOT / "examples" / "tiny-custom.yaml"
    extra = ["--set", HYBRID_4] if mode == "hybrid" else []
    result = pipebd("run", str(example), "--out", str(tmp_path / "run"), "--nproc", "4", "--mode", mode, *extra)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "student.pt").exists()
