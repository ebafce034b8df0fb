"""The task graph of a training iteration: what the simulator executes (plain data, no simpy).

A task runs on one stream of one simulated device (compute or communication; CUDA-stream
semantics: a stream runs its tasks one after another in issue order) or on no stream (a
point-to-point transfer, ordered only by its channel). A task starts when it is at the head of its
stream, all its dependencies have finished (a dataflow runtime's rule: a node runs when its inputs
are ready, as TensorFlow's executor does) and it holds the link ports it needs (shared links:
contention). Tasks of one collective on several simulated devices form a group: the collective
starts when every member is ready, runs as a priced duration or as its expanded point-to-point
schedule, and ends for all members together. Memory deltas are applied at a task's start and end.

Overlap slowdown: while communication of a device is in flight (its communication stream, the
point-to-point transfers it sends or receives), the compute and recompute kernels on its compute
stream progress at rate 1/(1 + σ), σ = `TaskGraph.overlap_slowdown` (`dlsim.cost.overlap`); the
time lost counts as exposed communication. Segments listed in a task's `rigid` already include
that slowdown (tensor-parallel collectives beside the kernels priced by `overlap_cost`) and keep
their duration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlsim.results import Source

# task categories (what the time of a task counts as)
COMPUTE = "compute"
RECOMPUTE = "recompute"
COMM = "comm"
CATEGORIES = (COMPUTE, RECOMPUTE, COMM)

# memory kinds tracked over time
ACTIVATIONS = "activations"
TRANSIENT_PARAMS = "gathered_params"
WORKSPACE = "workspace"
BUFFERS = "comm_buffers"
STAGING = "offload_staging"  # offloaded optimizer state while it visits the device for its step
MEMORY_KINDS = (ACTIVATIONS, TRANSIENT_PARAMS, WORKSPACE, BUFFERS, STAGING)
_MEASURED, _INTERPOLATED = Source.MEASURED, Source.INTERPOLATED  # (an enum member looked up once)


def measured_fraction(source: Source) -> float:
    """A task's `measured` share priced from one source: 1 for measured or interpolated tables, else 0."""
    return 1.0 if source is _MEASURED or source is _INTERPOLATED else 0.0


@dataclass(slots=True)
class Task:
    """One unit of work. `stream` is an index into `TaskGraph.streams` (−1: a transfer on no
    stream). `deps` are task ids. `ports` are link ports held while it runs. `group` ties the
    members of one collective. `mem_start` / `mem_end` are (kind, bytes) deltas on `device`.
    `measured` is the share of its duration priced from measured (or interpolated) tables;
    `label` = (phase, chunk, micro-batch, ...) for event-order inspection; `cross_stage` marks
    transfers between pipeline stages; `parts` splits a fused task into its pieces; `rigid` are the
    indices (into `segments()`) of compute pieces whose duration already includes the overlap
    slowdown, which the engine does not slow again. A transfer with `links` (indices into
    `TaskGraph.links`) is a flow on a shared network: its first `wire` seconds move its bytes at
    `rate` bytes/s when alone, and stretch when the links are shared (`dlsim.sim.engine`). `info` says what the task is, for traces (the
    engine never reads it): ``layers`` (the layer run, "a..b"), or ``op``, ``bytes``, ``group``,
    ``ranks``, ``source`` of a collective or transfer (``to_task``: the task a transfer feeds);
    `part_info` is the same per entry of `parts`. Both are read only: the tasks of a pass's
    micro-batches may share them (`TaskGraph.add_chain`, fused tasks' `part_info`)."""

    tid: int
    name: str
    device: int
    stream: int
    duration: float
    category: str
    deps: list[int]
    measured: float = 0.0
    ports: tuple[int, ...] = ()
    group: int = -1
    mem_start: tuple[tuple[str, float], ...] = ()
    mem_end: tuple[tuple[str, float], ...] = ()
    label: tuple = ()
    cross_stage: bool = False
    parts: tuple[tuple[str, float, float], ...] = ()
    rigid: tuple[int, ...] = ()
    links: tuple[int, ...] = ()
    wire: float = 0.0
    rate: float = 0.0
    info: dict | None = None
    part_info: tuple[dict, ...] = ()

    def segments(self) -> tuple[tuple[str, float, float], ...]:
        """(category, seconds, measured seconds) of the pieces this task runs back to back: a fused
        task (several kernels and uncontended blocking collectives on one stream) lists its parts."""
        return self.parts or ((self.category, self.duration, self.duration * self.measured),)


@dataclass(frozen=True)
class Stream:
    """An ordered queue of tasks on one device (kind: compute | comm), or a channel (kind: link)."""

    name: str
    device: int
    kind: str


@dataclass(frozen=True)
class Port:
    """One direction of one device's attachment to a link tier (full duplex: out and in)."""

    name: str
    device: int
    tier: str
    direction: str


@dataclass(frozen=True)
class Message:
    """One point-to-point transfer of an expanded collective schedule (simulated device ids).

    It starts when its `deps` (indices of earlier messages) have finished and it holds its sender's
    out port and its receiver's in port (`ports`); it frees the out port after `hold` (the LogGP
    injection gap S(s)), the in port after `recv_hold` (S(s) plus the reduction of its bytes) and
    finishes after `duration` (arrival T(s) plus the reduction), as `dlsim.cost.collectives.schedule`
    defines the data-flow semantics of a schedule. With `links` it is a flow on a shared network
    (`Task.links`): its first `wire` seconds stretch when the links are shared, and its port holds
    and end move by as much.
    """

    src: int
    dst: int
    nbytes: float
    duration: float
    deps: tuple[int, ...]
    ports: tuple[int, int]
    hold: float
    recv_hold: float
    links: tuple[int, ...] = ()
    wire: float = 0.0
    rate: float = 0.0


@dataclass
class Group:
    """A collective over several simulated devices: member task ids, and either a priced
    `duration` (closed form) holding `ports`, or `messages` executed on the link ports."""

    members: list[int]
    duration: float
    ports: tuple[int, ...] = ()
    messages: tuple[Message, ...] = ()


@dataclass(frozen=True)
class SimDevice:
    """A simulated device: the ranks it stands for (`multiplicity` real devices behave like it),
    its memory `capacity` and the static bytes it holds (weights, gradients, optimizer state...)."""

    name: str
    rank: int
    stage: int
    multiplicity: int
    capacity: float
    static: tuple[tuple[str, float], ...]


@dataclass
class TaskGraph:
    """Everything the engine needs; built by `dlsim.plan.iteration`, never read from files."""

    devices: list[SimDevice] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)
    orders: list[list[int]] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    ports: list[Port] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    overlap_slowdown: float = 0.0  # σ of the devices: compute slowdown beside communication
    links: list = field(default_factory=list)  # shared network links (`dlsim.cost.fabric.Link`) flows cross
    _parts_totals: dict = field(default_factory=dict, repr=False, compare=False)  # `add`'s cache

    def add_stream(self, name: str, device: int, kind: str) -> int:
        self.streams.append(Stream(name, device, kind))
        self.orders.append([])
        return len(self.streams) - 1

    def add_port(self, name: str, device: int, tier: str, direction: str) -> int:
        self.ports.append(Port(name, device, tier, direction))
        return len(self.ports) - 1

    def add(self, name: str, device: int, stream: int, duration: float, category: str, deps: list[int], *,
            source: Source = Source.MODEL, ports: tuple[int, ...] = (), group: int = -1,
            mem_start: tuple[tuple[str, float], ...] = (), mem_end: tuple[tuple[str, float], ...] = (),
            label: tuple = (), cross_stage: bool = False,
            parts: tuple[tuple[str, float, float], ...] = (), rigid: tuple[int, ...] = (),
            flow: tuple[tuple[int, ...], float, float] = ((), 0.0, 0.0), info: dict | None = None,
            part_info: tuple[dict, ...] = ()) -> int:
        """Append a task (to its stream's order when it has one); returns its id. A fused task gives
        its `parts` (category, seconds, measured seconds); its duration is their sum. `rigid`, `info`,
        `part_info`: see `Task`; `flow`: (links, wire, rate) of a transfer on a shared network (`Task`)."""
        tid = len(self.tasks)
        if parts:
            # a pass's parts are one tuple shared by its tasks of every micro-batch: summed once
            totals = self._parts_totals.get(id(parts))
            if totals is None or totals[0] is not parts:
                duration = sum(p[1] for p in parts)
                totals = self._parts_totals[id(parts)] = (
                    parts, duration, sum(p[2] for p in parts) / duration if duration > 0 else 0.0)
            duration, measured = totals[1], totals[2]
        else:
            measured = measured_fraction(source)
        links, wire, rate = flow
        self.tasks.append(Task(tid, name, device, stream, duration, category, deps, measured, ports, group,
                               mem_start, mem_end, label, cross_stage, parts, rigid, links, wire, rate, info,
                               part_info))
        if stream >= 0:
            self.orders[stream].append(tid)
        return tid

    def add_chain(self, chain: tuple[tuple, ...], device: int, stream: int, deps: list[int], label: tuple) -> tuple[int, int]:
        """Append a pass's tasks one after another on `stream` (the first waiting for `deps`, each
        next one only for its place in the stream): `chain` lists (name, duration, category,
        measured, ports, info) per task, named "<label[0]> <name> mb<label[2]>" and labelled
        `label`, as `add` makes them, in a fraction of its time (a pass instantiated for every
        micro-batch; the chain's `info` dicts shared, read only). Returns (first task, last task)."""
        tasks, order = self.tasks, self.orders[stream]
        head, tail = f"{label[0]} ", f" mb{label[2]}"
        first = tid = len(tasks)
        step_deps = list(deps)
        for name, duration, category, measured, ports, info in chain:
            tasks.append(Task(tid, head + name + tail, device, stream, duration, category, step_deps, measured, ports,
                              -1, (), (), label, False, (), (), (), 0.0, 0.0, info, ()))
            order.append(tid)
            tid += 1
            step_deps = []
        return first, tid - 1

    def add_group(self, members: list[int], duration: float, ports: tuple[int, ...] = (),
                  messages: tuple[Message, ...] = ()) -> int:
        gid = len(self.groups)
        self.groups.append(Group(members, duration, ports, messages))
        for tid in members:
            self.tasks[tid].group = gid
        return gid
