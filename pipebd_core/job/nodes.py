"""One job on several nodes: what the nodes tell each other through their shared run directory.

Every node runs a supervisor over the same run directory (a shared filesystem mounted at the same path on
every node: docs/multinode.md). Node 0 runs the job's phases as on one node; for each torchrun phase it
picks a rendezvous port, writes `nodes/rendezvous.json` (the phase, its c10d endpoint, a launch number)
and starts its own agent, which hosts the rendezvous. A follower (node k > 0, `Follower` in supervisor.py)
waits for each launch and starts its part; it runs nothing else (local steps and single processes stay
on node 0). The files, under the job's `run_id` (the same on every node, new for every attempt):

    nodes/node-<k>.json     node k's token: written at start; every node waits up to `bound_s` for every
                            other's, so nodes that do not share the run directory fail at once, saying so
    nodes/rendezvous.json   node 0's current launch {launch, phase, endpoint}, or {done, result} at the end
    nodes/ended-<k>.json    how node k's part of a launch ended; a node that sees another's failure
                            stops its own ranks at once (termination reason node_lost)
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pipebd_core.documents.base import Document
from pipebd_core.documents.nodes import NodeEnd, NodeLaunch, NodeToken
from pipebd_core.job.outcomes import INFRASTRUCTURE_FAULTS, SUCCEEDED, Result
from pipebd_core.job.processes import Rendezvous
from pipebd_core.rundir import RunDir

POLL_S = 0.1  # how often a node looks at its peers' files
# What a launch's rendezvous allows beyond `bound_s` for the agents to meet: a follower hears of the launch
# from the run directory and then starts its agent, while node 0's (forked warm: job/agent_server.py) is
# waiting within milliseconds; a follower's first launch also starts its agent server (2-4 s of imports, more
# on a loaded node). With the bound alone (3 s in the service tests) node 0's agent gave up on a follower
# that was on its way, twice in one suite. A follower that is gone is found by its silence (node_lost), not
# by this wait.
AGENT_START_S = 30.0
SETTLE_S = 3.0  # after a failed launch: how long a node waits for its peers' outcomes, to name the cause
# what gloo and the c10d store say when the other end of a connection went away (its process or host)
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe")


class NodeError(RuntimeError):
    """The nodes of a job cannot work together (they do not share the run directory, or one is missing)."""


@dataclass(frozen=True)
class NodeRole:
    """This node's part in a job on `nnodes` nodes."""

    nnodes: int
    node: int  # 0: runs the phases and hosts each rendezvous; others follow its launches
    run_id: str  # the same on every node of one attempt (the service: job id and attempt number)
    host: str = "127.0.0.1"  # node 0's address, where the others reach its rendezvous
    port: int | None = None  # node 0's rendezvous port; None: a free one for each launch
    local_addr: str | None = None  # the address the other nodes reach this one at (None: torchrun's guess)
    bound_s: float = 30.0  # how long the nodes wait for each other's token (and rendezvous, AGENT_START_S more)

    def __post_init__(self) -> None:
        if not 0 <= self.node < self.nnodes:
            raise ValueError(f"node rank {self.node} is not in 0..{self.nnodes - 1} for {self.nnodes} nodes")


def free_port(host: str) -> int:
    """A port nothing listens on now at `host` (node 0's agent binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


NodeFile = TypeVar("NodeFile", NodeToken, NodeLaunch, NodeEnd)


def _read(path: Path, kind: type[NodeFile]) -> NodeFile | None:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet, or being replaced
        return None
    try:
        return kind.from_json(document)
    except ValueError:  # not one (a DocumentError: another version, or another shape)
        return None


class NodeLink:
    """This node's side of the files above."""

    def __init__(self, run_dir: RunDir, role: NodeRole) -> None:
        self.run_dir, self.role = run_dir, role
        self.launch = 0  # the launch this node takes part in now (node 0 numbers them)

    def _write(self, path: Path, document: Document) -> None:
        self.run_dir.write_json(path, document.to_json())

    def _ours(self, path: Path, kind: type[NodeFile]) -> NodeFile | None:
        """The document at `path` if it belongs to this attempt (an earlier attempt's are stale)."""
        document = _read(path, kind)
        return document if document is not None and document.run_id == self.role.run_id else None

    def check_shared(self, stop: Callable[[], bool] = lambda: False) -> bool:
        """Write this node's token, then wait up to `bound_s` for every other node's: True once every node's is
        there, False as soon as `stop()` says the wait is over (the job ended or was requeued elsewhere, a peer's
        seat was lost, this worker shuts down); NodeError names the missing nodes and what an operator must
        provide."""
        role = self.role
        token = NodeToken(run_id=role.run_id, node=role.node, host=socket.gethostname(), pid=os.getpid())
        self._write(self.run_dir.node_token(role.node), token)
        deadline = time.monotonic() + role.bound_s
        while True:
            missing = [k for k in range(role.nnodes) if self._ours(self.run_dir.node_token(k), NodeToken) is None]
            if not missing:
                return True
            if stop():
                return False
            if time.monotonic() > deadline:
                raise NodeError(
                    f"node {role.node}: node(s) {', '.join(map(str, missing))} of {role.nnodes} did not show up in the"
                    f" run directory {self.run_dir.root.resolve()} within {role.bound_s:g} s (run id {role.run_id}):"
                    " every node must see the same run directory (a shared filesystem mounted at the same path on"
                    " every node, docs/multinode.md), and every node's launcher must start within that bound"
                )
            time.sleep(POLL_S)

    # node 0
    def publish(self, phase: str) -> Rendezvous:
        """Open the next launch of `phase`: its rendezvous on node 0's host, for every node to join."""
        role = self.role
        self.launch += 1
        endpoint = f"{role.host}:{role.port or free_port(role.host)}"
        self._write(
            self.run_dir.rendezvous, NodeLaunch(run_id=role.run_id, launch=self.launch, phase=phase, endpoint=endpoint)
        )
        return self.rendezvous(phase, endpoint)

    def done(self, result: Result) -> None:
        """The job ended on node 0: the followers stop waiting for launches."""
        end = NodeLaunch(run_id=self.role.run_id, launch=self.launch + 1, done=True, result=result)
        self._write(self.run_dir.rendezvous, end)

    # followers
    def next_launch(self, stop: Callable[[], bool]) -> NodeLaunch | None:
        """Wait for node 0's next launch (or its end): the rendezvous document, or None when `stop()`."""
        while not stop():
            document = self._ours(self.run_dir.rendezvous, NodeLaunch)
            if document is not None and document.launch > self.launch:
                self.launch = document.launch
                return document
            time.sleep(POLL_S)
        return None

    def rendezvous(self, phase: str, endpoint: str) -> Rendezvous:
        role = self.role
        run_id = f"{role.run_id}-{self.launch}-{phase}"
        join_timeout_s = max(1, int(role.bound_s + AGENT_START_S))
        return Rendezvous(role.nnodes, role.node, endpoint, run_id, join_timeout_s, role.local_addr)

    # every node
    def ended(self, result: str, reason: str | None, error: str | None) -> None:
        """Say how this node's part of the current launch ended."""
        role = self.role
        end = NodeEnd(run_id=role.run_id, launch=self.launch, node=role.node, result=result, reason=reason, error=error)
        self._write(self.run_dir.node_ended(role.node), end)

    def peer_ends(self) -> dict[int, NodeEnd]:
        """The other nodes' ends of the current launch, by node."""
        ends = {}
        for node in range(self.role.nnodes):
            document = self._ours(self.run_dir.node_ended(node), NodeEnd) if node != self.role.node else None
            if document is not None and document.launch == self.launch:
                ends[node] = document
        return ends

    def peer_failure(self) -> str | None:
        """What stopped another node's part of the current launch, if one ended other than by succeeding."""
        for node, end in sorted(self.peer_ends().items()):
            if end.result != SUCCEEDED:
                return f"node {node} ended: {end.reason}: {end.error or ''}".strip()
        return None

    def infrastructure_cause(self, error: str) -> str | None:
        """After this node's launch failed with `error`: a peer's fault of the machine (a killed rank, a lost
        worker) that explains it, waiting up to SETTLE_S for every peer to say how it ended; or, when a peer
        never said and `error` is a connection to it lost, that peer's host or worker gone."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            ends = self.peer_ends()
            for node, end in sorted(ends.items()):
                if end.result != SUCCEEDED and end.reason in INFRASTRUCTURE_FAULTS - {"node_lost"}:
                    return f"node {node}: {end.reason}: {end.error or ''}".strip()
            if len(ends) == self.role.nnodes - 1:
                return None
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        silent = [k for k in range(self.role.nnodes) if k != self.role.node and k not in ends]
        if any(marker in error for marker in PEER_GONE):
            nodes = ", ".join(map(str, silent))
            return f"node(s) {nodes} went away without a word (host or worker lost); here: {error.strip()}"
        return None
