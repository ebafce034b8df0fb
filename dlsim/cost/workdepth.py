"""Work-depth primitives of the survey (Ben-Nun & Hoefler 2018, §2.5, Table 4, Appendix A/B).

Work W counts the inner statements of an operator (one multiply-accumulate, comparison or
element update = 1); depth D is the longest dependency chain, where a reduction of n values
has depth ceil(log2 n). FLOPs (for timing) count a multiply-accumulate as 2.
"""

from __future__ import annotations

import math


def clog2(n: float) -> int:
    """ceil(log2 n) for n >= 1: the depth of a balanced reduction tree over n values (0 for n <= 1)."""
    return 0 if n <= 1 else math.ceil(math.log2(n) - 1e-12)


def conv_direct_work(n: int, c_out: int, h_out: int, w_out: int, c_in: int, k_y: int, k_x: int) -> int:
    """Direct/im2col convolution work, survey Table 6: W = N·C_out·H'·W'·C_in·K_y·K_x."""
    return n * c_out * h_out * w_out * c_in * k_y * k_x


def conv_direct_depth(c_in: int, k_y: int, k_x: int) -> int:
    """Direct convolution depth, survey Table 6: D = ⌈log2 C_in⌉ + ⌈log2 K_y⌉ + ⌈log2 K_x⌉."""
    return clog2(c_in) + clog2(k_y) + clog2(k_x)


def conv_im2col_depth(c_in: int, k_y: int, k_x: int) -> int:
    """im2col GEMM depth, survey Appendix B.2: D = ⌈log2(C_in·K_y·K_x)⌉ (one reduction over the patch)."""
    return clog2(c_in * k_y * k_x)


def fc_work(n: int, c_in: int, c_out: int) -> int:
    """Fully connected work, survey Table 4: W = C_out·C_in·N for y, ∇w and ∇x alike."""
    return n * c_in * c_out


def fc_depths(n: int, c_in: int, c_out: int) -> tuple[int, int, int]:
    """Fully connected depths (y, ∇x, ∇w), survey Table 4: ⌈log2 C_in⌉, ⌈log2 C_out⌉, ⌈log2 N⌉."""
    return clog2(c_in), clog2(c_out), clog2(n)


def pool_work_survey(h: int, k: int, c: int) -> int:
    """Pooling work as the survey's LeNet-5 example counts it (S002 L380): (K²−1)·H·H·C of the input.

    The example's W_pool(28, 2, 6) = 14,112 and W_pool(10, 2, 16) = 4,800 are reproduced by this
    form; it is kept only to reproduce the survey (see seeds-inventory §1.6); dlsim's own pooling
    cost counts one comparison per window element of every output.
    """
    return (k * k - 1) * h * h * c


def pool_depth(k_y: int, k_x: int) -> int:
    """Pooling depth, survey Table 4: ⌈log2 K_x⌉ + ⌈log2 K_y⌉ (the table's "log K_u" is a typo for K_y)."""
    return clog2(k_y) + clog2(k_x)
