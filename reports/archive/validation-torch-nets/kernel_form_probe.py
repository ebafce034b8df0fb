"""Three ways the tables had mistimed kernels (issue 15, session 12; a diagnosis, not a benchmark).

* GELU's exact form (x·Φ(x), erf: PyTorch's default) against its tanh approximation, over 32 × 8 × 8 × 128
  fp32 elements, forward and autograd backward;
* a depthwise 7×7 convolution (ConvNeXt's) with its input stored NCHW against channels-last (NHWC, what a
  permute back from a channels-last LayerNorm leaves), forward and autograd backward, at 32 × 32 × 8 × 8 and
  32 × 64 × 4 × 4;
* causal scaled dot-product attention (CPU flash kernel) over 16 × 4 × 32 × 32, forward and autograd backward,
  before and after ``torch.set_num_threads`` with the count already in use (last: it stays slow).

Back to back, the best of 5 blocks of 20-50 calls, PyTorch's default threads. Prints one JSON record (µs).
Findings: reports/validation-torch-nets-notes.md ("Session 12").

Usage: flock -x /tmp/w/cpu.lock python reports/archive/validation-torch-nets/kernel_form_probe.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from dlsim.calibrate.host_ops import best_block_mean  # noqa: E402


def best_us(fn, calls: int = 20) -> float:  # noqa: ANN001
    """Microseconds per call: the best of 5 blocks of `calls` back-to-back calls."""
    fn()
    return round(best_block_mean(fn, calls, 5) * 1e6, 1)


def main() -> None:
    import torch
    import torch.nn.functional as F

    out: dict = {"threads": torch.get_num_threads(), "gelu": {}, "depthwise_7x7": {}}
    x = torch.randn(32, 8, 8, 128, requires_grad=True)
    for form in ("none", "tanh"):
        y = F.gelu(x, approximate=form)
        dy = torch.randn_like(y)
        out["gelu"][form] = {"forward": best_us(lambda: F.gelu(x, approximate=form), 50),
                             "backward": best_us(lambda: torch.autograd.grad(y, [x], dy, retain_graph=True), 50)}
    for channels, side in ((32, 8), (64, 4)):
        conv = torch.nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        row = {}
        for name, layout in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
            xi = torch.randn(32, channels, side, side).to(memory_format=layout).requires_grad_()
            y = conv(xi)
            dy = torch.randn_like(y)
            row[name] = {"forward": best_us(lambda: conv(xi)),
                         "backward": best_us(lambda: torch.autograd.grad(y, [xi, *conv.parameters()], dy,
                                                                         retain_graph=True))}
        out["depthwise_7x7"][f"32x{channels}x{side}x{side}"] = row
    q, k, v = (torch.randn(16, 4, 32, 32, requires_grad=True) for _ in range(3))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dy = torch.randn_like(y)
    out["sdpa_causal"] = {}
    for when in ("before", "after_set_num_threads"):
        if when != "before":
            torch.set_num_threads(torch.get_num_threads())
        out["sdpa_causal"][when] = {
            "forward": best_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 50),
            "backward": best_us(lambda: torch.autograd.grad(y, [q, k, v], dy, retain_graph=True), 50)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
