"""Convolution methods: work, depth, FLOPs, bytes and workspace of direct, im2col+GEMM, FFT and Winograd.

For each method and each pass (forward y, backward-data ∇x, backward-weight ∇w, the last also called
backward-filter) this module gives:

* ``work`` W and ``depth`` D in the survey's sense (Ben-Nun & Hoefler, "Demystifying Parallel and
  Distributed Deep Learning", ACM CSUR 2019, Table 6 and Appendix B), in the *runtime-multiplicity*
  form: every transform and product the method really performs is counted, with its multiplicity.
  The survey's Table 6 formulas, which count one kernel transform, one data transform, one output
  transform and one product (seeds-inventory §14 items 1-3), are kept separately in `table6_work`
  and `table6_depth` for reproducing the table. Table 6 prints the Winograd tile size as
  α ≡ m − r + 1; its Appendix B.4 defines α = m + r − 1 (input tile; tiles overlap by r − 1), which
  is what is used everywhere here.
* ``flops`` (a multiply-accumulate = 2 FLOP, a complex multiply-accumulate = 8 FLOP, a real FFT of n
  points 2.5·n·log2 n FLOP, the usual "5 n log2 n" complex-FFT convention halved) and the share of
  it that runs as matrix products (``matmul_flops``: GEMM-class work that matrix units can run).
* ``bytes_read`` / ``bytes_written``: compulsory traffic of inputs, weights and outputs plus one
  write and one read of every workspace buffer (a streaming model).
* ``workspace_bytes``: the temporary buffers of the method, listed one by one in ``buffers``. They are
  the buffers of dlsim's NumPy reference implementations (`dlsim.calibrate.conv_numpy`, which carve
  exactly these from one workspace arena) and have the asymptotic shape of cuDNN's algorithms: im2col
  O(N·C_in·K_y·K_x·H'·W'), FFT O((N·C_in + C_in·C_out + N·C_out)·bins), Winograd
  O(α²·(C_in·C_out + (C_in + C_out)·tiles)). Direct convolution (the survey's Algorithm 3: every
  output a private reduction, as GPU direct / implicit-GEMM kernels run it) needs none; the NumPy
  reference runs it as K_y·K_x shifted GEMMs per sample and needs one sample's scratch
  (``implementation="numpy"``).

Shapes follow the survey (Appendix B): x is N×C_in×H×W, w is C_out×(C_in/g)×K_y×K_x, y is
N×C_out×H'×W', with H' = ⌊(H + 2P − d(K − 1) − 1)/S⌋ + 1. FFT and Winograd need stride 1,
dilation 1 and one group; Winograd also a square kernel (r = K_y = K_x).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dlsim.cost.workdepth import clog2

METHODS = ("direct", "im2col", "fft", "winograd")
PASSES = ("forward", "backward_data", "backward_weight")
WINOGRAD_M = 2
"""Output tile m of Winograd F(m×m, r×r) unless told otherwise (F(2×2, 3×3), Lavin & Gray, CVPR 2016)."""


def _pair(value: int | tuple[int, int] | list[int], what: str) -> tuple[int, int]:
    a, b = (value, value) if isinstance(value, int) else tuple(value)
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int) or not isinstance(b, int):
        raise ValueError(f"{what} must be an integer or a pair of integers, got {value!r}")
    return a, b


@dataclass(frozen=True)
class ConvGeometry:
    """A 2-D convolution for a batch of `n` samples (all plain integers)."""

    n: int
    c_in: int
    h: int
    w: int
    c_out: int
    k_h: int
    k_w: int
    stride_h: int = 1
    stride_w: int = 1
    pad_h: int = 0
    pad_w: int = 0
    dil_h: int = 1
    dil_w: int = 1
    groups: int = 1

    @property
    def h_out(self) -> int:
        return (self.h + 2 * self.pad_h - self.dil_h * (self.k_h - 1) - 1) // self.stride_h + 1

    @property
    def w_out(self) -> int:
        return (self.w + 2 * self.pad_w - self.dil_w * (self.k_w - 1) - 1) // self.stride_w + 1

    @property
    def pointwise(self) -> bool:
        """A 1×1, stride-1, unpadded convolution: x itself is its im2col matrix."""
        return self.k_h == self.k_w == 1 and self.stride_h == self.stride_w == 1 and self.pad_h == self.pad_w == 0

    @property
    def macs(self) -> int:
        """Multiply-accumulates of any pass: N·C_out·H'·W'·(C_in/g)·K_y·K_x (Table 6, direct)."""
        return self.n * self.c_out * self.h_out * self.w_out * (self.c_in // self.groups) * self.k_h * self.k_w

    @property
    def signature(self) -> str:
        """A name for the per-sample shape, the same for identical layers (μ-cuDNN keys its cache so)."""
        return (f"conv{self.c_in}x{self.h}x{self.w}-{self.c_out}-k{self.k_h}x{self.k_w}-s{self.stride_h}x{self.stride_w}"
                f"-p{self.pad_h}x{self.pad_w}-d{self.dil_h}x{self.dil_w}-g{self.groups}")

    def with_batch(self, n: int) -> "ConvGeometry":
        return replace(self, n=n)


def conv_geometry(n: int, c_in: int, h: int, w: int, c_out: int, k_h: int, k_w: int, stride: int | tuple = 1,
                  padding: int | tuple = 0, dilation: int | tuple = 1, groups: int = 1) -> ConvGeometry:
    """A validated `ConvGeometry` from plain numbers (pairs allowed for stride, padding, dilation)."""
    sh, sw = _pair(stride, "stride")
    ph, pw = _pair(padding, "padding")
    dh, dw = _pair(dilation, "dilation")
    for v, what in ((n, "n"), (c_in, "c_in"), (h, "h"), (w, "w"), (c_out, "c_out"), (k_h, "k_h"), (k_w, "k_w"),
                    (sh, "stride"), (sw, "stride"), (dh, "dilation"), (dw, "dilation"), (groups, "groups")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{what} must be a positive integer, got {v!r}")
    if ph < 0 or pw < 0:
        raise ValueError(f"padding must be non-negative, got {padding!r}")
    if c_in % groups or c_out % groups:
        raise ValueError(f"groups={groups} must divide c_in={c_in} and c_out={c_out}")
    geom = ConvGeometry(n, c_in, h, w, c_out, k_h, k_w, sh, sw, ph, pw, dh, dw, groups)
    if geom.h_out < 1 or geom.w_out < 1:
        raise ValueError(f"kernel {k_h}x{k_w} does not fit input {h}x{w} with padding {padding}")
    return geom


def geometry_from_dict(d: dict) -> ConvGeometry:
    """From the ``conv`` dict of `dlsim.cost.layers.LayerCost` (keys n, c_in, h, w, c_out, k_h, k_w, ...)."""
    return conv_geometry(d["n"], d["c_in"], d["h"], d["w"], d["c_out"], d["k_h"], d["k_w"], tuple(d["stride"]),
                         tuple(d["padding"]), tuple(d["dilation"]), d["groups"])


def winograd_alpha(m: int, r: int) -> int:
    """Input tile size of F(m×m, r×r): α = m + r − 1 (survey Appendix B.4; Table 6's m − r + 1 is a typo)."""
    return m + r - 1


def fast_len(n: int) -> int:
    """The smallest 5-smooth integer (2^a·3^b·5^c) ≥ n: an FFT length pocketfft/cuFFT run fast."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            v = p35
            while v < n:
                v *= 2
            best = min(best, v)
            p35 *= 3
        p5 *= 5
    return best


def fft_size(g: ConvGeometry) -> tuple[int, int]:
    """FFT lengths (H_f, W_f) for the padded circular correlation: the smallest fast length ≥ max(H + P, H', K).

    With the kernel placed at offsets (u − P) mod H_f, a circular correlation of that length equals the
    zero-padded linear one on every output (indices i − P + u stay in [−P, H + P − 1]).
    """
    return (fast_len(max(g.h + g.pad_h, g.h_out, g.k_h)), fast_len(max(g.w + g.pad_w, g.w_out, g.k_w)))


def winograd_tiles(g: ConvGeometry, pass_name: str, m: int = WINOGRAD_M) -> int:
    """P = N·⌈H_o/m⌉·⌈W_o/m⌉ tiles, H_o×W_o the output of the pass's convolution (∇x: H×W)."""
    ho, wo = (g.h, g.w) if pass_name == "backward_data" else (g.h_out, g.w_out)
    return g.n * -(-ho // m) * -(-wo // m)


def applicable(method: str, g: ConvGeometry) -> str | None:
    """None if `method` can compute this convolution, else the reason it cannot."""
    if method not in METHODS:
        raise ValueError(f"unknown convolution method {method!r} (use {', '.join(METHODS)})")
    if method in ("direct", "im2col"):
        return None
    if (g.stride_h, g.stride_w, g.dil_h, g.dil_w) != (1, 1, 1, 1):
        return f"{method} needs stride 1 and dilation 1"
    if g.groups != 1:
        return f"{method} needs groups=1"
    if method == "winograd":
        if g.k_h != g.k_w or g.k_h not in (2, 3, 4, 5):
            return "winograd needs a square kernel of size 2 to 5"
        if g.pad_h >= g.k_h or g.pad_w >= g.k_w:
            return "winograd needs padding smaller than the kernel"
    return None


@dataclass(frozen=True)
class Buffer:
    """One workspace buffer: `elements` values, complex ones counting twice."""

    name: str
    elements: int
    complex: bool = False

    def nbytes(self, dtype_bytes: int) -> int:
        return self.elements * dtype_bytes * (2 if self.complex else 1)


@dataclass(frozen=True)
class MethodPassCost:
    """Cost of one pass of one convolution method for the geometry's batch."""

    method: str
    pass_name: str
    work: float
    depth: int
    flops: float
    matmul_flops: float
    bytes_read: float
    bytes_written: float
    workspace_bytes: int
    buffers: tuple[Buffer, ...]
    kernels: int

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


def workspace_buffers(method: str, pass_name: str, g: ConvGeometry, m: int = WINOGRAD_M, *,
                      implementation: str = "survey") -> tuple[Buffer, ...]:
    """The temporary buffers of `method` for `pass_name` (see the module docstring); empty ones are left out.

    direct (Appendix B.1): none (``implementation="survey"``); the NumPy reference
    (``implementation="numpy"``) runs it as K_y·K_x shifted GEMMs per sample ("kn2row") with the weights re-laid out
    per kernel offset (K·C_out·C_in), one sample's shifted input slice (C_in·H'W'), one sample's
    partial product (C_out·H'W' forward; C_out·C_in for ∇w); ∇x needs the transposed weights and one
    sample's partial ∇x columns (C_in·H'W').
    im2col (Appendix B.2): the lowered matrix of the whole batch, N·C_in·K·H'·W' (none when x itself is
    that matrix, 1×1 stride 1 unpadded); ∇w adds one C_out×C_in·K product.
    FFT (Appendix B.3; Vasilache et al. ICLR 2015): the padded input / gradient (H_f·W_f per channel and
    sample), their spectra (H_f·(W_f/2+1) complex bins), the placed kernel and its spectrum
    (C_in·C_out planes) and the output spectrum and its inverse.
    Winograd F(m×m, r×r) (Appendix B.4; Lavin & Gray 2016): kernel re-layout, G·w (α·r) and U (α²) per
    (C_out, C_in); gathered and transformed tiles B^T·d·B (2·α² per channel and tile); the α² products
    M (α² per output channel and tile); A^T·M (m·α) and A^T·M·A (m²); ∇w runs F(r×r, m×m) on the
    same α and keeps the gradient tiles (m², α·m, α² per C_out and tile) and the α² products
    (C_out·C_in) with their transforms (r·α, r²).
    """
    if pass_name not in PASSES:
        raise ValueError(f"unknown pass {pass_name!r} (use {', '.join(PASSES)})")
    reason = applicable(method, g)
    if reason:
        raise ValueError(reason)
    n, ci, co = g.n, g.c_in, g.c_out
    kk, hw_out = g.k_h * g.k_w, g.h_out * g.w_out
    wk = co * (ci // g.groups) * kk
    if implementation not in ("survey", "numpy"):
        raise ValueError(f"unknown implementation {implementation!r} (use survey or numpy)")
    if method == "direct" and implementation == "survey":
        bufs = []
    elif method == "direct":
        slice_ = 0 if g.pointwise else ci * hw_out
        if pass_name == "forward":
            bufs = [Buffer("weights_by_offset", wk if kk > 1 else 0), Buffer("input_slice", slice_),
                    Buffer("partial_output", co * hw_out if kk > 1 else 0)]
        elif pass_name == "backward_data":
            bufs = [Buffer("weights_transposed", wk), Buffer("input_grad_columns", slice_)]
        else:
            bufs = [Buffer("weight_grad_by_offset", wk), Buffer("input_slice", slice_),
                    Buffer("partial_weight_grad", co * (ci // g.groups))]
    elif method == "im2col":
        cols = 0 if g.pointwise else n * ci * kk * hw_out
        bufs = [Buffer("columns", cols)]
        if pass_name == "backward_weight":
            bufs.append(Buffer("partial_weight_grad", wk))
    elif method == "fft":
        hf, wf = fft_size(g)
        bins = hf * (wf // 2 + 1)
        c_src, c_dst = {"forward": (ci, co), "backward_data": (co, ci), "backward_weight": (ci, co)}[pass_name]
        if pass_name == "backward_weight":
            bufs = [Buffer("input_padded", hf * wf * n * ci), Buffer("input_spectrum", bins * n * ci, True),
                    Buffer("grad_padded", hf * wf * n * co), Buffer("grad_spectrum", bins * n * co, True),
                    Buffer("kernel_grad_spectrum", bins * ci * co, True), Buffer("kernel_grad_planes", hf * wf * ci * co)]
        else:
            bufs = [Buffer("kernel_planes", hf * wf * ci * co), Buffer("kernel_spectrum", bins * ci * co, True),
                    Buffer("source_padded", hf * wf * n * c_src), Buffer("source_spectrum", bins * n * c_src, True),
                    Buffer("result_spectrum", bins * n * c_dst, True), Buffer("result_planes", hf * wf * n * c_dst)]
    else:
        r, a = g.k_h, winograd_alpha(m, g.k_h)
        p = winograd_tiles(g, pass_name, m)
        c_src, c_dst = (co, ci) if pass_name == "backward_data" else (ci, co)
        if pass_name == "backward_weight":
            bufs = [Buffer("input_tiles", a * a * ci * p), Buffer("input_tiles_half", a * a * ci * p),
                    Buffer("grad_tiles", m * m * co * p), Buffer("grad_tiles_half", a * m * co * p),
                    Buffer("grad_tiles_transformed", a * a * co * p), Buffer("products", a * a * co * ci),
                    Buffer("products_half", r * a * co * ci), Buffer("weight_grad_tiles", r * r * co * ci)]
        else:
            bufs = [Buffer("kernel_layout", r * r * ci * co), Buffer("kernel_half", a * r * ci * co),
                    Buffer("kernel_transformed", a * a * ci * co), Buffer("tiles", a * a * c_src * p),
                    Buffer("tiles_half", a * a * c_src * p), Buffer("products", a * a * c_dst * p),
                    Buffer("output_half", m * a * c_dst * p), Buffer("output_tiles", m * m * c_dst * p)]
    return tuple(b for b in bufs if b.elements > 0)


def _fft_flops(points: int) -> float:
    """2.5·n·log2 n: a real-input FFT of n points (half the 5·n·log2 n complex-FFT count)."""
    return 2.5 * points * math.log2(points) if points > 1 else 0.0


def method_pass_cost(method: str, pass_name: str, g: ConvGeometry, dtype_bytes: int = 4, *,
                     m: int = WINOGRAD_M, fft_c: float = 1.0, implementation: str = "survey") -> MethodPassCost:
    """Runtime-multiplicity cost of one pass of `method` on geometry `g` (batch `g.n`).

    Work W (inner statements, a MAC = 1) and depth D per pass, with S002 Table 4/6 and Appendix B:

    * direct / im2col: W = N·C_out·H'·W'·(C_in/g)·K_y·K_x for all three passes (im2col's lowering is
      layout only, B.2); D_y = ⌈log2 C_in⌉ + ⌈log2 K_y⌉ + ⌈log2 K_x⌉ (im2col: ⌈log2 C_in·K_y·K_x⌉),
      D_∇x the same over C_out, D_∇w = ⌈log2 N⌉ + ⌈log2 H'⌉ + ⌈log2 W'⌉ (Table 4).
    * FFT: W = c·H_f W_f log2(H_f W_f)·(#transforms) + bins·(product MACs), with the transforms of
      the pass (y: C_out·C_in kernels, N·C_in inputs, N·C_out inverses; ∇x: C_out·C_in, N·C_out,
      N·C_in; ∇w: N·C_in, N·C_out, C_out·C_in inverses) and bins = H_f·(W_f/2 + 1) complex
      products of C_out·C_in·N MACs; D = 2⌈log2 H_f W_f⌉ + ⌈log2 (reduced dim)⌉ (B.3).
    * Winograd F(m×m, r×r), α = m + r − 1, P tiles: W = C_out·C_in·(r²α + α²r) + P·C_in·2α³
      + C_out·P·(α²m + m²α) + α²·C_out·C_in·P (B.4 with multiplicities);
      D = 2⌈log2 r⌉ + 4⌈log2 α⌉ + ⌈log2 (reduced dim)⌉. ∇x is F(m, r) on ∇y with the flipped kernel;
      ∇w is F(r×r, m×m) over N·tiles (the same α).
    """
    reason = applicable(method, g)
    if reason:
        raise ValueError(reason)
    bufs = workspace_buffers(method, pass_name, g, m, implementation=implementation)
    ws = sum(b.nbytes(dtype_bytes) for b in bufs)
    n, ci, co, ho, wo = g.n, g.c_in, g.c_out, g.h_out, g.w_out
    x_el, y_el, w_el = n * ci * g.h * g.w, n * co * ho * wo, co * (ci // g.groups) * g.k_h * g.k_w
    reads, writes = {"forward": (x_el + w_el, y_el), "backward_data": (y_el + w_el, x_el),
                     "backward_weight": (x_el + y_el, w_el)}[pass_name]
    reduce_over = {"forward": ci // g.groups, "backward_data": co // g.groups, "backward_weight": n}[pass_name]
    kernels = 1
    if method in ("direct", "im2col"):
        work = float(g.macs)
        flops, matmul = 2.0 * g.macs, (2.0 * g.macs if method == "im2col" else 0.0)
        if pass_name == "backward_weight":
            depth = clog2(n) + clog2(ho) + clog2(wo)
        elif method == "im2col":
            depth = clog2(reduce_over * g.k_h * g.k_w)
        else:
            depth = clog2(reduce_over) + clog2(g.k_h) + clog2(g.k_w)
        kernels = 1 if method == "direct" or g.pointwise else 2
    elif method == "fft":
        hf, wf = fft_size(g)
        plane, bins = hf * wf, hf * (wf // 2 + 1)
        transforms = {"forward": co * ci + n * ci + n * co, "backward_data": co * ci + n * co + n * ci,
                      "backward_weight": n * ci + n * co + co * ci}[pass_name]
        cmacs = bins * co * ci * n
        work = fft_c * plane * math.log2(plane) * transforms + cmacs
        matmul = 8.0 * cmacs
        flops = transforms * _fft_flops(plane) + matmul
        depth = 2 * clog2(plane) + clog2(reduce_over)
        kernels = 4
    else:
        r, a = g.k_h, winograd_alpha(m, g.k_h)
        p = winograd_tiles(g, pass_name, m)
        if pass_name == "backward_weight":   # F(r×r, m×m): data α×α, gradient m×m → α×α, output α×α → r×r
            transforms = ci * p * 2 * a ** 3 + co * p * (m * m * a + a * a * m) + co * ci * (a * a * r + r * r * a)
            cmacs = a * a * co * ci * p
        else:
            c_src, c_dst = (co, ci) if pass_name == "backward_data" else (ci, co)
            transforms = co * ci * (r * r * a + a * a * r) + p * c_src * 2 * a ** 3 + c_dst * p * (a * a * m + m * m * a)
            cmacs = a * a * co * ci * p
        work = float(transforms + cmacs)
        matmul = 2.0 * cmacs
        flops = 2.0 * transforms + matmul
        depth = 2 * clog2(r) + 4 * clog2(a) + clog2(reduce_over)
        kernels = 4
    traffic = 2 * ws
    return MethodPassCost(method, pass_name, work, depth, flops, matmul, reads * dtype_bytes + traffic / 2,
                          writes * dtype_bytes + traffic / 2, ws, bufs, kernels)


def conv_method_costs(n: int, c_in: int, h: int, w: int, c_out: int, k_h: int, k_w: int, stride: int | tuple = 1,
                      padding: int | tuple = 0, dilation: int | tuple = 1, groups: int = 1, dtype_bytes: int = 4, *,
                      m: int = WINOGRAD_M, implementation: str = "survey") -> dict[str, dict[str, MethodPassCost]]:
    """Every applicable method's cost per pass: ``{method: {pass: MethodPassCost}}`` (plain-number signature)."""
    g = conv_geometry(n, c_in, h, w, c_out, k_h, k_w, stride, padding, dilation, groups)
    return {meth: {p: method_pass_cost(meth, p, g, dtype_bytes, m=m, implementation=implementation) for p in PASSES}
            for meth in METHODS if applicable(meth, g) is None}


def table6_work(method: str, n: int, c_in: int, h: int, w: int, c_out: int, k_y: int, k_x: int,
                h_out: int | None = None, w_out: int | None = None, *, m: int = WINOGRAD_M, c: float = 1.0) -> float:
    """Forward work exactly as the survey's Table 6 writes it (S002 L462-471), for reproducing the table.

    direct, im2col: N·C_out·H'·W'·C_in·K_y·K_x;
    fft: c·HW·log2(HW)·(C_out·C_in + N·C_in + N·C_out) + HW·N·C_in·C_out (c: the FFT's hidden constant);
    winograd: α(r² + αr + 2α² + αm + m²) + C_out·C_in·P with α = m + r − 1 (Appendix B.4, not the
    table's m − r + 1), r = K_y, P = N·⌈H/m⌉·⌈W/m⌉. It counts one transform of each kind; use
    `method_pass_cost` for the work actually performed.
    """
    ho, wo = h_out or h, w_out or w
    if method in ("direct", "im2col"):
        return float(n * c_out * ho * wo * c_in * k_y * k_x)
    if method == "fft":
        hw = h * w
        return c * hw * math.log2(hw) * (c_out * c_in + n * c_in + n * c_out) + hw * n * c_in * c_out
    if method == "winograd":
        r, a = k_y, winograd_alpha(m, k_y)
        p = n * -(-h // m) * -(-w // m)
        return float(a * (r * r + a * r + 2 * a * a + a * m + m * m) + c_out * c_in * p)
    raise ValueError(f"unknown convolution method {method!r}")


def table6_depth(method: str, c_in: int, h: int, w: int, k_y: int, k_x: int, *, m: int = WINOGRAD_M) -> int:
    """Forward depth as Table 6 writes it: direct/im2col ⌈log2 C_in⌉ + ⌈log2 K_y⌉ + ⌈log2 K_x⌉;
    FFT 2⌈log2 HW⌉ + ⌈log2 C_in⌉; Winograd 2⌈log2 r⌉ + 4⌈log2 α⌉ + ⌈log2 C_in⌉ (α = m + r − 1)."""
    if method in ("direct", "im2col"):
        return clog2(c_in) + clog2(k_y) + clog2(k_x)
    if method == "fft":
        return 2 * clog2(h * w) + clog2(c_in)
    if method == "winograd":
        return 2 * clog2(k_y) + 4 * clog2(winograd_alpha(m, k_y)) + clog2(c_in)
    raise ValueError(f"unknown convolution method {method!r}")
