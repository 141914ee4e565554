"""Service tier: tracking export. A job a worker runs (the launcher in this process, real torchrun ranks)
with PIPEBD_MLFLOW_URI set becomes an MLflow run on a real local `mlflow server` (SQLite backend, a
loopback port), read back through MLflow's own client: the spec as params, each step's loss, the summary,
the phases, the documents, its final status; the same run directory holds TensorBoard event files that
TensorBoard's reader reads. A tracking server that does not answer holds up no job for longer than its
bound and fails nothing; a resumed job finds its run again, and a sweep-style parent run is shared by
its children."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from sqlmodel import Session, select
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from app.core.database import get_engine
from app.core.tables import RegisteredModel
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.job.launch import prepare_run
from pipebd_core.rundir import RunDir
from pipebd_core.spec import parse_spec
from tests.service.conftest import make_settings
from tests.service.factories import queued_job, stored, tiny_job
from tests.service.services import free_port
from worker.launcher import JobRunner
from worker.tracking import MlflowExport

SERVER_START_S = 180  # a cold `mlflow server` imports a lot and migrates its SQLite database


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `mlflow server` on a free loopback port, SQLite backend and artifacts in a temporary folder."""
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination",
        str(folder / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with open(folder / "server.log", "wb") as output:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner processes beside it
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not answers(uri):
            assert server.poll() is None, (folder / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"mlflow server did not answer within {SERVER_START_S} s"
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its uvicorn worker
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_a_job_a_worker_runs_is_an_mlflow_run_and_has_tensorboard_files(tmp_path: Path, mlflow_uri: str) -> None:
    settings = make_settings(
        tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", mlflow_uri=mlflow_uri, public_url="https://pipebd.test"
    )
    document = tiny_job("tracked", train={"epochs": 2, "lr": 0.03})
    job_id = queued_job(settings, document)
    assert JobRunner(job_id, settings, threading.Event()).run() == "succeeded"
    job = stored(settings, job_id)
    assert job.run_dir is not None
    run_dir = RunDir(Path(job.run_dir))

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name("pipebd")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id], f"tags.`pipebd.job_id` = '{job_id}'")
    assert run.info.status == "FINISHED" and run.info.run_name == f"tracked-{job_id}"
    params = run.data.params
    assert params["train.lr"] == "0.03" and params["schedule.mode"] == "tr_dpu" and params["schedule.nproc"] == "2"
    assert params["workload.factory"] == document["workload"]["factory"] and params["name"] == "tracked"
    tags = run.data.tags
    assert tags["pipebd.state"] == "succeeded" and tags["pipebd.phase.distill"] == "succeeded"
    assert tags["pipebd.run_dir"] == job.run_dir
    assert f"https://pipebd.test/api/v1/jobs/{job_id}/artifacts/student.pt" in tags["mlflow.note.content"]

    # each step's loss of block 0 as its rank wrote it (one rank trains block 0 in this plan)
    written = [line for line in run_dir.read_telemetry(0, DISTILL) if isinstance(line, DistillLine)]
    expected = {line.step: line.loss[0] for line in written if 0 in line.loss}
    history = client.get_metric_history(run.info.run_id, "distill/loss/block_0")
    assert {metric.step: metric.value for metric in history} == pytest.approx(expected)
    assert len(history) == len(expected) == run_dir.load_plan().total_steps  # each step once
    summary = run_dir.load_summary()
    assert summary.final_loss is not None
    assert run.data.metrics["summary/final_loss/0"] == pytest.approx(summary.final_loss[0])
    assert run.data.metrics["phase/distill/duration_s"] > 0 and run.data.metrics["distill/samples_per_s"] > 0
    documents = {item.path for item in client.list_artifacts(run.info.run_id, "pipebd")}
    assert {"pipebd/summary.json", "pipebd/spec.json", "pipebd/plan.json"} <= documents

    # the job's registered model is a version in MLflow's Model Registry, linked to the run
    with Session(get_engine(settings.database)) as session:
        [model] = session.exec(select(RegisteredModel).where(RegisteredModel.job_id == job_id)).all()
    assert model.kind == "distilled" and model.mlflow_version == "tracked-distilled/1"
    [version] = client.search_model_versions("name = 'tracked-distilled'")
    assert version.run_id == run.info.run_id and version.tags["pipebd.model_id"] == str(model.id)
    assert version.tags["pipebd.content_hash"] == model.content_hash

    events = EventAccumulator(str(run_dir.tensorboard(DISTILL)))
    events.Reload()
    loss = events.Scalars("distill/loss/block_0")
    assert {event.step: event.value for event in loss} == pytest.approx(expected)
    assert {"distill/samples_per_s", "distill/memory_mib/rank_0", "distill/peak_mib/rank_1"} <= set(
        events.Tags()["scalars"]
    )


def test_a_choice_made_again_is_a_version_linked_to_its_search_jobs_run(tmp_path: Path, mlflow_uri: str) -> None:
    """The search's run directory and row as the engine and the worker leave them (no ranks), its run as the
    worker opened it; the choice's registered model becomes a version of `<job name>-chosen` linked to that run,
    once; with a tracking server that does not answer, the choice stands without a version."""
    from app.core.database import migrate
    from app.core.model_versions import JOB_TAG, RUN_DIR_TAG, register_choice
    from app.core.registry import register_job
    from tests.service.test_models import choose_written, search_from, text_folder
    from tests.transformer_specs import transformer_document

    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", mlflow_uri=mlflow_uri)
    migrate(settings.database)
    document = transformer_document(text_folder(settings), workload={"replacements": ["keep", "noop"]})
    document["name"] = "chooser"
    job, run_dir = search_from(settings, document)
    choose_written(run_dir, 1)
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        chosen = {model.kind: model for model in register_job(session, job)}["chosen"]
    client = MlflowClient(tracking_uri=mlflow_uri)
    found = client.get_experiment_by_name("pipebd")
    experiment = found.experiment_id if found is not None else client.create_experiment("pipebd")
    run = client.create_run(experiment, tags={JOB_TAG: str(job.id), RUN_DIR_TAG: str(run_dir.root)})
    assert chosen.id is not None
    for _ in range(2):  # a model that has its version is not sent again
        register_choice(settings, job, [chosen.id])
    with Session(get_engine(settings.database)) as session:
        stored_model = session.get(RegisteredModel, chosen.id)
    assert stored_model is not None and stored_model.mlflow_version == "chooser-chosen/1"
    [version] = client.search_model_versions("name = 'chooser-chosen'")
    assert version.run_id == run.info.run_id and version.tags["pipebd.model_id"] == str(chosen.id)
    assert version.tags["pipebd.kind"] == "chosen" and version.tags["pipebd.content_hash"] == chosen.content_hash

    down = make_settings(tmp_path, settings.database_url, mlflow_uri=f"http://127.0.0.1:{free_port()}")
    choose_written(run_dir, 2)
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        second = {model.name: model for model in register_job(session, job)}["choice-2"]
    assert second.id is not None
    register_choice(down, job, [second.id])  # logged, never raised
    with Session(get_engine(settings.database)) as session:
        assert session.get(RegisteredModel, second.id).mlflow_version is None  # type: ignore[union-attr]


def test_a_tracking_server_that_does_not_answer_costs_a_job_its_bound_and_fails_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = make_settings(tmp_path, "sqlite://", mlflow_uri=down, mlflow_retries=2, mlflow_wait_s=30)
    run_dir = prepare_run(parse_spec(tiny_job("unexported")), tmp_path / "run")
    export = MlflowExport(settings, 1, run_dir)
    with pytest.raises(Exception, match=r"Connection refused|Max retries|ConnectionError"):
        export.sync()  # what its thread meets, every try
    started = time.monotonic()
    export.start()
    with caplog.at_level(logging.WARNING, logger="pipebd.worker"):
        export.close("succeeded")  # a first try and 2 retries, 1 s then 2 s apart
    waited = time.monotonic() - started
    assert not export.thread.is_alive() and 3.0 <= waited < 30, waited
    assert any("given up" in record.getMessage() for record in caplog.records), caplog.text


def test_the_children_of_one_parent_share_its_mlflow_run(tmp_path: Path, mlflow_uri: str) -> None:
    settings = make_settings(tmp_path, "sqlite://", mlflow_uri=mlflow_uri, mlflow_experiment="sweeps")
    parent = {"pipebd.sweep_id": "7"}
    children = []
    for job_id in (101, 102):
        run_dir = prepare_run(parse_spec(tiny_job(f"child-{job_id}")), tmp_path / f"run-{job_id}")
        first = MlflowExport(settings, job_id, run_dir, parent=parent)
        first.sync()
        again = MlflowExport(settings, job_id, run_dir, parent=parent)  # the job resumed, by another worker
        again.sync()
        assert again.run_id == first.run_id  # found by its tags: one run per job
        children.append(first.run_id)
    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name("sweeps")
    assert experiment is not None
    [parent_run] = client.search_runs([experiment.experiment_id], "tags.`pipebd.sweep_id` = '7'")
    runs = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run.info.run_id}'")
    assert sorted(run.info.run_id for run in runs) == sorted(children) and None not in children
    assert {run.info.status for run in runs} == {"RUNNING"}
