"""Import accuracy and speed: the ten networks of tests/torchnets.py through `dlsim import torch` and
their ONNX exports through `dlsim import onnx`; prints one JSON record.

Per network: parameters (dlsim vs PyTorch), forward and backward FLOPs as dlsim charges them
(`dlsim.cost.counted.counted_flops`) against PyTorch's FLOP counter around a real forward and
loss.backward() (`dlsim.importers.torch_meter.counter`: FlopCounterMode with the CPU attention
kernel and a group-aware convolution backward; oneDNN off so that nn.LSTM runs kernels the counter
sees), the share of the predicted step on generic layers, import seconds, and the same counts
from the ONNX export. Run: ``python benchmarks/bench_import.py [--json-out F]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _counter_flops(net, x) -> tuple[float, float]:
    import torch

    from dlsim.importers.torch_meter import counter

    net.train()
    with torch.backends.mkldnn.flags(enabled=False):
        with counter() as fwd:
            out = net(x)
        with counter() as bwd:
            out.float().pow(2).mean().backward()
    return float(fwd.get_total_flops()), float(bwd.get_total_flops())


def _error(ours: float, want: float) -> float:
    return (ours - want) / want if want else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()
    import torch
    import torchnets

    from dlsim.api.importers import import_onnx_file, import_torch_module
    from dlsim.cost.counted import counted_flops

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in torchnets.NETWORKS:
            net, x = torchnets.build(name)
            start = time.perf_counter()
            imported = import_torch_module(net, [x], name=name)
            seconds = time.perf_counter() - start
            fwd, bwd = counted_flops(imported.model, x.shape[0])
            want_fwd, want_bwd = _counter_flops(net, x)
            path = Path(tmp) / f"{name}.onnx"
            net, x = torchnets.build(name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(net, (x,), str(path), dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                                  do_constant_folding=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
            start = time.perf_counter()
            onnx = import_onnx_file(path, name=name)
            onnx_seconds = time.perf_counter() - start
            onnx_fwd, _ = counted_flops(onnx.model, x.shape[0])
            rows.append({
                "network": name, "layers": len(imported.model.layers),
                "params": imported.model.params, "params_torch": sum(p.numel() for p in net.parameters()),
                "forward_flops": fwd, "forward_flops_counter": want_fwd, "forward_error": _error(fwd, want_fwd),
                "backward_flops": bwd, "backward_flops_counter": want_bwd, "backward_error": _error(bwd, want_bwd),
                "fallback_share": imported.fallback_share,
                "fallbacks": {r.op: r.layers for r in imported.fallbacks}, "import_s": seconds,
                "onnx_params": onnx.model.params, "onnx_forward_flops": onnx_fwd,
                "onnx_forward_error": _error(onnx_fwd, want_fwd), "onnx_fallback_share": onnx.fallback_share,
                "onnx_import_s": onnx_seconds,
            })
    worst = max(max(abs(r["forward_error"]), abs(r["backward_error"]), abs(r["onnx_forward_error"])) for r in rows)
    record = {"benchmark": "import", "torch": torch.__version__, "networks": rows,
              "params_exact": all(r["params"] == r["params_torch"] == r["onnx_params"] for r in rows),
              "worst_flop_error": worst, "priced_on": "cpu-epyc-2core", "batch": torchnets.BATCH}
    text = json.dumps(record, indent=1)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
