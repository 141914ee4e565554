"""The worker's Celery app, configured from the same settings as the API.

`pipebd worker` starts it with the threads pool: `worker_slots` jobs at once (one by default), each
in a thread that supervises its torchrun process group. Shutting down (Ctrl-C, SIGTERM) stops the
running jobs' ranks and records them as `worker_lost`, so no job is left `running`.
"""

from __future__ import annotations

from typing import Any

from celery.signals import worker_shutting_down

from app.core.queue import make_celery
from app.core.settings import get_settings
from worker.launcher import SHUTDOWN

celery_app = make_celery(get_settings())
celery_app.conf.update(include=["worker.tasks"], task_ignore_result=True)


@worker_shutting_down.connect
def _stop_running_jobs(**_: Any) -> None:
    SHUTDOWN.set()
