"""Which part of a simulated timeline a trace keeps: ranks (``0-7,64``) and a window of simulated time.

A 3,072-GPU iteration holds hundreds of thousands of spans; a trace of a few ranks over a slice of
the iteration stays small enough for Perfetto. Under the symmetry reduction one simulated device
stands for several ranks (every data-parallel replica of its stage and tensor-parallel rank, or
every tensor-parallel rank of its replica): it is kept when any rank it stands for is asked for.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable

from dlsim.errors import SpecError, UnitError
from dlsim.plan.comm import Layout
from dlsim.plan.taskgraph import TaskGraph
from dlsim.units import parse_time

MAX_RANK = 2**24          # devices of a strategy are bounded by the same number (dlsim.api.limits)
MAX_RANGES = 4096         # comma-separated items in one --trace-ranks
_RANGE = re.compile(r"^\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?$")


@dataclass(frozen=True)
class TraceFilter:
    """Ranks as inclusive intervals (None: every rank); window (start, end) in seconds (None: all)."""

    ranks: tuple[tuple[int, int], ...] | None = None
    window: tuple[float, float] | None = None

    def has_rank(self, rank: int) -> bool:
        return self.ranks is None or any(lo <= rank <= hi for lo, hi in self.ranks)

    def to_dict(self) -> dict:
        return {"ranks": None if self.ranks is None else [list(r) for r in self.ranks],
                "window_s": None if self.window is None else [self.window[0],
                                                               None if math.isinf(self.window[1]) else self.window[1]]}


def parse_ranks(text: str | Iterable[int]) -> tuple[tuple[int, int], ...]:
    """``"0-7,64"`` (or a list of ranks) as sorted, merged inclusive intervals."""
    if isinstance(text, str):
        items = text.split(",")
        if len(text) > 20000 or len(items) > MAX_RANGES:
            raise SpecError(f"at most {MAX_RANGES} comma-separated ranks or ranges", field="trace_ranks")
        out = []
        for item in items:
            m = _RANGE.match(item)
            if not m:
                raise SpecError(f"cannot read {item.strip()[:40]!r} as a rank or a range like 0-7 "
                                "(use e.g. 0-7,64)", field="trace_ranks")
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) is not None else lo
            if hi < lo:
                raise SpecError(f"range {lo}-{hi} ends before it starts", field="trace_ranks")
            out.append((lo, hi))
    else:
        ranks = list(text)
        if len(ranks) > MAX_RANGES:
            raise SpecError(f"at most {MAX_RANGES} ranks", field="trace_ranks")
        out = []
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int):
                raise SpecError(f"a rank is an integer, got {str(r)[:40]!r}", field="trace_ranks")
            out.append((r, r))
    if not out:
        raise SpecError("no ranks given", field="trace_ranks")
    for lo, hi in out:
        if lo < 0 or hi >= MAX_RANK:
            raise SpecError(f"ranks are 0 to {MAX_RANK - 1}", field="trace_ranks")
    out.sort()
    merged = [out[0]]
    for lo, hi in out[1:]:
        if lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def parse_window(text: str | tuple[float | str, float | str]) -> tuple[float, float]:
    """``"START:END"`` in simulated time (``2s:3s``, ``0:500ms``; an empty END is the end of the run)."""
    if isinstance(text, str):
        if text.count(":") != 1:
            raise SpecError(f"expected START:END (e.g. 0:500ms), got {text[:40]!r}", field="trace_window")
        a, b = text.split(":")
        parts: tuple = (a.strip() or "0", b.strip() or math.inf)
    else:
        parts = tuple(text)
        if len(parts) != 2:
            raise SpecError("expected (start, end)", field="trace_window")
    try:
        start = parse_time(parts[0])
        end = math.inf if parts[1] == math.inf else parse_time(parts[1])
    except (SpecError, UnitError) as e:
        raise SpecError(str(e), field="trace_window") from None
    if end <= start:
        raise SpecError(f"window ends ({end:g} s) before it starts ({start:g} s)", field="trace_window")
    return start, end


def make_filter(ranks: str | Iterable[int] | None = None,
                window: str | tuple[float | str, float | str] | None = None) -> TraceFilter | None:
    """A `TraceFilter` from user values (None when nothing is filtered)."""
    if ranks is None and window is None:
        return None
    return TraceFilter(None if ranks is None else parse_ranks(ranks), None if window is None else parse_window(window))


def kept_devices(graph: TaskGraph, layout: Layout, keep: TraceFilter, explicit_dp: bool,
                 explicit_tp: bool) -> set[int]:
    """Simulated devices standing for at least one rank `keep` asks for."""
    if keep.ranks is None:
        return set(range(len(graph.devices)))
    per_stage = layout.tp * layout.dp * layout.cp  # a cp ring's ranks are simulated as one device
    wanted: dict[int, list[tuple[int, int] | None]] = {}  # stage -> (dp, tp) of asked ranks; None: any
    for lo, hi in keep.ranks:
        if lo >= per_stage * layout.pp:
            continue
        hi = min(hi, per_stage * layout.pp - 1)
        for stage in range(lo // per_stage, hi // per_stage + 1):
            a, b = max(lo, stage * per_stage), min(hi, (stage + 1) * per_stage - 1)
            if b - a + 1 >= per_stage or (not explicit_dp and not explicit_tp):
                wanted.setdefault(stage, []).append(None)
            else:
                wanted.setdefault(stage, []).extend(
                    ((r // (layout.tp * layout.cp)) % layout.dp, r % layout.tp) for r in range(a, b + 1))
    out = set()
    for i, dev in enumerate(graph.devices):
        asks = wanted.get(dev.stage)
        if not asks:
            continue
        d, t = (dev.rank // (layout.tp * layout.cp)) % layout.dp, dev.rank % layout.tp
        if any(w is None or ((not explicit_dp or w[0] == d) and (not explicit_tp or w[1] == t)) for w in asks):
            out.add(i)
    return out
