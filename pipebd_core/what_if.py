"""What `pipebd plan` plans for: the spec's machines, or a what-if on several nodes (docs/multinode.md, "Planning
across nodes").

`pipebd plan SPEC --nodes N [--nproc P] --link-gbps G [--link-latency-ms L]` predicts a job on N nodes of P ranks
from profiles of one node (measured, or taken from the cache) with the link between nodes stated; without
--link-gbps, from profiles a job on those N nodes measured (cached), which hold the link's own figures. Both phases
are planned for the same machines:

- **distillation** (`distill_what_if`): the block profile's cost model on those machines; the stated link's
  latency is by default the node's own measured one (the block profile's `intra` link);
- **the finetune phase** (`finetune_what_if`, a spec with a `finetune` section on several nodes): the layer
  profile's costs with the same link, the strategy (the spec's, or the fastest for `auto`) and its cut, every
  strategy ranked (planning/finetune_planner.py). A `train` workload has no distillation, so no block profile:
  only its finetune is planned (on one node too), the link's latency as stated (0 unless `--link-latency-ms`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.profile import LinkFit, Profile
from pipebd_core.finetune.plan import TrainPlan
from pipebd_core.job.profiling import obtain_layer_profile, obtain_profile
from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_planner import cost_model
from pipebd_core.planning.finetune_planner import resolve_train_plan
from pipebd_core.planning.profiles import load_cached, load_cached_layers
from pipebd_core.planning.topology import Topology, stated_link
from pipebd_core.spec import Spec, SpecError, parse_spec


@dataclass(frozen=True)
class Machines:
    """The nodes to plan for and, for a what-if, the link stated between them."""

    nodes: int
    per_node: int
    gbit_per_s: float | None  # None: the link a job on these nodes measured (or one node: no link)
    latency_s: float | None  # None: the node's own measured latency

    @classmethod
    def of(cls, spec: Spec, args: argparse.Namespace) -> Machines:
        nodes = args.nodes or spec.schedule.nodes
        if nodes < 1:
            raise SpecError(f"--nodes {nodes}: a job runs on at least 1 node")
        latency_s = args.link_latency_ms / 1e3 if args.link_latency_ms is not None else None
        return cls(nodes, spec.schedule.nproc, args.link_gbps if nodes > 1 else None, latency_s)

    @property
    def stated(self) -> bool:
        """A what-if: several nodes planned from profiles of one, the link stated."""
        return self.gbit_per_s is not None

    def topology(self, intra: LinkFit | None) -> Topology:
        """The stated machines; the link's latency by default `intra`'s (the node's own, measured)."""
        assert self.gbit_per_s is not None, "only a what-if states its link"
        latency_s = self.latency_s if self.latency_s is not None else (intra.latency_s if intra else 0.0)
        try:
            link = stated_link(self.gbit_per_s, latency_s)
        except ValueError as error:
            raise SpecError(f"--link-gbps: {error}") from None
        return Topology(self.nodes, self.per_node, link)

    def spec(self, spec: Spec, nodes: int | None = None) -> Spec:
        """`spec` on these nodes (or `nodes`), checked again: the finetune's checks count every node's ranks. Its
        elastic bounds are left out: they say where the job may run, not how it is planned."""
        document = spec.model_dump(mode="json")
        document["schedule"].update(nodes=nodes or self.nodes, elastic=None)
        return parse_spec(document)

    def missing(self, what: str) -> SpecError:
        """No profile measured across these nodes: the link between them is unknown."""
        return SpecError(
            f"--nodes {self.nodes}: no {what} measured across {self.nodes} nodes is cached, so the link between them"
            " is unknown; give it, for example --link-gbps 10 (and --link-latency-ms), to predict from a profile of"
            " one node"
        )


def distill_what_if(spec: Spec, machines: Machines) -> tuple[CostModel, Profile]:
    """(cost model, block profile) of distillation on `machines`."""
    on_nodes = machines.spec(spec)
    if not machines.stated:
        cached = load_cached(on_nodes) if machines.nodes > 1 else None
        if machines.nodes > 1 and cached is None:
            raise machines.missing("profile")
        profile = cached or obtain_profile(on_nodes)[0]
        return cost_model(on_nodes, profile), profile
    profile = obtain_profile(machines.spec(spec, nodes=1))[0]
    return cost_model(on_nodes, profile, machines.topology(profile.links.get("intra"))), profile


def finetune_what_if(spec: Spec, machines: Machines, intra: LinkFit | None) -> tuple[TrainPlan, Topology]:
    """(plan, the machines it is for) of `spec`'s finetune phase: on several nodes from a layer profile of one
    node with the stated link (latency by default `intra`'s), or from one a job measured across those nodes
    (cached); on one node from its layer profile (cached, or measured now)."""
    on_nodes = machines.spec(spec)
    measured: LayerProfile | None
    if machines.stated:
        measured = obtain_layer_profile(machines.spec(spec, nodes=1))
        topology = machines.topology(intra)
        return resolve_train_plan(on_nodes, None, measured, topology), topology
    measured = load_cached_layers(on_nodes, None) if machines.nodes > 1 else obtain_layer_profile(on_nodes)
    if measured is None:
        raise machines.missing("layer profile")
    return resolve_train_plan(on_nodes, None, measured), Topology.of_layers(measured)


def finetune_report(plan: TrainPlan) -> dict[str, Any]:
    """What `pipebd plan` says of the finetune phase (its `finetune` in --json)."""
    details = plan.details
    assert details is not None, "a plan the planner made has its details"
    return {
        "strategy": plan.strategy,
        "requested_strategy": details.requested_strategy,
        "stages": [list(stage) for stage in plan.stages],
        "predicted_step_s": details.predictions.predicted_step_s if details.predictions else None,
        "strategies": [
            entry.model_dump(mode="json", exclude={"segments"}, exclude_none=True) for entry in details.strategies or []
        ],
        "profile_trust": details.profile_trust.model_dump(mode="json") if details.profile_trust else None,
    }
