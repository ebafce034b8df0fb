"""μ-cuDNN's micro-batch size policies (Oyama et al., CLUSTER 2018; spcl/ucudnn src/optimizer.cpp
``batchSizePolicyToBatchSizes``): which micro-batch sizes are benchmarked and may be used."""

from __future__ import annotations

from dlsim.errors import SpecError

POLICIES = ("undivided", "powerOfTwo", "all")


def batch_sizes(policy: str, batch: int) -> tuple[int, ...]:
    """S(policy, B), ascending: undivided {B}; powerOfTwo {1, 2, 4, …, 2^⌊lg B⌋} ∪ {B}; all {1, …, B}."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise SpecError(f"batch must be a positive integer, got {batch!r}", field="batch")
    if policy == "undivided":
        return (batch,)
    if policy == "powerOfTwo":
        sizes = {1 << k for k in range(batch.bit_length()) if 1 << k <= batch}
        return tuple(sorted(sizes | {batch}))
    if policy == "all":
        return tuple(range(1, batch + 1))
    raise SpecError(f"unknown micro-batch policy {policy!r} (use {', '.join(POLICIES)})", field="policy")
