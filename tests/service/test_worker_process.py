"""Service tier: a worker's own process never builds a network or loads a data set. Every phase that does
(the launch's preflight, plan, plan_finetune, and the ranks' phases) runs in a child process, so the
long-lived worker imports neither torchvision nor transformers, however many jobs it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_worker_that_ran_a_vision_transformer_job_end_to_end_imported_neither_library(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.service.worker_modules", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["outcome"] == "succeeded"
    assert report["after_job"] == []
    # planning in this process, as before, is what the check exists to catch
    assert report["after_planning_here"] == ["torchvision", "transformers"]
