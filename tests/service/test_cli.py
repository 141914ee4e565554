"""Service tier: the commands that talk to a server (`pipebd jobs`, `show`, `cancel`, `logs`, `download`,
`webhooks`),
called in-process against the real API served by uvicorn on a loopback port, with jobs and run
directories stored by the factories; human output, --json, pages, refusals as one line."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from app.cli.main import main
from app.core.database import get_engine
from app.core.settings import Settings
from app.core.tables import Job
from app.main import create_app
from pipebd_core.job.phases import new_records
from pipebd_core.rundir import RunDir
from tests.service.conftest import make_settings
from tests.service.factories import insert_job, stored
from tests.service.live import serve
from tests.service.services import free_port

TOKEN = "cli-test-token-0123456789abcdef"


@dataclass
class Server:
    url: str
    settings: Settings
    capsys: pytest.CaptureFixture[str]

    def run(self, *argv: str) -> tuple[int, str, str]:
        """`pipebd ARGV --server URL`: exit code, stdout, stderr."""
        self.capsys.readouterr()
        code = main([*argv, "--server", self.url])
        out, err = self.capsys.readouterr()
        return code, out, err

    def job(self, state: str = "queued", **fields: Any) -> int:
        job_id = insert_job(self.settings, state, **fields).id
        assert job_id is not None
        return job_id

    def run_dir(self, job_id: int, phases: list[str], phase: str, **fields: Any) -> RunDir:
        """Give the job a run directory, its `phases` (records as a worker writes them), `phase` running."""
        run_dir = RunDir(self.settings.runs / f"job-{job_id}")
        run_dir.root.mkdir(parents=True)
        update(self.settings, job_id, run_dir=str(run_dir.root), phases=phase_records(run_dir, phases), phase=phase)
        update(self.settings, job_id, **fields)
        return run_dir


def phase_records(run_dir: RunDir, phases: list[str]) -> list[dict[str, object]]:
    return [record.to_json() for record in new_records(run_dir, phases)]


def update(settings: Settings, job_id: int, **fields: Any) -> None:
    with Session(get_engine(settings.database)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        for name, value in fields.items():
            setattr(job, name, value)
        session.add(job)
        session.commit()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(text)


@pytest.fixture
def server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Server]:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'pipebd.db'}")
    with serve(create_app(settings)) as url:
        yield Server(url, settings, capsys)


def ids_of(table: str) -> list[int]:
    """The ID column of a printed table."""
    return [int(line.split()[0]) for line in table.splitlines()[1:]]


def test_jobs_lists_pages_and_filters(server: Server) -> None:
    made = [server.job(state) for state in ("queued", "succeeded", "failed", "succeeded", "queued")]
    code, out, err = server.run("jobs", "--limit", "2")
    assert code == 0 and out.splitlines()[0].split()[:4] == ["ID", "NAME", "STATE", "PHASE"]
    assert ids_of(out) == made[:2:-1]
    cursor = err.split("--cursor ")[1].split()[0]
    assert ids_of(server.run("jobs", "--limit", "2", "--cursor", cursor)[1]) == made[2:0:-1]
    assert ids_of(server.run("jobs", "--limit", "2", "--all")[1]) == made[::-1]
    code, out, _ = server.run("jobs", "--state", "succeeded", "--json")
    page = json.loads(out)
    assert code == 0 and [job["id"] for job in page["data"]] == [made[3], made[1]] and page["next_cursor"] is None
    assert {job["state"] for job in page["data"]} == {"succeeded"}
    code, _, err = server.run("jobs", "--state", "lost")
    assert code == 2 and err.count("\n") == 1 and "HTTP 422: state: Input should be 'queued'" in err


def test_show_and_cancel(server: Server) -> None:
    job_id = server.job("queued", priority=3)
    code, out, _ = server.run("show", str(job_id))
    lines = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
    assert code == 0 and lines["job"] == f"{job_id} tiny" and lines["state"] == "queued"
    assert lines["priority"] == "3" and lines["queue"].startswith("0 ahead; no worker is connected")
    code, out, _ = server.run("show", str(job_id), "--json")
    assert json.loads(out) == httpx.get(f"{server.url}/api/v1/jobs/{job_id}").json()
    code, out, _ = server.run("cancel", str(job_id), "--json")
    assert code == 0 and json.loads(out)["state"] == "cancelled" == stored(server.settings, job_id).state
    code, out, _ = server.run("cancel", str(job_id))
    assert code == 0 and out == f"pipebd: job {job_id} cancelled: {server.url}/api/v1/jobs/{job_id}\n"


def test_refusals_are_one_line(server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["show", "999"], ["cancel", "999"], ["logs", "999"], ["download", "999"]):
        code, out, err = server.run(*command)
        assert (code, out) == (2, "")
        assert (
            err == f"pipebd: error: {command[0]} job 999: HTTP 404: job 999 does not exist (it may have been deleted)\n"
        )
    nobody = Server(f"http://127.0.0.1:{free_port()}", server.settings, capsys)
    code, _, err = nobody.run("jobs")
    assert code == 2 and err.count("\n") == 1 and f"cannot reach the server at {nobody.url} (ConnectError" in err
    guarded = make_settings(tmp_path / "guarded", server.settings.database, api_tokens=f"{TOKEN}=read")
    with serve(create_app(guarded)) as url:
        code, _, err = Server(url, guarded, capsys).run("jobs")
        assert code == 2 and err.count("\n") == 1
        assert "pipebd: error: jobs: HTTP 401: " in err and "(give a token with --token or PIPEBD_TOKEN)" in err
        code, out, _ = Server(url, guarded, capsys).run("jobs", "--token", TOKEN)
        assert code == 0 and out == "no jobs\n"


def test_logs_read_a_phase_or_a_rank_in_chunks(server: Server) -> None:
    job_id = server.job("running", nproc=2)
    run_dir = server.run_dir(job_id, ["plan", "distill", "finalize"], "distill")
    big = "".join(f"launcher line {i:07d}\n" for i in range(80_000))  # 1.7 MB: two of the API's chunks
    write(run_dir.launcher_log("distill"), big)
    write(run_dir.log(1, "distill"), "rank 1 says hello\n")
    assert server.run("logs", str(job_id)) == (0, big, "")
    assert server.run("logs", str(job_id), "--rank", "1", "--phase", "distill")[1] == "rank 1 says hello\n"
    code, out, _ = server.run("logs", str(job_id), "--rank", "1", "--json")
    (chunk,) = [json.loads(line) for line in out.splitlines()]
    assert chunk["file"] == "logs/distill/rank-1.log" and chunk["text"] == "rank 1 says hello\n"
    assert server.run("logs", str(job_id), "--phase", "finalize")[:2] == (0, "")  # no log yet
    code, _, err = server.run("logs", str(job_id), "--rank", "2")
    assert code == 2 and "HTTP 422: rank: job" in err and "has ranks 0..1" in err


def test_logs_follow_each_phase_until_the_job_ends(server: Server) -> None:
    job_id = server.job("running")
    run_dir = server.run_dir(job_id, ["plan", "distill", "finalize"], "distill")
    write(run_dir.launcher_log("distill"), "distill 0\n")

    def job_runs() -> None:
        for step in range(1, 4):
            time.sleep(0.3)
            write(run_dir.launcher_log("distill"), f"distill {step}\n")
        write(run_dir.launcher_log("finalize"), "finalize 0\n")
        update(server.settings, job_id, phase="finalize")
        time.sleep(0.3)
        write(run_dir.launcher_log("finalize"), "finalize 1\n")  # written as the job ends: still printed
        update(server.settings, job_id, state="succeeded")

    writer = threading.Thread(target=job_runs)
    started = time.monotonic()
    writer.start()
    try:
        code, out, err = server.run("logs", str(job_id), "--follow")
    finally:
        writer.join()
    assert code == 0 and time.monotonic() - started < 30
    assert out == "".join(f"distill {step}\n" for step in range(4)) + "finalize 0\nfinalize 1\n"
    assert err == f"pipebd: -- logs/finalize/launcher.log --\npipebd: job {job_id} succeeded\n"
    assert server.run("logs", str(job_id), "--follow") == (0, out, err)  # a finished job: every phase too


def test_download_one_artifact_or_all(server: Server, tmp_path: Path) -> None:
    job_id = server.job("succeeded")
    run_dir = server.run_dir(job_id, ["plan", "distill", "finalize"], "finalize")
    files = {"student.pt": b"\x00weights" * 1000, "summary.json": b'{"loss": 0.5}', "plan.json": b"{}"}
    for name, data in files.items():
        run_dir.output(name).write_bytes(data)
    target = tmp_path / "summary-copy.json"
    code, out, _ = server.run("download", str(job_id), "summary.json", "-o", str(target))
    assert code == 0 and target.read_bytes() == files["summary.json"]
    assert out.splitlines()[1].split() == ["summary.json", "13", str(target)]
    folder = tmp_path / "all"
    code, out, _ = server.run("download", str(job_id), "-o", str(folder), "--json")
    assert code == 0 and {entry["name"]: entry["size"] for entry in json.loads(out)} == {
        name: len(data) for name, data in files.items()
    }
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == files
    code, _, err = server.run("download", str(job_id), "teacher.pt", "-o", str(tmp_path / "teacher.pt"))
    assert code == 2 and "HTTP 404: job" in err and "has no teacher.pt (yet)" in err
    assert not list(tmp_path.glob("teacher.pt*"))  # nothing half-written


def test_webhooks_create_list_deliveries_and_delete(server: Server) -> None:
    code, out, _ = server.run(
        "webhooks", "create", "http://127.0.0.1:9/hook", "--event", "job.cancelled", "--secret", "s" * 20, "--json"
    )
    hook = json.loads(out)
    assert code == 0 and hook["events"] == ["job.cancelled"] and "secret" not in hook
    job_id = server.job("queued")
    assert server.run("cancel", str(job_id))[0] == 0  # one delivery, to a receiver that is not there
    code, out, _ = server.run("webhooks", "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["ID", "URL", "EVENTS", "SCOPE", "PENDING", "SUCCEEDED", "FAILED"]
    assert lines[1].split()[:4] == [str(hook["id"]), "http://127.0.0.1:9/hook", "job.cancelled", "server"]
    code, out, _ = server.run("webhooks", "deliveries", str(hook["id"]), "--json")
    page = json.loads(out)
    assert code == 0 and [(d["event"], d["job_id"]) for d in page["data"]] == [("job.cancelled", job_id)]
    code, out, _ = server.run("webhooks", "deliveries", str(hook["id"]))
    delivery = str(page["data"][0]["id"])
    assert code == 0 and out.splitlines()[1].split()[:3] == [delivery, "job.cancelled", str(job_id)]
    code, _, err = server.run("webhooks", "create", "ftp://x", "--event", "job.cancelled", "--secret", "s" * 20)
    assert code == 2 and err.count("\n") == 1 and "HTTP 422" in err
    assert server.run("webhooks", "delete", str(hook["id"]))[0] == 0
    code, _, err = server.run("webhooks", "deliveries", str(hook["id"]))
    assert code == 2 and err.count("\n") == 1 and "HTTP 404" in err


def folder_files(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def test_a_model_folder_downloads_as_one_archive_tar_or_zip_and_unpacks(server: Server, tmp_path: Path) -> None:
    import hashlib
    import io
    import tarfile
    import zipfile

    job_id = server.job("succeeded")
    run_dir = server.run_dir(job_id, ["plan_finetune", "finetune", "evaluate"], "evaluate")
    model = run_dir.teacher_model
    (model / "sub").mkdir(parents=True)
    files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": bytes(range(256)) * 4099, "sub/x": b""}
    for name, data in files.items():
        (model / name).write_bytes(data)
    run_dir.output("summary.json").write_bytes(b"{}")
    listed = {item["name"]: item for item in httpx.get(f"{server.url}/api/v1/jobs/{job_id}/artifacts").json()["data"]}
    entry = listed["teacher_model.tar"]
    assert entry["media_type"] == "application/x-tar" and entry["url"].endswith("/artifacts/teacher_model.tar")
    response = httpx.get(f"{server.url}{entry['url']}")
    assert response.status_code == 200 and int(response.headers["content-length"]) == entry["size"]
    assert len(response.content) == entry["size"] and response.headers["content-type"] == "application/x-tar"
    line = httpx.get(f"{server.url}{entry['sha256_url']}").text
    assert line == f"{hashlib.sha256(response.content).hexdigest()}  job-{job_id}-teacher_model.tar\n"
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:  # byte for byte, every file and no other
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert got == {f"teacher_model/{name}": data for name, data in files.items()}
    zipped = listed["teacher_model.zip"]  # the same folder as a zip: streamed, its size and sha256 exact
    response = httpx.get(f"{server.url}{zipped['url']}")
    assert response.status_code == 200 and response.headers["content-type"] == zipped["media_type"] == "application/zip"
    assert int(response.headers["content-length"]) == len(response.content) == zipped["size"]
    line = httpx.get(f"{server.url}{zipped['sha256_url']}").text
    assert line == f"{hashlib.sha256(response.content).hexdigest()}  job-{job_id}-teacher_model.zip\n"
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        assert archive.testzip() is None  # every CRC-32 checks
        got = {info.filename: archive.read(info) for info in archive.infolist() if not info.is_dir()}
    assert got == {f"teacher_model/{name}": data for name, data in files.items()}
    code, _, err = server.run("download", str(job_id), "teacher_model.zip", "-o", str(tmp_path / "one.zip"))
    assert code == 0 and (tmp_path / "one.zip").read_bytes() == response.content, err
    folder = tmp_path / "all"
    code, out, _ = server.run("download", str(job_id), "-o", str(folder), "--json")
    assert code == 0, out
    written = {entry["name"]: entry for entry in json.loads(out)}
    assert written["teacher_model.tar"]["path"] == f"{folder / 'teacher_model'}/"
    assert folder_files(folder / "teacher_model") == folder_files(model) == files
    assert sorted(path.name for path in folder.iterdir()) == ["summary.json", "teacher_model"]  # no archive left
    missing = httpx.get(f"{server.url}/api/v1/jobs/{server.job('queued')}/artifacts/teacher_model.tar")
    assert missing.status_code == 404 and "has no teacher_model.tar (yet)" in missing.json()["detail"]


def test_sweep_follow_prints_each_child_until_the_sweep_ends(server: Server, tmp_path: Path) -> None:
    import yaml
    from sqlmodel import select

    from tests.service.factories import tiny_job

    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(tiny_job("cli")))

    def children_run() -> None:
        ids: list[int | None] = []
        deadline = time.monotonic() + 120
        while len(ids) < 2 and time.monotonic() < deadline:  # the sweep's children are stored once checked
            time.sleep(0.3)
            with Session(get_engine(server.settings.database)) as session:
                ids = [job.id for job in session.exec(select(Job)).all()]
        time.sleep(0.6)
        for job_id, state in zip(ids, ["running", "succeeded", "succeeded"], strict=False):
            update(server.settings, job_id, state="running")
            time.sleep(0.6)
            update(server.settings, job_id, state=state)
        update(server.settings, ids[0], state="succeeded")

    writer = threading.Thread(target=children_run)
    writer.start()
    try:
        code, out, _ = server.run("sweep", str(spec), "--grid", "train.lr=0.01,0.05", "--follow")
    finally:
        writer.join()
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("pipebd: sweep 1 queued") and "pipebd: sweep 1 succeeded" in out
    assert "  job 1 running" in lines and "  job 2 succeeded" in lines and lines.index("  job 1 running") > 2


def test_the_progress_line_shows_no_loss_before_the_first_step() -> None:
    from app.cli.client import Event, Follower

    follower = Follower(7)
    follower.add(Event("state", {"state": "running"}))
    assert "nan" not in follower.line() and "loss - " in follower.line()
