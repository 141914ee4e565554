"""A discrete-event simulation of a plan's per-rank timeline, replaying the runtime's own tasks.

Each rank walks through `schedule.rank_tasks` with costs from the cost model: load or receive its
input (waiting for the producer's send), teacher work per block, send (waiting when two steps of
sends are still in flight), student work per block, all-reduce (all group members must arrive),
barrier (tr: all ranks must arrive). On several nodes a receive from another node and an all-reduce
over ranks of several nodes are charged by the link between nodes (distill_costmodel.py, topology.py). The
result is Gantt data (rank, kind, block, step, start, end) and, by simulating two lengths, the
steady-state time per global step without fill and drain.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from pipebd_core.data.streams import SearchSchedule
from pipebd_core.distill.comm import SEND_WINDOW
from pipebd_core.distill.plan import Plan
from pipebd_core.distill.schedule import WORLD, Task, rank_tasks
from pipebd_core.planning.distill_costmodel import CostModel


@dataclass
class Segment:
    rank: int
    kind: str  # data | recv_wait | recv | teacher | student | allreduce | barrier
    block: int | None
    step: int
    start: float
    end: float
    round: str = "weights"  # NAS: "arch" for the architecture round of an update step

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class RankState:
    rank: int
    tasks: list[Task]
    index: int = 0
    clock: float = 0.0
    phase: int = 0  # 0 input, 1 compute+send, 2 students, 3 allreduce, 4 barrier
    sends: deque[tuple[int, tuple[int, ...]]] = field(default_factory=deque)  # (step, consumers) in flight
    collectives: dict[Any, int] = field(default_factory=lambda: defaultdict(int))


class Simulation:
    def __init__(self, plan: Plan, model: CostModel, steps: int) -> None:
        search = SearchSchedule(0, model.arch_every) if model.arch_every else None  # the search, past its warm-up
        self.plan, self.model, self.steps = plan, model, steps
        self.ranks = [
            RankState(r, list(rank_tasks(plan, r, steps, [0] * plan.num_blocks, search))) for r in range(plan.nproc)
        ]
        self.segments: list[Segment] = []
        self.sent: dict[tuple[int, int, int], float] = {}  # (step, src, dst) -> time the send was posted
        self.received: dict[tuple[int, int, int], float] = {}  # (step, src, dst) -> time the rows arrived
        self.arrivals: dict[Any, dict[int, float]] = defaultdict(dict)  # collective key -> rank -> arrival

    def run(self) -> float:
        """Simulate to the end; returns the makespan."""
        while any(state.index < len(state.tasks) for state in self.ranks):
            if not any(self._advance(state) for state in self.ranks):
                raise RuntimeError("simulation cannot progress: the schedule deadlocks")
        return max((state.clock for state in self.ranks), default=0.0)

    def _add(self, state: RankState, kind: str, block: int | None, duration: float) -> None:
        start = state.clock
        state.clock += duration
        task = state.tasks[state.index]
        self.segments.append(Segment(state.rank, kind, block, task.step, start, state.clock, task.round))

    def _advance(self, state: RankState) -> bool:
        """Run as many phases of this rank as its dependencies allow; True if anything moved."""
        moved = False
        while state.index < len(state.tasks):
            task = state.tasks[state.index]
            phase = [self._input, self._teacher_and_send, self._students, self._allreduce, self._barrier][state.phase]
            if not phase(state, task):
                return moved
            moved = True
            state.phase += 1
            if state.phase == 5:
                state.index, state.phase = state.index + 1, 0
        return moved

    def _rows(self, task: Task) -> int:
        return task.rows[1] - task.rows[0]

    def _input(self, state: RankState, task: Task) -> bool:
        batch = self._rows(task)
        if task.loads_data:
            self._add(state, "data", None, self.model.data(batch))
            return True
        keys = [(task.step, route.src, route.dst) for route in task.receive]
        if any(key not in self.sent for key in keys):
            return False
        ready = max(self.sent[key] for key in keys)
        self._add(state, "recv_wait", None, max(0.0, ready - state.clock))
        crosses = any(self.model.topology.crosses(route.src, route.dst) for route in task.receive)
        self._add(state, "recv", None, self.model.p2p(task.teacher.start, batch, crosses))
        for key in keys:
            self.received[key] = state.clock
        return True

    def _teacher_and_send(self, state: RankState, task: Task) -> bool:
        if task.send and len(state.sends) >= SEND_WINDOW:
            step, consumers = state.sends[0]
            keys = [(step, state.rank, dst) for dst in consumers]
            if any(key not in self.received for key in keys):
                return False
            state.clock = max(state.clock, *(self.received[key] for key in keys))
            state.sends.popleft()
        for block in task.teacher:
            self._add(state, "teacher", block, self.model.teacher(block, self._rows(task)))
        for route in task.send:
            self.sent[(task.step, route.src, route.dst)] = state.clock
        if task.send:
            state.sends.append((task.step, tuple(route.dst for route in task.send)))
        return True

    def _members(self, task: Task) -> tuple[int, ...]:
        """The ranks `task`'s gradients are combined over (itself alone: no group)."""
        if task.group is None:
            return (0,)
        return tuple(range(self.plan.nproc)) if task.group == WORLD else self.plan.stages[task.group].ranks

    def _students(self, state: RankState, task: Task) -> bool:
        replicas = len(self._members(task))
        for block in task.train:
            cost = self.model.student(block, self._rows(task), task.round, replicas)
            self._add(state, "student", block, cost)
        state.clock += self.model.task_overhead  # calibrated per-task overhead: time, not a segment
        return True

    def _collective(self, state: RankState, key: Any, members: tuple[int, ...], cost: float, kind: str) -> bool:
        occurrence = (key, state.collectives[key])
        self.arrivals[occurrence].setdefault(state.rank, state.clock)
        if len(self.arrivals[occurrence]) < len(members):
            return False
        done = max(self.arrivals[occurrence].values()) + cost
        self._add(state, kind, None, done - state.clock)
        state.collectives[key] += 1
        return True

    def _allreduce(self, state: RankState, task: Task) -> bool:
        if task.group is None:
            return True
        members = self._members(task)
        weights = task.round == "weights"  # architecture gradients are a few numbers per layer
        spans = self.model.topology.spans(members)
        cost = sum(self.model.allreduce(block, len(members), spans) for block in task.train) if weights else 0.0
        return self._collective(state, ("allreduce", task.group), members, cost, "allreduce")

    def _barrier(self, state: RankState, task: Task) -> bool:
        if not task.barrier:
            return True
        return self._collective(state, "barrier", tuple(range(self.plan.nproc)), 0.0, "barrier")


def simulate(plan: Plan, model: CostModel, steps: int = 4) -> tuple[float, list[Segment]]:
    """(steady-state seconds per global step, Gantt segments of a `steps`-step run).

    With architecture updates every k steps, `steps` is rounded up to a multiple of k."""
    if model.arch_every:
        steps = model.arch_every * -(-steps // model.arch_every)
    short = Simulation(plan, model, steps)
    short_makespan = short.run()
    long_makespan = Simulation(plan, model, 2 * steps).run()
    return (long_makespan - short_makespan) / steps, short.segments
