"""The worker's Celery app, configured from the same settings as the API.

`pipebd worker` starts it with the threads pool: `worker_slots` jobs at once (one by default), each
in a thread that supervises its job's phases. Shutting down (Ctrl-C, SIGTERM) sets `shutting_down`,
which every JobRunner of this process is handed: it stops the running phase's processes and records
the job as `worker_lost`, so no job is left `running`.
"""

from __future__ import annotations

import threading
from typing import Any

from celery.signals import worker_shutting_down

from app.core.queue import make_celery
from app.core.settings import get_settings

celery_app = make_celery(get_settings())
celery_app.conf.update(include=["worker.tasks"], task_ignore_result=True)
shutting_down = threading.Event()


@worker_shutting_down.connect
def _stop_running_jobs(**_: Any) -> None:
    shutting_down.set()
