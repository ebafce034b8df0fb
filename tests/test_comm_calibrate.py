"""Communication calibration: fits recover known parameters, nccl-tests import, plans, CLI errors, nccl mocks.

Fits are checked on synthetic tables generated from known parameters with the model's own formulas
(`reference/algorithms.md` §2.1-2.2), so a fit that recovers them is right by construction.
"""

import sys
import types

import numpy as np
import pytest

from dlsim.api.calibrate_comm import import_nccl_tests, make_plan, parse_hosts, profile_text, size_range
from dlsim.calibrate.comm_fit import (fit_alpha_beta, fit_gamma, fit_hockney, fit_loggp, fit_piecewise,
                                      link_parameters)
from dlsim.calibrate.comm_launch import Hosts, mpirun_command
from dlsim.calibrate.comm_measure import P2P_COLUMNS, P2P_TABLE, p2p_key
from dlsim.calibrate.comm_nccl import collective_from_name, parse_nccl_tests
from dlsim.calibrate.comm_plan import OPENMPI_ALLREDUCE, CommPlan
from dlsim.cost.collectives import ALGORITHMS
from dlsim.calibrate.comm_run import fit_tables, launches
from dlsim.calibrate.compute_store import TableFile
from dlsim.errors import DlsimError, SpecError, TableLookupError
from dlsim.io.profile_yaml import load_profile

US = 1e-6
SIZES = [2 ** k for k in range(0, 25)]


def test_alpha_beta_fits_recover_exact_line():
    alpha, beta = 20 * US, 1 / 25e6                 # 20 us, 25 MB/s
    times = [alpha + beta * m for m in SIZES]
    for fit in (fit_hockney(SIZES, times), fit_alpha_beta(SIZES, times)):
        assert fit.alpha == pytest.approx(alpha, rel=1e-6) and fit.beta == pytest.approx(beta, rel=1e-9)
        assert fit.median_abs_rel_error < 1e-6


def test_hockney_takes_beta_from_large_and_alpha_from_small_messages():
    # below 64 KiB a faster protocol: 5 us + m/1 GB/s; above, 30 us + m/100 MB/s
    times = [5 * US + m * 1e-9 if m < 65536 else 30 * US + m * 1e-8 for m in SIZES]
    fit = fit_hockney(SIZES, times)
    assert fit.beta == pytest.approx(1e-8, rel=1e-9)
    # α = median over m ≤ 1 KiB (m = 1, 2, ..., 1024; median m = 32) of T − βm = 5 us − 9e-9·m → 4.712 us
    assert fit.alpha == pytest.approx(5 * US - 9e-9 * 32, rel=1e-9)


def test_noisy_quick_run_gives_a_finite_bandwidth():
    """A quick gloo run's few repetitions can time the 1 MiB ping-pong below the 64 KiB one (the
    large messages' slope negative, issue 32: the profile got an infinite bandwidth that dlsim then
    refused). The fit takes the slope over the whole range instead, or, when even that falls, the
    largest message's time per byte; the tier it writes is finite and loads."""
    sizes = [1, 16, 256, 4096, 65536, 1 << 20]
    times = [60e-6, 61e-6, 62e-6, 70e-6, 900e-6, 850e-6]        # 1 MiB faster than 64 KiB: noise
    fit = fit_hockney(sizes, times)
    assert fit.beta == pytest.approx((850e-6 - 60e-6) / ((1 << 20) - 1), rel=1e-12) and fit.note
    link = link_parameters(fit, None)
    assert 0 < link.bandwidth < float("inf") and fit.note in link.notes
    falling = fit_hockney(sizes, [90e-6, 80e-6, 70e-6, 60e-6, 55e-6, 50e-6])
    assert falling.beta == pytest.approx(50e-6 / (1 << 20), rel=1e-12)


def test_piecewise_finds_the_protocol_break():
    times = [5 * US + m * 1e-9 if m < 65536 else 30 * US + m * 1e-8 for m in SIZES]
    pieces = fit_piecewise(SIZES, times)
    assert len(pieces) == 2
    assert pieces[0].hi_bytes == 32768 and pieces[1].lo_bytes == 65536
    assert pieces[0].beta == pytest.approx(1e-9, rel=1e-6) and pieces[1].alpha == pytest.approx(30 * US, rel=1e-6)


def prtt(L, o, g, G, n, s, d=0.0):
    one = 2 * (L + 2 * o + (s - 1) * G)
    return one if n == 1 else one + (n - 1) * max(o + d, g + (s - 1) * G)


def test_loggp_netgauge_recovers_parameters():
    L, o, g, G, n = 3 * US, 1 * US, 2 * US, 1e-10, 10          # the worked example of §2.2
    sizes = [1, 16, 256, 4096, 65536, 1 << 20]
    p1 = {s: prtt(L, o, g, G, 1, s) for s in sizes}
    pn = {s: prtt(L, o, g, G, n, s) for s in sizes}
    pd = {s: prtt(L, o, g, G, n, s, p1[s]) for s in sizes}
    fit = fit_loggp(p1, pn, pd, {s: p1[s] for s in sizes}, n)
    assert fit.L == pytest.approx(L, rel=1e-9) and fit.o == pytest.approx(o, rel=1e-9)
    assert fit.g == pytest.approx(g, rel=1e-6) and fit.G == pytest.approx(G, rel=1e-6)
    assert fit.dropped == 0


def test_loggp_drops_an_outlier():
    L, o, g, G, n = 3 * US, 1 * US, 2 * US, 1e-10, 10
    sizes = [1, 16, 256, 1024, 4096, 16384, 65536, 1 << 20]
    p1 = {s: prtt(L, o, g, G, 1, s) for s in sizes}
    pn = {s: prtt(L, o, g, G, n, s) for s in sizes}
    pn[4096] += 9 * 50 * US                                  # one disturbed point
    fit = fit_loggp(p1, pn, dict(pn), {}, n)
    assert fit.dropped >= 1 and fit.G == pytest.approx(G, rel=1e-3)


def test_gamma_and_link_parameters():
    sizes = [1 << k for k in range(12, 27, 2)]
    assert fit_gamma(sizes, [1e-6 + 2e-11 * m for m in sizes]) == pytest.approx(2e-11, rel=1e-9)
    ab = fit_hockney(SIZES, [20 * US + m / 25e6 for m in SIZES])
    loggp = fit_loggp({1: 40 * US, 2: 40 * US}, {1: 60 * US, 2: 60 * US}, {1: 500 * US, 2: 500 * US},
                      {1: 40 * US, 2: 40 * US}, 10)
    link = link_parameters(ab, loggp)
    # o = (500 − 40)/9 − 40 us = 11.1 us > α/2 = 10 us: capped, so L = α − 2o = 0
    assert link.overhead == pytest.approx(10 * US) and link.latency == pytest.approx(0.0, abs=1e-15)
    assert link.bandwidth == pytest.approx(25e6) and link.notes
    assert link.latency + 2 * link.overhead == pytest.approx(ab.alpha)


def synthetic_tables(out, alpha=20 * US, beta=1 / 25e6, hosts="h"):
    table = TableFile(out / P2P_TABLE, P2P_COLUMNS, p2p_key)
    for m in SIZES:
        t = repr(alpha + beta * m)
        table.append({"backend": "mpi", "hosts": hosts, "kind": "pingpong", "ranks": "4", "size_bytes": str(m),
                      "messages": "1", "delay_s": "0.0", "reps": "5", "median_s": t, "min_s": t, "max_s": t})
    for m in (1 << 18, 1 << 20, 1 << 22):
        t = repr(1e-6 + 5e-11 * m)
        table.append({"backend": "mpi", "hosts": hosts, "kind": "reduce", "ranks": "4", "size_bytes": str(m),
                      "messages": "1", "delay_s": "0.0", "reps": "5", "median_s": t, "min_s": t, "max_s": t})


def test_fitted_profile_loads_with_the_fitted_link(tmp_path):
    synthetic_tables(tmp_path)
    fits = fit_tables(tmp_path, "mpi", "h")
    hosts = Hosts(label="h", prefixes=(("true",),) * 4, addresses=("a", "b", "c", "d"))
    text = profile_text("emu", fits, {"cpu": "test cpu"}, 4, hosts, 1e11, "today", "mpi")
    (tmp_path / "profile.yaml").write_text(text)
    cluster = load_profile(tmp_path)
    assert cluster.nodes == 4 and cluster.devices_per_node == 1
    assert cluster.inter.bandwidth == pytest.approx(25e6, rel=1e-6)
    assert cluster.inter.latency + 2 * cluster.inter.overhead == pytest.approx(20 * US, rel=1e-3)
    assert 1 / cluster.reduce_bandwidth == pytest.approx(5e-11, rel=1e-3)
    assert set(cluster.tables) == {"comm_p2p", "comm_collectives"}


NCCL_SAMPLE = """# nThread 1 nGpus 1 minBytes 8 maxBytes 1048576 step: 64(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  11 on   node1 device  0 [0x07] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  12 on   node1 device  1 [0x0a] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    10.50    0.00    0.00      0    10.20    0.00    0.00      0
         512           128     float     sum      -1    11.00    0.05    0.05      0    10.90    0.05    0.05      0
       32768          8192     float     sum      -1    16.40    2.00    2.00      0    16.00    2.05    2.05    N/A
     1048576        262144     float     sum      -1    40.00   26.21   26.21      0    39.00   26.89   26.89      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 7.04
"""


def test_parse_nccl_tests_sample():
    table = parse_nccl_tests(NCCL_SAMPLE, "all_reduce_perf.txt")
    assert table.ranks == 2 and table.iterations == 20 and len(table.rows) == 8
    big = [r for r in table.rows if r.size_bytes == 1048576]
    assert big[0].variant == "out-of-place" and big[0].time_s == pytest.approx(40e-6)
    assert big[1].variant == "in-place" and big[1].busbw_bytes_per_s == pytest.approx(26.89e9)
    assert collective_from_name("all_reduce_perf") == "allreduce"
    assert collective_from_name("./reduce_scatter_perf -b 8") == "reduce-scatter"


def test_parse_nccl_tests_rejects_garbage():
    with pytest.raises(TableLookupError, match="no nccl-tests result rows"):
        parse_nccl_tests("hello\nworld\n", "x.txt")
    bad = NCCL_SAMPLE.replace("40.00   26.21", "4x.00   26.21")
    with pytest.raises(TableLookupError, match="line"):
        parse_nccl_tests(bad, "x.txt")


def test_import_nccl_tests_writes_rows_once(tmp_path):
    src = tmp_path / "all_reduce_perf.txt"
    src.write_text(NCCL_SAMPLE)
    rec = import_nccl_tests(tmp_path / "prof", [src])
    assert rec["rows_added"] == 8
    again = import_nccl_tests(tmp_path / "prof", [src])
    assert again["rows_added"] == 0 and again["rows_already_there"] == 8
    lines = (tmp_path / "prof" / "comm_collectives.csv").read_text().splitlines()
    # the sample's two ranks run on one host: the rows say so, and price only one-node groups
    assert len(lines) == 9 and "nccl-tests,1 node,allreduce,default,float,2,1048576" in lines[-2]


def test_plans_and_launches():
    plan = make_plan("mpi", "/tmp/x", Hosts(), sizes=size_range("1MiB:8MiB"))
    assert plan.collective_sizes == (1 << 20, 1 << 21, 1 << 22, 1 << 23)
    items = launches(plan, ["ring", "binomial-tree-openmpi"])
    assert [i.label for i in items] == ["default", "ring", "binomial-tree-openmpi"]
    assert items[1].mca["coll_tuned_allreduce_algorithm"] == "4" and items[1].plan.collectives == ("allreduce",)
    assert items[2].mca["coll_tuned_reduce_algorithm"] == "5" and not items[2].plan.point_to_point
    assert set(OPENMPI_ALLREDUCE) == {"ring", "recursive-doubling", "rabenseifner", "binomial-tree-openmpi"}
    assert all(name in ALGORITHMS["allreduce"] for name in OPENMPI_ALLREDUCE)
    with pytest.raises(SpecError, match="needs --backend mpi"):
        launches(make_plan("gloo", "/tmp/x", Hosts()), ["ring"])
    with pytest.raises(SpecError, match="unknown backend"):
        make_plan("ucx", "/tmp/x", Hosts())
    with pytest.raises(SpecError, match="LO:HI"):
        size_range("1MiB")
    with pytest.raises(SpecError, match="1 <= LO <= HI"):
        size_range("8MiB:1MiB")
    assert parse_hosts("ssh:a, b").addresses == ("a", "b")
    with pytest.raises(SpecError, match="ssh:HOST1"):
        parse_hosts("a,b")


def test_mpirun_over_hosts_uses_an_agent_and_tcp_only(tmp_path):
    hosts = Hosts(label="e", prefixes=(("ip", "netns", "exec", "n0"), ("ip", "netns", "exec", "n1")),
                  addresses=("10.0.0.10", "10.0.0.11"), subnet="10.0.0.0/24")
    try:
        cmd = mpirun_command(2, hosts, tmp_path, {"coll_tuned_allreduce_algorithm": "4"})
    except DlsimError:
        pytest.skip("mpirun not installed")
    assert cmd[:4] == ["ip", "netns", "exec", "n0"] and "tcp,self" in cmd and "10.0.0.0/24" in cmd
    agent = (tmp_path / "agent.sh").read_text()
    assert "10.0.0.11) exec ip netns exec n1" in agent
    assert (tmp_path / "hostfile").read_text() == "10.0.0.10 slots=1\n10.0.0.11 slots=1\n"
    with pytest.raises(DlsimError, match="only 2 hosts"):
        mpirun_command(3, hosts, tmp_path, {})


class _FakeCuda:
    def __init__(self, n):
        self.n, self.synced, self.device = n, 0, None

    def is_available(self):
        return self.n > 0

    def device_count(self):
        return self.n

    def set_device(self, d):
        self.device = d

    def synchronize(self, d=None):
        self.synced += 1


def _fake_torch(monkeypatch, gpus):
    torch = types.ModuleType("torch")
    torch.cuda = _FakeCuda(gpus)
    torch.device = lambda kind, index=None: types.SimpleNamespace(type=kind, index=index)
    torch.set_num_threads = lambda n: None
    dist = types.ModuleType("torch.distributed")
    dist.init_process_group = lambda backend: None
    dist.get_rank = lambda: 1
    dist.get_world_size = lambda: 2
    torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    return torch


def test_nccl_backend_refuses_without_gpus(monkeypatch, tmp_path):
    from dlsim.api.calibrate_comm import calibrate_comm
    _fake_torch(monkeypatch, 0)
    with pytest.raises(SpecError, match="needs CUDA GPUs"):
        calibrate_comm(tmp_path / "p", backend="nccl", ranks=2)
    _fake_torch(monkeypatch, 1)
    with pytest.raises(SpecError, match="needs 2 GPUs, found 1"):
        calibrate_comm(tmp_path / "p", backend="nccl", ranks=2)
    assert not (tmp_path / "p").exists()


def test_nccl_worker_uses_one_gpu_per_rank(monkeypatch):
    torch = _fake_torch(monkeypatch, 2)
    from dlsim.calibrate.comm_worker_gloo import TorchTransport
    monkeypatch.setenv("LOCAL_RANK", "1")
    t = TorchTransport("nccl")
    assert t.device.type == "cuda" and t.device.index == 1 and torch.cuda.device is t.device
    t._sync()
    assert torch.cuda.synced == 1
    cpu = TorchTransport("gloo")
    cpu._sync()
    assert cpu.device.type == "cpu" and torch.cuda.synced == 1


@pytest.mark.parametrize("args,message", [
    (["--ranks", "0"], "ranks must be an integer from 1"),
    (["--backend", "ucx"], "'ucx' is not one of"),
    (["--sizes", "1MiB"], "LO:HI"),
    (["--sizes", "1XB:2MB"], "unknown size unit"),
    (["--collective", "allsum"], "cannot measure collective 'allsum'"),
    (["--algorithm", "spiral"], "no Open MPI setting forces 'spiral'"),
    (["--backend", "gloo", "--algorithm", "ring"], "needs --backend mpi"),
    (["--hosts", "node1"], "ssh:HOST1"),
    (["--hosts", "ssh:a,b", "--ranks", "3"], "only 2 hosts"),
    (["--import-nccl-tests", "/no/such/file"], "no such file"),
])
def test_calibrate_comm_bad_input_one_line_exit_1(cli, tmp_path, args, message):
    code, out, err = cli("calibrate", "comm", "--out", str(tmp_path / "p"), *args)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_calibrate_comm_needs_out(cli):
    code, out, err = cli("calibrate", "comm", "--ranks", "2")
    assert code == 1 and "--out" in err and err.count("\n") == 1  # a missing option: usage, exit code 1


@pytest.mark.slow
def test_local_mpi_quick_calibration(tmp_path):
    pytest.importorskip("mpi4py")
    from dlsim.api.calibrate_comm import calibrate_comm
    rec = calibrate_comm(tmp_path / "p", backend="mpi", ranks=2, quick=True, algorithms=("ring",), quiet=True)
    assert rec["fits"]["hockney"]["beta"] > 0
    cluster = load_profile(tmp_path / "p")
    assert cluster.intra.bandwidth > 0
    rows = (tmp_path / "p" / "comm_collectives.csv").read_text()
    assert ",allreduce,ring," in rows
    again = calibrate_comm(tmp_path / "p", backend="mpi", ranks=2, quick=True, algorithms=("ring",), quiet=True)
    assert again["profile"] == [] and np.isclose(again["fits"]["hockney"]["beta"], rec["fits"]["hockney"]["beta"])


def test_measured_rows_price_only_groups_laid_out_as_measured():
    """Eight ranks measured inside one node do not price eight ranks spread over eight nodes."""
    from dlsim.cost.collectives.measured import CollectiveRow, MeasuredCollectives
    row = lambda hosts, t: CollectiveRow("allreduce", "default", 8, 1e6, t, "nccl-tests", hosts)  # noqa: E731
    table = MeasuredCollectives([row("1 node", 1e-4), row("8 nodes", 5e-4)])
    assert table.lookup("allreduce", 8, 1e6, nodes=1).seconds == 1e-4
    assert table.lookup("allreduce", 8, 1e6, nodes=8).seconds == 5e-4
    assert table.lookup("allreduce", 8, 1e6, nodes=2) is None
    unknown = MeasuredCollectives([row("my-cluster", 2e-4)])
    assert unknown.lookup("allreduce", 8, 1e6, nodes=2).seconds == 2e-4


def test_reduce_scatter_and_allgather_from_measured_allreduce():
    """Without rows of their own, a reduce-scatter or all-gather of a buffer costs half the measured
    all-reduce of that buffer; rows of their own take precedence."""
    from dlsim.cost.collectives.measured import CollectiveRow, MeasuredCollectives
    from dlsim.results import Source
    rows = [CollectiveRow("allreduce", "default", 8, s, t, "nccl-tests", "1 node") for s, t in ((1e6, 1e-4), (4e6, 3e-4))]
    table = MeasuredCollectives(rows)
    rs = table.lookup("reduce-scatter", 8, 1e6, nodes=1)
    assert rs.seconds == pytest.approx(0.5e-4) and rs.source == Source.INTERPOLATED and "half" in rs.note
    assert table.lookup("allgather", 8, 2e6, nodes=1).seconds == pytest.approx(table.lookup("allreduce", 8, 2e6, nodes=1).seconds / 2)
    assert table.lookup("allgather", 8, 8e6, nodes=1) is None  # outside the measured sizes
    own = MeasuredCollectives(rows + [CollectiveRow("allgather", "default", 8, 1e6, 7e-5, "nccl-tests", "1 node")])
    assert own.lookup("allgather", 8, 1e6, nodes=1).seconds == 7e-5
