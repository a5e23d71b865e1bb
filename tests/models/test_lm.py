"""Language models (JMLR §4.1.4): Table 10 sizes, causality, the key-value cache, masking, tokenizers, text data,
training on the engine, generation and their errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import tiny
import torch
from clitools import crate, one_line_error

import crate_transformer as ct
from crate_transformer.data import Position
from crate_transformer.data.text import TokenBlocks, load_tokens
from crate_transformer.layers import attend, frozen_weights
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.lm import GPT, CRATELanguageModel, LMConfig, build_lm, mask_tokens, sample_next
from crate_transformer.models.tokenizer import Tokenizer
from crate_transformer.train import load_training_state

TINY = {**tiny.LM, "dim": 32, "depth": 2}


@pytest.fixture(autouse=True)
def _token_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRATE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "token-cache"))


# --------------------------------------------------------------------------- sizes (Table 10)
def _crate_lm_params(L: int, d: int, V: int, n_pos: int = 0) -> int:
    """Per layer (JMLR eqs. (37), (44), (45)):
    LN1 2d + U d² + W (d² + d) + LN2 2d + D d² per layer; tied V×d head; learned positions."""
    return L * (3 * d * d + 5 * d) + V * d + n_pos * d


def _gpt2_params(L: int, d: int, V: int, n_pos: int) -> int:
    """GPT-2: LN 2d + c_attn (3d² + 3d) + c_proj (d² + d) + LN 2d + MLP (8d² + 5d) per layer, final LN, wte, wpe."""
    return L * (12 * d * d + 13 * d) + 2 * d + V * d + n_pos * d


@pytest.mark.parametrize(
    "name, L, d, V, n_pos, paper",
    [
        ("crate_bert_eq83_medium", 8, 512, 50265, 0, 33e6),  # the released ones: tests/loading/test_bert_release.py
        ("crate_bert_eq83_base", 12, 768, 50265, 0, 61e6),
        ("crate_bert_eq83_large", 24, 1024, 50265, 0, 129e6),
        ("crate_gpt_base", 12, 768, 50304, 1024, 60e6),
        ("crate_gpt_large", 36, 1280, 50304, 1024, 242e6),
    ],
)
def test_table_10_parameter_counts(name: str, L: int, d: int, V: int, n_pos: int, paper: float) -> None:
    with torch.device("meta"):
        model = ct.create_model(name)
    assert model.num_params() == _crate_lm_params(L, d, V, n_pos)
    assert model.num_params(exclude_positions=True) == _crate_lm_params(L, d, V)
    # the paper's numbers exclude the learned position table; rounded as printed (BERT-Large: 127.1M vs 129M)
    assert abs(model.num_params(exclude_positions=True) - paper) / paper < 0.035


def test_gpt2_baselines_have_gpt2_parameter_counts() -> None:
    with torch.device("meta"):
        base, large, small = (ct.create_model(n) for n in ("gpt2_base", "gpt2_large", "gpt2_small"))
    assert base.num_params() == _gpt2_params(12, 768, 50257, 1024) == 124_439_808  # GPT-2 124M
    assert large.num_params() == _gpt2_params(36, 1280, 50257, 1024) == 774_030_080  # GPT-2 774M
    assert round(small.num_params() / 1e6) == 64  # Table 10 "Small"


def test_crate_without_ista_trains_only_what_it_uses() -> None:
    m = build_lm(LMConfig(ista_mode="none", **TINY))
    assert not any(".ista." in k or ".norm2." in k for k in m.state_dict())  # no ISTA D and LN2 to leave unused
    assert m.num_params(trainable_only=True) == m.num_params()
    m(torch.randint(0, 262, (2, 8))).sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_registry_lists_and_builds_language_models(capsys: pytest.CaptureFixture) -> None:
    assert crate("models", "crate_bert_*") == 0
    out = capsys.readouterr().out
    assert "59,883,264" in out and "BERT ctx 512, vocab 50,265" in out and "crate_gpt" not in out
    names = ct.list_models("*gpt*")
    assert {"crate_gpt_small", "crate_gpt_mini", "gpt_mini", "gpt2_base"} <= set(names)
    m = ct.create_model("crate_gpt_mini", depth=1)
    assert isinstance(m, CRATELanguageModel) and m.config.depth == 1 and m.config.causal
    assert isinstance(ct.create_model("gpt_mini", depth=1), GPT)
    assert not ct.create_model("crate_bert_mini", depth=1).config.causal
    with pytest.raises(ValueError, match="unknown override"):
        ct.create_model("crate_gpt_mini", patch_size=4)


# --------------------------------------------------------------------------- causality and the cache
@pytest.mark.parametrize("arch", ["crate_lm", "gpt"])
def test_changing_a_future_token_never_changes_earlier_outputs(arch: str) -> None:
    model = build_lm(LMConfig(arch=arch, **TINY)).eval()
    x = torch.randint(0, 262, (3, 16))
    for t in (0, 5, 15):
        y = x.clone()
        y[:, t] = (y[:, t] + 7) % 262
        a, b = model(x), model(y)
        assert torch.equal(a[:, :t], b[:, :t]), t  # bit-identical: no information flows backwards
        assert (a[:, t] - b[:, t]).abs().max() > 1e-4  # the changed position itself does change
    bert = build_lm(LMConfig(arch=arch, causal=False, **TINY)).eval()  # bidirectional: earlier outputs see it
    y = x.clone()
    y[:, 15] = (y[:, 15] + 7) % 262
    assert (bert(x)[:, 0] - bert(y)[:, 0]).abs().max() > 1e-5


def test_offset_causal_attention_is_the_last_rows_of_full_attention() -> None:
    q, k, v = torch.randn(3, 2, 2, 9, 4).unbind(0)
    full = attend(q, k, v, causal=True, scale=0.5)
    for m in (1, 3, 9):
        assert torch.allclose(attend(q[..., -m:, :], k, v, causal=True, scale=0.5), full[..., -m:, :], atol=1e-6)


@pytest.mark.parametrize("arch", ["crate_lm", "gpt"])
def test_cached_and_uncached_generation_agree_also_past_the_context(arch: str) -> None:
    model = build_lm(LMConfig(arch=arch, **TINY))
    prompt = torch.randint(0, 262, (2, 5))
    runs = []
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(3)
        runs.append(
            model.generate(prompt, 30, top_k=20, top_p=0.9, generator=g, use_cache=use_cache, return_logits=True)
        )
    (ids_c, logits_c), (ids_u, logits_u) = runs
    assert ids_c.shape == (2, 35) and torch.equal(ids_c, ids_u)  # 35 > block_size 16: the window slides
    assert torch.allclose(logits_c, logits_u, atol=1e-5), (logits_c - logits_u).abs().max()
    assert model.training  # the mode is restored


def test_generation_runs_the_head_on_the_last_token_only() -> None:
    """The prompt's pass maps only its last token to logits (a V × d product per sequence, not per prompt token)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_lm(LMConfig(**TINY)).eval()
    prompt = torch.randint(0, 262, (2, 12))

    def flops(fn) -> int:
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            fn()
        return fc.get_total_flops()

    head = 2 * 2 * TINY["dim"] * TINY["vocab_size"]  # one token per sequence

    def features() -> None:
        with frozen_weights(model):  # as generate holds the weights
            model.forward_features(prompt)

    assert flops(lambda: model.generate(prompt, 1)) == flops(features) + head


def test_generation_holds_the_step_matrices_and_restores_the_mode() -> None:
    """generate holds each ISTA's A for its decoding steps (frozen_weights), then drops it and restores the mode."""
    model = build_lm(LMConfig(**TINY))
    prompt = torch.randint(0, 262, (1, 4))
    seen = []
    model.layers[0].ista.register_forward_pre_hook(lambda m, _: seen.append(m.frozen))
    model.generate(prompt, 3)
    assert len(seen) == 3 and seen[0] is not None and all(a is seen[0] for a in seen)
    assert model.training and all(layer.ista.frozen is None for layer in model.layers)


def test_crate_caches_one_tensor_per_layer_and_gpt_two() -> None:
    crate_m, gpt_m = build_lm(LMConfig(**TINY)), build_lm(LMConfig(arch="gpt", **TINY))
    x = torch.randint(0, 262, (1, 10))
    for model, keys in ((crate_m, ["w"]), (gpt_m, ["k", "v"])):
        cache = model.new_cache()
        model(x, cache)
        assert all(sorted(c) == keys for c in cache)
        assert ct.models.lm.cache_nbytes(cache) == len(keys) * 2 * 10 * 32 * 4  # layers x tokens x d x fp32


def test_sampling_rules() -> None:
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]])
    assert sample_next(logits, temperature=0).item() == 2
    g = torch.Generator().manual_seed(0)
    draws = {sample_next(logits, top_k=2, generator=g).item() for _ in range(200)}
    assert draws == {2, 3}
    p = torch.softmax(logits, -1)[0]  # p(2) = 0.64, p(3) = 0.24: the nucleus of 0.7 is {2, 3}
    assert p[2] < 0.7 < p[2] + p[3]
    draws = {sample_next(logits, top_p=0.7, generator=g).item() for _ in range(200)}
    assert draws == {2, 3}
    with pytest.raises(ValueError, match="top_p"):
        sample_next(logits, top_p=1.5)


# --------------------------------------------------------------------------- masking (eq. (85))
def test_mlm_masking_statistics() -> None:
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 250, (64, 512))
    idx[:, ::50] = 256  # special tokens are never chosen
    inputs, labels = mask_tokens(idx, mask_id=258, vocab_size=262, special_ids=[256, 258], generator=g)
    chosen = labels != -100
    eligible = idx != 256
    assert not chosen[~eligible].any() and torch.equal(labels[chosen], idx[chosen])
    rate = chosen.sum() / eligible.sum()
    n = int(chosen.sum())
    assert abs(rate - 0.15) < 4 * math.sqrt(0.15 * 0.85 / int(eligible.sum()))
    masked = (inputs == 258) & chosen
    kept = (inputs == idx) & chosen
    randomised = chosen & ~masked & ~kept
    sd = math.sqrt(0.1 * 0.9 / n)
    assert abs(masked.sum() / n - 0.8) < 5 * sd
    # a random replacement equals the original with probability 1/262, which counts as kept
    assert abs(kept.sum() / n - (0.1 + 0.1 / 262)) < 5 * sd
    assert abs(randomised.sum() / n - (0.1 - 0.1 / 262)) < 5 * sd
    assert torch.equal(inputs[~chosen], idx[~chosen])


# --------------------------------------------------------------------------- tokenizers
def test_tokenizers_round_trip_and_reload(tmp_path: Path) -> None:
    text = "def f(x):\n    return x ** 2  # café, naïve, 数学, 🎉\r\n\ttabs"
    byte = Tokenizer.byte_level()
    assert byte.vocab_size == 262 and byte.decode(byte.encode(text)) == text
    assert byte.encode("é") == list("é".encode())  # one id per UTF-8 byte
    corpus = [text, "import os\nprint(os.getcwd())\n" * 20, "The quick brown fox jumps over the lazy dog. " * 30]
    bpe = Tokenizer.train("bpe", corpus, vocab_size=400)
    assert bpe.decode(bpe.encode(text)) == text and len(bpe.encode(corpus[2])) < len(byte.encode(corpus[2])) / 3
    wp = Tokenizer.train("wordpiece", corpus, vocab_size=400)
    assert wp.decode(wp.encode("The quick brown fox")) == "the quick brown fox"  # BERT's lower-casing
    for tok in (byte, bpe, wp):
        again = Tokenizer.from_file(tok.save(tmp_path / f"{tok.kind}.json"))
        assert again.kind == tok.kind and again.encode(text) == tok.encode(text) and again.mask_id == tok.mask_id
    # any tokenizers JSON loads; missing special tokens are added
    import tokenizers

    plain = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    plain.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    plain.save(str(tmp_path / "plain.json"))
    t = Tokenizer.from_file(tmp_path / "plain.json")
    assert t.encode("a b a") == [0, 1, 0] and t.vocab_size == 8 and t.mask_id >= 3
    with pytest.raises(ValueError, match="not a valid tokenizers JSON"):
        (tmp_path / "bad.json").write_text("{nope")
        Tokenizer.from_file(tmp_path / "bad.json")


# --------------------------------------------------------------------------- data
def test_token_file_is_memory_mapped_and_blocks_follow_the_source_contract(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("hello world\n" * 30)
    (folder / "b.md").write_text("second document\n" * 20)
    (folder / "skip.bin").write_bytes(b"\xff\xfe")
    tok = Tokenizer.byte_level()
    tokens = load_tokens(str(folder), tok)
    assert isinstance(tokens, __import__("numpy").memmap)
    expected = tok.encode("hello world\n" * 30) + [tok.eos_id] + tok.encode("second document\n" * 20) + [tok.eos_id]
    assert tokens.tolist() == expected
    blocks = TokenBlocks(tokens, 8, 0, len(tokens), "corpus", "train")
    assert len(blocks) == (len(tokens) - 1) // 8  # evaluation: every window of the unshifted grid
    assert blocks.steps_per_epoch(4) == ((len(tokens) - 8) // 8) // 4  # training: the windows that fit any shift
    one = torch.cat(list(blocks.batches(4, shuffle=True, at=Position(seed=1, epoch=2))))
    halves = [Position(seed=1, epoch=2, rank=r, world=2) for r in (0, 1)]
    two = [torch.cat(list(blocks.batches(4, shuffle=True, at=at))) for at in halves]
    assert one.shape[1] == 9 and len(one) == 4 * blocks.steps_per_epoch(4)
    assert sorted(map(tuple, one.tolist())) == sorted(map(tuple, torch.cat(two).tolist()))  # ranks split each batch
    first = blocks.get(torch.tensor([1]))[0].tolist()
    assert first == expected[8:17]  # window i starts at token 8i and holds 9 tokens (inputs + next-token targets)
    # each training epoch reads windows of one grid, shifted by its seeded offset (none in epoch 0), in the
    # epoch's seeded order
    from crate_transformer.data.base import epoch_permutation

    offsets = []
    for epoch in range(6):
        rows = torch.cat(list(blocks.batches(4, shuffle=True, at=Position(seed=1, epoch=epoch)))).tolist()
        o = blocks.offset(1, epoch)
        order = epoch_permutation(blocks.train_windows, 1, epoch)[: 4 * blocks.steps_per_epoch(4)].tolist()
        assert rows == [expected[o + 8 * i : o + 8 * i + 9] for i in order]
        offsets.append(o)
    assert offsets[0] == 0 and len(set(offsets)) > 2 and all(0 <= o < 8 for o in offsets)


def test_empty_and_non_utf8_text_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    common = ["--threads", 1, "--no-progress", "--max-steps", 1]
    (tmp_path / "empty.txt").write_text("")
    err = one_line_error(capsys, "train-lm", "--data", tmp_path / "empty.txt", *common, "--out", tmp_path / "r1")
    assert "holds no text" in err
    (tmp_path / "latin.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 10)
    err = one_line_error(capsys, "train-lm", "--data", tmp_path / "latin.txt", *common, "--out", tmp_path / "r2")
    assert "is not UTF-8" in err and "iconv" in err
    err = one_line_error(capsys, "train-lm", "--data", tmp_path / "nothing", *common, "--out", tmp_path / "r3")
    assert "not found" in err
    err = one_line_error(capsys, "train-lm", "--model", "crate_bert_mini", *common, "--out", tmp_path / "r4")
    assert "--objective mlm" in err


def test_sequences_longer_than_the_context_are_refused() -> None:
    model = build_lm(LMConfig(**TINY))
    with pytest.raises(ValueError, match="longer than the model's context of 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.full((1, 4), 262))
    with pytest.raises(ValueError, match="batch dimension"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="causal"):
        build_lm(LMConfig(causal=False, **TINY)).generate(torch.zeros(1, 2, dtype=torch.long), 3)


# --------------------------------------------------------------------------- training, saving, generation
def test_loss_falls_on_the_built_in_corpus_and_the_run_generates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "gpt"
    args = [
        "--threads",
        1,
        "--no-progress",
        "--model-args",
        "dim=48",
        "depth=2",
        "heads=2",
        "block_size=32",
        "--batch-size",
        16,
        "--epochs",
        1,
        "--eval-every",
        0,
        "--lr",
        1e-2,
        "--warmup-epochs",
        0.01,
        "--eval-blocks",
        64,
        "--sample-tokens",
        20,
    ]
    assert crate("train-lm", *args, "--max-steps", 40, "--out", run) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    final = records[-1]
    # from the unigram level where the token prior starts it (ln 262 = 5.57 without) to a real byte model
    assert train[0]["loss"] < 3.6 and final["loss"] < 3.0
    assert final["ppl"] == pytest.approx(math.exp(final["loss"])) and final["tokens"] == 64 * 32  # --eval-blocks 64
    state = load_training_state(run)
    assert state["train_config"]["task"] == "lm" and state["train_config"]["model"] == "crate_gpt_mini"
    # the saved model dispatches on its config.json arch and carries its tokenizer
    model = load_model(run)
    assert isinstance(model, CRATELanguageModel) and model.tokenizer.kind == "byte" and model.config.dim == 48
    assert ct.from_pretrained(run / "model").config.to_dict() == model.config.to_dict()
    # generation: same seed, same text; another seed, other text
    outs = []
    for seed in (1, 1, 2):
        capsys.readouterr()
        assert crate("generate", run, "--prompt", "def ", "--max-new-tokens", 40, "--seed", seed) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] != outs[2] and outs[0].startswith("def ")
    # crate analyze on a language model: per-layer measurements of held-out token representations + attention PNGs
    assert crate("analyze", run, "--out", tmp_path / "an", "--num-blocks", 3, "--attn-tokens", 12, "--eps", 0.5) == 0
    report = json.loads((tmp_path / "an" / "report.json").read_text())
    layers = report["measure"]["held-out text"]["layers"]
    assert len(layers) == 2 and {"attention_layer1.png", "attention_layer2.png"} <= set(report["figures"])
    assert all((tmp_path / "an" / f).stat().st_size > 1000 for f in report["figures"])
    assert [v["section"] for v in report["verdicts"]] == ["language model"] * 2  # compression, sparsity
    page = (tmp_path / "an" / "report.html").read_text()
    assert page.index("Did the paper's claims hold?") < page.index("attention_layer1.png")
    tokens = load_tokens("python-docs", model.tokenizer)
    cut = int(len(tokens) * 0.9)
    blocks = torch.from_numpy(tokens[cut : cut + 3 * 32 + 1].astype("int64"))[:96].view(3, 32)
    with torch.no_grad():
        trace = model.eval().forward_trace(blocks)  # computed here independently of the analysis code
        P = model.layers[0].attn.qkv(model.layers[0].norm1(trace.tokens[0])).view(3, 32, 2, 24).transpose(1, 2)
    assert layers[1]["sparsity"] == pytest.approx(float((trace.tokens[2] == 0).double().mean()), abs=1e-9)
    from crate_transformer.objectives import coding_rate

    P = torch.nn.functional.normalize(P.double(), dim=-1)  # official R^c: per-head unit-normalised projections
    assert layers[0]["rc_in"] == pytest.approx(float(coding_rate(P, 0.5).sum(-1).mean()), rel=1e-6)
    # resuming continues the same run (same tokenizer, same data), and the wrong command is refused
    assert crate("train-lm", "--resume", run, "--max-steps", 45) == 0
    assert load_training_state(run)["step"] == 45
    err = one_line_error(capsys, "train", "--resume", run)
    assert f"crate train-lm --resume {run}" in err


def test_masked_lm_trains_with_a_trained_bpe_tokenizer(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i}: the value of x is {i * i} and y is {i + 3}.\n" for i in range(600)))
    run = tmp_path / "bert"
    assert (
        crate(
            "train-lm",
            "--objective",
            "mlm",
            "--data",
            corpus,
            "--tokenizer",
            "bpe",
            "--vocab-size",
            320,
            "--threads",
            1,
            "--no-progress",
            "--model-args",
            "dim=32",
            "depth=1",
            "heads=2",
            "block_size=32",
            "--batch-size",
            8,
            "--max-steps",
            8,
            "--eval-every",
            0,
            "--out",
            run,
        )
        == 0
    )
    final = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["split"] == "test" and math.isfinite(final["ppl"]) and final["tokens"] > 0
    model = load_model(run)
    assert not model.config.causal and model.config.pos_embed == "sinusoidal" and model.tokenizer.kind == "bpe"
    assert model.config.vocab_size == model.tokenizer.vocab_size == 320
    assert (run / "model" / "tokenizer.json").is_file() and not (run / "sample.txt").exists()


# --------------------------------------------------------------------------- fine-tuning on labelled text (Table 5)
@pytest.mark.parametrize("causal", [True, False])
def test_padding_never_changes_the_classification(causal: bool) -> None:
    model = build_lm(LMConfig(causal=causal, num_labels=3, **TINY)).eval()
    x = torch.randint(0, 256, (1, 9))
    padded = torch.cat([x, torch.full((1, 5), 257)], 1)
    alone = model.classify(x)
    together = model.classify(torch.cat([padded, torch.randint(0, 256, (1, 14))]), torch.tensor([9, 14]))
    assert torch.allclose(alone[0], together[0], atol=1e-5)


def test_text_metrics_match_independent_computations() -> None:
    from scipy.stats import spearmanr

    from crate_transformer.train.text_classification import text_metrics

    pred, target = torch.tensor([1, 0, 1, 1, 0, 1]), torch.tensor([1, 0, 0, 1, 1, 1])
    m = text_metrics(pred, target, regression=False)
    precision, recall = 3 / 4, 3 / 4  # predicted positives 4 (3 right), true positives 4 (3 found)
    assert m["acc"] == pytest.approx(4 / 6) and m["f1"] == pytest.approx(2 * precision * recall / (precision + recall))
    p, t = torch.tensor([0.1, 0.4, 0.2, 0.9]), torch.tensor([1.0, 3.0, 2.5, 4.0])
    assert text_metrics(p, t, regression=True)["spearman"] == pytest.approx(spearmanr(p, t).statistic)


def test_finetune_text_classifies_and_regresses_from_a_pretrained_lm(tmp_path: Path, capsys) -> None:
    import random

    rng = random.Random(0)
    pretrained = build_lm(LMConfig(dim=32, depth=1, heads=2, block_size=48))
    pretrained.tokenizer = Tokenizer.byte_level()
    pretrained.save_pretrained(tmp_path / "lm")
    with open(tmp_path / "train.tsv", "w") as f:  # SST-2 layout: sentence <tab> label
        f.write("sentence\tlabel\n")
        for _ in range(160):
            y = rng.randint(0, 1)
            f.write(f"the {rng.choice(['film', 'meal', 'book'])} was {'good' if y else 'bad'}\t{y}\n")
    common = ["--threads", 1, "--no-progress", "--eval-every", 0, "--lr", 3e-3, "--batch-size", 16]
    assert (
        crate(
            "finetune-text",
            "--from",
            tmp_path / "lm",
            "--data",
            tmp_path / "train.tsv",
            *common,
            "--epochs",
            4,
            "--out",
            tmp_path / "sst",
        )
        == 0
    )
    final = json.loads((tmp_path / "sst" / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["acc"] > 0.9 and "f1" in final
    model = load_model(tmp_path / "sst")
    assert model.config.num_labels == 2 and model.tokenizer is not None
    with open(tmp_path / "sts.csv", "w") as f:  # STS-B layout: a pair and a score
        f.write("sentence1,sentence2,score\n")
        for _ in range(120):
            s = rng.random() * 5
            f.write(f"a cat,{'a cat' if s > 2.5 else 'a dog'},{s:.2f}\n")
    assert (
        crate(
            "finetune-text",
            "--from",
            tmp_path / "lm",
            "--data",
            tmp_path / "sts.csv",
            *common,
            "--max-steps",
            6,
            "--out",
            tmp_path / "sts",
        )
        == 0
    )
    final = json.loads((tmp_path / "sts" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "spearman" in final and load_model(tmp_path / "sts").config.num_labels == 1
    (tmp_path / "one.csv").write_text("text,label\nhello,1\nworld,1\n")
    err = one_line_error(
        capsys,
        "finetune-text",
        "--from",
        tmp_path / "lm",
        "--data",
        tmp_path / "one.csv",
        *common,
        "--out",
        tmp_path / "bad",
    )
    assert "single label" in err


@pytest.mark.slow
def test_train_lm_under_torchrun_matches_one_process(tmp_path: Path, torchrun) -> None:
    args = ["--threads", 1, "--no-progress", "--model-args", "dim=32", "depth=2", "heads=2", "block_size=16",
            "--batch-size", 16, "--epochs", 1, "--eval-every", 0, "--lr", 3e-3, "--warmup-epochs", 0.01,
            "--eval-blocks", 32, "--sample-tokens", 0, "--max-steps", 8, "--log-every", 1]  # fmt: skip
    proc = torchrun("train-lm", *args, "--out", tmp_path / "ddp")
    assert crate("train-lm", *args, "--out", tmp_path / "single") == 0  # runs while torchrun starts up
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]

    def losses(run: Path) -> list[float]:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if r["split"] == "train"]

    single, ddp = losses(tmp_path / "single"), losses(tmp_path / "ddp")
    assert len(single) == len(ddp) == 8 and single[0] != single[-1]
    assert ddp == pytest.approx(single, rel=1e-4, abs=1e-5)  # each process takes its half of the same global batch
    w1 = load_model(tmp_path / "single").state_dict()
    w2 = load_model(tmp_path / "ddp").state_dict()
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False], ids=["gpt", "bert-like"])
def test_finetune_text_under_torchrun_averages_gradients_as_one_process(tmp_path: Path, torchrun, causal) -> None:
    """finetune-text's loss runs ``classify`` through DDP's forward (it used to call ``model.module.classify``: no
    gradient averaging, the processes drifting apart) and through FSDP (which failed on its sharded weights):
    the weights after the steps are those of one process on the same global batches.  Padding differs between
    the two processes' halves and the whole batch, so this also checks that padding never changes the loss."""
    import random

    rng = random.Random(0)
    pretrained = build_lm(LMConfig(dim=32, depth=2, heads=2, block_size=48, causal=causal))
    pretrained.tokenizer = Tokenizer.byte_level()
    pretrained.save_pretrained(tmp_path / "lm")
    with open(tmp_path / "train.tsv", "w") as f:
        f.write("sentence\tlabel\n")
        for _ in range(96):
            y = rng.randint(0, 1)
            words = " ".join(rng.choice(["film", "meal", "book", "very", "quite"]) for _ in range(rng.randint(1, 6)))
            f.write(f"the {words} was {'good' if y else 'bad'}\t{y}\n")
    args = ["finetune-text", "--from", tmp_path / "lm", "--data", tmp_path / "train.tsv", "--threads", 1,
            "--no-progress", "--eval-every", 0, "--lr", 3e-3, "--batch-size", 16, "--max-steps", 4,
            "--log-every", 1, "--accum-steps", 2]  # fmt: skip
    ddp = torchrun(*args, "--out", tmp_path / "ddp")
    fsdp = torchrun(*args, "--strategy", "fsdp", "--out", tmp_path / "fsdp")
    assert crate(*args, "--out", tmp_path / "single") == 0
    for proc in (ddp, fsdp):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    single = load_model(tmp_path / "single").state_dict()
    start = load_model(tmp_path / "lm").state_dict()
    assert max((single[k] - start[k]).abs().max().item() for k in start) > 1e-3  # the steps changed the weights
    for run in ("ddp", "fsdp"):
        w = load_model(tmp_path / run).state_dict()
        assert w.keys() == single.keys()
        for k in single:
            torch.testing.assert_close(w[k], single[k], rtol=0, atol=2e-5, msg=f"{run}: {k}")


def test_finetune_text_compiles_its_classify(tmp_path: Path, monkeypatch) -> None:
    """--compile compiles what the loss runs (classify, through the engine's entry module); before, it compiled the
    unused ``forward`` and the steps ran eagerly."""
    from crate_transformer.train import loop

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compiled.append(m) or m)
    pretrained = build_lm(LMConfig(dim=16, depth=1, heads=2, block_size=24))
    pretrained.tokenizer = Tokenizer.byte_level()
    pretrained.save_pretrained(tmp_path / "lm")
    (tmp_path / "t.csv").write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(32)))
    args = ["finetune-text", "--from", tmp_path / "lm", "--data", tmp_path / "t.csv", "--threads", 1,
            "--no-progress", "--eval-every", 0, "--batch-size", 8, "--max-steps", 1, "--compile"]  # fmt: skip
    assert crate(*args, "--out", tmp_path / "run") == 0
    (module,) = compiled
    assert isinstance(module, loop.Entry) and module.method == "classify"
