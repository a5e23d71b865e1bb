"""The benchmarks stay runnable: each is run at its tiny, CPU-sized setting (the numbers are not checked, only that
every row was measured)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(result: dict, models: set[str], modes: set[str]) -> None:
    rows = result["rows"]
    assert {r["model"] for r in rows} == models and {r["mode"] for r in rows} == modes
    assert all(r["img_s"] > 0 and r["tflops"] > 0 and 0 < r["mfu"] for r in rows)
    flops = {r["model"]: r["gflop_img"] for r in rows}
    assert flops["CRATE-T"] < flops["official CRATE-T"] < flops["ViT d=384"]  # the formulations' FLOPs, in order
    assert result["peak_flops"] > 0


def test_bench_gpu_runs_at_tiny_sizes(tmp_path: Path) -> None:
    result = _load("bench_gpu").main(["--tiny", "--threads", "1", "--json", str(tmp_path / "out.json")])
    _check(result, {"CRATE-T", "official CRATE-T", "ViT d=384"}, {"eager"})
    e2e = result["e2e"]
    assert e2e["e2e_img_s"] > 0 and e2e["model_img_s"] > 0 and math.isfinite(e2e["ratio"])
    assert json.loads((tmp_path / "out.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))


@pytest.mark.slow
def test_bench_gpu_compiled_rows_at_tiny_sizes() -> None:
    """The compiled rows' plumbing, traced by dynamo and AOT autograd without code generation (inductor's C++ build
    of three models takes minutes on two cores)."""
    args = ["--tiny", "--threads", "1", "--compile", "T", "--backend", "aot_eager", "--e2e", "none"]
    result = _load("bench_gpu").main(args)
    _check(result, {"CRATE-T", "official CRATE-T", "ViT d=384"}, {"eager", "compiled"})
