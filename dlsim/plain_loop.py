"""The plain training loop a PyTorch user writes, ready for timed steps.

One step::

    opt.zero_grad(set_to_none=True); out = net(x); loss = F.cross_entropy(out.reshape(-1, C), y)
    loss.backward(); opt.step()

The loss is cross-entropy over the output's last dimension C, with random targets; the optimizer is
the caller's (`make_optimizer`). Validation times users' modules with it (`dlsim.validate.torch_loop`);
the calibration's loop probe its probe networks (`dlsim.calibrate.loop_probe`). torch is imported
inside the functions only.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from dlsim.errors import DlsimError


def loss_of(out: Any, target: Any) -> Any:
    import torch.nn.functional as F
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def make_batch(input_shape: Sequence[int], batch: int, tokens: bool, vocab: int, seed: int = 0) -> Any:
    import torch
    gen = torch.Generator().manual_seed(seed)
    full = (batch, *input_shape)
    return torch.randint(0, vocab, full, generator=gen) if tokens else torch.randn(full, generator=gen)


class PlainLoop:
    """The module, its batch, random targets and optimizer, ready for timed steps."""

    def __init__(self, module: Any, x: Any, optimizer: str, make_optimizer: Callable[[str, Any], tuple[Any, str]],
                 seed: int = 0):
        import torch
        torch.manual_seed(seed)
        self.net, self.x = module.train(), x
        with torch.no_grad():
            out = self.net(x)
        if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.dim() < 2:
            raise DlsimError("the module's output must be one floating-point tensor (batch, ..., classes) to train "
                             "with cross-entropy")
        gen = torch.Generator().manual_seed(seed)
        self.target = torch.randint(0, out.shape[-1], out.shape[:-1], generator=gen)
        self.opt, self.impl = make_optimizer(optimizer, self.net.parameters())
        self.threads = torch.get_num_threads()

    def step(self) -> tuple[float, float, float]:
        clock = time.perf_counter
        t0 = clock()
        self.opt.zero_grad(set_to_none=True)
        loss = loss_of(self.net(self.x), self.target)
        t1 = clock()
        loss.backward()
        t2 = clock()
        self.opt.step()
        return t1 - t0, t2 - t1, clock() - t2
