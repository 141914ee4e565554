"""TensorBoard event files of a run: every training phase's series (scalars.py), readable by
`tensorboard --logdir` pointed at a run directory or at a folder of them.

The supervisor writes them when a training phase ends, whatever its outcome (pipebd_core/job/supervisor.py),
for `pipebd run` and the service alike: `tensorboard/<phase>/` is one TensorBoard run per phase. They are
written anew from the phase's telemetry files each time (a resumed phase's folder holds every step once,
its earlier attempts' included), so the files always agree with metrics/.

A series keeps at most MAX_POINTS points (TensorBoard itself keeps 1000 scalars per series unless told
otherwise; tensorboard's writer checksums every byte in pure Python, so each point costs). Each series is
written in step order: TensorBoard's reader takes a step that goes back for a restart and drops the
series' points from that step on.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from pipebd_core.rundir import RunDir
from pipebd_core.tracking.scalars import Scalar, run_scalars, thinned

MAX_POINTS = 1000  # per series
FILE_VERSION = "brain.Event:2"  # what an event file starts with, as TensorFlow writes it


def write_scalars(path: Path, scalars: list[Scalar]) -> None:
    """Write `scalars` as event file `path`, the only one of its folder (what was there is replaced).

    Written here rather than by tensorboard's EventFileWriter, whose writer thread takes each event in
    turn (seconds for ten thousand points): the same records (a file-version event, then one event per
    point), written at once to a temporary file that then takes the file's place."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    shutil.rmtree(path.parent, ignore_errors=True)
    path.parent.mkdir(parents=True)
    temporary = path.with_name(path.name + ".tmp")  # not a "tfevents" name until complete
    with temporary.open("wb") as handle:
        records = RecordWriter(handle)
        records.write(Event(wall_time=time.time(), file_version=FILE_VERSION).SerializeToString())
        for point in scalars:  # by tag, then step: each series in step order
            value = Summary.Value(tag=point.tag, simple_value=point.value)
            records.write(
                Event(wall_time=point.time, step=point.step, summary=Summary(value=[value])).SerializeToString()
            )
    temporary.replace(path)


def write_phase(run_dir: RunDir, phase: str) -> int:
    """Write the event files of training phase `phase` from its telemetry; the number of points written."""
    scalars = thinned(run_scalars(run_dir, phase), MAX_POINTS)
    write_scalars(run_dir.tensorboard_events(phase), scalars)
    return len(scalars)
