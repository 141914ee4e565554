"""A finished job's outputs as a client gets them: every documented output of its run directory is listed by
the artifacts API and downloads byte for byte, from the in-process app (TestClient) or a live server (httpx)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

from pipebd_core.rundir import OUTPUTS


def assert_outputs_download(client: httpx.Client, run: Path, job_id: int, expected: set[str]) -> None:
    """Every documented output in `run` (the job's run directory) is listed, and downloads byte for byte;
    `expected` names the outputs this job must have written."""
    present = {output.name for output in OUTPUTS if (run / output.name).is_file()}
    assert expected <= present, expected - present
    listed = {item["name"]: item for item in client.get(f"/api/v1/jobs/{job_id}/artifacts").json()["data"]}
    assert present <= set(listed), present - set(listed)
    for name in present:
        assert listed[name]["size"] == (run / name).stat().st_size, name
        digest = hashlib.sha256()
        with client.stream("GET", listed[name]["url"]) as response:
            assert response.status_code == 200, name
            for chunk in response.iter_bytes():
                digest.update(chunk)
        assert digest.hexdigest() == hashlib.sha256((run / name).read_bytes()).hexdigest(), name
