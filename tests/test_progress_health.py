"""Progress bar with the time left (quiet off a terminal) and calibration health warnings (issue 16)."""

import io

import pytest

from dlsim.calibrate.health import LoadWatch, quantisation_warning
from dlsim.progress import Progress, format_clock, time_left


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_time_left_and_clock_format():
    assert time_left(0, 10, 5.0) is None
    assert time_left(4, 10, 8.0) == pytest.approx(12.0)
    assert time_left(12, 20, 4.0, base=10) == pytest.approx(16.0)  # 10 items resumed, 2 done in 4 s
    assert [format_clock(s) for s in (0, 42, 187, 3723)] == ["0s", "42s", "3:07", "1:02:03"]


def last_frame(out: io.StringIO) -> str:
    """The last redraw of the live display, control sequences removed."""
    import re
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    return text.split("\r")[-1]


def test_bar_on_a_terminal(monkeypatch):
    monkeypatch.delenv("DLSIM_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    out, clock = Tty(), Clock()
    bar = Progress(10, stream=out, clock=clock, min_interval=0, width=200, label="kernels")
    assert bar.enabled
    for i in range(1, 4):
        clock.t = 2.0 * i
        bar.update(i, 10, f"kernel {i}")
    bar.line("failed: kernel 3")
    bar.close()
    text = out.getvalue()
    assert "3/10" in text and "~14s left" in text and "failed: kernel 3\n" in text and "kernels" in text
    assert text.endswith("\n") or text.endswith("\x1b[?25h")


def test_the_clock_ticks_while_nothing_finishes(monkeypatch):
    """A long phase (the calibration's loop probe: 15 minutes on a busy machine) showed `0/2940 0% 31s elapsed`
    the whole time (issue 34): the display redraws on its own, so its clock moves without an update."""
    import time as real_time
    out = Tty()
    clock = Clock()
    bar = Progress(stream=out, enabled=True, clock=clock, min_interval=0, width=200)
    bar.phase("loop probe (heap) 3/16: cnn in a fresh process", 16, 3, waiting=True)
    clock.t = 75.0
    real_time.sleep(1.2)  # redrawn every half second while this process waits on another
    assert "1:15" in out.getvalue() and "3/16" in out.getvalue()
    bar.phase("host probe", waiting=False)  # timed here: no redraw behind the timing's back
    drawn = out.getvalue()
    clock.t = 200.0
    real_time.sleep(1.2)
    assert out.getvalue() == drawn
    bar.close()
def test_quiet_off_a_terminal(monkeypatch):
    monkeypatch.delenv("DLSIM_PROGRESS", raising=False)
    out = io.StringIO()
    with Progress(5, stream=out) as bar:
        assert not bar.enabled
        for i in range(1, 6):
            bar.update(i, 5, "x")
        bar.message("[3/5] layer conv1")
        bar.line("warning stays")
    assert out.getvalue() == "warning stays\n"
    monkeypatch.setenv("DLSIM_PROGRESS", "1")
    assert Progress(stream=io.StringIO()).enabled
    monkeypatch.setenv("DLSIM_PROGRESS", "0")
    assert not Progress(stream=Tty()).enabled


def test_message_counts_and_resumed_pace():
    clock = Clock()
    bar = Progress(stream=Tty(), enabled=True, clock=clock, min_interval=0)
    clock.t = 1.0
    bar.message("[31/40] conv1 forward b=4 fft: 3.1 ms")  # 30 rows were there already
    assert (bar.done, bar.total, bar._base) == (31, 40, 30)
    assert bar.status.startswith("conv1 forward")
    bar.message("round 2/5")
    assert (bar.done, bar.total) == (2, 5)
    bar.message("gemm 64x64x64: measured")  # no count: status only
    assert bar.done == 2 and bar.status.startswith("gemm")


def test_phase_before_the_items_left_out_of_the_pace():
    """The calibration's loop probe (a minute or two before kernel 1) must not set the pace: 90 s of probe
    then 1 s per kernel is ~9 s left after kernel 1 of 10, not ~14 min."""
    from dlsim.cli.calibrate_compute import _progress
    clock, out = Clock(), Tty()
    bar = Progress(stream=out, enabled=True, clock=clock, min_interval=0, width=200)
    report = _progress(bar)
    report(2, 16, "loop probe (heap) 3/16: cnn", "waiting")  # a phase's own count, in another process
    assert bar.done == 0 and "2/16" in out.getvalue() and "loop probe" in out.getvalue()
    clock.t = 90.0
    report(0, 10, "probes", "done")
    clock.t = 91.0
    report(1, 10, "gemm 64x64x64", "1.0 s")
    assert bar.left() == pytest.approx(9.0)
    assert "1:31 elapsed" in last_frame(out) and "~9s left" in last_frame(out)
    clock.t = 93.0  # a phase still open when an item finishes ends there
    bar.phase("host probe")
    clock.t = 193.0
    bar.update(2, 10, "gemm 128x128x128")
    assert bar.left() == pytest.approx(12.0)  # 3 s for 2 kernels outside the phase
    bar.close()


def test_quantised_timings_warned():
    tick = 4e-3
    busy = [tick * k for k in (1, 1, 2, 1, 3, 1, 1, 2, 1, 1, 1, 2, 4, 1, 1, 1)]  # the busy machine's table
    w = quantisation_warning(busy)
    assert w and "4 ms" in w and "16 of 16" in w
    rng = __import__("random").Random(1)
    real = [rng.uniform(1e-5, 5e-3) for _ in range(200)]
    assert quantisation_warning(real) is None
    assert quantisation_warning(busy[:5]) is None                   # too few to say
    assert quantisation_warning([1e-6 * k for k in (1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2)]) is None  # 1 µs: a fine clock


def _watch(busy_s, own_s, load, cpus=8, threads=1, wall=10.0):
    clock, busy, own = Clock(), iter([0.0, busy_s]), iter([0.0, own_s])
    w = LoadWatch(machine_busy=lambda: next(busy), own_cpu=lambda: next(own), loadavg=lambda: load,
                  clock=clock, cpus=cpus, threads=threads)
    w.start()
    clock.t = wall
    return w


def test_busy_machine_warned():
    w = _watch(busy_s=40.0, own_s=10.0, load=4.0)  # others: 30 CPU s in 10 s = 3 cores
    msg = w.warning()
    assert msg and "3.0 CPU cores" in msg and "load average 4.0 on 8 CPUs" in msg
    assert _watch(busy_s=11.0, own_s=10.0, load=1.0).warning() is None  # 0.1 core: idle enough
    assert _watch(busy_s=10.0, own_s=10.0, load=12.0).warning() is not None  # over-subscribed by load
    unknown = LoadWatch(machine_busy=lambda: None, own_cpu=lambda: 0.0, loadavg=lambda: None, cpus=4).start()
    assert unknown.warning() is None
