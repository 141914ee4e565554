"""The files the nodes of one job tell each other through their shared run directory (nodes/; written and
read by pipebd_core/job/nodes.py): every file names the attempt (`run_id`) it belongs to."""

from __future__ import annotations

from typing import Any, Literal

from pipebd_core.documents.base import Document


class NodeToken(Document):
    """nodes/node-<k>.json: node k is here and sees the run directory."""

    NAME = "nodes/node-<k>.json"
    VERSION = 1

    run_id: str
    node: int
    host: str
    pid: int


class NodeLaunch(Document):
    """nodes/rendezvous.json: node 0's current launch (`phase` at `endpoint`), or the job's end (`done`)."""

    NAME = "nodes/rendezvous.json"
    VERSION = 1

    run_id: str
    launch: int  # numbered by node 0; a follower takes part in each launch above its last
    phase: str | None = None
    endpoint: str | None = None  # host:port of the c10d rendezvous node 0's agent hosts
    done: bool | None = None  # the job ended on node 0 ...
    result: Literal["succeeded", "failed", "cancelled"] | None = None  # ... with this outcome (a job's Result)

    def to_json(self) -> dict[str, Any]:
        """A launch's fields or an end's, as node 0 wrote them (the others left out), and the format version."""
        return self.model_dump(mode="json", exclude_none=True)


class NodeEnd(Document):
    """nodes/ended-<k>.json: how node k's part of launch `launch` ended."""

    NAME = "nodes/ended-<k>.json"
    VERSION = 1

    run_id: str
    launch: int
    node: int
    result: str
    reason: str | None
    error: str | None
