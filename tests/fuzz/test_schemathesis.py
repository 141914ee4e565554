"""Fuzz tier: schemathesis against a real `pipebd api`, with both token scopes.

The run (tests/fuzz/schemathesis.toml: a fixed seed, bounded examples per operation, every phase)
fails on any 5xx, any status, content type, header or body its operation's schema does not document, and
any schema-violating request the server accepts. The server runs without a worker, so submitted jobs stay
queued, with a short spec-check bound so that the large workloads the generator asks for are refused
quickly rather than built. The stateful phase runs its scenarios but follows none of the schema's 15 links
(0 covered in every run read, also with the queue emptied first): its generated submissions create no job
to follow them from. What those links promise (a created job read, followed, cancelled, paused, resumed,
deleted, and gone after) is checked by the service tests (tests/service/test_api.py, test_resume_api.py).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.conftest import make_settings
from tests.service.live import pipebd_api

CONFIG = Path(__file__).with_name("schemathesis.toml")
SUBMIT = "submit-token-0123456789abcdef"
READ = "reader-token-0123456789abcdef"
RUN_TIMEOUT_S = 420
SERVER = {  # a server that refuses quickly what would be slow, and does not rate-limit the fuzzer
    "PIPEBD_API_TOKENS": f"{SUBMIT}=submit,{READ}=read",
    "PIPEBD_SUBMISSIONS_PER_MINUTE": "100000",
    "PIPEBD_MAX_QUEUED_JOBS": "4",
    "PIPEBD_SPEC_CHECK_TIMEOUT_S": "3",
    "PIPEBD_SPEC_CHECKERS": "1",
}


def schemathesis(url: str, token: str, folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    executable = Path(sys.executable).with_name("schemathesis")
    if not executable.exists():
        pytest.skip("schemathesis is not installed (it is a dev dependency: pip install -e '.[dev]')")
    command = [str(executable), "--config-file", str(CONFIG), "--no-color", "run", f"{url}/openapi.json"]
    command += ["-H", f"Authorization: Bearer {token}", *options]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)


def generated(output: str) -> int:
    found = re.search(r"(\d+) generated", output)
    assert found, output[-3000:]
    return int(found.group(1))


# Two runs of up to RUN_TIMEOUT_S each: 66 s alone on a slow AVX2 machine, 234 s beside the ViT chain in a full
# suite there, close to the suite's 300 s hang guard
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_schemathesis_finds_nothing(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}")
    with pipebd_api(settings, **SERVER) as server:
        submit = schemathesis(server.url, SUBMIT, tmp_path)
        # The read scope answers what the submit scope does on reads (the run above covered them) and 401/403
        # on writes: generated examples reach every operation; the coverage phase's boundary cases
        # (about 2,000, 84 s) would only repeat the submit run's on reads and meet a 403 on writes.
        read = schemathesis(server.url, READ, tmp_path, "--phases", "fuzzing", "--max-examples", "2")
    shutil.rmtree(tmp_path / "schemathesis-report", ignore_errors=True)
    assert submit.returncode == 0, submit.stdout[-12000:]
    assert read.returncode == 0, read.stdout[-12000:]
    assert re.search(r"Stateful \(in [\d.]+s\)\s+Scenarios:\s+[1-9]", submit.stdout), submit.stdout[-3000:]
    assert generated(submit.stdout) >= 100 and generated(read.stdout) >= 15  # at least one per operation
    print(submit.stdout[-1500:], read.stdout[-600:])  # the counts, for whoever runs this with -s
