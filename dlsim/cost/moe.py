"""A mixture-of-experts layer's cost per pass, as its busiest rank runs it under expert parallelism
(routing imbalance and capacity from `dlsim.cost.moe_routing`). Conventions as in `dlsim.cost.layers`.
"""

from __future__ import annotations


from dlsim.cost.layercost import ACTIVATION_FLOPS, GLU_FLOPS, INDEX_BYTES, Gemm, LayerCost, PassCost, elementwise, without_gemms
from dlsim.cost.moe_routing import routing
from dlsim.cost.workdepth import clog2
from dlsim.spec.model import Layer


ROUTER_BYTES = 4  # router logits, probabilities and the auxiliary loss's statistics are kept in fp32
MOE_ROUTED_GEMMS = 3
"""A `moe` pass lists its router GEMM, the routed experts' up and down GEMMs, then the shared experts'."""


def moe_cost(layer: Layer, n: int, b: int, ep: int = 1) -> LayerCost:
    """Mixture-of-experts layer (Shazeer et al. 2017; GShard; Switch Transformer, Fedus et al. 2022;
    DeepSeekMoE, Dai et al. 2024, for shared and fine-grained experts) on the busiest of `ep` expert
    ranks, R = N·L tokens of width D, E experts of width F, top-k, S shared experts of width F_s:

    * router: GEMM (R, E, D), softmax over R·E scores (5 FLOP/element, fp32) and top-k selection
      (one pass over the scores); with `aux_loss` the load-balancing loss (Switch eq. 4:
      α·E·Σ_i f_i·P_i: per score a count and a mean, 2 FLOP/element);
    * permute: the R·k routed copies of the tokens gathered into expert order (a copy);
    * routed experts: on this rank E/ep experts, each a GEMM (t, m·F, D) up (m = 2 gated, 1 otherwise),
      the activation and (t, D, F) down, t = ⌈u·R·k / (E/ep)⌉ rows (`dlsim.cost.moe_routing`:
      u = the busiest rank's load over the mean, capped by the capacity factor) — balanced, the same
      FLOPs as all E experts over the R·k pairs at ep = 1;
    * unpermute: the k outputs of each token scaled by its gates and summed (2 FLOP per element);
    * shared experts: GEMMs (R, m·S·F_s, D) and (R, D, S·F_s) on every token.

    ∇x and ∇w repeat the GEMM volumes (as `_linear`); the router's ∇x includes the softmax's.
    Fine-grained experts (DeepSeekMoE) are many experts of small F with a larger k: the same formulas.
    Kept for the backward pass: the input, the router's probabilities (fp32) and indices, the
    permuted tokens, each expert's up-projection output and activation, the shared experts' likewise.
    """
    a, (steps, d) = layer.attrs, layer.in_shapes[0]
    rows = n * steps
    r = routing(a, rows, ep)
    e, k, f = r.experts, r.top_k, a["ffn_hidden"]
    gated = a["activation"] in ("swiglu", "geglu")
    up = (2 if gated else 1) * f
    local, t = r.local_experts, r.rows_per_expert
    pairs = t * local
    fs = (a["shared_ffn_hidden"] or f) * a["shared_experts"]
    ups = (2 if gated else 1) * fs
    fwd_g = [Gemm(rows, e, d), Gemm(t, up, d, local), Gemm(t, d, f, local)]
    bx_g = [Gemm(rows, d, e), Gemm(t, f, d, local), Gemm(t, d, up, local)]
    bw_g = [Gemm(e, d, rows), Gemm(d, f, t, local), Gemm(up, d, t, local)]
    if fs:
        fwd_g += [Gemm(rows, ups, d), Gemm(rows, d, fs)]
        bx_g += [Gemm(rows, fs, d), Gemm(rows, d, ups)]
        bw_g += [Gemm(d, fs, rows), Gemm(ups, d, rows)]
    scores = rows * e
    act = a["activation"]
    act_f, act_b = GLU_FLOPS[act] if gated else ACTIVATION_FLOPS[act]
    act_elems = pairs * f + rows * fs
    bias = (pairs * (up + d) + rows * (ups + d if fs else 0)) if a["bias"] else 0
    fwd_parts = [("softmax", "forward", elementwise(scores, ROUTER_BYTES, 5 + (2 if a["aux_loss"] else 0),
                                                      depth=2 * clog2(e))),
                 ("relu", "forward", elementwise(pairs * d, b, 0)),  # permute: gather in expert order
                 (act, "forward", elementwise(act_elems, b, act_f, reads=2 if gated else 1)),
                 ("add", "forward", elementwise(pairs * d, b, 2, reads=2))]  # unpermute, gate and sum
    bwd_parts = [("add", "forward", elementwise(pairs * d, b, 2, reads=2)),
                 (act, "backward_data", elementwise(act_elems, b, act_b, reads=3 if gated else 2,
                                                     writes=2 if gated else 1)),
                 ("relu", "forward", elementwise(pairs * d, b, 0)),
                 ("softmax", "backward_data", elementwise(scores, ROUTER_BYTES, 4 + (2 if a["aux_loss"] else 0), reads=2))]
    elementwise_f = sum(p[2].flops for p in fwd_parts) + bias
    elementwise_b = sum(p[2].flops for p in bwd_parts)
    w_bytes = (d * e + local * (up + f) * d + (ups + fs) * d) * b
    hidden = (pairs * (up + (f if gated else 0)) + rows * (ups + (fs if gated else 0))) * b
    x_bytes, perm = rows * d * b, pairs * d * b
    depth = clog2(d) + 2 * clog2(e) + clog2(f) + 1
    def gemm_pass(gemms: list[Gemm], extra: float, reads: float, writes: float, parts) -> PassCost:
        flops = sum(g.flops for g in gemms) + extra
        return PassCost(flops, flops / 2, depth, reads, writes, tuple(gemms), "gemm",
                        kernels=len(gemms) + len(parts), parts=tuple(parts))
    fwd = gemm_pass(fwd_g, elementwise_f, x_bytes + w_bytes + scores * ROUTER_BYTES + perm + hidden,
                    scores * ROUTER_BYTES + perm + hidden + x_bytes, fwd_parts)
    bwd_x = gemm_pass(bx_g, elementwise_b, x_bytes + w_bytes + hidden + perm + scores * ROUTER_BYTES,
                      x_bytes + hidden + perm, bwd_parts)
    bwd_w = gemm_pass(bw_g, bias, x_bytes + perm + hidden, w_bytes, ())
    saved = scores * ROUTER_BYTES + rows * k * INDEX_BYTES + perm + hidden
    reads_x = (Gemm(rows, d, e), Gemm(t, d, up, local)) + ((Gemm(rows, d, ups),) if fs else ())  # router, up-projections
    return LayerCost(fwd, bwd_x, bwd_w, saves_input=True, extra_saved_bytes=saved,
                     internal_backward=without_gemms(bwd_x, reads_x, hidden + perm))


