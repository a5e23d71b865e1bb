"""The unigram plateau of language-model training (docs/language-models.md): the initialisation against crate-lm's,
the token prior (``LanguageModel.init_token_prior``), the lm task's plateau check and its one-line warning, the
warm-up as a share of the run's steps, and the plateau benchmark's tiny mode."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tiny
import torch
import torch.nn.functional as F
from clitools import crate
from official import crate_lm_official as crate_lm

import crate_transformer as ct
from crate_transformer.data import text as text_data
from crate_transformer.data.text import TokenBlocks, load_tokens, split_tokens
from crate_transformer.errors import OptionWarning
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.lm import crate_lm_to_native
from crate_transformer.models.tokenizer import Tokenizer
from crate_transformer.train import TrainConfig
from crate_transformer.train.lm import PLATEAU_BLOCKS, PLATEAU_MARGIN, PLATEAU_SHARE, plateau_warning
from crate_transformer.train.optim import warmup_steps

ROOT = Path(__file__).resolve().parents[2]
TINY = {**tiny.LM, "dim": 32, "depth": 2}


@pytest.fixture(autouse=True)
def _token_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRATE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "token-cache"))


def _kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p ‖ q) of two distributions, in float64."""
    p, q = p.double(), q.double()
    return float((p * (p.log() - q.log())).sum())


# --------------------------------------------------------------------------- the initialisation is crate-lm's
def test_crate_gpt_initialisation_matches_crate_lm() -> None:
    """Every tensor of a new crate_gpt_mini has the distribution crate-lm's crate.py gives it: Linear and Embedding
    weights N(0, 0.02), the residual projections c_proj N(0, 0.02/√(2L)), ISTA dictionaries kaiming-uniform
    (bound √(6/d)), biases 0 and LayerNorms 1 / 0 — so the plateau is not an initialisation that differs."""
    d, L = 128, 4
    torch.manual_seed(0)
    theirs = crate_lm.CRATE(crate_lm.CRATEConfig(block_size=128, vocab_size=262, n_layer=L, n_head=4, n_embd=d))
    theirs = crate_lm_to_native(theirs.state_dict(), ct.model_config("crate_gpt_mini"))
    torch.manual_seed(1)
    ours = ct.create_model("crate_gpt_mini").state_dict()
    assert set(ours) == set(theirs)
    for key, mine in ours.items():
        other = theirs[key]
        assert mine.shape == other.shape, key
        if key.endswith("ista.weight"):
            bound = math.sqrt(6 / d)
            assert mine.abs().max() <= bound and other.abs().max() <= bound, key
            assert float(mine.std()) == pytest.approx(bound / math.sqrt(3), rel=0.03), key
        elif mine.ndim == 2:
            std = 0.02 / math.sqrt(2 * L) if key.endswith("attn.proj.weight") else 0.02
            assert float(mine.std()) == pytest.approx(std, rel=0.05), key
            assert float(other.std()) == pytest.approx(std, rel=0.05), key
        else:  # LayerNorm weights 1, biases 0
            assert torch.equal(mine, other), key


# --------------------------------------------------------------------------- the token prior
MODELS = [
    ("crate_gpt_mini", {}),
    ("crate_gpt_mini", {"layer_form": "jmlr"}),
    ("crate_bert_mini", {}),
    ("crate_gpt_mini", {"mlp": "ista_overcomplete", "final_norm": True}),  # the released CRATE-GPT's layout
    ("crate_gpt_mini", {"ista_mode": "none"}),  # Table 16: the last layer's output is MSSA's, with a bias
    ("gpt_mini", {}),  # a final LayerNorm
]


@pytest.mark.parametrize("name,args", MODELS, ids=[f"{n}{a or ''}" for n, a in MODELS])
def test_the_token_prior_moves_the_predictions_and_not_what_the_layers_read(name: str, args: dict) -> None:
    torch.manual_seed(0)
    model = ct.create_model(name, **{**TINY, **args}).eval()
    idx = torch.randint(0, 262, (8, 16))
    prior = torch.distributions.Dirichlet(torch.full((262,), 0.3)).sample().clamp_min(1e-9)
    prior = prior / prior.sum()

    def read() -> list[torch.Tensor]:  # what every layer reads of its input, and the CRATE layers' outputs
        trace = model.forward_trace(idx)
        reads = [layer.norm1(z) for layer, z in zip(model.layers, trace.tokens)]
        crate_outputs = [z for layer, z in zip(model.layers, trace.tokens[1:]) if layer.output_bias() is None]
        return reads + crate_outputs

    with torch.no_grad():
        before, mean_before = read(), F.softmax(model(idx).double(), -1).mean((0, 1))
        assert model.init_token_prior(prior.log(), idx)
        after, mean_after = read(), F.softmax(model(idx).double(), -1).mean((0, 1))
    assert _kl(prior, mean_before) > 0.5
    assert _kl(prior, mean_after) < 0.05  # the untrained model predicts the prior (on average over the tokens)
    for b, a in zip(before, after):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_the_released_crate_bert_takes_the_prior_in_its_vocabulary_bias() -> None:
    torch.manual_seed(0)
    model = ct.create_model("crate_bert_medium", vocab_size=262, dim=32, depth=1, heads=2, block_size=18)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    log_prior = torch.log_softmax(torch.randn(262, dtype=torch.float64), 0)
    assert model.init_token_prior(log_prior, torch.randint(3, 262, (2, 8)))
    centred = log_prior - (log_prior.exp() * log_prior).sum()
    torch.testing.assert_close(model.lm_head.bias.double(), centred, atol=1e-6, rtol=0)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items() if k != "lm_head.bias")


def test_a_model_without_a_constant_feature_channel_is_left_as_it_is() -> None:
    torch.manual_seed(0)
    model = ct.create_model("crate_gpt_mini", **TINY, mlp="odl")  # CRATE-α's ODL: residual, no bias anywhere
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not model.init_token_prior(torch.zeros(262), torch.randint(0, 262, (2, 8)))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# --------------------------------------------------------------------------- counts and the task's facts
def test_token_counts_are_a_bincount_of_the_split_counted_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = np.random.default_rng(0).integers(0, 40, 1000).astype(np.uint16)
    monkeypatch.setattr(text_data, "_COUNT_PIECE", 7)
    counts = TokenBlocks(tokens, 16, 100, 900, "x", "train").token_counts(50)
    assert counts.dtype == np.int64 and counts.tolist() == np.bincount(tokens[100:900], minlength=50).tolist()
    with pytest.raises(ValueError, match="outside the vocabulary of 30; delete the token cache"):
        TokenBlocks(tokens, 16, 0, 1000, "x", "train").token_counts(30)


LM_ARGS = ["--threads", 1, "--no-progress", "--model-args", *tiny.kv(TINY), "--batch-size", 16, "--epochs", 1,
           "--eval-every", 0, "--eval-blocks", 16, "--sample-tokens", 0]  # fmt: skip


def corpus(where: Path) -> Path:
    """About 40,000 characters of Python's documentation as a text file: a run of 1 epoch is ~140 steps."""
    from pydoc_data.topics import topics

    path = where / "docs.txt"
    if not path.exists():
        path.write_text("\n\n".join(topics[k] for k in sorted(topics))[:40_000], encoding="utf-8")
    return path


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _derived(run: Path) -> dict:
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())["derived"]


def test_a_new_run_starts_at_the_unigram_distribution(tmp_path: Path) -> None:
    """The unigram entropy recorded for the run is the training tokens' (an independent float64 computation), and
    the first steps' loss of a new run is near it with the token prior and near ln V without."""
    runs = {}
    for prior in ("--token-prior", "--no-token-prior"):
        runs[prior] = tmp_path / prior
        argv = [
            *LM_ARGS,
            "--lr",
            1e-6,
            "--min-lr",
            0,
            "--max-steps",
            10,
            "--log-every",
            10,
            prior,
            "--out",
            runs[prior],
        ]
        assert crate("train-lm", *argv) == 0
    tokens = load_tokens("python-docs", Tokenizer.byte_level())
    cut = split_tokens(len(tokens), 0.1, 16)
    p = np.bincount(np.asarray(tokens[:cut]).astype(np.int64)) / cut
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    derived = _derived(runs["--token-prior"])
    assert derived["unigram_entropy"] == pytest.approx(entropy, abs=1e-4) and derived["token_prior"] is True
    assert _derived(runs["--no-token-prior"])["token_prior"] is False
    first = {k: next(r for r in _records(run) if r["split"] == "train")["loss"] for k, run in runs.items()}
    assert abs(first["--token-prior"] - entropy) < 0.25
    assert abs(first["--no-token-prior"] - math.log(262)) < 0.25


# --------------------------------------------------------------------------- the plateau check
def test_a_run_still_on_the_plateau_gets_one_warning_line_naming_flags(tmp_path: Path) -> None:
    """The command as a user runs it, in its own process (pytest records warnings, so in-process the line would
    never reach stderr): one line, naming flags."""
    run = tmp_path / "flat"
    argv = ["train-lm", *LM_ARGS, "--data", corpus(tmp_path), "--lr", 1e-6, "--min-lr", 0, "--out", run]  # cannot learn
    proc = subprocess.run([sys.executable, "-m", "crate_transformer.cli", *map(str, argv)], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr
    derived = _derived(run)
    check = round(PLATEAU_SHARE * derived["total_steps"])
    lines = [line for line in err.splitlines() if "warning" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("crate train-lm: warning: held-out loss ")
    assert f"after {check} of {derived['total_steps']} steps" in lines[0]
    assert "--warmup-fraction" in lines[0] and "--lr" in lines[0] and "--epochs" in lines[0]
    assert "warmup_fraction" not in lines[0]
    record = next(r for r in _records(run) if r["split"] == "plateau_check")
    assert record["step"] == check and record["on_plateau"] is True
    assert record["unigram_entropy"] == pytest.approx(derived["unigram_entropy"], abs=1e-4)
    assert record["loss"] > (1 - PLATEAU_MARGIN) * record["unigram_entropy"]


def test_the_check_evaluates_the_first_held_out_windows(tmp_path: Path) -> None:
    """The check's held-out loss is the model's mean cross-entropy over the first PLATEAU_BLOCKS held-out windows
    (here the 16 of --eval-blocks), computed here from the saved model (the run stops at the check)."""
    text = corpus(tmp_path)
    run = tmp_path / "short"
    assert crate("train-lm", *LM_ARGS, "--data", text, "--lr", 1e-6, "--min-lr", 0, "--out", run, "--max-steps", 1) == 0
    check = round(PLATEAU_SHARE * _derived(run)["total_steps"])
    run = tmp_path / "at-check"
    assert crate("train-lm", *LM_ARGS, "--data", text, "--lr", 3e-3, "--out", run, "--max-steps", check) == 0
    record = next(r for r in _records(run) if r["split"] == "plateau_check")
    model = load_model(run).eval()
    tokens = load_tokens(str(text), model.tokenizer)
    cut = split_tokens(len(tokens), 0.1, 16)
    windows = np.stack([np.asarray(tokens[cut + 16 * i : cut + 16 * i + 17]) for i in range(min(16, PLATEAU_BLOCKS))])
    windows = torch.from_numpy(windows.astype(np.int64))
    with torch.no_grad():
        logits = model(windows[:, :-1]).double()
    loss = float(F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()))
    assert record["loss"] == pytest.approx(loss, abs=1e-4)


def test_the_warning_names_options_in_the_library() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn(plateau_warning(3.2, 3.27, 80, 400, token_prior=False), stacklevel=1)
    (w,) = caught
    assert isinstance(w.message, OptionWarning)
    text = str(w.message)
    assert (
        "after 80 of 400 steps (20%)" in text
        and "is not yet 5% below the unigram entropy of the training tokens (3.270)" in text
    )
    assert "try token_prior (it is off), a longer warm-up (warmup_fraction), a lower lr or more epochs" in text
    assert "--" not in text
    assert "token_prior" not in str(plateau_warning(3.2, 3.27, 80, 400, token_prior=True))


@pytest.mark.slow
def test_the_default_run_leaves_the_plateau_by_the_check_and_lower_than_the_plain_initialisation(
    tmp_path: Path,
) -> None:
    """``crate train-lm`` as a new user runs it, cut at the plateau check (20% of the 4 epochs): with the token prior
    the held-out loss is already below the plateau and well below crate-lm's initialisation alone (whether that
    one has left the plateau by then depends on the seed and the machine), and the one warning line appears
    exactly when the check says the run is on the plateau."""
    args = ["--threads", 1, "--no-progress", "--eval-every", 0, "--sample-tokens", 0]
    checks = {}
    for prior in ("--token-prior", "--no-token-prior"):
        run = tmp_path / prior
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert crate("train-lm", *args, prior, "--max-steps", 82, "--out", run) == 0
        assert _derived(run)["total_steps"] == 408  # 82 = 20% of the default run
        checks[prior] = next(r for r in _records(run) if r["split"] == "plateau_check")
        warned = [w for w in caught if isinstance(w.message, OptionWarning) and "held-out loss" in str(w.message)]
        assert len(warned) == checks[prior]["on_plateau"], [str(w.message) for w in caught]
    assert checks["--token-prior"]["on_plateau"] is False
    assert checks["--token-prior"]["loss"] < checks["--no-token-prior"]["loss"] - 0.2


# --------------------------------------------------------------------------- warm-up as a share of the steps
def test_one_warm_up_replaces_the_other() -> None:
    lm = TrainConfig(warmup_fraction=0.05)
    assert (lm.optim.warmup_epochs, lm.optim.warmup_fraction) == (0.0, 0.05)
    epochs = TrainConfig.from_dict({"warmup_epochs": 1}, lm)
    assert (epochs.optim.warmup_epochs, epochs.optim.warmup_fraction) == (1.0, 0.0)
    kept = TrainConfig.from_dict({"lr": 1e-3}, lm)
    assert (kept.optim.warmup_epochs, kept.optim.warmup_fraction) == (0.0, 0.05)
    assert TrainConfig.from_dict(kept.to_dict()).optim == kept.optim  # a saved config reads back as it was
    with pytest.raises(ValueError, match="two warm-ups: warmup_epochs=1.0 and warmup_fraction=0.1; set one"):
        TrainConfig(warmup_epochs=1, warmup_fraction=0.1)
    assert warmup_steps(TrainConfig(warmup_fraction=0.05).optim, 100, 400) == 20
    assert warmup_steps(TrainConfig(warmup_fraction=0.001).optim, 100, 400) == 1  # at least one step
    assert warmup_steps(TrainConfig(warmup_epochs=0.5).optim, 100, 400) == 50


def test_the_learning_rate_peaks_after_the_warm_up_share(tmp_path: Path) -> None:
    run = tmp_path / "w"
    argv = [*LM_ARGS, "--data", corpus(tmp_path), "--lr", 1e-3, "--min-lr", 0, "--warmup-fraction", 0.25]
    assert crate("train-lm", *argv, "--log-every", 1, "--max-steps", 60, "--out", run) == 0
    derived = _derived(run)
    w = derived["warmup_steps"]
    assert w == round(0.25 * derived["total_steps"]) and 8 <= w < 60
    lr = {r["step"]: r["lr"] for r in _records(run) if r["split"] == "train"}
    # WarmupCosine: step s (0-based) trains at (s + 1) / w of the peak; the record after step s shows step s's next
    assert lr[w - 1] == pytest.approx(1e-3) and lr[w // 2 - 1] == pytest.approx(1e-3 * (w // 2) / w)


# --------------------------------------------------------------------------- the benchmarks stay alive
def _script(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), "--tiny", *args], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_plateau_benchmark_runs_tiny() -> None:
    out = _script("bench_lm_plateau.py", "--seeds", "0", "--corpora", "python-docs")
    rows = [line for line in out.splitlines() if line.startswith("| python-docs |")]
    assert len(rows) == 3 and "gpt_mini dim=" in rows[2]
    assert "CRATE-GPT − equal-size GPT" in out


@pytest.mark.slow
def test_first_steps_benchmark_runs_tiny() -> None:
    out = _script("lm_first_steps.py", "--data", "python-docs", "--models", "crate_plain", "--init", "ista=zero")
    rows = [line for line in out.splitlines() if line.startswith("| 0 |") or line.startswith("| 4 |")]
    assert len(rows) == 2
    zero = float(rows[0].split("|")[5])  # with D = 0 the one layer's ISTA step is ReLU(LN(z) − ηλ): about half zero
    assert 0.4 < zero < 0.6
