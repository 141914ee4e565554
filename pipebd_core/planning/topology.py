"""Where a job's ranks are and what links join them: the nodes, the ranks of each, the link between nodes.

Ranks are numbered node by node (torchrun gives each node's agent a consecutive range; which node gets
which range is the rendezvous's choice, so only "same node or not" is known beforehand): ranks r and s
share a node when r // per_node == s // per_node. A send between nodes costs the `inter` link's
latency + bytes / bandwidth (measured by a profile taken across nodes, or stated for a what-if); an
all-reduce over a group that spans nodes runs at the pace of a ring over that link,
2 (k - 1) latency + 2 (k - 1) / k bytes / bandwidth. A send inside a node costs what the profile measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipebd_core.data.streams import even_ranges
from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.profile import LinkFit, Profile
from pipebd_core.spec import Spec


@dataclass(frozen=True)
class Topology:
    """`nodes` nodes of `per_node` ranks each, nodes joined by `inter` (None: no figure for it)."""

    nodes: int = 1
    per_node: int = 1
    inter: LinkFit | None = None

    @classmethod
    def of(cls, profile: Profile) -> Topology:
        """The machines a profile was measured on."""
        return cls(profile.nodes, profile.nproc // profile.nodes, profile.links.get("inter"))

    @classmethod
    def of_layers(cls, profile: LayerProfile) -> Topology:
        """The machines a layer profile (the finetune phase's) was measured on."""
        return cls(profile.nodes, profile.nproc // profile.nodes, profile.inter)

    def on(self, nodes: int, per_node: int) -> Topology:
        """These machines, or, for a job resumed on another rank count (an elastic job that lost or regained
        nodes), `nodes` of `per_node` ranks joined by the same link between nodes."""
        if (self.nodes, self.per_node) == (nodes, per_node):
            return self
        return Topology(nodes, per_node, self.inter)

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def crosses(self, src: int, dst: int) -> bool:
        """Whether a send from `src` to `dst` leaves its node (never on one node)."""
        return self.nodes > 1 and self.node_of(src) != self.node_of(dst)

    def spans(self, ranks: Iterable[int]) -> bool:
        """Whether a group of ranks lies on more than one node."""
        return len({self.node_of(rank) for rank in ranks}) > 1

    def receive_crosses(self, producer: Sequence[int], consumer: Sequence[int], batch_size: int) -> bool:
        """Whether any rank of a consumer stage receives rows from a producer rank on another node (the
        stages' replicas split the batch as the runtime does: routes_between in distill/plan.py)."""
        if self.nodes == 1:
            return False
        sent = zip(producer, even_ranges(batch_size, len(producer)), strict=True)
        taken = list(zip(consumer, even_ranges(batch_size, len(consumer)), strict=True))
        return any(
            max(a_start, b_start) < min(a_stop, b_stop) and self.crosses(src, dst)
            for src, (a_start, a_stop) in sent
            for dst, (b_start, b_stop) in taken
        )


def stated_link(gbit_per_s: float, latency_s: float) -> LinkFit:
    """A link given by its figures (a what-if), not measured."""
    if gbit_per_s <= 0:
        raise ValueError(f"a link of {gbit_per_s} Gbit/s carries nothing; give a rate above 0 (for example 10)")
    return LinkFit(latency_s=latency_s, bytes_per_s=gbit_per_s * 1e9 / 8)


def ring_allreduce_s(nbytes: int, group: int, link: LinkFit) -> float:
    """An all-reduce of `nbytes` over `group` ranks as a ring whose slowest hop is `link`."""
    if group <= 1:
        return 0.0
    return 2 * (group - 1) * link.latency_s + 2 * (group - 1) / group * nbytes / link.bytes_per_s


def planned_machines(spec: Spec, profile: Profile) -> Topology:
    """The machines to plan for: the profile's, or, for a job resumed on another rank count (an elastic job that
    lost or regained nodes), the spec's nodes and ranks with the profile's block costs and link between nodes."""
    return Topology.of(profile).on(spec.schedule.nodes, spec.schedule.nproc)
