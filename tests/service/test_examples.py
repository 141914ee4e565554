"""Service tier: every bundled example is accepted by a server in its default configuration.

A server started as `make run` starts it (no PIPEBD_DATA_ROOTS) must take each spec in examples/ as
shipped: the language-model examples read the checkout's docs/, and the two examples that distil a
teacher trained by an earlier example name that teacher's `teacher.pt`; on a server, the teacher a job
of this server wrote is in its runs folder, which is always inside its roots, and the test names it
there as a user does with `--set workload.teacher_weights=...`. Each spec goes through the API's whole
check (the engine's preflight included) and is stored queued (202); none is run here. The ones a newcomer
submits first run to success elsewhere, on real services, each job once: examples/tiny-llama-teacher.yaml
then examples/tiny-llama-text.yaml distilling that teacher in tests/service/test_phases.py,
examples/tiny-vit-teacher.yaml then examples/tiny-vit-digits.yaml, and examples/tiny-llama-search.yaml in
tests/service/test_example_chains.py, and the README's examples/tiny-custom.yaml through the New job page
in tests/web/test_browser.py. Of examples/multinode/
only two-nodes.yaml is a spec (accepted: it waits for two hosts in the queue); kubernetes.yaml, node.sh
and slurm.sbatch are launchers of workers, not specs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from fastapi.testclient import TestClient

from app.main import create_app
from pipebd_core.rank.network import network_to_train
from pipebd_core.spec import parse_spec
from tests.service.conftest import make_settings

REPO = Path(__file__).resolve().parents[2]
SPECS = [*sorted((REPO / "examples").glob("*.yaml")), REPO / "examples" / "multinode" / "two-nodes.yaml"]
TEACHERS = {"digits-compress.yaml": "digits-teacher.yaml", "tiny-vit-digits.yaml": "tiny-vit-teacher.yaml"}


def post(client: TestClient, document: dict[str, object]) -> dict[str, object]:
    response = client.post("/api/v1/jobs", json=document)
    assert response.status_code == 202, (document["name"], response.json().get("detail"))
    answer: dict[str, object] = response.json()
    return answer


def test_every_bundled_example_is_accepted_by_a_default_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # as `make run` runs it: the examples' relative paths are the checkout's
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'pipebd.db'}", data_roots="")
    assert {path.name for path in SPECS} >= {"tiny-llama-teacher.yaml", "tiny-llama-text.yaml", *TEACHERS}
    documents = {path.name: yaml.safe_load(path.read_text()) for path in SPECS}
    with TestClient(create_app(settings)) as client:
        jobs = {name: post(client, document) for name, document in documents.items() if name not in TEACHERS}
        for name, teacher in TEACHERS.items():  # what the teacher's job writes at the end, in its run folder
            weights = settings.runs / f"job-{jobs[teacher]['id']}" / "teacher.pt"
            weights.parent.mkdir(parents=True)
            torch.save(network_to_train(parse_spec(documents[teacher])).state_dict(), weights)
            refused = client.post("/api/v1/jobs", json=documents[name])
            assert refused.status_code == 422 and "file not found" in refused.json()["detail"]  # not trained yet
            workload = {**documents[name]["workload"], "teacher_weights": str(weights)}
            jobs[name] = post(client, {**documents[name], "workload": workload})
    assert set(jobs) == {path.name for path in SPECS}
