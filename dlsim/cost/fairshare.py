"""Max-min fair rates of concurrent flows on shared links, by progressive filling.

Every flow f has a cap c_f (the rate it reaches alone: its port's bandwidth) and crosses links ℓ
of capacity C_ℓ. Progressive filling (Bertsekas & Gallager, *Data Networks*, 2nd ed., §6.5.2) raises
all unfrozen flows' rates together from zero; a flow freezes when it reaches its cap or when a link
it crosses fills. With λ the common level of the unfrozen flows, the next level is

    λ' = min( min_{f unfrozen} c_f,  min_ℓ (C_ℓ − Σ_{f frozen on ℓ} r_f) / n_ℓ )

(n_ℓ: unfrozen flows on ℓ); the flows at their cap or on a link that λ' fills freeze at λ'. The
result is the unique max-min fair allocation: no flow can go faster without slowing one that is
no faster. Flows on no shared link, or whose links never fill, get their cap exactly, so a network
whose links cannot be oversubscribed changes no rate. The same inputs give the same rates bit for
bit (flows and links are visited in index order).
"""

from __future__ import annotations

from typing import Sequence

_TIGHT = 1e-12  # a link counts as full when its residual is this fraction of its capacity or less


def fair_rates(paths: Sequence[Sequence[int]], caps: Sequence[float], capacity: Sequence[float]) -> list[float]:
    """The max-min fair rate of each flow (module doc): `paths[f]` the link indices flow f crosses,
    `caps[f]` its rate alone (bytes/s), `capacity[l]` link l's bytes/s."""
    n = len(paths)
    rate = [0.0] * n
    users: dict[int, list[int]] = {}
    for f, path in enumerate(paths):
        for link in path:
            users.setdefault(link, []).append(f)
    live = [f for f in range(n) if paths[f]]
    for f in range(n):
        if not paths[f]:
            rate[f] = caps[f]
    used = {link: 0.0 for link in users}  # bytes/s of frozen flows on each link
    active = {link: len(fs) for link, fs in users.items()}
    frozen = [not paths[f] for f in range(n)]
    while live:
        level = min(caps[f] for f in live)
        for link, count in active.items():
            if count:
                level = min(level, (capacity[link] - used[link]) / count)
        full = {link for link, count in active.items()
                if count and capacity[link] - used[link] - level * count <= _TIGHT * capacity[link]}
        still = []
        for f in live:
            if caps[f] <= level or any(link in full for link in paths[f]):
                rate[f] = min(level, caps[f])
                frozen[f] = True
                for link in paths[f]:
                    used[link] += rate[f]
                    active[link] -= 1
            else:
                still.append(f)
        live = still
    return rate


def slowdown(paths: Sequence[Sequence[int]], caps: Sequence[float], capacity: Sequence[float]) -> float:
    """max_f c_f / r_f ≥ 1: how much slower than alone the slowest of these concurrent flows moves."""
    rates = fair_rates(paths, caps, capacity)
    return max((c / r for c, r in zip(caps, rates) if c > 0), default=1.0)
