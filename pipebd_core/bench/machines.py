"""Which benchmark records shared a machine: the page's machines table (`<!-- pipebd bench --machines
FILE... -->`, rendered by page.py).

Two records ran on the same machine when their CPU model string, CPU flags, core count and memory (in
whole GiB) are the same and their reference speeds (reference.py: the matmul's GFLOP/s at the start of each bench)
are within SAME_SPEED of each other. A record without a reference speed (one that predates it) is
grouped by the rest alone, and its group says that it cannot be told apart from another machine of
the same description.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipebd_core.documents.bench_record import BenchRecord

SAME_SPEED = 0.10  # reference speeds within 10% of the group's first: the same machine


@dataclass
class MachineGroup:
    """Records that ran on one machine, in the order given."""

    description: tuple[str, tuple[str, ...] | None, int, int]  # cpu model, flags, cores, memory in GiB
    speed: float | None  # the first record's start matmul GFLOP/s (None: no reference speed)
    names: list[str] = field(default_factory=list)
    speeds: list[float] = field(default_factory=list)

    def takes(self, record: BenchRecord) -> bool:
        if describe(record) != self.description:
            return False
        speed = start_speed(record)
        if self.speed is None or speed is None:
            return self.speed is None and speed is None
        return abs(speed - self.speed) <= SAME_SPEED * self.speed


def describe(record: BenchRecord) -> tuple[str, tuple[str, ...] | None, int, int]:
    machine = record.machine
    flags = tuple(machine.cpu_flags) if machine.cpu_flags is not None else None
    return machine.cpu_model, flags, machine.cores, round(machine.memory_bytes / 2**30)  # GiB: boots differ by KiB


def start_speed(record: BenchRecord) -> float | None:
    return record.reference.start.matmul_gflops if record.reference is not None else None


def group(records: list[tuple[str, BenchRecord]]) -> list[MachineGroup]:
    """The machines `records` (name, record) ran on, each with the records that ran on it."""
    groups: list[MachineGroup] = []
    for name, record in records:
        found = next((g for g in groups if g.takes(record)), None)
        if found is None:
            found = MachineGroup(describe(record), start_speed(record))
            groups.append(found)
        found.names.append(name)
        speed = start_speed(record)
        if speed is not None:
            found.speeds.append(speed)
    return groups


def machines_table(records: list[tuple[str, BenchRecord]]) -> str:
    """Markdown: one row a machine, the records that shared it."""
    lines = [
        "| machine | CPU | flags | cores | memory | matmul GFLOP/s at the start (one thread) | records |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, machine in enumerate(group(records), start=1):
        model, flags, cores, memory = machine.description
        flag_text = "not recorded" if flags is None else " ".join(flags) or "none"
        if machine.speeds:
            speed = f"{min(machine.speeds):.1f} - {max(machine.speeds):.1f} ({len(machine.speeds)} records)"
        else:
            speed = "not measured: not told apart from another machine of this description"
        cells = [f"M{index}", model, flag_text, str(cores), f"{memory} GiB", speed]
        cells.append(", ".join(f"`{Path(name).name}`" for name in machine.names))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
