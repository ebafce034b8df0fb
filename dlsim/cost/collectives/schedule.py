"""Executable form of a collective: its point-to-point messages, in steps, with dependencies.

A `Schedule` is frozen data the simulator (dlsim.sim) runs on shared links. Its meaning, which the
reference executor in `replay.py` implements without contention:

* Messages are listed in issue order; `step` numbers are non-decreasing along the list.
* Step semantics (the closed forms assume it): step i starts when every message of step i−1 has
  arrived and been reduced. Inside a step each rank has one send port and one receive port
  (full duplex, one message at a time each way, the model of Thakur et al. 2005 §2 and Chan et al.
  2007); a port serves its messages in list order, the next one starting S(s) after the previous one
  started (plus the reduction time at a receive port), see `dlsim.cost.p2p`.
* Data-flow semantics (for an asynchronous simulator): a message may start once every message in
  its `deps` has arrived at its destination and been reduced there. `deps` are the messages of the
  sender's and of the receiver's most recent earlier step, so every rank's operations are ordered
  and every datum is received before it is forwarded.
* `reduce_bytes` bytes are combined by the receiver on arrival (γ seconds per byte).
* `intra` marks messages of hierarchical algorithms that use the intra-node tier.
* `shared` marks messages a rank posts at once (non-blocking sends, Open MPI's binomial broadcast
  `ompi_coll_base_bcast_intra_generic`): the shared messages of one sender in one step start
  together and share its send port fairly instead of being served one after another (see
  `replay.py`). c shared messages of equal size all arrive at (c − 1)·S(s) + T(s), when the last of
  c back-to-back messages would.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Message:
    """One point-to-point transfer of `nbytes` from rank `src` to rank `dst`."""

    src: int
    dst: int
    nbytes: float
    reduce_bytes: float = 0.0
    step: int = 0
    deps: tuple[int, ...] = ()
    intra: bool = False
    shared: bool = False


@dataclass(frozen=True)
class Schedule:
    """The messages of one collective call; `ranks` counts every participant (PS servers included)."""

    collective: str
    algorithm: str
    nbytes: float
    ranks: int
    messages: tuple[Message, ...]
    params: tuple[tuple[str, object], ...] = ()

    @property
    def steps(self) -> tuple[tuple[int, ...], ...]:
        """Message indices grouped by step, in step order."""
        groups: dict[int, list[int]] = defaultdict(list)
        for i, m in enumerate(self.messages):
            groups[m.step].append(i)
        return tuple(tuple(groups[k]) for k in sorted(groups))

    def bytes_sent(self) -> dict[int, float]:
        """Total bytes each rank sends."""
        out: dict[int, float] = defaultdict(float)
        for m in self.messages:
            out[m.src] += m.nbytes
        return dict(out)

    def bytes_reduced(self) -> dict[int, float]:
        """Total bytes each rank reduces."""
        out: dict[int, float] = defaultdict(float)
        for m in self.messages:
            out[m.dst] += m.reduce_bytes
        return dict(out)


@dataclass
class ScheduleBuilder:
    """Collects messages step by step and fills in `deps` (see the module doc)."""

    collective: str
    algorithm: str
    nbytes: float
    ranks: int
    messages: list[Message] = field(default_factory=list)
    _done: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    _current: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    _step: int = -1

    def send(self, step: int, src: int, dst: int, nbytes: float, reduce: bool = False, intra: bool = False,
             shared: bool = False) -> int:
        """Add a message in `step` (non-decreasing); with `reduce` the receiver combines all its bytes;
        with `shared` it shares the sender's port with the sender's other shared messages of the step."""
        if step < self._step:
            raise ValueError(f"steps must be added in order ({step} after {self._step})")
        if step > self._step:
            for rank, ids in self._current.items():
                self._done[rank] = ids
            self._current = defaultdict(list)
            self._step = step
        deps = tuple(sorted(set(self._done.get(src, ())) | set(self._done.get(dst, ()))))
        index = len(self.messages)
        self.messages.append(Message(src, dst, float(nbytes), float(nbytes) if reduce else 0.0, step, deps, intra,
                                     shared))
        self._current[src].append(index)
        self._current[dst].append(index)
        return index

    def build(self, **params: object) -> Schedule:
        return Schedule(self.collective, self.algorithm, float(self.nbytes), self.ranks, tuple(self.messages),
                        tuple(sorted(params.items())))


def relabel(schedule: Schedule, rank_map: list[int], step_offset: int, *, intra: bool | None = None) -> list[Message]:
    """Messages of `schedule` with ranks renamed through `rank_map` and steps shifted (deps dropped)."""
    out = []
    for m in schedule.messages:
        out.append(Message(rank_map[m.src], rank_map[m.dst], m.nbytes, m.reduce_bytes, m.step + step_offset, (),
                           m.intra if intra is None else intra, m.shared))
    return out


def append_messages(builder: ScheduleBuilder, messages: list[Message]) -> None:
    """Add already-placed messages (from `relabel`) to a builder, recomputing their deps."""
    for m in sorted(messages, key=lambda x: x.step):
        builder.send(m.step, m.src, m.dst, m.nbytes, reduce=m.reduce_bytes > 0, intra=m.intra, shared=m.shared)
