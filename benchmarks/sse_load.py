"""Load on a real `pipebd up` while a job runs: 100 event-stream followers plus list and metrics requests.

Loopback only, bounded in count and time: `--followers` SSE clients (100) follow one 2-rank job from
its submission to its `end` event, while `--pollers` clients each send `GET /api/v1/jobs?limit=50` and
`GET /api/v1/jobs/{id}/metrics` back to back, `--requests` of each at most, until the job ends; the
whole run stops after `--deadline-s` whatever happens. Reported: p50/p95 latency of the list and the
metrics requests, of each follower's connection (time to its first event) and of every metric line
(written by its rank -> received by a follower), the errors (non-2xx answers, broken streams), and
whether every follower received every metrics event exactly once, in order (against the stream read
again from its start once the job has ended).

.venv/bin/python benchmarks/sse_load.py [--followers 100] [--pollers 2] [--epochs 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.service import Up, percentile  # noqa: E402
from tests.service.factories import tiny_job  # noqa: E402

JOBS = "/api/v1/jobs"


@dataclass
class Follower:
    connected_s: float | None = None  # to the first event
    metrics_ids: list[int] = field(default_factory=list)
    line_delays: list[float] = field(default_factory=list)  # rank's line time -> received here
    ended: bool = False
    error: str | None = None


@dataclass
class Load:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"list": [], "metrics": []})
    errors: list[str] = field(default_factory=list)


async def read_events(response: httpx.Response) -> Any:
    """(event name, id, data) of an SSE body; comments and the retry line skipped."""
    name, data, event_id = "message", "", None
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield name, event_id, json.loads(data)
            name, data, event_id = "message", "", None
        elif line.startswith("id:"):
            event_id = int(line[3:].strip())
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()


async def follow(client: httpx.AsyncClient, job_id: int, follower: Follower) -> None:
    started = time.monotonic()
    try:
        async with client.stream("GET", f"{JOBS}/{job_id}/events") as response:
            if response.status_code != 200:
                follower.error = f"HTTP {response.status_code}"
                return
            async for name, event_id, data in read_events(response):
                follower.connected_s = follower.connected_s or time.monotonic() - started
                if name == "metrics":
                    follower.metrics_ids.append(event_id)
                    now = time.time()
                    follower.line_delays += [now - record["time"] for record in data["records"]]
                elif name == "end":
                    follower.ended = True
                    return
    except httpx.HTTPError as error:
        follower.error = f"{type(error).__name__}: {error}"


async def poll(client: httpx.AsyncClient, what: str, url: str, load: Load, count: int, done: asyncio.Event) -> None:
    for _ in range(count):
        if done.is_set():
            return
        started = time.monotonic()
        try:
            response = await client.get(url)
            if response.status_code != 200:
                load.errors.append(f"{what}: HTTP {response.status_code}")
        except httpx.HTTPError as error:
            load.errors.append(f"{what}: {type(error).__name__}: {error}")
            continue
        load.latencies[what].append(time.monotonic() - started)


async def reference_ids(client: httpx.AsyncClient, job_id: int) -> list[int]:
    """The metrics events of the finished job, read once more from the stream's start."""
    reference = Follower()
    await follow(client, job_id, reference)
    assert reference.ended, reference.error
    return reference.metrics_ids


async def run(url: str, args: argparse.Namespace) -> tuple[list[Follower], Load, list[int]]:
    limits = httpx.Limits(max_connections=args.followers + 2 * args.pollers + 10)
    timeout = httpx.Timeout(30, read=60)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        job_id = (await client.post(JOBS, json=tiny_job(train={"epochs": args.epochs}))).json()["id"]
        followers = [Follower() for _ in range(args.followers)]
        load, done = Load(), asyncio.Event()
        streams = [asyncio.create_task(follow(client, job_id, follower)) for follower in followers]
        pollers = [
            asyncio.create_task(poll(client, what, path, load, args.requests, done))
            for what, path in (("list", f"{JOBS}?limit=50"), ("metrics", f"{JOBS}/{job_id}/metrics"))
            for _ in range(args.pollers)
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*streams), args.deadline_s)
        finally:
            done.set()
            for task in streams:
                task.cancel()
            await asyncio.gather(*pollers, *streams, return_exceptions=True)
        return followers, load, await reference_ids(client, job_id)


def describe(values: list[float], unit: str = "ms", scale: float = 1000.0) -> str:
    if not values:
        return "n=0"
    scaled = [value * scale for value in values]
    median, p95 = statistics.median(scaled), percentile(scaled, 0.95)
    return f"n={len(values)} p50={median:.1f}{unit} p95={p95:.1f}{unit} max={max(scaled):.1f}{unit}"


def report(followers: list[Follower], load: Load, reference: list[int]) -> bool:
    exact = [follower for follower in followers if follower.ended and follower.metrics_ids == reference]
    stream_errors = [follower.error for follower in followers if follower.error]
    print(f"followers               {len(followers)}, each to its `end` event: {sum(f.ended for f in followers)}")
    print(f"metrics events          {len(reference)}; received exactly once, in order, by {len(exact)} followers")
    for what, values in load.latencies.items():
        print(f"GET {what:<19} {describe(values)}")
    print(f"stream: first event     {describe([f.connected_s for f in followers if f.connected_s is not None])}")
    print(f"stream: line -> client  {describe([d for f in followers for d in f.line_delays], 's', 1.0)}")
    print(f"errors                  {len(load.errors) + len(stream_errors)} {(load.errors + stream_errors)[:5]}")
    return len(exact) == len(followers) and not load.errors and not stream_errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--followers", type=int, default=100, help="concurrent event-stream clients")
    parser.add_argument("--pollers", type=int, default=2, help="clients sending list (and metrics) requests each")
    parser.add_argument("--requests", type=int, default=2000, help="requests per poller at most")
    parser.add_argument("--epochs", type=int, default=300, help="epochs of the tiny 2-rank job that runs")
    parser.add_argument("--deadline-s", type=float, default=300.0, help="the run stops after this, whatever happens")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        up = Up(Path(folder))
        try:
            started = time.monotonic()
            followers, load, reference = asyncio.run(run(up.url, args))
            print(f"pipebd up, one 2-rank job of {args.epochs} epochs: {time.monotonic() - started:.0f} s")
            ok = report(followers, load, reference)
        finally:
            up.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
