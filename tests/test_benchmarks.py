"""The speed benchmarks still run: each at its ``--tiny`` size (seconds), checked for the rows it promises.

The benchmarks' numbers are not asserted (they depend on the machine and its load); what is asserted is that every
row is printed, that ours and the official formulation agree where the benchmark checks it, and that the ratios
are measured (finite and positive).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(script: str) -> list[list[str]]:
    """The script's output at ``--tiny``, as whitespace-split lines."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--tiny"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [line.split() for line in done.stdout.splitlines()]


def ratio(cell: str) -> float:
    assert cell.endswith("x"), cell
    value = float(cell[:-1])
    assert math.isfinite(value) and value > 0, cell
    return value


def test_bench_speed_tiny():
    lines = run("bench_speed.py")
    inference = [w for w in lines if len(w) == 10 and w[0] == "CRATE-T" and w[1].isdigit()]
    assert [w[1] for w in inference] == ["1", "2"]
    for w in inference:
        ratio(w[6]), ratio(w[7])
        assert float(w[8]) < 1e-4  # ours and the official formulation give the same logits
    training = [w for w in lines if len(w) == 8 and w[0] == "CRATE-T" and w[1] == "32/8"]
    assert [w[3] for w in training] == ["official", "ours"]
    assert ratio(training[0][6]) == 1.0 and ratio(training[1][6]) > 0


def test_bench_generate_tiny():
    lines = run("bench_generate.py")
    rows = [w for w in lines if len(w) == 10 and w[0].startswith("crate_gpt")]
    shapes = ("crate_gpt_small", "crate_gpt_base", "crate_gpt_12l_pile")
    assert [(w[0], w[1], w[3]) for w in rows] == [
        (s, model, batch) for s in shapes for batch in ("1", "8") for model in ("CRATE-GPT", "GPT")
    ]
    for w in rows:
        assert float(w[5]) > 0 and float(w[6]) > 0  # tokens/s, ms/token
        ratio(w[8])


def test_bench_tost_tiny():
    lines = run("bench_tost.py")
    ops = ("tssa", "mssa", "mssa-matrix", "softmax", "linear")
    rows = [w for w in lines if len(w) == 7 and w[0] in ops and w[1].isdigit()]
    assert [(w[0], w[1]) for w in rows] == [(op, n) for op in ops for n in ("64", "256")]
    for w in rows:
        assert float(w[2].replace(",", "")) > 0 and float(w[4]) >= 0  # tokens/s, MiB
        ratio(w[5])
    slopes = [w for w in lines if len(w) == 4 and w[0] in ops]  # time (fastest), time (median), memory
    assert [w[0] for w in slopes] == list(ops) and all(math.isfinite(float(v)) for w in slopes for v in w[1:3])
    kept = {(w[0], w[1]): ratio(w[4]) for w in lines if len(w) == 5 and w[0] in ops and w[1].isdigit()}
    assert set(kept) == {(op, n) for op in ("tssa", "mssa", "softmax") for n in ("64", "256")}
    assert kept["mssa", "256"] == 1.0 and kept["tssa", "256"] <= 1.0  # bytes kept for the backward, against MSSA's
    digits = [w for w in lines if len(w) == 6 and w[0] in ("tost_mnist", "crate_mnist_p4") and w[1] == "0"]
    assert [w[0] for w in digits] == ["tost_mnist", "crate_mnist_p4"]
    assert all(0 <= float(w[2]) <= 100 for w in digits)


def test_tssa_backward_tiny():
    """``tssa_backward.py --tiny``: one row timing TSSA's two backward paths interleaved, its ratio finite, and the
    hand-derived backward keeping fewer bytes than autograd's graph of the operator (0.40x at every size)."""
    lines = run("tssa_backward.py")
    assert lines[0][:2] == ["load", "before:"] and lines[-1][:2] == ["load", "after:"]
    rows = [w for w in lines if len(w) == 9 and w[0] in ("global", "causal")]
    assert [(w[0], w[1], w[2]) for w in rows] == [("global", "2", "64")]
    saving_s, plain_s, time_ratio, saving_mib, plain_mib, mem_ratio = map(float, rows[0][3:])
    assert min(saving_s, plain_s) > 0 and math.isfinite(time_ratio) and time_ratio > 0
    assert 0 < saving_mib < plain_mib and mem_ratio < 0.5


def test_bench_data_loading_tiny():
    """Streamed JPEG decoding against the same batches in memory: a row per worker count, rates measured."""
    lines = run("bench_data_loading.py")
    rows = [w for w in lines if len(w) == 9 and w[0] == "|" and w[1].isdigit()]
    assert [w[1] for w in rows] == ["0", "1"]
    for w in rows:
        e2e, model, share = float(w[3]), float(w[5]), float(w[7])
        assert e2e > 0 and model > 0 and abs(share - e2e / model) < 0.01 + 0.05 * share  # both rounded for print


def test_bench_datapath_tiny():
    """The real loop, the model alone and the loader alone, each row timed over the steps it promises."""
    lines = run("bench_datapath.py")
    rows = [w for w in lines if len(w) >= 11 and w[-10] in ("crate_mnist_p4", "crate_tiny")]
    assert [(" ".join(w[:-10]), w[-9], w[-7]) for w in rows] == [("digits", "32", "6"), ("folder 32px", "8", "4")]
    for w in rows:
        assert all(float(v.replace(",", "")) > 0 for v in w[-6:-3])  # e2e, model alone, loader alone: img/s
        ratio(w[-3]), ratio(w[-2]), ratio(w[-1])
    assert any(w[0] == "start:" for w in lines) and any(w[0] == "end:" for w in lines)  # the load beside the numbers


# --------------------------------------------------------------------------- bench_gpu.py (in this process)
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
    # the compiled attention rows at one length, traced without code generation (inductor: test_tssa_compile.py)
    args = ["--tiny", "--threads", "1", "--attention-compiled-tokens", "64", "--backend", "aot_eager"]
    result = _load("bench_gpu").main([*args, "--json", str(tmp_path / "out.json")])
    _check(result, {"CRATE-T", "official CRATE-T", "ViT d=384"}, {"eager"})
    e2e = result["e2e"]
    assert e2e["e2e_img_s"] > 0 and e2e["model_img_s"] > 0 and math.isfinite(e2e["ratio"])
    assert json.loads((tmp_path / "out.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    attention = {(r["op"], r["tokens"]) for r in result["attention"] if r["ms"] > 0}
    eager = {(op, n) for op in ("tssa", "mssa", "softmax") for n in (64, 128)}
    assert attention == eager | {("tssa-compiled", 64), ("mssa-compiled", 64)}
    assert all((r["compile_s"] > 0) == r["op"].endswith("-compiled") for r in result["attention"])
    kept = {(r["op"], r["tokens"]): r["saved_mib"] for r in result["attention"]}
    assert all(0 < kept["tssa", n] <= kept["mssa", n] for n in (64, 128))  # bytes kept for the backward
    decode = result["decode"]  # the decoding pairs, eager at --tiny (compiled: test_decode.py, and the GPU run)
    assert [(r["model"], r["batch"], r["dtype"]) for r in decode] == [
        (m, b, d) for b in (1, 8) for d in ("fp32", "bf16") for m in ("CRATE-GPT", "GPT")
    ]
    assert all(r["mode"] == "eager" and r["tok_s"] > 0 and r["ms_token"] > 0 for r in decode)


def test_bench_gpu_profile_splits_a_step_by_kernel_kind() -> None:
    """``--profile``: where one training step's time goes, for CRATE and the ViT, eager and compiled (compiled by
    aot_eager here: no code generation on two cores), every share a fraction and the shares summing to 1, the
    heaviest kernels named with their time; both eager rows first, each written to the JSON file as it is measured
    (a time limit that cuts the compilations keeps them)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.json"
        args = ["--tiny", "--threads", "1", "--profile", "T", "--backend", "aot_eager", "--device", "cpu"]
        rows = _load("bench_gpu").main([*args, "--json", str(out)])["profile"]
        assert json.loads(out.read_text())["profile"] == json.loads(json.dumps(rows))
    assert [(r["model"], r["mode"]) for r in rows] == [
        (m, mode) for mode in ("eager", "compiled") for m in ("CRATE-T", "ViT d=384")
    ]
    for r in rows:
        assert r["ms"] > 0 and r["kernels"] > 10 and r["share"]["GEMM"] > 0
        assert math.isclose(sum(r["share"].values()), 1.0, rel_tol=1e-9)
        times = [ms for _, ms, _ in r["top"]]
        assert 0 < len(times) <= 8 and times == sorted(times, reverse=True) and sum(times) <= r["ms"] * (1 + 1e-9)


@pytest.mark.slow
def test_bench_gpu_compiled_rows_at_tiny_sizes() -> None:
    """The compiled rows' plumbing, traced by dynamo and AOT autograd without code generation (inductor's C++ build
    of three models takes minutes on two cores)."""
    args = ["--tiny", "--threads", "1", "--compile", "T", "--backend", "aot_eager", "--e2e", "none"]
    result = _load("bench_gpu").main(args)
    _check(result, {"CRATE-T", "official CRATE-T", "ViT d=384"}, {"eager", "compiled"})


def test_gpu_check_dry_run_keeps_each_stages_share_of_the_budget(tmp_path: Path) -> None:
    """``gpu_check.sh --dry-run`` on a CPU (the train and lm stages only): with a budget of 46 s the train stage is
    given at most 46 - 5 - lm's 20 s share (21 s, not its own 25 s cap), so a long stage cannot starve the lm stage
    as it did on the first GPU run (lm cut to 16 s); lm then runs."""
    env = {**os.environ, "GPU_CHECK_PY": sys.executable, "GPU_CHECK_STAGES": "train lm", "GPU_CHECK_BUDGET": "46"}
    env["OUT"] = str(tmp_path)
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"
    done = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, env=env, timeout=240)
    log = done.stdout
    assert done.returncode == 0, log[-2000:]
    train = re.search(r"===== \[train\] \(timeout (\d+)s", log)
    assert train and int(train.group(1)) <= 46 - 5 - 20, log[-2000:]
    assert re.search(r"===== \[lm\] \(timeout (\d+)s", log), log[-2000:]  # how it ends depends on the load


@pytest.mark.slow
def test_layer_kernels_counts_a_compiled_crate_layer_against_a_vit_layer() -> None:
    """``layer_kernels.py --tiny``: per layer, CRATE's compiled forward and backward are no more fused kernels than
    the ViT's, with the same GEMMs forward (four) and one attention kernel each way; every count is a difference of
    two real inductor builds (a layer's share is positive); eager, a CRATE layer dispatches no more operators."""
    rows = {r["model"]: r for r in _load("layer_kernels").main(["--tiny", "--depths", "1", "2"])}
    crate, vit = rows["crate_base"], rows["vit_base"]
    for part in ("forward", "backward"):
        assert 0 < crate[part]["fused"] <= vit[part]["fused"], rows
        assert crate[part].get("aten") == vit[part].get("aten") == 1, rows
    assert crate["forward"]["extern"] == vit["forward"]["extern"] == 4, rows
    assert 0 < crate["eager"] <= vit["eager"], rows


def test_bench_hooks_tiny():
    """``bench_hooks.py --tiny``: each row's forward here against the commit before the hook points (extracted with
    git archive, run in its own processes, interleaved), with a finite ratio and the hooked time beside it; then the
    unhooked machinery's share of each forward."""
    lines = run("bench_hooks.py")
    labels = ["CRATE-T 32/4 b1", "CRATE-T 32/4 b32", "CRATE-GPT mini 64 tok", "GPT mini 64 tok"]
    rows = [w for w in lines if len(w) > 5 and w[0] in ("CRATE-T", "CRATE-GPT", "GPT") and w[-3].endswith("x")]
    assert [" ".join(w[:-5]) for w in rows] == labels
    for w in rows:
        assert float(w[-5]) > 0 and float(w[-4]) > 0 and float(w[-2]) > 0  # baseline, ours, hooked ms
        ratio(w[-3])
    inside = [w for w in lines if len(w) > 4 and w[0] in ("CRATE-T", "CRATE-GPT", "GPT") and w[-2].endswith("x")]
    assert [" ".join(w[:-4]) for w in inside] == labels  # the same models with their hook points stripped out
    for w in inside:
        assert float(w[-4]) > 0 and float(w[-3]) > 0 and ratio(w[-2]) == pytest.approx(float(w[-3]) / float(w[-4]),
                                                                                       abs=0.01)  # fmt: skip
    shares = [w for w in lines if len(w) > 4 and w[0] in ("CRATE-T", "CRATE-GPT", "GPT") and w[-1].endswith("%")]
    assert [" ".join(w[:-4]) for w in shares] == labels
    assert all(0 <= float(w[-1][:-1]) < 100 and int(w[-3]) == 2 for w in shares)  # --tiny: depth 2


# --------------------------------------------------------------------------- the other scripts, each at --tiny
def run_tiny(script: str, tmp: Path, *args: str) -> str:
    """The script's stdout at ``--tiny`` (and ``args``), its temporary folders made under ``tmp`` (``TMPDIR``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    command = [sys.executable, str(ROOT / "benchmarks" / script), "--tiny", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def positive(cell: str) -> float:
    """A printed number (``1,094``, ``0.95``, ``1.44x``) that is finite and positive."""
    value = float(cell.replace(",", "").removesuffix("x"))
    assert math.isfinite(value) and value > 0, cell
    return value


def markdown_rows(out: str, first: tuple[str, ...]) -> list[list[str]]:
    """The cells of the Markdown table rows whose first cell is one of ``first``."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.splitlines() if line[:1] == "|"]
    return [c for c in cells if c[0] in first]


def test_bench_crate_vs_vit_tiny(tmp_path: Path) -> None:
    """Both models trained and tested; the ratio row's parameter ratio is the two rows' parameters divided."""
    lines = [w for w in (line.split() for line in run_tiny("bench_crate_vs_vit.py", tmp_path).splitlines()) if w]
    rows = {w[0]: w for w in lines if w[0] in ("crate_mnist", "vit_mnist") and len(w) == 5}
    assert set(rows) == {"crate_mnist", "vit_mnist"}
    for w in rows.values():
        assert 0 <= float(w[1]) <= 100 and positive(w[2]) and positive(w[3])  # test acc %, params, img/s
    (ratio_row,) = [w for w in lines if w[:2] == ["ratio", "CRATE/ViT"]]
    acc, params, ips, wall = map(float, ratio_row[2:])
    assert math.isfinite(acc) and acc >= 0 and ips > 0 and wall > 0
    assert params == pytest.approx(positive(rows["crate_mnist"][2]) / positive(rows["vit_mnist"][2]), abs=0.006)


def test_bench_dino_tiny(tmp_path: Path) -> None:
    """A DINO pre-training, then k-NN at every k and a linear probe for the teacher, a random init and the pixels;
    the figure written."""
    out = run_tiny("bench_dino.py", tmp_path)
    rows = {line[:14].strip(): line[14:].split() for line in out.splitlines()}
    for name in ("DINO teacher", "random init", "raw pixels"):
        cells = rows[name]
        assert len(cells) == 6 and all(0 <= float(c.rstrip("%")) <= 100 for c in cells[:5]), cells  # k=10..200, probe
        assert positive(cells[5])  # feature std
    (figure,) = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("figure: ")]
    assert Path(figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_effects_tiny(tmp_path: Path) -> None:
    """Every model, trained and untrained, a row per layer with the seeds' mean ± std; the JSON holds each seed."""
    out = run_tiny("bench_effects.py", tmp_path)
    labels = [f"{m}, {s}" for m in ("CRATE (ISTA atoms)", "ViT (MLP units)") for s in ("trained", "untrained")]
    rows = markdown_rows(out, tuple(labels))
    assert [(c[0], c[1]) for c in rows] == [(label, layer) for label in labels for layer in ("1", "2")]
    for c in rows:
        assert len(c) == 11 and 0 <= float(c[2]) <= 100 and c[8] in ("0/2", "1/2", "2/2")
        assert all(0 <= float(c[i].split(" ± ")[0]) <= 1 for i in (3, 4, 5, 6, 7))  # purity and flip rates
    (saved,) = tmp_path.glob("bench_effects_*/effects-images.json")
    results = json.loads(saved.read_text())
    assert list(results) == labels and all(len(runs) == 2 for runs in results.values())  # seeds 0 and 1


def test_bench_effects_says_undefined_where_a_correlation_has_no_value() -> None:
    """A ρ against a constant column (a briefly trained text model flips nothing) is NaN for that seed: the row says
    so ("undefined", or the seeds it averages over), never "nan"."""
    bench = _load("bench_effects")
    keys = ("purity", "flip", "purest_flip", "random_flip", "random_q95", "rho_flip", "rho_loss")

    def run(rho_flip: float) -> dict:
        layer = {k: 0.25 for k in keys} | {"rho_flip": rho_flip, "purest_above_q95": False}
        return {"accuracy": 0.5, "layers": [layer]}

    none = bench._row("m", [run(math.nan), run(math.nan)], 0).split(" | ")
    some = bench._row("m", [run(math.nan), run(0.5), run(0.7)], 0).split(" | ")
    assert none[9] == "undefined" and some[9] == "0.60 ± 0.14 (2 of 3 seeds)", (none, some)
    assert none[10] == some[10] == "0.25 ± 0.00 |" and "nan" not in " ".join(none + some)


@pytest.mark.parametrize("task", ["images", "text"])
def test_bench_features_tiny(tmp_path: Path, task: str) -> None:
    """Two seeds of each model trained, ``crate features`` run on each and its report read back: a row per model
    and layer, every column a mean ± std of fractions."""
    out = run_tiny("bench_features.py", tmp_path, "--task", task)
    labels = {"images": ("CRATE (ISTA code)", "ViT (MLP units)"), "text": ("CRATE-GPT (ISTA code)", "GPT (MLP units)")}
    rows = markdown_rows(out, labels[task])
    assert [(c[0], c[1], c[2]) for c in rows] == [(label, "1", "16") for label in labels[task]]  # --tiny: d=16, L=1
    columns = 5 if task == "images" else 6
    for c in rows:
        means = [float(cell.split(" ± ")[0]) for cell in c[3:]]
        assert len(means) == columns and all(0 <= m <= 1 for m in means), c
    assert "over seeds [0, 1]" in out


@pytest.mark.slow
def test_bench_fsdp_tiny(tmp_path: Path) -> None:
    """Two torchrun jobs a model (DDP, FSDP): FSDP's per-process tensors fewer than DDP's; the formula rows hold 16
    bytes a parameter on a DDP process, half of it on each FSDP one."""
    out = run_tiny("bench_fsdp.py", tmp_path)
    rows = markdown_rows(out, ("crate_mnist", "crate_mae_mnist", "gpt2_large"))
    models = ("crate_mnist", "crate_mae_mnist", "gpt2_large")
    assert [(c[0], c[2]) for c in rows] == [(m, s) for m in models for s in ("ddp", "fsdp")]
    total = {(c[0], c[2]): float(c[6]) for c in rows}
    for c in rows:
        weights, grads, state = map(float, c[3:6])
        assert abs(weights + grads + state - total[c[0], c[2]]) <= 0.0015  # rounded to 1e-3 GB for print
        assert positive(c[7]) if c[0] != "gpt2_large" else c[7] == "(formula)"  # peak RSS, GB
    for m in ("crate_mnist", "crate_mae_mnist"):
        assert 0 < total[m, "fsdp"] < total[m, "ddp"]
    n = float(rows[-1][1].removesuffix("M")) * 1e6
    assert total["gpt2_large", "ddp"] == pytest.approx(16 * n / 1e9, abs=0.002)
    assert total["gpt2_large", "fsdp"] == pytest.approx(8 * n / 1e9, abs=0.002)


def test_bench_mae_tiny(tmp_path: Path) -> None:
    """Both rows: ours and the official formulation agree before timing, and both ratios are measured."""
    lines = [line.split() for line in run_tiny("bench_mae.py", tmp_path).splitlines()]
    rows = [w for w in lines if len(w) > 7 and w[-1].endswith("x") and w[-3].endswith("x")]
    assert [w[0] for w in rows] == ["MAE-S", "digits"]
    for w in rows:
        assert w[-7] == "4" and float(w[-6]) < 1e-5  # batch, max |diff| against the official code
        positive(w[-5]), positive(w[-4]), positive(w[-3]), positive(w[-2]), positive(w[-1])


def test_bench_recipes_tiny(tmp_path: Path) -> None:
    """A row per recipe piece, each timed against the plain step (itself 1.00)."""
    rows = markdown_rows(run_tiny("bench_recipes.py", tmp_path), tuple(_load("bench_recipes").ROWS))
    assert [c[0] for c in rows] == _load("bench_recipes").ROWS
    assert all(positive(c[1]) and positive(c[2]) for c in rows) and rows[0][2] == "1.00"


@pytest.mark.slow
def test_bench_threads_tiny(tmp_path: Path) -> None:
    """Every setting on the idle and the busy machine, each a fresh process; the reference row is 1.00 of itself."""
    rows = markdown_rows(run_tiny("bench_threads.py", tmp_path), ("idle", "busy"))
    settings = [s[0] for s in _load("bench_threads").SETTINGS]
    assert [(c[0], c[1]) for c in rows] == [(m, s) for m in ("idle", "busy") for s in settings]
    for c in rows:
        assert int(c[2]) >= 1 and positive(c[3]) and positive(c[4]) and float(c[5]) >= 0
        assert c[1] == "auto" or int(c[2]) == int(c[1][0])  # the threads asked for are the threads used
    assert rows[2][4] == "1.00"


def test_bench_train_throughput_tiny(tmp_path: Path) -> None:
    """The real loop, the model alone and the data alone for both configurations; e2e/compute is their quotient."""
    lines = [line.split() for line in run_tiny("bench_train_throughput.py", tmp_path).splitlines()]
    rows = [w for w in lines if len(w) >= 8 and w[0] in ("default", "CRATE-T") and w[-6] == "8"]
    assert [w[0] for w in rows] == ["default", "CRATE-T"]
    for w in rows:
        e2e, compute, data, share = (positive(v) for v in w[-5:-1])
        assert positive(w[-7].removesuffix("M")) and float(w[-1]) >= 0  # params, wall s
        assert share == pytest.approx(e2e / compute, abs=0.006 + 0.01 * share)  # both rounded for print
        assert data > 0


def test_defaults_data_tiny(tmp_path: Path) -> None:
    """The two folders written as promised: 100 grey digits in class folders; 32x32 colour patches of six
    photographs, 8 training and 2 test patches each."""
    from PIL import Image

    out = run_tiny("defaults_data.py", tmp_path)
    counts = {Path(w[0].rstrip(":")).name: int(w[1]) for w in (line.split() for line in out.splitlines())}
    assert counts == {"digits": 100, "photos": 60}
    (root,) = tmp_path.glob("defaults_data_*")
    digits = sorted((root / "digits").glob("*/*.png"))
    assert len(digits) == 100 and {p.parent.name for p in digits} == {str(d) for d in range(10)}
    assert Image.open(digits[0]).mode == "L" and Image.open(digits[0]).size == (8, 8)
    for split, n in (("train", 8), ("test", 2)):
        classes = sorted((root / "photos" / split).iterdir())
        assert len(classes) == 6 and all(len(list(c.glob("*.png"))) == n for c in classes)
        assert Image.open(next(classes[0].glob("*.png"))).size == (32, 32)


def test_lm_corpora_tiny(tmp_path: Path) -> None:
    """Both corpora written within the character budget, the printed SHA-256 that of the file's text."""
    import hashlib

    lines = run_tiny("lm_corpora.py", tmp_path).splitlines()
    assert [line.split(":")[0] for line in lines] == ["stdlib", "english"]
    for line in lines:
        path, digest = Path(line.rsplit(", ", 1)[1]), re.search(r"sha256 ([0-9a-f]{16})", line).group(1)
        text = path.read_text(encoding="utf-8")
        assert 0 < len(text) <= 20_000 and f"{len(text):,} characters" in line
        assert hashlib.sha256(text.encode()).hexdigest()[:16] == digest


def test_speed_figure_tiny(tmp_path: Path) -> None:
    """docs/speed.md's tables parsed (three CPU inference sweeps, the training steps, the GPU rows), each speed-up
    positive, and the figure drawn outside docs/."""
    lines = run_tiny("speed_figure.py", tmp_path).splitlines()
    inference = [line.split() for line in lines if " inference " in line]
    assert [w[0] for w in inference] == ["CRATE-T", "CRATE-S", "CRATE-B"]
    assert all(positive(cell.split(":")[1]) for w in inference for cell in w[2:])
    assert any(line.startswith("training step ") for line in lines)
    assert any(" img/s, official " in line for line in lines)
    figure = Path(lines[-1])
    assert figure.parent.parent == tmp_path and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_digit_scenes_segmentation_tiny():
    """``bench_digit_scenes_segmentation.py --tiny``: both models trained two steps and scored on 8 scenes, the
    table's four rows (each model untrained and trained) and a verdict per metric."""
    lines = run("bench_digit_scenes_segmentation.py")
    rows = [(w[1], w[3]) for w in lines if len(w) > 4 and w[0] == "|" and w[1] in ("CRATE", "ViT")]
    assert rows == [("CRATE", "untrained"), ("CRATE", "trained"), ("ViT", "untrained"), ("ViT", "trained")]
    verdicts = [w[1] for w in lines if w and w[0] == "verdict"]
    assert verdicts == ["(maskcut_AP50):", "(maskcut_boxAP50):", "(maskcut_corloc):", "(maskcut_jaccard):"]
    assert any(w[:2] == ["seeds", "[0];"] for w in lines)


def _digit_rows(seed: int, crate: float, vit: float, untrained: float) -> list[dict]:
    metrics = dict.fromkeys(("maskcut_boxAP50", "maskcut_corloc", "maskcut_jaccard", "attention_AP50"), 0.0)
    row = dict(seed=seed, test_acc=0.5, score_cpu_s=1.0, train_cpu_s=2.0, **metrics)
    return [
        {**row, "model": "CRATE", "trained": False, "maskcut_AP50": untrained},
        {**row, "model": "CRATE", "trained": True, "maskcut_AP50": crate},
        {**row, "model": "ViT", "trained": False, "maskcut_AP50": 0.0},
        {**row, "model": "ViT", "trained": True, "maskcut_AP50": vit},
    ]


def test_digit_scenes_rows_merge_across_processes_and_the_verdict_rule(tmp_path: Path, monkeypatch) -> None:
    """Seeds written by separate processes are collected in seed order (10 after 2); the verdict's noise is
    2·√((s_c² + s_v²)/n), here computed by hand: sd 0.02 for both over 3 seeds gives 0.0327."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = _load("bench_digit_scenes_segmentation")
    for seed, (c, v, u) in zip((10, 2, 1), [(0.30, 0.10, 0.00), (0.32, 0.12, 0.01), (0.34, 0.14, 0.02)]):
        (tmp_path / f"rows-seed{seed}.json").write_text(json.dumps(_digit_rows(seed, c, v, u)))
    rows = bench.collect(tmp_path)
    assert [r["seed"] for r in rows[::4]] == [1, 2, 10]
    noise = 2 * math.sqrt((0.02**2 + 0.02**2) / 3)
    said = bench.verdict(rows)
    assert said.startswith("holds") and f"noise {noise:.3f}" in said and "CRATE 0.320 ± 0.020" in said
    for r in (r for r in rows if r["trained"]):  # the other way round (0.44 - x): the ViT ahead by the same margin
        r["maskcut_AP50"] = 0.44 - r["maskcut_AP50"]
    assert bench.verdict(rows).startswith("fails: the ViT's")
    partial = [r for r in rows if not (r["model"] == "ViT" and r["seed"] == 10)]  # one ViT seed still training
    sv = math.sqrt(2) * 0.01  # the sd (ddof 1) of the ViT's 0.32 and 0.30, now over 2 seeds
    noise = 2 * math.sqrt(0.02**2 / 3 + sv**2 / 2)
    assert f"noise {noise:.3f}" in bench.verdict(partial) and "seeds: CRATE 3, ViT 2" in bench.verdict(partial)
    split = tmp_path / "split"  # one seed's two models from two processes (--models ViT, --models CRATE)
    split.mkdir()
    both = _digit_rows(4, 0.3, 0.1, 0.0)
    (split / "rows-seed4-ViT.json").write_text(json.dumps(both[2:]))
    (split / "rows-seed4-CRATE.json").write_text(json.dumps(both[:2]))
    assert bench.collect(split) == both


def test_digit_scenes_patch_diagnostic_against_a_loop(tmp_path: Path, monkeypatch) -> None:
    """``--diagnose``'s AUCs, stds and mask fill against a patch-by-patch loop: torch's LayerNorm, a pairwise AUC
    (ties count a half) and the decoded masks' pixel counts."""
    import numpy as np
    import torch
    from PIL import Image

    from crate_transformer.analysis import read_coco
    from crate_transformer.data.digit_scenes import write_digit_scenes

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = _load("bench_digit_scenes_segmentation")
    gt = read_coco(write_digit_scenes(tmp_path, n=3, size=64, seed=5), tmp_path / "images")
    got = bench.patch_diagnostic(gt, n=3, patch=8)
    raw, normed, digit, fill = [], [], [], []
    for i in gt.image_ids:
        x = np.asarray(Image.open(gt.files[i]).convert("RGB"), dtype=np.float64) / 255
        masks = gt.masks(i)
        for m in masks:  # the box from the mask itself
            ys, xs = np.nonzero(m)
            fill.append(m.sum() / ((ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)))
        for r in range(0, 64, 8):
            for c in range(0, 64, 8):
                share = masks.any(0)[r : r + 8, c : c + 8].mean()
                if 0 < share < 0.05:
                    continue
                tile = torch.from_numpy(x[r : r + 8, c : c + 8].reshape(-1))
                raw.append(tile.max().item()), digit.append(share >= 0.05)
                normed.append(torch.nn.functional.layer_norm(tile, (tile.numel(),), eps=1e-5).max().item())

    def auc(score: list[float]) -> float:
        pos = [s for s, d in zip(score, digit) if d]
        neg = [s for s, d in zip(score, digit) if not d]
        return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))

    assert got["patches"] == len(digit) and 0 < sum(digit) < len(digit)
    assert math.isclose(got["auc_raw"], auc(raw), abs_tol=1e-9)
    assert math.isclose(got["auc_layernorm"], auc(normed), abs_tol=1e-6)
    assert math.isclose(got["fill_median"], float(np.median(fill)), abs_tol=1e-12)


def test_corridor_tiny():
    """benchmarks/corridor.py counts what ``wc -l`` and a listing count, and finds no route but ``option(...)``."""
    text = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "corridor.py"), "--tiny"],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    package = ROOT / "src" / "crate_transformer"
    names = ("config.py", "config_utils.py", "train/config.py", "cli/options.py", "cli/__init__.py", "errors.py")
    lines = sum(len((package / n).read_text().splitlines()) for n in (*names, "layers/config.py"))
    words = len((package / "cli" / "messages.py").read_text().splitlines())
    assert f"total, the issue's list (this tree): {lines}; with cli/messages.py: {lines + words}" in text, text
    assert f"modules at the package root: {len(list(package.glob('*.py')))}\n" in text
    routes = re.findall(r"^  (.+?)\s+(\d+)$", text, re.M)
    assert len(routes) == 5 and all(int(n) == 0 for name, n in routes if not name.startswith("add_argument")), routes
