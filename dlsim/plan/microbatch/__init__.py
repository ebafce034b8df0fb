"""μ-cuDNN micro-batch planning (Oyama, Ben-Nun, Hoefler & Matsuoka, IEEE CLUSTER 2018).

Split each convolution's mini-batch into micro-batches so that faster algorithms whose workspace
would not fit can run: WR (workspace reuse, a DP per layer-pass) or WD (workspace division, an ILP
across layers over the DP's desirable sets). See `dp`, `ilp`, `plan`.
"""

from dlsim.plan.microbatch.configs import Config, Kernel, pareto_front
from dlsim.plan.microbatch.dp import min_feasible_limit, undivided, wr_best, wr_desirable
from dlsim.plan.microbatch.ilp import IlpResult, wd_ilp
from dlsim.plan.microbatch.plan import plan_wd, plan_wr
from dlsim.plan.microbatch.records import MODES, LayerPlan, MicrobatchPlan, PassPlan
from dlsim.plan.microbatch.policies import POLICIES, batch_sizes
from dlsim.plan.microbatch.table import PASSES, BenchTable, KernelTable

__all__ = ["Config", "Kernel", "pareto_front", "min_feasible_limit", "undivided", "wr_best", "wr_desirable",
           "IlpResult", "wd_ilp", "MODES", "LayerPlan", "MicrobatchPlan", "PassPlan", "plan_wd", "plan_wr",
           "POLICIES", "batch_sizes", "PASSES", "BenchTable", "KernelTable"]
