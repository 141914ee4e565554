"""`python -m tests.service.worker_modules DIR`: this process plays a worker. Its `JobRunner` (what the
Celery task runs) takes a tiny torchvision vision transformer, whose layer replacements the transformer
workload builds with transformers, through every phase of a job that is distilled and then trained end to
end; then it prints, as one JSON line, the job's outcome and the heavy packages this process imported, and
the same after running the `plan_finetune` step here, in this process, as PipeBD did before (the check's
own proof that it can fail).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from app.core.settings import Settings
from pipebd_core.job import launch
from pipebd_core.rundir import RunDir
from pipebd_core.spec import parse_spec
from tests.service.factories import queued_job, stored
from tests.transformer_specs import vit_document
from worker.launcher import JobRunner

HEAVY = ("torchvision", "transformers")
FINETUNE = {"strategy": "ddp", "epochs": 1, "max_steps": 2, "lr": 0.05, "profile": False}


def imported() -> list[str]:
    return [name for name in HEAVY if name in sys.modules]


def main(folder: Path) -> None:
    settings = Settings(  # type: ignore[call-arg]
        data_dir=folder / "data", database_url=f"sqlite:///{folder / 'db.sqlite'}", poll_s=0.1
    )
    document = vit_document(finetune=FINETUNE)
    job_id = queued_job(settings, document)
    outcome = JobRunner(job_id, settings, threading.Event()).run()
    after_job = imported()
    run_dir = RunDir(Path(stored(settings, job_id).run_dir or ""))
    launch.plan_step(run_dir, parse_spec(document), "plan_finetune")
    print(json.dumps({"outcome": outcome, "after_job": after_job, "after_planning_here": imported()}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
