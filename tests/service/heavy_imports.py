"""Which of torch, torchvision and transformers a running process has imported, asked from outside it.

`python -m tests.service.heavy_imports FOLDER MODULE [ARG...]` runs `python -m MODULE ARG...` in this
process (the embedded service's worker: `app.cli worker ...`) beside a thread that answers `ask(FOLDER)`:
a file FOLDER/ask appearing is answered by FOLDER/imported.json, the heavy packages in this process's
`sys.modules` at that moment. `--plan-finetune RUN_DIR...` as MODULE instead runs finished jobs'
`plan_finetune` steps here, in this process, as PipeBD did before its planners ran in a child, prints
`planned` and answers until its standard input closes (`imported_planning_here`): the check's own proof
that it can fail.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.service.workers import REPO, wait_for

HEAVY = ("torch", "torchvision", "transformers")
ASK_TIMEOUT_S = 30


def imported() -> list[str]:
    """The heavy packages this process has imported."""
    return [name for name in HEAVY if name in sys.modules]


def answer_when_asked(folder: Path) -> None:
    """Forever (a daemon thread): answer each ask file with imported.json, written whole, then remove it."""
    ask_file, answer, partial = folder / "ask", folder / "imported.json", folder / "imported.json.partial"
    while True:
        if ask_file.exists():
            partial.write_text(json.dumps(imported()))
            partial.replace(answer)
            ask_file.unlink()
        time.sleep(0.1)


def ask(folder: Path) -> list[str]:
    """What the process answering in `folder` has imported now."""
    answer = folder / "imported.json"
    answer.unlink(missing_ok=True)
    (folder / "ask").touch()
    wait_for(answer.exists, ASK_TIMEOUT_S, f"an answer in {folder}")
    names: list[str] = json.loads(answer.read_text())
    return names


def plan_finetune_here(*runs: Path) -> None:
    """Each finished job's `plan_finetune` step in this process, then wait until standard input closes."""
    from pipebd_core.job import steps
    from pipebd_core.rundir import RunDir

    for run in runs:
        run_dir = RunDir(run)
        steps.plan_finetune(run_dir, run_dir.load_spec())
    print("planned", flush=True)
    sys.stdin.read()


def imported_planning_here(folder: Path, *runs: Path) -> list[str]:
    """What a process that ran the finished jobs' `plan_finetune` steps itself answers it imported."""
    command = [sys.executable, "-m", "tests.service.heavy_imports", str(folder), "--plan-finetune", *map(str, runs)]
    with subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None and process.stdin is not None
        if "planned\n" not in iter(process.stdout.readline, ""):  # read up to the line, or to the end
            raise AssertionError(f"planning failed with exit code {process.wait()}")
        names = ask(folder)
        process.stdin.close()
        assert process.wait(timeout=ASK_TIMEOUT_S) == 0
    return names


def main(folder: Path, module: str, *args: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    threading.Thread(target=answer_when_asked, args=(folder,), name="heavy-imports", daemon=True).start()
    if module == "--plan-finetune":
        plan_finetune_here(*map(Path, args))
        return
    sys.argv = [module, *args]  # argv[0] becomes the module's file, as `python -m` sets it
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
