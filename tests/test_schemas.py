"""The shipped JSON Schemas (dlsim/schemas/*.schema.json) are those the typed records give, and they
accept every file of the zoo, the built-in profiles, the stacks, the examples and the reports' inputs,
and refuse a misspelt key."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from dlsim.io import schemas
from dlsim.io.yamlfile import read_yaml

ROOT = Path(__file__).resolve().parents[1]


def _kind(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "stacks":
        return "stack"
    if "models" in rel.parts:
        return "model"
    if rel.parts[0] == "hardware_profiles" or path.name == "profile.yaml":
        return "profile"
    return "sweep" if "sweeps" in rel.parts else "strategy"


FILES = sorted([*ROOT.glob("models/**/*.yaml"), *ROOT.glob("examples/**/*.yaml"), *ROOT.glob("stacks/*.yaml"),
                *(p for p in ROOT.glob("hardware_profiles/**/*.yaml") if p.name != "meta.yaml"),
                *ROOT.glob("reports/**/profile.yaml"), *ROOT.glob("reports/seeds/models/*.yaml")])


def _json(data):
    """YAML data as JSON reads it (mapping keys are strings)."""
    return json.loads(json.dumps(data))


def _validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(schemas.schema_path(kind).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


VALIDATORS = {kind: _validator(kind) for kind in schemas.KINDS}


def test_shipped_schemas_are_current():
    assert schemas.stale() == [], "run: python -m dlsim.io.schemas"


def test_every_kind_of_file_is_covered():
    assert {_kind(p) for p in FILES} == set(schemas.KINDS)
    assert len([p for p in FILES if _kind(p) == "model"]) >= 40


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_file_validates(path):
    errors = sorted(VALIDATORS[_kind(path)].iter_errors(_json(read_yaml(path))), key=str)
    assert not errors, f"{path}: {errors[0].json_path}: {errors[0].message}"


@pytest.mark.parametrize("kind, data, where", [
    ("profile", {"device": {"peak_tflops": {"fp32": 1}, "memory_gb": 16, "memory_bandwidth_gbytes_per_s": 1},
                 "intra_node": {"latency_us": 1, "bandwidth_gbytes_per_s": 1}}, "device"),
    ("profile", {"device": {"peak_tflops": {"fp33": 1}, "memory_gib": 16, "memory_bandwidth_gbytes_per_s": 1},
                 "intra_node": {"latency_us": 1, "bandwidth_gbytes_per_s": 1}}, "device"),
    ("profile", {"device": {"peak_tflops": {"fp32": 1}, "memory_gib": 16, "memory_bandwidth_gbytes_per_s": 1},
                 "intra_node": {"latency_us": 1}}, "intra_node"),
    ("model", {"input": {"shape": [3, 8, 8]}, "layers": [{"name": "c", "type": "conv2d", "out_channels": 4,
                                                          "kernel": 3, "strides": 2}]}, "layers"),
    ("model", {"input": {"shape": [3, 8, 8]}, "layers": [{"name": "fc", "type": "linear"}]}, "layers"),
    ("strategy", {"tpp": 2}, "$"),
    ("strategy", {"dp": 0}, "dp"),
    ("strategy", {"schedule": "zigzag"}, "schedule"),
    ("strategy", {"fused_kernels": ["flash"]}, "fused_kernels"),
    ("sweep", {"models": "gpt2", "clusters": "dgx-h100", "global_batch": 8, "grid": {"tp": [1, 0]}}, "grid"),
    ("sweep", {"models": "gpt2", "clusters": "dgx-h100"}, "$"),
    ("stack", {"name": "x", "version": "1", "framework": "f",
               "keys": {"dp": {"value": 2, "source": "NVIDIA/Megatron-LM@55ba1f7 a.py"}}}, "keys"),
    ("stack", {"name": "x", "version": "1", "framework": "f", "keys": {"zero": {"value": 1}}}, "keys"),
])
def test_a_wrong_file_is_refused(kind, data, where):
    errors = list(VALIDATORS[kind].iter_errors(data))
    assert errors and any(e.json_path == "$" and where == "$" or e.json_path.startswith(f"$.{where}")
                          for e in errors), [e.json_path for e in errors]
