"""Chaos tier, beside the soak: its load meter (app/soak/load.py) counts as the soak's own the processes outside its
process tree that work in its folders (an orphaned rank, its daemonized PostgreSQL), with the CPU they used since it
started, and leaves its own descendants to the load meter (they are counted once reaped) and strangers to "other"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.soak.load import OwnOutsideTree

BUSY = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(60)"
DEADLINE_S = 30  # only a hang takes this long


def orphan(cwd: Path) -> int:
    """A process that burns 0.3 CPU s then sleeps, in `cwd`, whose parent has already exited (reparented)."""
    shell = f"{sys.executable} -c '{BUSY}' >/dev/null 2>&1 & echo $!"
    done = subprocess.run(["sh", "-c", shell], cwd=cwd, capture_output=True, text=True, check=True, timeout=30)
    return int(done.stdout)


def test_an_orphan_in_the_soaks_folder_is_its_own_and_its_child_and_a_stranger_are_not(tmp_path: Path) -> None:
    soak, elsewhere = tmp_path / "soak", tmp_path / "elsewhere"
    soak.mkdir(), elsewhere.mkdir()
    meter = OwnOutsideTree([soak], soak / "data")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=soak)
    mine, stranger = orphan(soak), orphan(elsewhere)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while meter.used.get(mine, 0.0) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.1)
        seconds = meter.seconds()
        assert mine in meter.used and child.pid not in meter.used and stranger not in meter.used
        assert 0.25 <= seconds < 5.0  # the orphan's busy 0.3 s, seen after it burnt them
    finally:
        meter.stopped.set()
        for pid in (mine, stranger):
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()
