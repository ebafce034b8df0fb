"""What an eager training step pays per ATen operator beyond the operator's own kernel time.

The kernel tables time each operator alone, called back to back (warm), so each row holds the
kernel and one dispatch. An eager step also pays, per operator, the Python and ``nn.Module`` call
around it, autograd's recording of the operator (forward) and the autograd engine's walk to its
backward node (backward), and the operators dlsim prices at nothing (views, transposes, the
``t`` inside ``linear``) — none of which a table row holds. The probe measures that cost directly:

    h_fwd = (T_fwd − Σ_i t_i) / N_fwd,   h_bwd = (T_bwd − Σ_j t_j) / N_bwd

where T_fwd is the eager forward of `HostProbe` (a stack of small, varied layers — linear, layer and
batch norm, 1-D convolution, GELU, ReLU, softmax, tanh, mean, transposes, a copying reshape, adds and
multiplies — on tensors of a few hundred elements, so that kernel work is small next to the host's
share), T_bwd its ``backward()``, N the ATen operators each dispatches (counted by a
``TorchDispatchMode``), and t_i the time of each of those operators replayed alone on the same
arguments, back to back and without autograd (what a table row holds). Minimum over blocks on both
sides (noise on a shared machine only adds time). The prediction charges h per ATen operator an
imported layer dispatches (``host_ops`` of the layer, counted at capture,
`dlsim.importers.torch_export`). The probe is none of the validated networks. torch is imported
inside the functions only.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from dlsim.cost.hostops import QUANTITIES

HOW = ("eager forward of the host probe (8 blocks of 16 small varied layers, batch 2) minus its {n} ATen "
       "operators replayed alone, per operator", "backward of the host probe minus its {n} ATen operators "
       "replayed alone, per operator")


def best_block_mean(fn: Callable[[], Any], calls: int, blocks: int) -> float:
    """Minimum over `blocks` of the mean seconds per call of `calls` back-to-back calls."""
    best = float("inf")
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def _probe(width: int = 32, depth: int = 8) -> Any:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class HostProbe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
            self.ln = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
            self.conv = nn.ModuleList(nn.Conv1d(4, 4, 3, padding=1) for _ in range(depth))
            self.bn = nn.ModuleList(nn.BatchNorm1d(4) for _ in range(depth))

        def forward(self, x: Any) -> Any:  # x (B, 4, width)
            for lin, ln, conv, bn in zip(self.lin, self.ln, self.conv, self.bn):
                y = F.gelu(ln(lin(x)))
                y = y.transpose(1, 2).reshape(x.shape[0], -1).view(x.shape[0], width, 4).transpose(1, 2)
                y = torch.relu(bn(conv(y))) * 0.5 + x
                x = torch.softmax(y, -1).tanh() + y.mean(-1, keepdim=True)
            return x

    torch.manual_seed(0)
    return HostProbe(), torch.randn(2, 4, width)


def _recorded(run: Callable[[], Any]) -> tuple[Any, list]:
    """`run()`'s result and every ATen call it dispatched, as (operator, args, kwargs)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            kwargs = kwargs or {}
            self.calls.append((func, args, kwargs))
            return func(*args, **kwargs)

    rec = Recorder()
    with rec:
        out = run()
    return out, rec.calls


def _replayed(calls: list, reps: int = 100) -> float:
    """Σ over the recorded calls of each one's time alone (back to back, no autograd)."""
    import torch
    with torch.no_grad():
        return sum(best_block_mean(lambda: func(*args, **kwargs), reps, 3) for func, args, kwargs in calls)


def host_op_seconds() -> tuple[float, float, int, int]:
    """(h_fwd, h_bwd, N_fwd, N_bwd): the probe's measured host seconds per ATen operator (module docstring),
    each at least 0."""
    net, x = _probe()
    for _ in range(3):
        net(x).sum().backward()
    fwd = best_block_mean(lambda: net(x), 20, 7)
    step = best_block_mean(lambda: net(x).sum().backward(), 10, 7)
    out, fcalls = _recorded(lambda: net(x))
    loss = out.sum()
    _, bcalls = _recorded(lambda: loss.backward())
    f_alone, b_alone = _replayed(fcalls), _replayed(bcalls)
    h_f = max(fwd - f_alone, 0.0) / len(fcalls)
    h_b = max(step - fwd - b_alone, 0.0) / len(bcalls)
    return h_f, h_b, len(fcalls), len(bcalls)


def host_op_rows(seconds: tuple[float, float, int, int] | None = None, origin: str = "") -> list[dict[str, str]]:
    """device.csv rows (quantity, value, unit, how) of the probe: `seconds` (`host_op_seconds`'s result;
    measured now when None); `origin` is appended to each row's ``how``."""
    h_f, h_b, n_f, n_b = host_op_seconds() if seconds is None else seconds
    return [{"quantity": q, "value": f"{v:.9g}", "unit": "s", "how": how.format(n=n) + (f"; {origin}" if origin else "")}
            for q, v, how, n in zip(QUANTITIES, (h_f, h_b), HOW, (n_f, n_b))]
