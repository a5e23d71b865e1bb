"""CRATE-MAE: masking invariants, the masked-patch loss, parameter counts, official parity and round trips,
clear errors, and the pretraining task on the built-in digits."""

import argparse
import copy
import json
import pickle

import pytest
import tiny
import torch
from clitools import crate
from official.crate_ae import OfficialCRATEMAE, sincos_2d

import crate_transformer as ct
from crate_transformer.io import CheckpointError
from crate_transformer.layers import DecoderLayer
from crate_transformer.loading.official import mae_native_to_official
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.mae import CRATEMAE, MAEConfig, mae_to_classifier, random_masking, sincos_pos_embed

SMALL = dict(image_size=32, patch_size=8, in_chans=3, dim=64, depth=2, heads=4)


def small_mae(**kw):
    return ct.create_model("crate_mae_tiny", **{**SMALL, **kw})


def official_small(**kw):
    return OfficialCRATEMAE(img_size=32, patch_size=8, in_chans=3, embed_dim=64, depth=2, num_heads=4, **kw)


def perturbed(module):
    """Random values everywhere (biases, LayerNorms, tokens) so that a wrong key map cannot pass."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "pos_embed" not in name:
                p.add_(0.2 * torch.randn_like(p))
    return module


# --------------------------------------------------------------------------- masking
@pytest.mark.parametrize("ratio,n", [(0.75, 16), (0.5, 49), (0.9, 196), (0.3, 10)])
def test_random_masking_fraction_and_consistency(ratio, n):
    ids_keep, mask, ids_restore = random_masking(5, n, ratio)
    keep = int(n * (1 - ratio))
    assert mask.shape == (5, n) and ids_keep.shape == (5, keep)
    assert torch.all(mask.sum(1) == n - keep)  # exactly |Ω| masked per sample
    for b in range(5):  # kept ids are exactly the unmasked positions, and ids_restore inverts the shuffle
        assert set(ids_keep[b].tolist()) == set((mask[b] == 0).nonzero().flatten().tolist())
        assert sorted(ids_restore[b].tolist()) == list(range(n))
    assert not torch.equal(mask[0], mask[1]) or not torch.equal(mask[1], mask[2])  # per-sample draws


def test_masked_pixels_do_not_reach_the_encoder_and_loss_uses_only_masked_patches():
    m = perturbed(small_mae()).eval()
    x = torch.randn(2, 3, 32, 32)
    noise = torch.rand(2, 16)
    _, mask = m.forward_encoder(x, noise=noise)
    masked_pixels = mask[:, :, None].bool().expand(-1, -1, 8 * 8 * 3)
    # 1. changing the masked pixels changes neither the encoder output nor the prediction (no leakage)
    x2 = ct.models.classifier.unpatchify(
        torch.where(masked_pixels, torch.randn(2, 16, 192), ct.models.classifier.patchify(x, 8)), 8, 4, 4
    )
    assert not torch.equal(x, x2)
    z1, z2 = m.forward_encoder(x, noise=noise)[0], m.forward_encoder(x2, noise=noise)[0]
    torch.testing.assert_close(z1, z2, rtol=0, atol=0)
    # 2. the loss is the mean over masked patches only: changing a visible patch's target leaves it unchanged
    out = m(x, noise=noise)
    pred = out.pred.detach()
    per_patch = (pred - ct.models.classifier.patchify(x, 8)).pow(2).mean(-1)
    torch.testing.assert_close(out.loss, per_patch[mask.bool()].mean())
    grad = torch.zeros_like(pred, requires_grad=True)
    m.forward_loss(x, pred + grad, mask).backward()
    assert torch.all(grad.grad.abs().sum(-1)[mask == 0] == 0) and torch.all(grad.grad.abs().sum(-1)[mask == 1] > 0)


def test_visible_only_encoder_sees_only_visible_tokens():
    m = perturbed(small_mae(visible_only=True)).eval()
    x = torch.randn(2, 3, 32, 32)
    noise = torch.rand(2, 16)
    seen = []
    h = m.layers[0].register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape[1]))
    out = m(x, noise=noise)
    h.remove()
    assert seen == [1 + 4] and out.pred.shape == (2, 16, 192) and torch.isfinite(out.loss)


@pytest.mark.parametrize("norm_pix", [False, True])
def test_visible_only_is_he_et_al_mae_forward(norm_pix):
    """visible_only against MAE's forward_encoder / forward_decoder (facebookresearch/mae, transcribed in
    tests/official/mae_he.py) run on the same official CRATE-MAE's modules: positions added before masking,
    encoder on the visible tokens, mask tokens appended and unshuffled, then the decoder's position table
    added to every token.  MAE's decoder_embed is the identity: CRATE-MAE's decoder works at width d."""
    from official.mae_he import MAEForward

    off = perturbed(official_small(norm_pix_loss=norm_pix)).eval()
    with torch.no_grad():
        off.decoder_embed.weight.copy_(torch.eye(64))
        off.decoder_embed.bias.zero_()
    he = MAEForward(off)
    m = ct.from_official(off.state_dict(), "crate_mae_tiny", **SMALL, norm_pix_loss=norm_pix, visible_only=True)
    x, noise = torch.randn(3, 3, 32, 32), torch.rand(3, 16)
    with torch.no_grad():
        loss_he, pred_he, mask_he = he(x, 0.75, noise)
        out = m.eval()(x, noise=noise)
        torch.testing.assert_close(out.pred, pred_he, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.loss, loss_he, rtol=1e-5, atol=1e-5)
        assert torch.equal(out.mask, mask_he)
        # the decoder input itself: every token (visible ones too) carries the position table once more
        latent, _, ids_restore = he.forward_encoder(x, 0.75, noise)
        mask_tokens = off.mask_token.repeat(3, 16 + 1 - latent.shape[1], 1)
        x_ = torch.gather(torch.cat([latent[:, 1:], mask_tokens], 1), 1, ids_restore.unsqueeze(-1).repeat(1, 1, 64))
        dec_in = torch.cat([latent[:, :1], x_], 1) + off.decoder_pos_embed
        torch.testing.assert_close(m.forward_encoder(x, noise=noise)[0], dec_in, rtol=1e-5, atol=1e-5)


def test_norm_pix_loss_target():
    m = small_mae(norm_pix_loss=True)
    t = m.target(torch.rand(2, 3, 32, 32))
    torch.testing.assert_close(t.mean(-1), torch.zeros(2, 16), atol=1e-5, rtol=0)
    torch.testing.assert_close(t.std(-1), torch.ones(2, 16), atol=1e-3, rtol=0)


# --------------------------------------------------------------------------- parameter counts (Table 9, spec §2.10)
def mae_count(d, L, patch=16, grid=14, chans=3):
    layer = 3 * d * d + 5 * d  # LN + U + W(+b) + LN + D (encoder) or LN + E + LN + U + W(+b) (decoder)
    pd = chans * patch * patch
    return (
        2 * L * layer + (pd * d + d) + 2 * (grid * grid + 1) * d + 2 * d + (d * d + d) + 4 * d + (d * pd + pd)
    )  # layers, patch conv, 2 sin-cos tables, cls+mask, decoder_embed, 2 LNs, decoder_pred


@pytest.mark.parametrize("name,d,L,expected", [("crate_mae_small", 576, 12, 25_405_824),
                                                ("crate_mae_base", 768, 12, 44_638_464)])  # fmt: skip
def test_parameter_counts_match_table_9(name, d, L, expected):
    assert mae_count(d, L) == expected
    with torch.device("meta"):
        m = ct.create_model(name)
        ref = OfficialCRATEMAE(embed_dim=d, depth=L, num_heads=12) if d == 576 else None
    assert m.num_params(layout="official") == expected
    assert m.num_params() == expected - (d * d + d) - 2 * 197 * d  # native: no unused decoder_embed, tables are buffers
    if ref is not None:
        assert sum(p.numel() for p in ref.parameters()) == expected
    assert round(expected / 1e6, 1) == {576: 25.4, 768: 44.6}[d]


def test_large_at_table_9_depth_and_registry():
    with torch.device("meta"):
        assert ct.create_model("crate_mae_large", depth=12).num_params(layout="official") == mae_count(1024, 12)
    assert {"crate_mae_tiny", "crate_mae_small", "crate_mae_base", "crate_mae_large", "crate_mae_mnist"} <= set(
        ct.list_models("crate_mae_*")
    )
    assert isinstance(ct.model_config("crate_mae_small"), MAEConfig)


# --------------------------------------------------------------------------- operators
def test_decoder_layer_forms():
    layer = perturbed(DecoderLayer(16, 2, 8)).eval()
    x = torch.randn(2, 5, 16)
    x_ = torch.nn.functional.linear(layer.norm1(x), layer.weight)  # eq. (63): E·LN(X)
    torch.testing.assert_close(layer(x), x_ - layer.attn(layer.norm2(x_)))  # official crate_decoder
    jmlr = DecoderLayer(16, 2, 8, form="jmlr")
    jmlr.load_state_dict(layer.state_dict())
    torch.testing.assert_close(jmlr(x), layer.norm2(x_) - layer.attn(layer.norm2(x_)))  # Alg. 5
    with pytest.raises(AttributeError):  # set when built; an assignment afterwards would change nothing
        layer.form = "jmlr"


def test_native_grid_reuses_the_table_other_grids_compute_one():
    m = small_mae()
    g = m.config.grid
    assert m.position_embedding(g, g) is m.pos_embed  # no per-forward work at the trained size
    torch.testing.assert_close(m.position_embedding(2, 3)[0], sincos_pos_embed(m.config.dim, 2, 3))


def test_sincos_matches_the_official_table():
    torch.testing.assert_close(
        sincos_pos_embed(64, 4, 4), torch.from_numpy(sincos_2d(64, 4)).float(), atol=1e-6, rtol=0
    )


# --------------------------------------------------------------------------- official parity and round trips
@pytest.mark.parametrize("norm_pix", [False, True])
def test_from_official_reproduces_official_loss_and_predictions(tmp_path, norm_pix):
    off = perturbed(official_small(norm_pix_loss=norm_pix)).eval()
    path = tmp_path / "checkpoint-799.pth"
    torch.save({"model": off.state_dict(), "epoch": 799}, path)  # FAIR-MAE container
    m = ct.from_official(path, "crate_mae_tiny", **SMALL, norm_pix_loss=norm_pix).eval()
    assert isinstance(m, CRATEMAE)
    x, noise = torch.randn(3, 3, 32, 32), torch.rand(3, 16)
    loss_o, pred_o, mask_o = off(x, 0.75, noise)
    loss, pred, mask = m(x, noise=noise)
    # two float32 roundings of one function (ISTA as two or three matmuls), each ~1e-5 from float64
    _, pred64, _ = copy.deepcopy(off).double()(x.double(), 0.75, noise.double())
    assert (pred.double() - pred64).abs().max() <= 2 * (pred_o.double() - pred64).abs().max() + 1e-6
    torch.testing.assert_close(pred, pred_o, rtol=1e-5, atol=3e-5)
    torch.testing.assert_close(loss, loss_o, rtol=1e-5, atol=1e-5)
    assert torch.equal(mask, mask_o)


def mae_codebase_args(**kw):
    """The argparse.Namespace of the MAE codebase's main_pretrain.py (its flags' defaults, facebookresearch/mae
    @ efb2a80, plus what main() adds: lr, distributed) — what misc.save_model stores under 'args'."""
    return argparse.Namespace(**{
        "batch_size": 64, "epochs": 800, "accum_iter": 1, "model": "mae_crate_base", "input_size": 32,
        "mask_ratio": 0.75, "norm_pix_loss": False, "weight_decay": 0.05, "lr": 0.00015, "blr": 1.5e-4,
        "min_lr": 0.0, "warmup_epochs": 40, "data_path": "/datasets01/imagenet_full_size/061417/",
        "output_dir": "./output_dir", "log_dir": "./output_dir", "device": "cuda", "seed": 0, "resume": "",
        "start_epoch": 0, "num_workers": 10, "pin_mem": True, "world_size": 1, "local_rank": -1,
        "dist_on_itp": False, "dist_url": "env://", "distributed": False, **kw,
    })  # fmt: skip


def test_from_official_reads_the_mae_codebase_checkpoint(tmp_path):
    """The container of facebookresearch/mae util/misc.py::save_model (@ efb2a80), which CRATE-MAE's training
    code writes: {'model': state_dict, 'optimizer': optimizer.state_dict(), 'epoch': int,
    'scaler': loss_scaler.state_dict(), 'args': argparse.Namespace}."""
    off = perturbed(official_small()).eval()
    opt = torch.optim.AdamW(off.parameters(), lr=1.5e-4, betas=(0.9, 0.95), weight_decay=0.05)
    off(torch.randn(2, 3, 32, 32), 0.75, torch.rand(2, 16))[0].backward()
    opt.step()  # AdamW moments and step counts in the optimizer state
    # MAE's NativeScaler state: torch.cuda.amp.GradScaler().state_dict()
    scaler = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
              "_growth_tracker": 0}  # fmt: skip
    path = tmp_path / "checkpoint-799.pth"
    container = {"model": off.state_dict(), "optimizer": opt.state_dict(), "epoch": 799, "scaler": scaler,
                 "args": mae_codebase_args()}  # fmt: skip
    torch.save(container, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path, weights_only=True)  # torch's own safe list refuses the Namespace ...
    off64 = copy.deepcopy(off).double()  # in float64: the weights read equal, not two float32 roundings (~1e-5)
    for m in (ct.from_official(path, "crate_mae_tiny", **SMALL), load_model(path, "crate_mae_tiny", **SMALL)):
        x, noise = torch.randn(3, 3, 32, 32, dtype=torch.float64), torch.rand(3, 16, dtype=torch.float64)
        loss_o, pred_o, _ = off64(x, 0.75, noise)
        loss, pred, _ = m.eval().double()(x, noise=noise)
        torch.testing.assert_close(pred, pred_o, rtol=1e-10, atol=1e-10)
        # the loss is reduced in float32 by design (models/mae.py: pred.float(), safe under autocast)
        torch.testing.assert_close(loss, loss_o, rtol=1e-7, atol=0)
    raw = ct.io.load_pickle(path)  # ... ours reads it, Namespace and all, with nothing else allowed after
    assert vars(raw["args"]) == vars(mae_codebase_args()) and raw["epoch"] == 799
    assert argparse.Namespace not in torch.serialization.get_safe_globals()


def test_official_round_trip_and_save_pretrained(tmp_path):
    m = perturbed(small_mae()).eval()
    off = official_small()
    off.load_state_dict(mae_native_to_official(m.state_dict(), 3), strict=True)
    back = ct.from_official(off.state_dict(), "crate_mae_tiny", **SMALL)
    for k, v in m.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    m.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["arch"] == "crate_mae"
    r = ct.from_pretrained(tmp_path / "m")
    assert isinstance(r, CRATEMAE) and r.config == m.config
    x, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 16)
    torch.testing.assert_close(r(x, noise=noise).pred, m(x, noise=noise).pred, rtol=0, atol=0)
    assert isinstance(load_model(tmp_path / "m"), CRATEMAE)
    clf = load_model(tmp_path / "m", as_classifier=True)
    assert isinstance(clf, ct.CRATE) and clf.config.patch_norm is False


def test_classifier_from_mae_encoder_reproduces_encoder_features():
    m = perturbed(small_mae()).eval()
    clf = mae_to_classifier(m, num_classes=7).eval()
    x = torch.randn(2, 3, 32, 32)
    # the encoder's last layer; its final LayerNorm became the head's (applied after pooling)
    torch.testing.assert_close(clf.forward_features(x), m.forward_trace(x).tokens[-1], rtol=0, atol=0)
    assert clf.pos_embed.requires_grad and clf(x).shape == (2, 7)
    torch.testing.assert_close(clf.pos_embed, m.pos_embed)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.1, 1.5, 0.999, float("nan")])
def test_bad_mask_ratio_is_one_line_error(ratio):
    with pytest.raises(ValueError, match="mask_ratio") as e:
        small_mae(mask_ratio=ratio)
    assert "\n" not in str(e.value)
    m = small_mae()
    with pytest.raises(ValueError, match="mask_ratio"):
        m(torch.randn(1, 3, 32, 32), mask_ratio=ratio)


def test_bad_image_sizes_and_configs():
    m = small_mae()
    with pytest.raises(ValueError, match="not divisible by the patch size 8"):
        m(torch.randn(1, 3, 30, 30))
    with pytest.raises(ValueError, match="3-channel"):
        m(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match="image_size=30 is not divisible"):
        small_mae(image_size=30)
    with pytest.raises(ValueError, match="multiple of 4"):
        small_mae(dim=66, heads=3)
    assert m(torch.randn(1, 3, 48, 48)).pred.shape == (1, 36, 192)  # sin-cos is defined on any grid


def test_bad_checkpoints_are_one_line_errors(tmp_path, without_file_checksums):
    clf_state = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=64, depth=2, heads=4).state_dict()
    with pytest.raises(CheckpointError, match="not a CRATE-MAE|is a CRATE classifier checkpoint"):
        ct.from_official(clf_state, "crate_mae_tiny", **SMALL)
    with pytest.raises(CheckpointError, match="is a CRATE-MAE checkpoint"):
        ct.from_official(official_small().state_dict(), "crate_tiny")
    sd = official_small().state_dict()
    del sd["decoder_blocks.1.layers.0.0.fn.weight"]
    with pytest.raises(CheckpointError, match="missing keys: decoder_layers.1.weight"):
        ct.from_official(sd, "crate_mae_tiny", **SMALL)
    with pytest.raises(CheckpointError, match="shape mismatches"):
        ct.from_official(official_small().state_dict(), "crate_mae_tiny", **{**SMALL, "patch_size": 4})
    bad = tmp_path / "cfg"
    without_file_checksums(small_mae().save_pretrained(bad))  # a config.json of an old save, edited
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "mask_ratio": 1.2}))
    with pytest.raises(CheckpointError, match=r"config.json: mask_ratio must be a finite number in \(0, 1\)"):
        ct.from_pretrained(bad)


# --------------------------------------------------------------------------- crate pretrain mae / finetune from MAE
DIGITS = ["--data", "digits", "--threads", "1", "--no-progress", "--model-args", *tiny.SSL_ARCH]


def test_pretrain_mae_loss_falls_on_digits_then_resume_finetune_and_probe(tmp_path, capsys):
    from crate_transformer.data import load_dataset
    from crate_transformer.train.mae import masked_eval
    from crate_transformer.train.rundir import load_training_state

    run = tmp_path / "mae"
    args = [*DIGITS, "--epochs", 4, "--batch-size", 64, "--lr", "3e-3", "--figure-images", 4, "--out", run]
    assert crate("pretrain", "mae", *args, "--max-steps", 40, "--no-probe") == 0  # interrupted by max-steps
    assert crate("pretrain", "mae", "--resume", run, "--max-steps", 0) == 0  # continues to the end
    state = load_training_state(run)
    assert state["train_config"]["task"] == "mae" and state["step"] == 4 * (1437 // 64)
    model = ct.from_pretrained(run / "model")
    assert isinstance(model, CRATEMAE) and model.config.data.name == "digits" and model.config.in_chans == 1
    test = load_dataset("digits", "test")
    kw = dict(mean=model.config.data.mean, std=model.config.data.std, image_size=8, seed=0)
    trained = masked_eval(model, test, **kw)["loss"]
    torch.manual_seed(0)
    untrained = masked_eval(ct.create_model("crate_mae_mnist", **{**model.config.to_dict(), "data": None}), test, **kw)
    assert trained < 0.8 * untrained["loss"], (trained, untrained)
    assert (run / "reconstruction.png").read_bytes()[:4] == b"\x89PNG" and (run / "curves.png").is_file()
    out = capsys.readouterr().out
    assert "held-out masked-patch loss" in out and f"crate finetune --from {run}" in out and "recognises" in out
    rec = json.loads((run / "recognition.json").read_text())
    assert rec["images"] == len(test) and rec["original"] > rec["mean_fill"] and 0 <= rec["reconstruction"] <= 1
    # fine-tune a classifier from the MAE encoder (Table 3 protocol)
    ft = tmp_path / "ft"
    assert crate("finetune", "--from", run, "--data", "digits", "--threads", 1, "--no-progress", "--epochs", 1,
                 "--eval-every", 0, "--measure-every", 0, "--out", ft) == 0  # fmt: skip
    clf = ct.from_pretrained(ft / "model")
    assert isinstance(clf, ct.CRATE) and clf.config.patch_norm is False and clf.config.num_classes == 10
    # the linear probe of the engine's eval command reads the MAE encoder
    assert crate("eval", run, "--data", "digits", "--linear-probe", "--pool", "avg", "--out", tmp_path / "ev") == 0
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["linear_probe"]["acc"] > 0.5
    assert crate("eval", run, "--data", "digits") == 2  # no head: a one-line error naming the fix
    assert "--linear-probe" in capsys.readouterr().err
    # the wrong command on an MAE run names the right one
    assert crate("train", "--resume", run) == 2
    assert "crate pretrain mae --resume" in capsys.readouterr().err


def test_pretrain_mae_refuses_a_classifier_model(tmp_path, capsys):
    assert crate("pretrain", "mae", *DIGITS[:5], "--model", "crate_mnist", "--out", tmp_path / "x") == 2
    err = capsys.readouterr().err
    assert "crate_mnist is an image classifier, and crate pretrain mae trains a masked autoencoder" in err


def test_analyze_reports_decoder_inversion(tmp_path):
    from crate_transformer.analysis import analyze, decoder_inversion

    m = perturbed(small_mae()).eval()
    rows = decoder_inversion(m, torch.randn(4, 3, 32, 32))
    assert [(r["layer"], r["decoder_layer"]) for r in rows] == [(1, 2), (2, 1)]
    assert all(-1 <= r["cos_local"] <= 1 and r["r2_identity"] <= 1 for r in rows)
    report = analyze(m, tmp_path / "a", {"test": torch.rand(4, 3, 32, 32)}, normalization=([0.5] * 3, [0.25] * 3),
                     num_vis=1, progress=False)  # fmt: skip
    assert len(report["decoder_inversion"]["layers"]) == 2
    sections = [v["section"] for v in report["verdicts"]]
    assert sections == ["CRATE-MAE encoder"] * 3 + ["CRATE-MAE decoder"]  # compression, sparsity, incoherence
    dec = report["verdicts"][-1]["measured"]  # CKA of each decoder layer's output and input with the encoder's Z^l
    assert len(dec["cka_out_per_layer"]) == len(dec["cka_in_per_layer"]) == 2 and dec["samples"] == 4
    assert all(0 <= c <= 1 + 1e-9 for c in dec["cka_out_per_layer"] + dec["cka_in_per_layer"])
    assert "cka_out_per_image" not in report["decoder_inversion"]["layers"][0]  # per-image values stay out of JSON
    assert (tmp_path / "a" / "figures" / "decoder_inversion.png").is_file()


def test_reconstruction_recognition_against_pixels_written_directly(monkeypatch):
    from crate_transformer.analysis import reconstruction_recognition
    from crate_transformer.analysis.probe import knn_classify

    torch.manual_seed(0)
    m = perturbed(small_mae(in_chans=1, image_size=16, patch_size=4)).eval()  # 16 patches, 12 masked
    mean, std = [0.5], [0.25]

    def digits(n):  # two classes: the bright half is the left or the right one
        y = torch.arange(n) % 2
        x = 0.3 * torch.randn(n, 1, 16, 16)
        x[y == 0, :, :, :8] += 1.5
        x[y == 1, :, :, 8:] += 1.5
        return x, y

    (trx, tr_y), (tex, te_y) = digits(40), digits(10)
    pix = lambda x: (x * std[0] + mean[0]).flatten(1)  # noqa: E731
    knn = lambda x: knn_classify(pix(trx), tr_y, pix(x), te_y, k=5)  # noqa: E731
    r = reconstruction_recognition(m, trx, tr_y, tex, te_y, mean=mean, std=std, seed=3, k=5, batch_size=3)
    assert r["original"] == knn(tex) and r["images"] == 10
    # the do-nothing reconstruction, written directly: masked 4x4 patches take the mean training image
    noise = torch.rand(10, 16, generator=torch.Generator().manual_seed(3))
    masked = torch.zeros(10, 16)
    masked.scatter_(1, noise.argsort(1)[:, 4:], 1.0)  # the 12 patches of largest noise are masked
    mask_img = masked.view(10, 1, 4, 4).repeat_interleave(4, -2).repeat_interleave(4, -1)
    assert r["mean_fill"] == knn(tex * (1 - mask_img) + trx.mean(0) * mask_img)
    with torch.no_grad():
        assert r["reconstruction"] == knn(m.reconstruct(tex, noise=noise)[0])
    # a perfect autoencoder is recognised exactly as often as the originals
    monkeypatch.setattr(m, "reconstruct", lambda x, noise: (x, torch.zeros_like(x), torch.zeros(len(x))))
    perfect = reconstruction_recognition(m, trx, tr_y, tex, te_y, mean=mean, std=std, k=5)
    assert perfect["reconstruction"] == perfect["original"] > 0.9 and perfect["mean_fill"] == perfect["original"]


@pytest.mark.slow
def test_pretrain_mae_under_torchrun_reduces_the_held_out_loss_over_processes(tmp_path, torchrun):
    import yaml

    from crate_transformer.data import load_dataset
    from crate_transformer.train.mae import masked_eval

    run = tmp_path / "ddp"
    proc = torchrun("pretrain", "mae", *DIGITS, "--epochs", 2, "--batch-size", 64, "--no-probe",
                    "--eval-batch-size", 100, "--out", run)  # fmt: skip
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert out.count("held-out masked-patch loss") == 1  # rank 0 only
    assert yaml.safe_load((run / "config.yaml").read_text())["derived"]["world_size"] == 2
    # each process evaluated its share of every batch; the reduced loss equals one process evaluating them all
    final = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines() if '"final"' in r][-1]
    model = ct.from_pretrained(run / "model")
    c = model.config
    alone = masked_eval(model, load_dataset("digits", "test"), mean=c.data.mean, std=c.data.std, image_size=8,
                        batch_size=100, seed=0)  # fmt: skip
    assert abs(final["loss"] - alone["loss"]) < 1e-5 and abs(final["visible_loss"] - alone["visible_loss"]) < 1e-5
    assert json.loads((run / "recognition.json").read_text())["images"] == 359
