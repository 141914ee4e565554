"""Service tier, end to end: `pipebd up` on a free port, a 2-rank CPU job submitted over HTTP and
followed through its event stream to `succeeded`, `student.pt` downloaded, then Ctrl-C stops it all."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import torch
import yaml

from app.cli.client import events
from app.cli.main import main
from tests.service.factories import tiny_job
from tests.service.services import free_port
from tests.service.workers import REPO, wait_for


def alive(processes: list[psutil.Process]) -> list[int]:
    """The pids of `processes` still running (zombies count as ended)."""
    running = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process.pid)
        except psutil.NoSuchProcess:
            pass
    return running


def pipebd_command() -> list[str]:
    script = Path(sys.executable).parent / "pipebd"
    return [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]


def test_pipebd_up_runs_a_job_submitted_over_http(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port, output = free_port(), tmp_path / "up.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIPEBD_")}
    env["PIPEBD_CACHE_DIR"] = str(tmp_path / "cache")
    with output.open("wb") as handle:
        up = subprocess.Popen(
            [*pipebd_command(), "up", "--port", str(port), "--data-dir", str(tmp_path / "data")],
            cwd=REPO,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "dashboard and API at" in output.read_text(), 120, "pipebd up", output.read_text)
        children = psutil.Process(up.pid).children(recursive=True)
        server = f"http://127.0.0.1:{port}"
        key = {"Idempotency-Key": "e2e"}
        submitted = httpx.post(f"{server}/api/v1/jobs", json=tiny_job(), headers=key, timeout=60)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        seen = list(events(server, None, job_id))
        states = [event.data["state"] for event in seen if event.name == "state"]
        assert states == ["queued", "starting", "running", "succeeded"], output.read_text()[-3000:]
        assert seen[-1].name == "end" and seen[-1].data["state"] == "succeeded"
        assert any(event.name == "metrics" for event in seen)
        student = httpx.get(f"{server}/api/v1/jobs/{job_id}/artifacts/student.pt", timeout=60)
        assert student.status_code == 200
        weights = torch.load(io.BytesIO(student.content), weights_only=True)
        assert any(key.startswith("blocks.0.") for key in weights)
        assert (tmp_path / "data" / "pipebd.db").exists() and (tmp_path / "data" / "broker.db").exists()
        # `pipebd submit` with the same key and spec gets the same (finished) job back and follows it
        spec_file = tmp_path / "tiny.yaml"
        spec_file.write_text(yaml.safe_dump(tiny_job()))
        assert main(["submit", str(spec_file), "--server", server, "--idempotency-key", "e2e", "--follow"]) == 0
        printed = capsys.readouterr().out
        assert f"pipebd: job {job_id} succeeded" in printed
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=180)
    assert code == 0, output.read_text()[-3000:]
    # each child ends after `pipebd up` does (its own session): wait for the last, as long as only a hang takes
    wait_for(lambda: not alive(children), 60, "pipebd up's children to end", lambda: str(alive(children)))
    assert "stopping the API and the worker" in output.read_text()
