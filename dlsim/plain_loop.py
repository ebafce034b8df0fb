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

from dlsim.hostmem import meminfo_bytes
from dlsim.errors import DlsimError


def loss_of(out: Any, target: Any) -> Any:
    import torch.nn.functional as F
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def float_dtype_of(module: Any) -> Any:
    """The dtype of the module's first floating-point parameter (its inputs' dtype), else torch's default."""
    import torch
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.get_default_dtype())


def make_batch(input_shape: Sequence[int], batch: int, tokens: bool, vocab: int, seed: int = 0,
               dtype: Any = None) -> Any:
    """A random batch (batch, *input_shape): token ids below `vocab`, or normal values of `dtype` (default
    torch's); one line, not an allocation failure, when it cannot fit in this host's free memory."""
    import math

    import torch
    full = (batch, *input_shape)
    itemsize = 8 if tokens else torch.empty((), dtype=dtype).element_size()
    need = math.prod(full) * itemsize
    free = meminfo_bytes("MemAvailable")
    if free is not None and need > free:
        raise DlsimError(f"the example input {'x'.join(map(str, full))} needs {need / 2**30:.1f} GiB, more than the "
                         f"{free / 2**30:.1f} GiB available here: use a smaller batch or input shape")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, full, generator=gen) if tokens else torch.randn(full, generator=gen, dtype=dtype)


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
