"""Records that say which machine: the CPU flags that matter, the reference speed (a fixed matmul and
convolution on one thread) and how it follows the machine's speed, the report's line, and which records
the page groups on one machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebd_core.bench.conditions import cpu_flags, machine
from pipebd_core.bench.machines import group, machines_table
from pipebd_core.bench.reference import gflops, reference_speed
from pipebd_core.bench.report import describe
from pipebd_core.documents.bench_record import BenchRecord, KernelSpeed, Reference, RunSpeed

RECORD = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "record.json"
CPUINFO = """processor\t: 0
model name\t: Some CPU
flags\t\t: fpu sse2 avx2 avx512f avx512bw amx_tile amx_bf16 avx_vnni
processor\t: 1
flags\t\t: fpu
"""


def test_the_flags_that_matter_are_read_from_cpuinfo() -> None:
    assert cpu_flags(CPUINFO) == ["amx_bf16", "amx_tile", "avx512bw", "avx512f"]
    assert cpu_flags("processor\t: 0\nflags\t\t: fpu sse2 avx2\n") == []
    here = machine()
    assert here.cpu_flags is not None and here.cpu_model and here.cores >= 1


def test_the_reference_speed_falls_when_the_reference_kernel_is_slowed() -> None:
    # timed by a clock that each kernel call moves on by a millisecond: the arithmetic, free of the machine's load
    # (timing the real kernel twice, normal then slowed, failed beside the suite: 32.7 then 19.5 GFLOP/s)
    now = [0.0]

    def kernel() -> None:
        now[0] += 1e-3

    def clock() -> float:
        return now[0]

    normal, slowed = gflops(kernel, 1e6, clock=clock), gflops(kernel, 1e6, slowdown=4, clock=clock)
    assert normal == pytest.approx(1.0)  # 1 MFLOP a millisecond
    assert slowed == pytest.approx(normal / 4)  # four times the work for each counted call: a quarter the speed
    measured = reference_speed()  # and the real kernels give a speed
    assert measured.matmul_gflops > 0 and measured.conv_gflops > 0
    with pytest.raises(ValueError, match="slowdown 0"):
        reference_speed(slowdown=0)


def record_on(speed: float | None, flags: list[str] | None = None, model: str = "AMD EPYC") -> BenchRecord:
    record = BenchRecord.from_json(json.loads(RECORD.read_text()))
    reference = None if speed is None else Reference(start=KernelSpeed(matmul_gflops=speed, conv_gflops=speed / 2))
    machine_ = record.machine.model_copy(update={"cpu_flags": flags, "cpu_model": model})
    return record.model_copy(update={"machine": machine_, "reference": reference})


def test_the_report_prints_the_flags_and_the_reference_speed_at_both_ends() -> None:
    record = record_on(40.0, ["avx512f"])
    assert record.reference is not None
    ended = record.model_copy(
        update={
            "reference": record.reference.model_copy(update={"end": KernelSpeed(matmul_gflops=38.5, conv_gflops=19.0)})
        }
    )
    text = describe(ended)
    assert "(avx512f)" in text and "matmul / conv GFLOP/s: 40.0 / 20.0 at the start, 38.5 / 19.0 at the end" in text
    after = [RunSpeed(run=f"dp-{n}", speed=KernelSpeed(matmul_gflops=36.0 + n, conv_gflops=18.0 + n)) for n in range(3)]
    assert ended.reference is not None
    between = ended.model_copy(update={"reference": ended.reference.model_copy(update={"after_runs": after})})
    assert "40.0 / 20.0 at the start, 36-38 / 18-20 after its 3 runs, 38.5 / 19.0 at the end" in describe(between)
    assert "reference speed not measured" in describe(record_on(None)) and "CPU flags not recorded" in describe(
        record_on(None)
    )


def test_records_share_a_machine_only_with_the_same_description_and_reference_speed() -> None:
    flags = ["avx512f"]
    records = [
        ("a.json", record_on(40.0, flags)),
        ("b.json", record_on(42.0, flags)),  # within 10%: the same machine
        ("c.json", record_on(70.0, flags)),  # the same model string, 1.75x faster: another machine
        ("d.json", record_on(40.0, [])),  # another flag set
        ("e.json", record_on(None, flags)),  # no reference speed: grouped by description alone
    ]
    assert [machine.names for machine in group(records)] == [["a.json", "b.json"], ["c.json"], ["d.json"], ["e.json"]]
    table = machines_table(records)
    assert "| M1 | AMD EPYC | avx512f | 2 |" in table and "40.0 - 42.0 (2 records) | `a.json`, `b.json` |" in table
    assert "| M3 | AMD EPYC | none |" in table and "not told apart" in table
