"""The white-box analysis toolkit: layer-wise measurement vs an independent hooked computation,
attention maps, subspace incoherence, the report and `crate analyze` on every checkpoint kind."""

import json
import math

import numpy as np
import pytest
import tiny
import torch
import torch.nn.functional as F
from clitools import crate, one_line_error

import crate_transformer as ct
from crate_transformer import analysis
from crate_transformer.cli import analyze as analyze_cmd
from crate_transformer.data import DataSpec, load_dataset, load_image_folder, normalize
from crate_transformer.loading.official import native_to_official
from crate_transformer.models.spec import resolve_normalization

TINY = tiny.DIGITS


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", "train"), load_dataset("digits", "test")


@pytest.fixture(scope="module")
def trained(digits):
    """A tiny CRATE trained for 60 steps on the built-in 8x8 digits (a plain loop, ~1 s)."""
    torch.manual_seed(0)
    train, _ = digits
    model = ct.create_model("crate_tiny", **TINY)
    # what `crate train` records with the model
    model.config.data = DataSpec(source="digits", name="digits", mean=list(train.mean), std=list(train.std))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    x_all = normalize(train.images.float() / 255, train.mean, train.std)
    first = None
    for _ in range(60):
        idx = torch.randint(0, len(train), (64,), generator=g)
        loss = F.cross_entropy(model(x_all[idx]), train.labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.7 * first  # it did learn something
    return model.eval()


@pytest.fixture(scope="module")
def batch(digits):
    _, test = digits
    return normalize(test.images[:48].float() / 255, test.mean, test.std)


# --------------------------------------------------------------------------- direct computation
def direct_logdet_rate(P, eps2):
    """½ logdet(I + p/(n eps²) G) of row tokens P (n, p), float64 numpy, written from the formula."""
    n, p = P.shape
    sign, val = np.linalg.slogdet(np.eye(n) + p / (n * eps2) * P @ P.T)
    assert sign > 0
    return 0.5 * val


def unit_rows(a):
    return a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)


def hooked(model, x):
    """Run the model once with forward hooks on the real modules; returns per-layer numpy arrays."""
    rec = {"qkv": {}, "half": {}, "ista": {}}
    handles = []
    for l, layer in enumerate(model.layers):
        handles.append(layer.attn.qkv.register_forward_hook(lambda m, i, o, l=l: rec["qkv"].__setitem__(l, o)))
        handles.append(layer.norm2.register_forward_hook(lambda m, i, o, l=l: rec["half"].__setitem__(l, i[0])))
        handles.append(layer.ista.register_forward_hook(lambda m, i, o, l=l: rec["ista"].__setitem__(l, o)))
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return {k: {l: t.double().numpy() for l, t in v.items()} for k, v in rec.items()}


def test_measure_matches_direct_computation_from_hooked_tokens(trained, batch):
    """R^c (official protocol, eps² = 0.01), sparsity, l1, R and ΔR vs forward hooks + a float64 logdet."""
    table = analysis.measure(trained, batch, batch_size=20, progress=False)
    h = hooked(trained, batch)
    K, p = trained.config.heads, trained.config.head_dim
    for l, layer in enumerate(trained.layers):
        W = layer.attn.qkv.weight.detach().double().numpy()  # rows [U_1ᵀ; …; U_Kᵀ]
        for i in range(batch.shape[0]):
            qkv = h["qkv"][l][i]  # (n, K·p): U_kᵀ LN1(Z^ℓ)
            rc_in = sum(direct_logdet_rate(unit_rows(qkv[:, k * p : (k + 1) * p]), 0.01) for k in range(K))
            half_proj = h["half"][l][i] @ W.T
            rc_half = sum(direct_logdet_rate(unit_rows(half_proj[:, k * p : (k + 1) * p]), 0.01) for k in range(K))
            z = h["ista"][l][i]  # ISTA output Z^{ℓ+1}
            out_proj = z @ W.T
            rc_out = sum(direct_logdet_rate(unit_rows(out_proj[:, k * p : (k + 1) * p]), 0.01) for k in range(K))
            zn = unit_rows(z)
            rate = direct_logdet_rate(zn, 0.01)  # eq. (8) in the n×n form: α = d/(n ε²)
            rc_sphere = sum(direct_logdet_rate(unit_rows(zn) @ W[k * p : (k + 1) * p].T, 0.01) for k in range(K))
            np.testing.assert_allclose(table.values["rc_in"][i, l], rc_in, rtol=1e-5)
            np.testing.assert_allclose(table.values["rc_half"][i, l], rc_half, rtol=1e-5)
            np.testing.assert_allclose(table.values["rc_out"][i, l], rc_out, rtol=1e-5)
            assert table.values["sparsity"][i, l] == np.mean(z == 0)
            np.testing.assert_allclose(table.values["l1"][i, l], np.abs(z).mean(), rtol=1e-6)
            np.testing.assert_allclose(table.values["rate_reduction"][i, l], rate - rc_sphere, rtol=1e-5, atol=1e-6)
    # the per-layer means are the means of those per-sample values
    rec = table.to_records()
    assert [r["layer"] for r in rec] == [1, 2]
    np.testing.assert_allclose([r["rc_in"] for r in rec], table.values["rc_in"].mean(0), rtol=1e-12)
    np.testing.assert_allclose([r["nonzero"] for r in rec], 1 - table.values["sparsity"].mean(0), rtol=1e-12)
    # a real ISTA output is sparse, and the official R^c is bounded by (K/2)·p·log(1 + βn/p)
    assert all(0.05 < r["sparsity"] < 0.95 for r in rec)
    n = batch.shape[-1] ** 2 // 4 + 1
    bound = K / 2 * p * math.log(1 + (p / (n * 0.01)) * n / p)
    assert all(0 < r["rc_in"] < bound for r in rec)


def test_rate_matches_the_d_by_d_form_of_eq_8(trained, batch):
    """R of eq. (8) on the unit-normalised layer output, checked in the d×d form ½ logdet(I_d + α ZZᵀ)."""
    table = analysis.measure(trained, batch[:4], progress=False)
    z = hooked(trained, batch[:4])["ista"][1]
    for i in range(4):
        zn = unit_rows(z[i])
        n, d = zn.shape
        sign, val = np.linalg.slogdet(np.eye(d) + d / (n * 0.01) * zn.T @ zn)
        np.testing.assert_allclose(table.values["rate"][i, 1], 0.5 * val, rtol=1e-6)


def test_measure_is_deterministic_and_independent_of_batch_order(trained, batch):
    a = analysis.measure(trained, batch, batch_size=16, progress=False)
    b = analysis.measure(trained, batch, batch_size=16, progress=False)
    for k in a.values:
        np.testing.assert_array_equal(a.values[k], b.values[k])
    perm = torch.randperm(batch.shape[0], generator=torch.Generator().manual_seed(1))
    c = analysis.measure(trained, batch[perm], batch_size=7, progress=False)
    for k in a.values:
        np.testing.assert_allclose(c.values[k], a.values[k][perm.numpy()], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(c.mean(k), a.mean(k), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(c.std(k), a.std(k), rtol=1e-9, atol=1e-12)


def test_eps_parameter_and_cls_token_option_change_the_value(trained, batch):
    base = analysis.measure(trained, batch[:8], progress=False)
    coarse = analysis.measure(trained, batch[:8], eps=0.5, progress=False)
    no_cls = analysis.measure(trained, batch[:8], include_cls=False, progress=False)
    assert (coarse.mean("rc_in") < base.mean("rc_in")).all()  # coarser precision → fewer nats
    assert not np.allclose(no_cls.mean("rc_in"), base.mean("rc_in"))
    assert base.meta["eps"] == 0.1 and math.isclose(base.meta["eps_squared"], 0.01)
    with pytest.raises(ValueError, match="eps"):
        analysis.measure(trained, batch[:2], eps=0, progress=False)


def test_dataset_input_is_normalised_like_the_model_expects(trained, digits):
    _, test = digits
    sub = torch.utils.data.Subset(test, range(10))
    ref = analysis.measure(trained, normalize(test.images[:10].float() / 255, test.mean, test.std), progress=False)
    got = analysis.measure(trained, sub, progress=False)  # map-style dataset of [0, 1] images
    np.testing.assert_allclose(got.values["rc_in"], ref.values["rc_in"], rtol=1e-6)
    full = analysis.measure(trained, test, batch_size=128, progress=False)  # the ImageDataset itself
    assert full.num_samples == len(test)
    np.testing.assert_allclose(full.values["rc_in"][:10], ref.values["rc_in"], rtol=1e-6)


def test_grey_dataset_on_an_rgb_model_is_converted_like_training(tmp_path, digits):
    _, test = digits
    rgb = ct.create_model("crate_tiny", **{**TINY, "in_chans": 3}).eval()
    t = analysis.measure(rgb, torch.utils.data.Subset(test, range(4)), progress=False)
    x = normalize(test.images[:4].float().div(255).expand(-1, 3, -1, -1), test.mean * 3, test.std * 3)
    ref = analysis.measure(rgb, x, progress=False).values["rc_in"]
    np.testing.assert_allclose(t.values["rc_in"], ref, rtol=1e-4)  # float32 rounding of /255 vs normalise
    rgb.save_pretrained(tmp_path / "rgb")
    out = tmp_path / "o"
    assert (
        crate("analyze", tmp_path / "rgb", "--data", "digits", "--num-images", "8", "--no-progress", "--out", out) == 0
    )
    rep = json.loads((out / "report.json").read_text())
    assert "converted to 3 channels" in rep["source"]["channels"]
    np.testing.assert_allclose(rep["normalization"], [list(test.mean) * 3, list(test.std) * 3], rtol=1e-12)


def test_normalization_comes_from_the_model_config_then_the_dataset(digits):
    train, _ = digits
    m = ct.create_model("crate_tiny", **TINY)
    assert resolve_normalization(m) is None
    assert resolve_normalization(m, train) == (list(train.mean), list(train.std))
    m.config.data = DataSpec(mean=[0.5], std=[0.25])  # the model's record wins over the dataset's statistics
    assert resolve_normalization(m, train) == ([0.5], [0.25])
    assert resolve_normalization(m.config, train) == ([0.5], [0.25])  # a config works as well as a model
    m.config.data = DataSpec(name="rgb-trained", mean=[0.1, 0.2, 0.6], std=[0.2, 0.4, 0.3])  # RGB stats, 1 channel
    np.testing.assert_allclose(resolve_normalization(m, train), [[0.3], [0.3]], rtol=1e-12)  # averaged over RGB
    rgb = ct.create_model("crate_tiny", **{**TINY, "in_chans": 3})
    assert resolve_normalization(rgb, train) == (list(train.mean) * 3, list(train.std) * 3)  # grey stats repeated
    m.config.data = DataSpec(name="no statistics", classes=["a"])
    assert resolve_normalization(m, train) == (list(train.mean), list(train.std))


def test_training_loop_call_restores_mode_and_returns_json_records(trained, batch):
    trained.train()
    try:
        records = analysis.measure(trained, batch[:8], progress=False).to_records()
        assert trained.training
    finally:
        trained.eval()
    text = json.dumps([{**r, "epoch": 3} for r in records])
    back = json.loads(text)
    assert len(back) == 2 and {"layer", "rc_in", "rc_in_std", "sparsity", "nonzero", "l1", "rate"} <= set(back[0])


def test_layer_table_roundtrip_and_format(trained, batch):
    t = analysis.measure(trained, batch[:6], thresholds=(0.1, 1.0), progress=False)
    assert np.all(t.values["below_0.1"] <= t.values["below_1"])
    assert np.all(t.values["below_0.1"] >= t.values["sparsity"])  # exact zeros are below any τ
    t2 = analysis.LayerTable.from_dict(json.loads(t.to_json(per_sample=True)))
    for k in t.values:
        np.testing.assert_array_equal(t2.values[k], t.values[k])
    assert "layer" in str(t) and len(str(t).splitlines()) == 3
    with pytest.raises(ValueError, match="unknown metric"):
        t.mean("nope")


def test_vit_baseline_has_no_exact_zeros_but_threshold_sparsity():
    vit = ct.create_model("vit_mnist", image_size=8, patch_size=2, dim=32, depth=2, heads=4).eval()
    t = analysis.measure(vit, torch.randn(4, 1, 8, 8), thresholds=(0.5,), progress=False)
    assert np.all(t.values["sparsity"] == 0)  # Fig. 26: a ViT MLP output is not sparse
    assert np.all((t.values["below_0.5"] > 0) & (t.values["below_0.5"] < 1))
    assert np.all(np.isfinite(t.values["rc_in"]))


def test_measure_errors_are_one_line_value_errors(trained):
    with pytest.raises(ValueError, match="1-channel.*got 3 channels"):
        analysis.measure(trained, torch.randn(2, 3, 8, 8), progress=False)
    with pytest.raises(ValueError, match="no images"):
        analysis.measure(trained, torch.zeros(0, 1, 8, 8), progress=False)
    with pytest.raises(ValueError, match=r"layer 2 does not exist.*2 layers"):
        analysis.cls_attention(trained, torch.randn(1, 1, 8, 8), layer=2)
    with pytest.raises(ValueError, match="layer -3 does not exist"):
        analysis.patch_features(trained, torch.randn(1, 1, 8, 8), layer=-3)
    # NaN/Inf in user tensors is refused at the analysis entry points (the forward pass no longer checks it)
    bad = torch.randn(3, 1, 8, 8)
    bad[2, 0, 1, 1] = float("nan")
    for call in (
        lambda: analysis.measure(trained, bad, batch_size=2, progress=False),  # in the second batch
        lambda: analysis.measure(trained, iter([bad[:1], bad * float("inf")]), progress=False),  # a loader
        lambda: analysis.cls_attention(trained, bad),
        lambda: analysis.patch_features(trained, bad[2]),
    ):
        with pytest.raises(ValueError, match="NaN or Inf"):
            call()


# --------------------------------------------------------------------------- attention, subspaces
def test_cls_attention_is_the_class_row_of_eq_437_at_any_image_size(trained):
    x = torch.randn(2, 1, 12, 16)  # not the training size: 6x8 patches, interpolated position embedding
    maps = analysis.cls_attention(trained, x, layer=0)
    assert maps.shape == (2, 4, 6, 8)
    torch.testing.assert_close(maps.sum((-2, -1)), torch.ones(2, 4))
    w = {}
    hk = trained.layers[0].attn.qkv.register_forward_hook(lambda m, i, o: w.__setitem__("qkv", o))
    with torch.no_grad():
        trained(x)
    hk.remove()
    K, p = 4, 8
    U = w["qkv"].view(2, -1, K, p).transpose(1, 2).double()  # (b, K, n, p)
    scores = (U[:, :, :1] @ U.transpose(-1, -2))[:, :, 0] * p**-0.5  # ⟨U_kᵀz_cls, U_kᵀz_i⟩ / √p
    a = torch.softmax(scores, -1)[..., 1:]
    a = a / a.sum(-1, keepdim=True)
    torch.testing.assert_close(maps.double(), a.reshape(2, K, 6, 8), rtol=1e-5, atol=1e-7)
    ent = analysis.attention_entropy(maps)
    assert ent.shape == (2, 4) and (ent <= math.log(48) + 1e-5).all()


def test_subspace_incoherence_orthogonal_random_and_identical():
    m = ct.create_model("crate_tiny", **TINY)
    d, K, p = 32, 4, 8
    Q, _ = torch.linalg.qr(torch.randn(d, d))
    with torch.no_grad():
        m.layers[0].attn.qkv.weight.copy_(Q.T * 3.0)  # orthogonal subspaces (scaled)
        W = m.layers[1].attn.qkv.weight
        W[p : 2 * p] = torch.randn(p, p) @ W[:p]  # head 1 spans the same subspace as head 0
    inc = analysis.incoherence(m)
    assert inc[0]["mean_cross_coherence"] < 1e-6 and inc[0]["max_principal_cos"] < 1e-6
    np.testing.assert_allclose(np.diag(inc[0]["block_coherence"]), 1.0, rtol=1e-9)
    assert inc[1]["max_principal_cos"] > 1 - 1e-6 and inc[1]["block_coherence"][0][1] > 1 - 1e-6
    assert inc[0]["random_baseline"] == pytest.approx(math.sqrt(p / d))
    g = analysis.subspace_gram(m, 0)
    assert g.shape == (K * p, K * p)
    np.testing.assert_allclose(g, np.eye(K * p), atol=1e-6)  # orthonormal columns → identity
    g4 = analysis.subspace_gram(m, 1, directions=4)
    assert g4.shape == (16, 16) and np.all(g4 <= 1 + 1e-9)
    with pytest.raises(ValueError, match="directions"):
        analysis.subspace_gram(m, 0, directions=9)


# --------------------------------------------------------------------------- plots
def test_training_hook_records_metrics_log_and_history_plot(tmp_path, trained, batch, digits):
    """--measure-every N: the hook's records go to metrics.jsonl, are read back and plotted (Fig. 15)."""
    from types import SimpleNamespace

    with pytest.raises(ValueError, match=r"^measure_every must be a positive integer \(steps\), got 8.0 \(float\)$"):
        analysis.measure_hook(every=8.0)
    hook = analysis.measure_hook(every=2)
    log = tmp_path / "metrics.jsonl"
    with log.open("w") as f:
        f.write(json.dumps({"split": "train", "step": 1, "loss": 2.3}) + "\n")  # other records are ignored
        for step in range(5):
            ctx = SimpleNamespace(model=trained, step=step, epoch=step // 2, fixed_batch=(batch[:8], None))
            recs = hook(ctx)
            assert (recs is None) == (step % 2 == 1)
            for r in recs or []:
                f.write(json.dumps(r) + "\n")
        f.write('{"split": "measure", "layer": 1, "rc_')  # a line cut short by a killed run
    records = analysis.load_measure_records(log)
    assert [(r["step"], r["layer"]) for r in records] == [(0, 1), (0, 2), (2, 1), (2, 2), (4, 1), (4, 2)]
    direct = analysis.measure(trained, batch[:8], progress=False).to_records()
    assert records[-1]["rc_in"] == direct[-1]["rc_in"] and records[-1]["nonzero"] == direct[-1]["nonzero"]
    fig = analysis.plot_measure_history(records, tmp_path / "hist.png", step_key="step")
    assert (tmp_path / "hist.png").stat().st_size > 5000
    assert [a.get_xlabel() for a in fig.axes[:2]] == [r"layer index $\ell$"] * 2
    assert len(fig.axes[0].lines) == 3 and "Fig. 15" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="'epoch'"):
        analysis.plot_measure_history([{"layer": 1, "rc_in": 1.0}], step_key="epoch")
    with pytest.raises(ValueError, match="positive"):
        analysis.measure_hook(0)
    # checkpoints / splits as a mapping of tables
    t = analysis.measure(trained, batch[:4], progress=False)
    fresh = analysis.measure(ct.create_model("crate_tiny", **TINY), batch[:4], progress=False)
    fig = analysis.plot_measure_history({"random init": fresh, "trained": t}, tmp_path / "ckpts.png")
    assert [ln.get_label() for ln in fig.axes[0].lines] == ["random init", "trained"]
    fig = analysis.plot_layerwise({"train": t, "val": t.to_records()}, tmp_path / "lw.png")
    assert len(fig.axes[0].lines) == 2 and "Fig. 14" in fig._suptitle.get_text()


def test_each_reference_curve_takes_its_splits_colour_and_its_kinds_dash() -> None:
    """A fine-tuned run's figure: per split an untrained network and the starting checkpoint, dashed in that split's
    colour and told apart by their dash; step-0 records that belong to no split are grey."""
    rows = [{"layer": i, "rc_in": 1.0 + i, "nonzero": 0.5} for i in (1, 2)]
    refs = {f"{s} {k}": rows for k in ("untrained", "starting checkpoint") for s in ("train", "test")}
    fig = analysis.plot_layerwise({"train": rows, "test": rows}, references=refs)
    lines = {ln.get_label(): ln for ln in fig.axes[0].lines}
    for split in ("train", "test"):
        colour = lines[split].get_color()
        assert lines[f"{split} untrained"].get_color() == lines[f"{split} starting checkpoint"].get_color() == colour
    assert lines["train"].get_color() != lines["test"].get_color()
    dashes = {k: lines[f"train {k}"].get_linestyle() for k in ("untrained", "starting checkpoint")}
    assert dashes["untrained"] != dashes["starting checkpoint"] and "-" not in dashes.values(), dashes
    grey = analysis.plot_layerwise({"test": rows}, references={"starting checkpoint (step-0 records)": rows})
    assert grey.axes[0].lines[1].get_color() == "0.45"
    single = analysis.plot_layerwise({"": rows}, references={"untrained": rows})
    assert single.axes[0].lines[1].get_color() == single.axes[0].lines[0].get_color()


# --------------------------------------------------------------------------- report + CLI
FIGS = [
    "layerwise.png",
    "layerwise_all.png",
    "layerwise_rate.png",
    "attention.png",
    "pca.png",
    "maskcut.png",
    "subspaces.png",
    "token_heatmaps.png",
]


def test_crate_analyze_on_run_dir_pretrained_dir_and_official_checkpoint(tmp_path, trained, capsys):
    pretrained = tmp_path / "pretrained"
    trained.save_pretrained(pretrained)
    run_dir = tmp_path / "run"
    trained.save_pretrained(run_dir / "model")  # what `crate train` leaves behind
    sd = {"module." + k: v for k, v in native_to_official(trained.state_dict()).items()}
    torch.save({"state_dict": sd, "epoch": 1}, tmp_path / "official.pth")
    common = ["--num-images", "24", "--num-vis", "2", "--no-progress", "--masks", "2"]
    overrides = ["--model-args", *(f"{k}={v}" for k, v in TINY.items())]
    reports = {}
    for name, argv in {
        "pretrained": [str(pretrained), "--data", "digits"],
        # `crate analyze RUN_DIR`, as `crate train` suggests: data from the model config; layers numbered 1..L
        "run": [str(run_dir), "--attn-layer", "1"],
        "official": [str(tmp_path / "official.pth"), "--model", "crate_mnist", *overrides, "--data", "digits"],
    }.items():
        out = tmp_path / f"out_{name}"
        assert crate("analyze", *argv, *common, "--out", out) == 0
        rep = json.loads((out / "report.json").read_text())
        reports[name] = rep
        page = (out / "report.html").read_text()
        for f in FIGS:
            assert (out / "figures" / f).stat().st_size > 2000, f
            assert f"figures/{f}" in page
        for fig in ("Fig. 14", "Fig. 16", "Fig. 17", "Figs. 18", "Fig. 19", "eq. (437)", "Alg. 1"):
            assert fig in page
        assert len(list((out / "masks").glob("*.png"))) == 2
    assert "wrote" in capsys.readouterr().out
    rep = reports["pretrained"]
    assert set(rep["measure"]) == {"train", "test"}
    assert [r["layer"] for r in rep["measure"]["test"]["layers"]] == [1, 2]
    norm = trained.config.data
    assert rep["normalization"] == [norm.mean, norm.std]
    assert reports["official"]["source"]["normalization_source"] == "dataset statistics"  # official: no config
    assert len(rep["subspaces"]) == 2 and len(rep["attention"]["entropy_per_head"]) == 4
    assert (rep["attention"]["layer"], reports["run"]["attention"]["layer"]) == (2, 1)  # -1 (the default) and 1
    # the same weights give the same numbers whichever way they were loaded
    for name in ("run", "official"):
        for split in ("train", "test"):
            a = [r["rc_in"] for r in rep["measure"][split]["layers"]]
            b = [r["rc_in"] for r in reports[name]["measure"][split]["layers"]]
            np.testing.assert_allclose(b, a, rtol=1e-9)
    # the report's numbers are the API's numbers on the same (seeded) subset of images
    test = load_dataset("digits", "test")
    idx = analyze_cmd._subset(len(test), 24, 0)
    direct = analysis.measure(trained, torch.utils.data.Subset(test, idx), progress=False).to_records()
    assert rep["measure"]["test"]["meta"]["n_samples"] == 24
    np.testing.assert_allclose([r["rc_in"] for r in rep["measure"]["test"]["layers"]], [r["rc_in"] for r in direct])


def test_crate_analyze_on_a_folder_of_images(tmp_path, trained):
    from PIL import Image

    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    g = np.random.default_rng(0)
    Image.fromarray(g.integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(folder / "a.png")
    Image.fromarray(g.integers(0, 255, (16, 16), dtype=np.uint8)).save(folder / "sub" / "b.jpg")
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "out"
    assert (
        crate(
            "analyze",
            str(_save(trained, tmp_path)),
            "--images",
            str(folder),
            "--out",
            str(out),
            "--no-progress",
            "--image-size",
            "12",
        )
        == 0
    )
    rep = json.loads((out / "report.json").read_text())
    assert rep["measure"]["images"]["meta"]["n_samples"] == 2
    assert rep["visual"]["grid"] == [6, 6]  # 12x12 images, patch 2: position embedding interpolated
    imgs, files = load_image_folder(folder, 8, 1)
    assert imgs.shape == (2, 1, 8, 8) and 0 <= imgs.min() and imgs.max() <= 1 and files[0].endswith("a.png")


def test_crate_analyze_images_use_the_models_normalisation_not_the_photos(tmp_path):
    """Photos are normalised with the model's mean/std (its config, else ImageNet's), never silently with their
    own statistics; the report's normalisation row says which, as numbers, not Python lists."""
    from PIL import Image

    from crate_transformer.models.spec import IMAGENET_MEAN, IMAGENET_STD, fit_normalization

    folder = tmp_path / "photos"
    folder.mkdir()
    g = np.random.default_rng(0)
    for i in range(4):  # dark photos: their own statistics are far from ImageNet's
        Image.fromarray(g.integers(0, 60, (20, 36, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    m = ct.create_model("crate_tiny", image_size=8, patch_size=2, in_chans=3, num_classes=10, dim=16, depth=2, heads=2)
    path = tmp_path / "m"
    m.save_pretrained(path)  # no data normalisation recorded: a released checkpoint's situation
    common = ["--num-vis", "1", "--no-progress", "--masks", "1", "--images", str(folder)]
    reports = {}
    for choice in ("auto", "folder"):
        out = tmp_path / choice
        assert crate("analyze", str(path), *common, "--normalize", choice, "--out", str(out)) == 0
        reports[choice] = (json.loads((out / "report.json").read_text()), (out / "report.html").read_text())
    rep, page = reports["auto"]
    imagenet = fit_normalization(IMAGENET_MEAN, IMAGENET_STD, 3)
    np.testing.assert_allclose(rep["normalization"], imagenet)
    assert rep["source"]["normalization_source"] == "ImageNet's (the model config records none)"
    row = page[page.index("<th>normalisation</th>") :].split("</tr>")[0]
    assert "mean 0.485, 0.456, 0.406; std 0.229, 0.224, 0.225 (ImageNet&#x27;s" in row and "[" not in row
    imgs, _ = load_image_folder(folder, 8, 3)
    folder_stats = reports["folder"][0]["normalization"]
    np.testing.assert_allclose(folder_stats[0], imgs.mean((0, 2, 3)).numpy(), rtol=1e-5)
    with pytest.raises(SystemExit):
        crate("analyze", str(path), *common, "--normalize", "photos")


def test_crate_analyze_images_of_a_released_model_use_its_stated_crop_and_statistics(tmp_path):
    """An authors' file of a released model (crate_small): the photos are resized to 32 / 0.875 = 37 px and
    centre-cropped (its release's resize 256 / crop 224), normalised with ImageNet's statistics as its release
    states; --crop-pct still chooses another crop."""
    from PIL import Image
    from test_pretrained import official_tiny_file

    folder = tmp_path / "photos"
    folder.mkdir()
    g = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(g.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    _, f = official_tiny_file(tmp_path / "crate_small.pth")
    arch = [f"{k}={v}" for k, v in tiny.IMAGE.items()]
    common = ["--model", "crate_small", "--model-args", *arch, "--images", str(folder), "--num-vis", "1",
              "--no-progress", "--masks", "1"]  # fmt: skip
    for extra, want in (([], "shorter side to 37 px (bilinear), centre crop 32"),
                        (["--crop-pct", "1"], "shorter side to 32 px (bilinear), centre crop 32")):  # fmt: skip
        out = tmp_path / f"out{len(extra)}"
        assert crate("analyze", str(f), *common, *extra, "--out", str(out)) == 0
        rep = json.loads((out / "report.json").read_text())
        assert rep["source"]["data"] == f"{folder} (2 images; {want})"
        assert rep["source"]["normalization_source"] == "the released weights' (their zoo entry)"
        np.testing.assert_allclose(rep["normalization"], [[0.485, 0.456, 0.406], [0.229, 0.224, 0.225]])


def test_image_folder_keeps_the_aspect_ratio_and_crops_the_centre(tmp_path):
    from PIL import Image

    a = np.full((20, 40), 255, dtype=np.uint8)
    a[:, :10] = 0  # a black left quarter: squashing the 2:1 photo into a square would keep it
    a[:, 30:] = 0  # and a black right quarter
    (tmp_path / "f").mkdir()
    Image.fromarray(a).save(tmp_path / "f" / "wide.png")
    imgs, _ = load_image_folder(tmp_path / "f", 10, 1)  # 20x40 -> 10x20, centre 10 columns: all white
    assert imgs.shape == (1, 1, 10, 10) and imgs.min() > 0.8  # (antialiasing greys the edge columns a little)
    imgs, _ = load_image_folder(tmp_path / "f", 10, 1, crop_pct=0.5)  # shorter side 20: no resize, centre 10x10
    np.testing.assert_array_equal((imgs[0, 0] * 255).round().numpy(), a[5:15, 15:25])
    with pytest.raises(ValueError, match=r"crop_pct must be a finite number in \(0, 1\]"):
        load_image_folder(tmp_path / "f", 10, 1, crop_pct=1.5)


def _save(model, tmp_path):
    path = tmp_path / "m"
    if not path.exists():
        model.save_pretrained(path)
    return path


def test_crate_analyze_errors(tmp_path, trained, capsys):
    ckpt = str(_save(trained, tmp_path))
    out = ["--out", str(tmp_path / "o")]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("x")
    for argv, match in (
        ([ckpt, "--images", str(empty)], r"no images found in .*empty"),
        ([ckpt, "--images", str(tmp_path / "missing")], "image folder not found"),
        ([ckpt, "--data", "digits", "--attn-layer", "5"], "--attn-layer 5 does not exist: the model has 2 layers"),
        ([ckpt, "--data", "digits", "--attn-layer", "0"], r"--attn-layer 0 does not exist: .*pass 1\.\.2"),
        ([ckpt, "--data", "digits", "--seg-layer", "-3"], "layer -3 does not exist"),
    ):
        one_line_error(capsys, "analyze", *argv, *out, match=match)
    two = ct.create_model("crate_tiny", **{**TINY, "in_chans": 2})
    two.save_pretrained(tmp_path / "two")
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(photos / "rgb.png")
    for argv, match in (
        ([str(tmp_path / "two"), "--images", str(photos)], "cannot convert 3-channel images to 2"),
        ([str(tmp_path / "two")], "pass --images DIR or --data"),  # no dataset recorded
        ([ckpt, "--data", "digits", "--image-size", "9"], "not a multiple of the model's patch size"),
        ([ckpt, "--data", "digits", "--model-args", "dim"], "KEY=VALUE"),
    ):
        one_line_error(capsys, "analyze", *argv, *out, match=match)
    assert not (tmp_path / "o").exists()  # every check happens before anything is written


def test_crate_cli_prints_one_line_error(tmp_path, trained, capsys):
    from crate_transformer.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["analyze", str(_save(trained, tmp_path)), "--images", str(empty), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("crate analyze: error: no images found") and "\n" not in err


def test_analyze_api_on_the_vit_baseline(tmp_path):
    """The same report for the ViT baseline (Fig. 26): key projections play the subspaces."""
    vit = ct.create_model("vit_mnist", image_size=8, patch_size=2, dim=32, depth=2, heads=4).eval()
    imgs = torch.rand(6, 1, 8, 8)
    rep = analysis.analyze(vit, tmp_path / "vit", {"images": imgs}, normalization=([0.5], [0.25]), progress=False)
    assert rep["model"]["config"]["arch"] == "vit"
    assert all(r["sparsity"] == 0 for r in rep["measure"]["images"]["layers"])
    assert len(rep["subspaces"]) == 2 and rep["subspaces"][0]["dim_head"] == 8
    assert (tmp_path / "vit" / "report.html").is_file() and (tmp_path / "vit" / "figures" / "subspaces.png").is_file()
    x = (imgs - 0.5) / 0.25
    np.testing.assert_allclose(
        [r["rc_in"] for r in rep["measure"]["images"]["layers"]],
        analysis.measure(vit, x, progress=False).mean("rc_in"),
        rtol=1e-12,
    )


# the width report.html gives a figure: body max-width 1100 px less 1em padding either side
PAGE_PX = 1100 - 2 * 16


def _shown_px(fig, ax, png) -> float:
    """How wide ``ax`` of ``fig`` (saved as ``png``) appears on the report's page, in screen pixels."""
    from PIL import Image

    width = Image.open(png).size[0]
    return ax.get_position().width * fig.get_figwidth() * fig.dpi * min(1.0, PAGE_PX / width)


@pytest.mark.parametrize("heads", [4, 12])
def test_attention_maps_of_many_heads_stay_readable_on_the_page(tmp_path, heads):
    """12 heads (CRATE-B) wrap onto two rows instead of a strip of 14 thumbnails ~65 px wide on the page."""
    images, maps = torch.rand(2, 3, 32, 32), torch.rand(2, heads, 4, 4)
    fig = analysis.plot_attention(images, maps, tmp_path / "attention.png")
    titled = [ax for ax in fig.axes if ax.get_title().startswith("head ")]
    assert sorted({ax.get_title() for ax in titled}) == sorted(f"head {k}" for k in range(1, heads + 1))
    assert all(_shown_px(fig, ax, tmp_path / "attention.png") >= 110 for ax in titled)
    rows = {round(ax.get_position().y0, 3) for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.axison}
    assert len(rows) == (2 if heads == 4 else 4)  # one row per image with 4 heads, two with 12


def test_the_token_heatmap_caption_states_what_the_figure_draws(tmp_path):
    """65 tokens x 96 features: 50 random of each (capped); 17 tokens x 32 features: all of them."""
    wide = ct.create_model("crate_mnist", image_size=8, patch_size=1, dim=96, depth=1, heads=12).eval()
    small = ct.create_model("crate_mnist", **TINY).eval()
    for model, caption in (
        (wide, "50 random tokens of 65 x 50 random features of 96, the same at every layer"),
        (small, "all 17 tokens x all 32 features, the same at every layer"),
    ):
        out = tmp_path / str(model.config.dim)
        analysis.analyze(model, out, {"x": torch.rand(4, 1, 8, 8)}, normalization=([0.5], [0.3]), num_vis=1,
                         progress=False, initial=None)  # fmt: skip
        assert f"|Z^(l+1)| of the first image: {caption} (colour 0-2)" in (out / "report.html").read_text()


def test_report_json_rebuilds_the_tables(tmp_path, trained, batch):
    imgs = torch.rand(5, 1, 8, 8)
    rep = analysis.analyze(trained, tmp_path / "r", {"x": imgs}, normalization=([0.5], [0.3]), progress=False)
    back = analysis.LayerTable.from_dict(json.loads((tmp_path / "r" / "report.json").read_text())["measure"]["x"])
    direct = analysis.measure(trained, (imgs - 0.5) / 0.3, progress=False)
    for k in direct.values:
        np.testing.assert_allclose(back.values[k], direct.values[k], rtol=1e-12)
    assert rep["segmentation"]["masks"][0]["file"] == "masks/image_000.png"


def test_measurements_ignore_an_enclosing_autocast():
    """A bf16 training step's measurements are those of the model in its own dtype (the trace and the Gram matrices
    are not computed in bf16 when the measurement runs inside autocast)."""
    model = ct.create_model("crate_tiny", **tiny.IMAGE).eval()
    x = torch.randn(2, 3, 32, 32)
    want = analysis.measure_batch(model, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = analysis.measure_batch(model, x)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-9)
