"""Two nodes on a slow link, emulated on this machine: the planner's prediction for a job across nodes against
what the job measured, and the what-if's prediction for the same job from a profile of one node.

Two network namespaces joined by a veth pair, both ends rate-limited by `tc tbf` (--gbit, default 0.2
Gbit/s; this kernel has no `netem`, so no delay is added: the latency is what the pair measures). Node 0 of
a 2-node x 1-rank `pipebd run` runs in one namespace, node 1 in the other (gloo bound to the pair's
addresses), over one run directory (the machine's filesystem: what a shared mount gives real nodes). Each
arm (a mode) runs once; the first profiles across the two nodes (the link measured into profile.json), the
others reuse that profile (cached). Then `pipebd profile` measures one node (1 rank, no link) and `pipebd
plan --nodes 2 --nproc 1 --link-gbps RATE` predicts each mode from it.

Needs root and `ip netns` (it says so and stops where they are missing). Run it alone:

    ../shared/bin/quiet .venv/bin/python benchmarks/shaped_link.py

Writes benchmarks/records/shaped-link.json (`--out`); prints the table docs/benchmarks.md renders from it.
Never asserted: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipebd_core.bench.arms import timed  # noqa: E402
from pipebd_core.bench.conditions import LoadMeter, commit, machine  # noqa: E402
from pipebd_core.bench.distill import read_metrics  # noqa: E402
from pipebd_core.bench.page import render_shaped_link  # noqa: E402
from pipebd_core.planning.profiles import CACHE_ENV  # noqa: E402
from pipebd_core.rundir import RunDir  # noqa: E402

OUT = REPO / "benchmarks" / "records" / "shaped-link.json"
ADDRESSES = ("10.77.0.1", "10.77.0.2")
RUN_TIMEOUT_S = 600
SPEC: dict[str, Any] = {
    "name": "shaped-link",
    "workload": {
        "kind": "custom",
        "factory": "pipebd_core.workloads.tiny:make_blocks",
        "options": {"num_blocks": 4, "channels": 16},
    },
    "data": {"dataset": "synthetic", "image_size": 16, "num_samples": 320, "batch_size": 16},
    "train": {"epochs": 2, "lr": 0.05, "seed": 3},
    "schedule": {"mode": "auto", "nproc": 1, "nodes": 2, "profile": True},
}


def sh(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


class Link:
    """Two namespaces joined by a veth pair, each end limited to `gbit` Gbit/s; removed on exit."""

    def __init__(self, gbit: float) -> None:
        tag = uuid.uuid4().hex[:6]
        self.names = (f"pbd-a-{tag}", f"pbd-b-{tag}")
        self.devices = (f"va{tag}", f"vb{tag}")
        self.gbit = gbit

    def __enter__(self) -> Link:
        (a, b), (va, vb) = self.names, self.devices
        try:
            sh("ip", "netns", "add", a)
            sh("ip", "netns", "add", b)
        except (OSError, subprocess.CalledProcessError) as error:
            raise SystemExit(
                f"shaped_link: this machine does not allow network namespaces ({error}); nothing ran"
            ) from None
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        for name, device, address in ((a, va, ADDRESSES[0]), (b, vb, ADDRESSES[1])):
            sh("ip", "link", "set", device, "netns", name)
            sh("ip", "-n", name, "addr", "add", f"{address}/24", "dev", device)
            sh("ip", "-n", name, "link", "set", device, "up")
            sh("ip", "-n", name, "link", "set", "lo", "up")
            rate = f"{self.gbit * 1000:.0f}mbit"
            sh(
                "tc",
                "-n",
                name,
                "qdisc",
                "add",
                "dev",
                device,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "64kb",
                "latency",
                "100ms",
            )
        return self

    def __exit__(self, *_: object) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def command(self, node: int, argv: list[str]) -> list[str]:
        """`argv` inside node `node`'s namespace, gloo on its end of the pair."""
        return ["ip", "netns", "exec", self.names[node], "env", f"GLOO_SOCKET_IFNAME={self.devices[node]}", *argv]


def pipebd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipebd_core.cli", *args]


def run_two_nodes(link: Link, spec_path: Path, mode: str, out: Path, env: dict[str, str]) -> dict[str, Any]:
    """One 2-node run of `mode`; its plan's prediction, its measured steps, the load meanwhile."""
    run_id = uuid.uuid4().hex[:8]
    common = ["run", str(spec_path), "--mode", mode, "--nnodes", "2", "--out", str(out), "--rdzv-id", run_id]
    meter = LoadMeter.open()
    nodes = [
        subprocess.Popen(
            link.command(
                node,
                pipebd(
                    *common, "--node-rank", str(node), "--rdzv-endpoint", ADDRESSES[0], "--local-addr", ADDRESSES[node]
                ),
            ),
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (1, 0)
    ]
    errors = [node.communicate(timeout=RUN_TIMEOUT_S)[1] for node in nodes]
    load = meter.load()
    if any(node.returncode for node in nodes):
        raise SystemExit(f"shaped_link: the {mode} run failed:\n" + "\n".join(error[-3000:] for error in errors))
    run_dir = RunDir(out)
    plan = run_dir.load_plan()
    steps, timing = timed(read_metrics(run_dir, plan.nproc), run_dir)
    profile = run_dir.load_profile()
    inter = profile.links["inter"]
    return {
        "mode": mode,
        "stages": [[s.start, s.stop, s.replicas] for s in plan.stages],
        "crossing_routes": sum(route.crosses_nodes for route in plan.routes),
        "predicted_step_s": plan.details.predicted_step_s,
        "measured_step_s": statistics.fmean(steps),
        "timed_steps": timing.timed_steps,
        "link": {"gbit_per_s": inter.gbit_per_s, "latency_s": inter.latency_s, "points": len(inter.points)},
        "load": load.model_dump(),
    }


def what_if(spec_path: Path, rate: float, env: dict[str, str]) -> dict[str, float]:
    """Every mode's predicted step on 2 nodes x 1 rank at `rate` Gbit/s, from a profile of one node."""
    one_node = ["--set", "schedule.nodes=1", "--nproc", "1"]
    subprocess.run(pipebd("profile", str(spec_path), *one_node), cwd=REPO, env=env, check=True, capture_output=True)
    printed = subprocess.run(
        pipebd("plan", str(spec_path), *one_node, "--nodes", "2", "--link-gbps", str(rate), "--json"),
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    report = json.loads(printed)
    steps: dict[str, float] = report["mode_step_s"]
    return {**steps, "auto": steps["hybrid"]}  # hybrid: the best plan of the search, as auto runs it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gbit", type=float, default=0.2, help="the link's rate, Gbit/s (tc tbf)")
    parser.add_argument("--modes", default="auto,tr,dp", help="comma-separated modes, one 2-node run each")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        raise SystemExit("shaped_link: needs root with `ip` and `tc` (iproute2); nothing ran")
    work = Path(tempfile.mkdtemp(prefix="pipebd-shaped-"))
    env = {**os.environ, CACHE_ENV: str(work / "cache"), "OMP_NUM_THREADS": "1"}
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(SPEC))
    try:
        with Link(args.gbit) as link:
            arms = [run_two_nodes(link, spec_path, mode, work / f"run-{mode}", env) for mode in args.modes.split(",")]
        predicted = what_if(spec_path, args.gbit, env)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for arm in arms:
        arm["what_if_step_s"] = predicted.get(arm["mode"])
    record = {"benchmark": "shaped_link", "commit": commit(), "machine": machine().model_dump(), "gbit": args.gbit}
    record |= {"spec": SPEC, "arms": arms}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(render_shaped_link(record))


if __name__ == "__main__":
    main()
