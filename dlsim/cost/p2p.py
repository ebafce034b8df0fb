"""Point-to-point message time: Hockney (α-β), LogP and LogGP, per link tier.

A `LinkTier` carries the LogGP parameters (Alexandrov, Ionescu, Schauser, Scheiman, SPAA 1995):
latency L, per-message CPU overhead o, gap g between consecutive messages, and G = 1/bandwidth
seconds per byte (the achievable bandwidth: link rate × `LinkTier.bandwidth_efficiency`). The
three models price one message of `s` bytes as

    Hockney (Hockney, Parallel Computing 20, 1994):  T(s) = α + β·s,  α = L + 2o,  β = G
    LogGP (SPAA 1995):                               T(s) = L + 2o + (s − 1)·G       (s ≥ 1)
    LogP (Culler et al., PPoPP 1993):                T(s) = L + 2o + (k − 1)·max(g, o)

where LogP sends a long message as k = ⌈s / w⌉ small messages of w bytes and w = g / G, so that
LogP's long-message rate (w bytes every g) equals the link bandwidth (the mapping α ≈ L + 2o,
β ≈ G of `reference/algorithms.md` §2.1).

Besides T(s) every model gives the *injection gap* S(s): the least time between the starts of two
messages one rank sends back to back (or two that one rank receives back to back):

    Hockney: S(s) = T(s)                   (messages are serialised, k·(α + βs) for k messages)
    LogGP:   S(s) = max(o, g + (s − 1)·G)   (the spacing Netgauge fits, §2.2)
    LogP:    S(s) = k·max(g, o)

so k messages sent back to back arrive by (k − 1)·S(s) + T(s). dlsim's collective costs assume a
sender can always start its next message once its previous one has fully arrived, S(s) ≤ T(s);
for LogP/LogGP that is g ≤ L + 2o, checked when a model is built.

A fourth model, ``table``, prices a message from a measured point-to-point curve instead of one
line (the piecewise fits of Netgauge, Hoefler, Mehlan, Rehm, Rex, IPDPS/CAC 2007, taken to one
piece per measured interval): with measured one-way times t_i at sizes s_0 < … < s_k (ping-pong
RTT/2, `dlsim calibrate comm`) made non-increasing from the right (t_i ← min_{j≥i} t_j: a smaller
message is never slower, it could be padded),

    T(s) = t_0                                       s ≤ s_0
           t_i + (s − s_i)·(t_{i+1} − t_i)/(s_{i+1} − s_i)   s_i ≤ s ≤ s_{i+1}
           t_k + (s − s_k)·(t_k − t_{k−1})/(s_k − s_{k−1})   s ≥ s_k   (the last slope)
    S(s) = T(s)                                      (back-to-back messages serialised, as Hockney)

It keeps what one line cannot: protocol switches and, on a token-bucket-shaped link, small messages
that pass at the burst rate. Its α is t_0 and its β the last slope.

Token-bucket ports (optional, `LinkTier.burst` b > 0, Hockney and LogGP only). A shaped port (a tc
tbf, a cloud NIC's burst credits) holds up to b bytes of tokens that refill at the line rate
1/G; bytes leave at the peak rate R while tokens last, then at 1/G (Linux `sch_tbf.c`). x bytes
sent from a port holding B tokens have all left after the shaped time

    D(x, B) = max(x / R, (x − B)·G)       (B = b: a port idle long enough to be full)

and the port then holds min(b, B + D(x, B)/G − x) tokens, refilling at 1/G up to b. A message of
s bytes (x = s − 1 for LogGP, s for Hockney) sent from a full port takes

    T(s) = L + 2o + D(x, b),    S(s) = max(o, g + D(x, b))  (LogGP),  S = T (Hockney)

With b = 0 and R = ∞ these are the formulas above. `dlsim.cost.collectives.bucket` carries the
bucket through the steps of a collective (a port that sent recently is not full).

Everything is vectorised: `s` may be a float or a NumPy array. The γ of the α-β-γ model (seconds
per byte of reduction compute) is not a link property and lives with the collectives; the survey's
γ ("bytes per value", seeds-inventory §14 item 5) is `elem_bytes` in `dlsim.cost.collectives.survey`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Union

import numpy as np

from dlsim.errors import SpecError
from dlsim.spec.cluster import LinkTier

Bytes = Union[float, np.ndarray]

MODELS = ("hockney", "logp", "loggp", "table")
"""The point-to-point models; ``auto`` picks loggp when a link has an overhead or gap, else hockney."""


@dataclass(frozen=True)
class PointToPoint:
    """One link tier under one p2p model: `time(s)` and `spacing(s)` in seconds, vectorised in s."""

    model: str
    latency: float
    overhead: float
    gap: float
    gap_per_byte: float
    packet_bytes: float = 0.0
    name: str = ""
    table_sizes: tuple[float, ...] = ()
    table_times: tuple[float, ...] = ()
    burst: float = 0.0
    peak_bandwidth: float = float("inf")

    @property
    def shaped(self) -> bool:
        """Whether the port is token-bucket shaped (burst > 0)."""
        return self.burst > 0

    def payload(self, s: Bytes) -> Bytes:
        """x: the bytes a message of s bytes pays per-byte time for (s − 1 in LogGP, s in Hockney); one
        size in plain arithmetic (a numpy scalar, as the array operation gives), an array elementwise."""
        if self.model != "loggp":
            return s
        return np.float64(max(s - 1.0, 0.0)) if isinstance(s, float) else np.maximum(s - 1.0, 0.0)

    def fixed_time(self) -> float:
        """The size-independent part of T(s) on a shaped port: L + 2o (α)."""
        return self.alpha

    def fixed_gap(self) -> float:
        """The size-independent part of S(s) on a shaped port: g (LogGP), α (Hockney)."""
        return self.gap if self.model == "loggp" else self.alpha

    def shaped_time(self, x: Bytes, tokens: Bytes) -> Bytes:
        """D(x, B) = max(x/R, (x − B)·G): until x bytes have left a port holding B tokens (module doc)."""
        return np.maximum(x / self.peak_bandwidth, (x - tokens) * self.gap_per_byte)

    def tokens_after(self, x: Bytes, tokens: Bytes) -> Bytes:
        """Tokens left when x bytes have left a port that held B: min(b, B + D(x, B)/G − x)."""
        return np.minimum(self.burst, tokens + self.shaped_time(x, tokens) / self.gap_per_byte - x)

    def refill(self, tokens: Bytes, seconds: Bytes) -> Bytes:
        """Tokens after `seconds` idle: min(b, B + seconds/G)."""
        return np.minimum(self.burst, tokens + seconds / self.gap_per_byte)

    @property
    def alpha(self) -> float:
        """Hockney start-up α = L + 2o (table: the time of the smallest measured message)."""
        if self.model == "table":
            return self.table_times[0]
        return self.latency + 2.0 * self.overhead

    @property
    def beta(self) -> float:
        """Hockney β = G, seconds per byte (table: the slope of the last measured interval)."""
        return self.gap_per_byte

    def time(self, s: Bytes) -> Bytes:
        """T(s): from the start of a send of `s` bytes to its arrival at the receiver."""
        if self.model == "table":
            x = np.asarray(s, dtype=float)
            sizes, times = self.table_sizes, self.table_times
            out = np.interp(x, sizes, times) + np.maximum(x - sizes[-1], 0.0) * self.gap_per_byte
            return out if np.ndim(out) else float(out)
        if self.shaped:
            return self.alpha + self.shaped_time(self.payload(s), self.burst)
        if self.model == "hockney":
            return self.alpha + self.beta * s
        if self.model == "loggp":
            return self.alpha + self.payload(s) * self.gap_per_byte
        return self.alpha + (self._packets(s) - 1.0) * max(self.gap, self.overhead)

    def spacing(self, s: Bytes) -> Bytes:
        """S(s): least time between the starts of two back-to-back messages at one rank (S ≤ T)."""
        if self.model in ("hockney", "table"):
            return self.time(s)
        if self.shaped:
            return np.maximum(self.overhead, self.gap + self.shaped_time(self.payload(s), self.burst))
        if self.model == "loggp":
            x = self.gap + self.payload(s) * self.gap_per_byte
            return np.float64(max(self.overhead, x)) if isinstance(x, float) else np.maximum(self.overhead, x)
        return self._packets(s) * max(self.gap, self.overhead)

    def slowed(self, factor: float) -> "PointToPoint":
        """The same port with its per-byte time multiplied by `factor` ≥ 1 (a bandwidth share of 1/factor,
        `dlsim.plan.contention`): G·factor, and for LogP packets of w/factor bytes (so that k·max(g, o)
        grows by the same factor), for a shaped port a peak rate R/factor; the start-up terms stay."""
        if factor == 1.0:
            return self
        return replace(self, gap_per_byte=self.gap_per_byte * factor,
                       packet_bytes=self.packet_bytes / factor if self.packet_bytes else 0.0,
                       peak_bandwidth=self.peak_bandwidth / factor,
                       table_times=tuple(self.table_times[0] + (t - self.table_times[0]) * factor
                                         for t in self.table_times))

    def _packets(self, s: Bytes) -> Bytes:
        return np.maximum(np.ceil(np.asarray(s, dtype=float) / self.packet_bytes), 1.0)


def _check_link(link: LinkTier) -> None:
    values = {"latency": link.latency, "bandwidth": link.bandwidth, "overhead": link.overhead, "gap": link.gap,
              "burst": link.burst}
    for key, value in values.items():
        if not np.isfinite(value) or value < 0:
            raise SpecError(f"must be a finite non-negative number, got {value!r}", field=f"link {link.name!r}.{key}")
    if link.bandwidth <= 0:
        raise SpecError("must be positive", field=f"link {link.name!r}.bandwidth")
    if not 0 < link.bandwidth_efficiency <= 1:
        raise SpecError(f"must be in (0, 1], got {link.bandwidth_efficiency!r}",
                        field=f"link {link.name!r}.bandwidth_efficiency")
    if not link.peak_bandwidth > 0:
        raise SpecError("must be positive", field=f"link {link.name!r}.peak_bandwidth")


def p2p_model(link: LinkTier, model: str = "auto") -> PointToPoint:
    """The point-to-point model of `link`: ``hockney``, ``logp``, ``loggp`` or ``auto``.

    ``auto`` is LogGP when the link has an overhead o or gap g, Hockney otherwise (with o = g = 0
    the two differ only by one byte's G). LogP and LogGP need g ≤ L + 2o (see the module doc).
    """
    _check_link(link)
    if model == "auto":
        model = "loggp" if (link.overhead > 0 or link.gap > 0) else "hockney"
    if model == "table":
        raise SpecError("the table model is built from measured times (p2p.table_model), not from a link",
                        field="model")
    if model not in MODELS:
        raise SpecError(f"unknown point-to-point model {model!r} (use {', '.join(MODELS)} or auto)", field="model")
    G = link.gap_per_byte   # 1 / (bandwidth × bandwidth_efficiency)
    if model != "hockney" and link.gap > link.latency + 2 * link.overhead:
        raise SpecError(f"gap g = {link.gap:.3g} s exceeds L + 2o = {link.latency + 2 * link.overhead:.3g} s; "
                        "dlsim's LogP/LogGP collective costs need g <= L + 2o (or use --model hockney)",
                        field=f"link {link.name!r}.gap")
    packet = 0.0
    if model == "logp":
        if link.gap <= 0:
            raise SpecError("LogP needs a gap g > 0 (its packet size is w = g x bandwidth); give a gap or use loggp",
                            field=f"link {link.name!r}.gap")
        packet = link.gap / G
    if link.burst > 0:
        if model == "logp":
            raise SpecError("a token-bucket link (burst) is priced with loggp or hockney, not logp", field="model")
        return PointToPoint(model, link.latency, link.overhead, link.gap, G, packet, link.name,
                            burst=float(link.burst), peak_bandwidth=float(link.peak_bandwidth))
    return PointToPoint(model, link.latency, link.overhead, link.gap, G, packet, link.name)


def table_model(sizes, times, name: str = "") -> PointToPoint:
    """The ``table`` model (module doc) from measured one-way times `times` (s) at `sizes` (bytes)."""
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if s.ndim != 1 or s.shape != t.shape or len(s) < 2:
        raise SpecError("a point-to-point table needs at least two (size, time) points", field="table")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))) or np.any(s < 0) or np.any(t <= 0):
        raise SpecError("table sizes must be finite non-negative bytes and times positive seconds", field="table")
    order = np.argsort(s)
    s, t = s[order], t[order]
    if np.any(np.diff(s) <= 0):
        raise SpecError("table sizes must be distinct", field="table")
    t = np.minimum.accumulate(t[::-1])[::-1]
    slope = (t[-1] - t[-2]) / (s[-1] - s[-2])
    return PointToPoint("table", 0.0, 0.0, 0.0, float(slope), 0.0, name, tuple(float(x) for x in s),
                        tuple(float(x) for x in t))


def hockney_time(n_bytes: Bytes, link: LinkTier) -> Bytes:
    """Hockney α-β time of one message: α + β·n with α = L + 2o, β = 1/bandwidth."""
    return p2p_model(link, "hockney").time(n_bytes)


def loggp_time(n_bytes: Bytes, link: LinkTier) -> Bytes:
    """LogGP time of one message: L + 2o + (n − 1)·G (Alexandrov et al. 1995)."""
    return p2p_model(link, "loggp").time(n_bytes)


def logp_time(n_bytes: Bytes, link: LinkTier) -> Bytes:
    """LogP time of one message sent as ⌈n/w⌉ packets of w = g/G bytes: L + 2o + (k − 1)·max(g, o)."""
    return p2p_model(link, "logp").time(n_bytes)


def burst_time(count: int, n_bytes: Bytes, model: PointToPoint) -> Bytes:
    """Arrival of the last of `count` back-to-back messages of `n_bytes`: (count − 1)·S(n) + T(n).

    For LogGP this is the `(k−1)·max(o, g+(m−1)G) + L + 2o + (m−1)G` of `reference/algorithms.md` §2.1.
    """
    return (count - 1) * model.spacing(n_bytes) + model.time(n_bytes)
