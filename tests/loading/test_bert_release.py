"""The released CRATE-BERT (bert.py) against the authors' Hugging Face port, transcribed in
tests/official/crate_bert_hf.py: checkpoints saved as the port saves them load here and give the port's masked-LM
and classification logits; the three released sizes have Table 10's parameter counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from official.crate_bert_hf import CrateConfig, CrateForMaskedLM, CrateForSequenceClassification
from safetensors.torch import save_file

import crate_transformer as ct
from crate_transformer.io import CheckpointError
from crate_transformer.loading.official import native_to_official
from crate_transformer.models.bert import CRATEBert, bert_native_to_official, position_ids

TINY = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=20)
# the same model in this package's terms (20 position rows − pad_token_id 1 − 1 = 18 tokens)
OURS = dict(vocab_size=50, dim=32, depth=2, heads=4, block_size=18)


def _randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random (LayerNorm gains around 1), so that no term of the forward is trivially zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied parameters appear once
            gain = name.endswith("weight") and p.dim() == 1
            p.copy_((1.0 if gain else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def _batch(pad: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids (3, 12) without the pad id in the text, right padding in row 1 and left padding in row 2 (whose
    positions then start after the padding), their attention mask, and token types."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 50, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    ids[1, 8:], mask[1, 8:] = pad, 0
    ids[2, :3], mask[2, :3] = pad, 0
    types = torch.zeros(3, 12, dtype=torch.long)
    types[0, 6:] = 1
    return ids, mask, types


def _save_as_port(model: torch.nn.Module, folder: Path, fmt: str) -> Path:
    """Write ``model`` as ``save_pretrained`` of transformers does: ``pytorch_model.bin`` (torch.save of the whole
    state dict, tied copies included) or ``model.safetensors`` (the ``_tied_weights_keys`` copies dropped), and a
    config.json with ``model_type: "crate"``."""
    folder.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    if fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        tied = getattr(model, "_tied_weights_keys", [])
        kept = {k: v.contiguous() for k, v in state.items() if k not in tied}
        save_file(kept, folder / "model.safetensors", {"format": "pt"})
    cfg = model.config
    hf = {"model_type": "crate", **{k: getattr(cfg, k) for k in vars(cfg)}}
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


# --------------------------------------------------------------------------- sizes (Table 10)
def _released_params(L: int, d: int, V: int = 50265, P: int = 512, T: int = 2) -> int:
    """CRATE layers ``L(3d² + 4d)`` (two LayerNorms, U, W without bias, D), embeddings ``(V + P + T) d`` + LayerNorm
    ``2d``, LM head dense ``d² + d`` + LayerNorm ``2d`` + vocabulary bias ``V`` (its decoder is the embedding)."""
    return L * (3 * d * d + 4 * d) + (V + P + T) * d + 2 * d + d * d + 3 * d + V


@pytest.mark.parametrize(
    "name, L, d, K, exact, paper",
    [
        ("crate_bert_medium", 8, 512, 8, 32_621_657, 33e6),
        ("crate_bert_base", 12, 768, 12, 60_912_729, 61e6),
        ("crate_bert_large", 24, 1024, 16, 128_697_433, 129e6),
    ],
)
def test_released_sizes_have_table_10_counts(name: str, L: int, d: int, K: int, exact: int, paper: float) -> None:
    cfg = CrateConfig(hidden_size=d, num_hidden_layers=L, num_attention_heads=K)
    with torch.device("meta"):
        ours, port = ct.create_model(name), CrateForMaskedLM(cfg)
    assert isinstance(ours, CRATEBert) and ours.config.heads == K
    assert ours.num_params() == _released_params(L, d) == exact
    assert sum(p.numel() for p in port.parameters()) == exact  # the port's own count (tied decoder once)
    assert round(exact / 1e6) == paper / 1e6  # as Table 10 prints it
    assert ours.num_params(exclude_positions=True) == exact - 512 * d


def test_literal_form_is_still_available() -> None:
    with torch.device("meta"):
        eq83 = ct.create_model("crate_bert_eq83_base")
    assert not isinstance(eq83, CRATEBert) and eq83.config.pos_embed == "sinusoidal"
    assert eq83.num_params() == 12 * (3 * 768**2 + 5 * 768) + 50265 * 768 == 59_883_264


# --------------------------------------------------------------------------- parity with the port
@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_masked_lm_logits_match_the_port(tmp_path: Path, fmt: str, dtype: torch.dtype, tol: float) -> None:
    torch.manual_seed(0)
    port = _randomise(CrateForMaskedLM(CrateConfig(**TINY)), seed=1)
    folder = _save_as_port(port, tmp_path / "crate-tiny", fmt)
    ours = ct.from_official(folder, "crate_bert_base").eval()  # the sizes come from the port's config.json
    c = ours.config
    assert (c.dim, c.depth, c.heads, c.block_size, c.layer_norm_eps) == (32, 2, 4, 18, 1e-12)
    ids, mask, types = _batch()
    port, ours = port.to(dtype), ours.to(dtype)
    with torch.no_grad():
        want = port(ids, attention_mask=mask, token_type_ids=types)
        got = ours(ids, key_mask=mask, token_type_ids=types)
        unmasked = ours(ids, token_type_ids=types)
    assert got.dtype == dtype and got.shape == (3, 12, 50)
    assert (got - want).abs().max() <= tol
    # the padding mask and the token types are exercised: without them the logits differ
    assert (unmasked[1, :8] - want[1, :8]).abs().max() > 1e-3
    assert (ours(ids, key_mask=mask) - want)[0].abs().max() > 1e-3


def test_sizes_come_from_the_file_and_overrides_must_agree(tmp_path: Path) -> None:
    port = _randomise(CrateForMaskedLM(CrateConfig(**TINY)), seed=5)
    folder = _save_as_port(port, tmp_path / "hf", "bin")
    with pytest.raises(CheckpointError) as e:  # config.json says 4 heads
        ct.from_official(folder, "crate_bert_base", heads=8)
    assert "heads=8 (checkpoint: 4)" in _one_line(e)
    assert ct.from_official(folder, "crate_bert_base", dropout=0.0).config.dropout == 0.0  # dropout may differ
    # a bare weights file: vocabulary, depth and token types from the tensors; width and heads from the caller
    bare = ct.from_official(folder / "pytorch_model.bin", "crate_bert_base", dim=32, heads=4, block_size=18)
    assert (bare.config.vocab_size, bare.config.depth, bare.config.type_vocab_size) == (50, 2, 2)
    ids, mask, _ = _batch()
    assert torch.equal(
        bare.eval()(ids, key_mask=mask), ct.from_official(folder, "crate_bert_base").eval()(ids, key_mask=mask)
    )
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(CheckpointError) as e:
        ct.from_official(folder, "crate_bert_base")
    assert "depth: 3 in config.json, 2 in the tensors" in _one_line(e)


def test_zoo_entry_loads_from_the_hub_cache(hub_cache: Path, tmp_path: Path) -> None:
    """``create_model("crate_bert_base", pretrained=True)``: the zoo's jackbai/crate-base entry (pytorch_model.bin
    and the port's config.json, as transformers saves them) read offline from the Hub cache."""
    from hubcache import put_in_hub_cache

    from crate_transformer.loading import pretrained

    port = _randomise(CrateForMaskedLM(CrateConfig(**TINY)), seed=6)
    folder = _save_as_port(port, tmp_path / "hf", "bin")
    src = pretrained.ZOO["crate_bert_base"]
    put_in_hub_cache(hub_cache, src.repo_id, {f: folder / f for f in (src.filename, *src.also)})
    model = ct.create_model("crate_bert_base", pretrained=True).eval()
    ids, mask, types = _batch()
    with torch.no_grad():
        assert (model(ids, key_mask=mask, token_type_ids=types) - port(ids, mask, types)).abs().max() <= 1e-5
    assert model.pretrained_cfg["loader"] == "CRATE-BERT" and model.pretrained_cfg["repo_id"] == "jackbai/crate-base"


def test_weights_converted_back_load_into_the_port(tmp_path: Path) -> None:
    ours = _randomise(ct.create_model("crate_bert_base", **OURS), seed=2)
    port = CrateForMaskedLM(CrateConfig(**TINY)).eval()
    port.load_state_dict(bert_native_to_official(ours.state_dict()), strict=True)
    assert port.lm_head.decoder.weight is port.crate.embeddings.word_embeddings.weight  # still tied
    ids, mask, types = _batch()
    with torch.no_grad():
        assert (ours(ids, key_mask=mask, token_type_ids=types) - port(ids, mask, types)).abs().max() <= 1e-5


def test_position_ids_skip_padding_as_the_port() -> None:
    ids = torch.tensor([[5, 6, 7, 1, 1], [1, 1, 5, 6, 7]])
    assert position_ids(ids, 1).tolist() == [[2, 3, 4, 1, 1], [1, 1, 2, 3, 4]]


def test_classification_head_matches_the_port(tmp_path: Path) -> None:
    port = _randomise(CrateForSequenceClassification(CrateConfig(**TINY, num_labels=3)), seed=3)
    torch.save(port.state_dict(), tmp_path / "cls.bin")
    with pytest.warns(UserWarning, match="has no lm_head weights; they keep their fresh initialisation"):
        ours = ct.from_official(tmp_path / "cls.bin", "crate_bert_base", **OURS).eval()
    assert ours.config.num_labels == 3
    ids, mask, _ = _batch()
    ids, mask = ids[:2], mask[:2]  # right padding only: classify takes the lengths of right-padded rows
    with torch.no_grad():
        want = port(ids, attention_mask=mask)
        got = ours.classify(ids, lengths=mask.sum(1))
    assert got.shape == (2, 3) and (got - want).abs().max() <= 1e-5
    # padding never reaches the first token: a longer padding gives the same logits
    longer = torch.cat([ids, torch.ones(2, 4, dtype=torch.long)], 1)
    assert (ours.classify(longer, lengths=mask.sum(1)) - got).abs().max() <= 1e-5


def test_loaded_model_round_trips_through_save_pretrained(tmp_path: Path) -> None:
    port = _randomise(CrateForMaskedLM(CrateConfig(**TINY)), seed=4)
    ours = ct.from_official(_save_as_port(port, tmp_path / "hf", "bin"), "crate_bert_base")
    ours.save_pretrained(tmp_path / "native")
    again = ct.from_pretrained(tmp_path / "native")
    ids, mask, _ = _batch()
    assert isinstance(again, CRATEBert) and again.config == ours.config
    assert torch.equal(again.eval()(ids, key_mask=mask), ours.eval()(ids, key_mask=mask))
    # forward_head(pre_logits=True) stops before the tied decoder, the head's last linear map
    z = ours.forward_features(ids, key_mask=mask)
    logits = ours.forward_head(z, pre_logits=True) @ ours.wte.weight.T + ours.lm_head.bias
    torch.testing.assert_close(logits, ours.forward_head(z), rtol=1e-6, atol=1e-5)


# --------------------------------------------------------------------------- errors
def test_wrong_files_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "notes.bin").write_text("not a checkpoint")
    with pytest.raises(CheckpointError) as e:
        ct.from_official(tmp_path / "notes.bin", "crate_bert_base")
    assert "cannot read checkpoint" in _one_line(e)

    image = ct.create_model("crate_small", dim=32, depth=1, heads=2, image_size=8, patch_size=4, num_classes=3)
    torch.save(native_to_official(image.state_dict()), tmp_path / "crate.pth")
    with pytest.raises(CheckpointError) as e:
        ct.from_official(tmp_path / "crate.pth", "crate_bert_base")
    assert "is not a CRATE-BERT checkpoint" in _one_line(e)

    port = CrateForMaskedLM(CrateConfig(**TINY))
    torch.save(port.state_dict(), tmp_path / "bert.bin")
    with pytest.raises(CheckpointError) as e:
        ct.from_official(tmp_path / "bert.bin", "crate_small")
    assert "is a CRATE-BERT checkpoint" in _one_line(e) and "crate_bert_base" in str(e.value)

    with pytest.raises(CheckpointError) as e:  # the registered sizes do not fit a tiny checkpoint
        ct.from_official(tmp_path / "bert.bin", "crate_bert_base")
    assert "shape mismatches" in _one_line(e)

    untied = {**port.state_dict(), "lm_head.decoder.weight": torch.zeros(50, 32)}
    with pytest.raises(CheckpointError) as e:
        ct.from_official(untied, "crate_bert_base", **OURS)
    assert "untied LM head" in _one_line(e)

    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError) as e:
        ct.from_official(tmp_path / "empty", "crate_bert_base")
    assert "is a folder without model.safetensors or pytorch_model.bin" in _one_line(e)


def test_bad_inputs_are_one_line_errors() -> None:
    model = ct.create_model("crate_bert_base", **OURS)
    ids = torch.randint(3, 50, (2, 6))
    with pytest.raises(ValueError, match="token_type_ids"):
        model(ids, token_type_ids=torch.full((2, 6), 2))
    with pytest.raises(ValueError, match="key_mask must have the shape"):
        model(ids, key_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="longer than the model's context of 18"):
        model(torch.randint(3, 50, (1, 19)))
    with pytest.raises(ValueError, match="causal=False"):
        ct.LMConfig(arch="crate_bert")
    with pytest.raises(ValueError, match="crate_bert_eq83"):
        ct.LMConfig(arch="crate_bert", causal=False, pos_embed="sinusoidal")


# --------------------------------------------------------------------------- training
def test_masked_lm_training_uses_the_tokenizers_padding_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crate_transformer import cli
    from crate_transformer.loading.pipeline import load_model

    monkeypatch.setenv("CRATE_CACHE_DIR", str(tmp_path / "token-cache"))
    run = tmp_path / "run"
    args = ["train-lm", "--objective", "mlm", "--model", "crate_bert_base", "--threads", 1, "--no-progress"]
    args += ["--model-args", "dim=32", "depth=1", "heads=2", "block_size=32", "--batch-size", 8, "--max-steps", 3]
    assert cli.main([str(a) for a in [*args, "--eval-every", 0, "--eval-blocks", 4, "--out", run]]) == 0
    model = load_model(run)
    assert isinstance(model, CRATEBert) and model.tokenizer is not None
    assert model.config.pad_token_id == model.tokenizer.pad_id != 1  # the byte tokenizer's [PAD], not RoBERTa's 1
    assert model.wpe.num_embeddings == 32 + model.tokenizer.pad_id + 1
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = torch.tensor([m["loss"] for m in metrics if "loss" in m])
    assert len(losses) >= 2 and bool(torch.isfinite(losses).all())  # the training and the held-out loss
