"""Which tbf burst lets an emulated link behave like a real one? A 2-host check per burst.

    flock -x /tmp/dlsim-measure.lock python reports/archive/comm-validation/comm_burst_probe.py --bursts 2kb,3kb,4kb,8kb,16kb

A real NIC serialises every byte at line rate; tc tbf lets up to `burst` bytes pass at memory speed
after an idle period (Linux sch_tbf.c: tokens accrue at `rate` up to `burst`; a packet leaves when
its length in tokens is there). For each burst, on a fresh 2-host EmulatedCluster (prefix dlsimc):

* stream: one TCP connection sends `--stream-mb` MB from host 0 to host 1; rate = bytes / (time from
  the first to the last byte at the receiver). It must reach the configured rate (a burst below
  rate x timer slack would lose rate).
* one-way: a message of S bytes sent after an idle 20 ms, acknowledged by 1 byte; one-way time =
  RTT − the 1-byte RTT, median of 15. On a real link it is ≈ S / rate; a deep bucket makes it far less.
* `tc -s qdisc` counters (sent, dropped, overlimits) of both ends after the runs.

Prints one JSON record per burst and a summary list.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

from dlsim.units import parse_bandwidth
from dlsim.validate.emulated_cluster import EmulatedCluster

PORT = 5201

SERVER = r"""
import socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", port)); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if mode == "stream":
    n = 0; t0 = None
    while True:
        b = c.recv(1 << 20)
        if not b: break
        if t0 is None: t0 = time.perf_counter()
        n += len(b); t1 = time.perf_counter()
    print(n, t1 - t0, flush=True)
else:
    while True:
        hdr = c.recv(8, socket.MSG_WAITALL)
        if len(hdr) < 8: break
        size = int.from_bytes(hdr, "little"); got = 0
        while got < size: got += len(c.recv(min(1 << 20, size - got)))
        c.sendall(b"x")
"""

CLIENT = r"""
import socket, sys, time, statistics, json
mode, host, port, arg = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
c = socket.create_connection((host, port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if mode == "stream":
    buf = b"\0" * (1 << 20)
    for _ in range(int(arg)): c.sendall(buf)
    c.close()
else:
    out = {}
    for size in [int(x) for x in arg.split(",")]:
        msg = size.to_bytes(8, "little") + b"\0" * size; ts = []
        for _ in range(15):
            time.sleep(0.02)
            t0 = time.perf_counter(); c.sendall(msg); c.recv(1); ts.append(time.perf_counter() - t0)
        out[size] = statistics.median(ts)
    print(json.dumps(out), flush=True)
    c.close()
"""


def _server(cluster: EmulatedCluster, mode: str) -> subprocess.Popen:
    proc = subprocess.Popen(cluster.exec_prefix(1) + [sys.executable, "-c", SERVER, mode, str(PORT)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _client(cluster: EmulatedCluster, mode: str, arg: str) -> str:
    return subprocess.run(cluster.exec_prefix(0) + [sys.executable, "-c", CLIENT, mode, cluster.address(1), str(PORT),
                                                    arg], capture_output=True, text=True, check=True).stdout


def _qdisc_counters(cluster: EmulatedCluster) -> dict[str, dict[str, int]]:
    out = {}
    for where, cmd in (("host0 out", cluster.exec_prefix(0) + ["tc", "-s", "qdisc", "show", "dev", cluster.interface(0)]),
                       ("host1 in", ["tc", "-s", "qdisc", "show", "dev", f"{cluster.prefix}v1"])):
        text = subprocess.run(cmd, capture_output=True, text=True).stdout
        m = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", text)
        out[where] = dict(zip(("sent_bytes", "packets", "dropped", "overlimits"), map(int, m.groups()))) if m else {}
    return out


def probe(burst: str, rate: str, queue: str, mtu: int, stream_mb: int, sizes: list[int]) -> dict:
    with EmulatedCluster(hosts=2, rate=rate, burst=burst, queue=queue, mtu=mtu, tcp_congestion="reno",
                         prefix="dlsimc") as cluster:
        rates = []
        for _ in range(3):
            srv = _server(cluster, "stream")
            _client(cluster, "stream", str(stream_mb))
            n, secs = srv.communicate()[0].split()
            rates.append(int(n) / float(secs))
        srv = _server(cluster, "pingpong")
        rtt = {int(k): v for k, v in json.loads(_client(cluster, "pingpong", ",".join(map(str, [1] + sizes)))).items()}
        srv.wait()
        counters = _qdisc_counters(cluster)
    line = parse_bandwidth(rate.replace("mbit", "Mbps").replace("gbit", "Gbps"))
    return {"burst": burst, "rate": rate, "mtu": mtu, "queue": queue,
            "stream_bytes_per_s": rates, "stream_median_over_rate": statistics.median(rates) / line,
            "one_way_s": {s: rtt[s] - rtt[1] for s in sizes},
            "one_way_over_line": {s: (rtt[s] - rtt[1]) / (s / line) for s in sizes},
            "rtt_1byte_s": rtt[1], "qdisc": counters}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bursts", default="2kb,3kb,4kb,8kb,16kb")
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--queue", default="400ms")
    ap.add_argument("--mtu", default=1500, type=int)
    ap.add_argument("--stream-mb", default=20, type=int)
    ap.add_argument("--sizes", default="2048,8192,16384,65536")
    args = ap.parse_args()
    out = []
    for burst in args.bursts.split(","):
        t0 = time.time()
        rec = probe(burst, args.rate, args.queue, args.mtu, args.stream_mb, [int(s) for s in args.sizes.split(",")])
        rec["wall_s"] = time.time() - t0
        print(json.dumps(rec), flush=True)
        out.append(rec)
    print(json.dumps([{"burst": r["burst"], "stream/rate": round(r["stream_median_over_rate"], 3),
                       "one_way/line": {k: round(v, 2) for k, v in r["one_way_over_line"].items()},
                       "dropped": sum(c.get("dropped", 0) for c in r["qdisc"].values())} for r in out]))


if __name__ == "__main__":
    main()
