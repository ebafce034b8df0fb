"""Point-to-point models: hand-computed values (reference/algorithms.md §2.1 worked example)."""

import numpy as np
import pytest

from dlsim.cost.p2p import burst_time, hockney_time, logp_time, loggp_time, p2p_model
from dlsim.errors import SpecError
from dlsim.spec.cluster import LinkTier

US = 1e-6
# L = 3 us, o = 1 us, g = 2 us, G = 0.1 ns/B (10 GB/s)
LINK = LinkTier("ex", latency=3 * US, bandwidth=10e9, overhead=1 * US, gap=2 * US)


def test_one_megabyte_message():
    assert hockney_time(1e6, LINK) == pytest.approx(105 * US)            # α = L + 2o = 5 us, β = 0.1 ns
    assert loggp_time(1e6, LINK) == pytest.approx(5 * US + (1e6 - 1) * 1e-10)
    # LogP: packets of w = g/G = 20,000 B; k = 50; L + 2o + 49·max(g, o) = 5 + 98 us
    assert logp_time(1e6, LINK) == pytest.approx(103 * US)


def test_ten_back_to_back_kib_messages():
    # spacing max(o, g + 1023 G) = 2.1023 us; last arrival 9·2.1023 + 5.1023 = 24.023 us
    assert burst_time(10, 1024, p2p_model(LINK, "loggp")) == pytest.approx(24.023 * US)
    # Hockney serialises: 10·(5 + 0.1024) us
    assert burst_time(10, 1024, p2p_model(LINK, "hockney")) == pytest.approx(10 * (5 + 0.1024) * US)


def test_small_messages_and_vectors():
    m = p2p_model(LINK, "loggp")
    sizes = np.array([0.0, 1.0, 2.0, 1e3])
    assert np.allclose(m.time(sizes), [5 * US, 5 * US, 5 * US + 1e-10, 5 * US + 999e-10])
    assert np.allclose(m.spacing(sizes), [2 * US, 2 * US, 2 * US + 1e-10, 2 * US + 999e-10])
    logp = p2p_model(LINK, "logp")
    assert logp.time(1.0) == pytest.approx(5 * US) and logp.time(20_001) == pytest.approx(7 * US)
    assert logp.spacing(40_000) == pytest.approx(4 * US)


def test_auto_model_and_alpha_beta():
    plain = LinkTier("plain", latency=5 * US, bandwidth=1e9)
    assert p2p_model(plain).model == "hockney" and p2p_model(LINK).model == "loggp"
    m = p2p_model(LINK)
    assert m.alpha == pytest.approx(5 * US) and m.beta == pytest.approx(1e-10)
    assert np.all(m.spacing(np.geomspace(1, 1e9, 20)) <= m.time(np.geomspace(1, 1e9, 20)))


def test_invalid_parameters():
    with pytest.raises(SpecError, match="exceeds L \\+ 2o"):
        p2p_model(LinkTier("x", latency=1 * US, bandwidth=1e9, gap=5 * US), "loggp")
    assert p2p_model(LinkTier("x", latency=1 * US, bandwidth=1e9, gap=5 * US), "hockney").time(0) == 1 * US
    with pytest.raises(SpecError, match="LogP needs a gap"):
        p2p_model(LinkTier("x", latency=1 * US, bandwidth=1e9), "logp")
    with pytest.raises(SpecError, match="unknown point-to-point model"):
        p2p_model(LINK, "pigeon")
    with pytest.raises(SpecError, match="must be positive"):
        p2p_model(LinkTier("x", latency=1 * US, bandwidth=0.0))
