"""Loaders that mislead (issue 29): every loader returns an eval-mode model, ``pretrained_file=`` takes what the other
loaders take, the old import paths keep working, the docs name what exists, and a file read under the wrong loader
or the wrong name is refused naming the right one."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import tiny
import torch
from hubcache import blob_of, flip_bytes, put_in_hub_cache
from official.crate import OfficialCRATE
from official.crate_alpha_official import CRATE as OfficialCRATEAlpha
from official.crate_bert_hf import CrateConfig, CrateForMaskedLM
from test_bert_release import TINY as BERT_TINY
from test_bert_release import _randomise, _save_as_port

import crate_transformer as ct
from crate_transformer.cli import main
from crate_transformer.io import CONFIG_NAME, FILE_DIGESTS, WEIGHTS_NAME, CheckpointError, json_sha256, save_safetensors
from crate_transformer.loading import pretrained

TINY = tiny.IMAGE
ROOT = Path(__file__).resolve().parents[2]


def official_file(path: Path) -> tuple[OfficialCRATE, Path]:
    """A tiny official ``model/crate.py`` classifier saved as the official main.py does."""
    torch.manual_seed(0)
    off = OfficialCRATE(**TINY).eval()
    torch.save({"epoch": 1, "state_dict": {"module." + k: v for k, v in off.state_dict().items()}}, path)
    return off, path


def trained_run(tmp_path: Path, with_model: bool = True) -> tuple[ct.Model, Path]:
    """A run folder as ``crate train`` leaves it: ``model/`` and ``checkpoints/last.pt`` (or only the state)."""
    m = ct.create_model("crate_tiny", **TINY, dropout=0.3)
    run = tmp_path / "run"
    if with_model:
        m.save_pretrained(run / "model")
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"model_config": m.config.to_dict(), "model": m.state_dict(), "step": 3}, run / "checkpoints/last.pt")
    return m, run


def in_eval_mode(model: torch.nn.Module) -> bool:
    return not any(m.training for m in model.modules())


# --------------------------------------------------------------------------- eval mode
def test_every_loader_returns_eval_mode(tmp_path, hub_cache):
    """Dropout off after every loader (CRATE-BERT's 0.1 made two calls differ by up to 5.9 before)."""
    port = _randomise(CrateForMaskedLM(CrateConfig(**BERT_TINY)), 0)
    folder = _save_as_port(port, tmp_path / "bert", "safetensors")
    bert = ct.from_official(folder, "crate_bert_base")
    ids = torch.randint(3, 50, (2, 9))
    with torch.no_grad():
        assert in_eval_mode(bert) and torch.equal(bert(ids), bert(ids))
    off, f = official_file(tmp_path / "off.pth")
    m, run = trained_run(tmp_path)
    loaded = {
        "from_official": ct.from_official(f, "crate_tiny", **TINY),
        "create_model(pretrained_file)": ct.create_model("crate_tiny", pretrained_file=f, **TINY),
        "ct.from_pretrained": ct.from_pretrained(run / "model"),
        "Family.from_pretrained": ct.CRATE.from_pretrained(run / "model"),
        "load_model(folder)": ct.load_model(run / "model"),
        "load_model(run)": ct.load_model(run),
        "load_model(state)": ct.load_model(run / "checkpoints/last.pt"),
        "load_model(official)": ct.load_model(f, "crate_tiny", **TINY),
        "load_model(as_classifier)": ct.load_model(run, as_classifier=True),
    }
    assert {k: in_eval_mode(v) for k, v in loaded.items()} == dict.fromkeys(loaded, True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded["load_model(run)"](x), loaded["load_model(run)"](x))  # dropout 0.3 is off


# --------------------------------------------------------------------------- pretrained_file takes every source
def test_pretrained_file_takes_a_downloaded_hub_folder_and_this_packages_models(tmp_path):
    off, f = official_file(tmp_path / "off.pth")
    hub_folder = tmp_path / "downloaded"
    hub_folder.mkdir()
    torch.save(off.state_dict(), hub_folder / "pytorch_model.bin")  # what a Hub repository of the weights holds
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = off(x)
        got = ct.create_model("crate_tiny", pretrained_file=hub_folder, **TINY)(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        m, run = trained_run(tmp_path)
        m.eval()
        for source in (run / "model", run, run / "checkpoints/last.pt"):
            model = ct.create_model("crate_tiny", pretrained_file=source, **TINY, dropout=0.3)
            assert torch.equal(model(x), m(x)), source
            assert {k: model.pretrained_cfg.get(k) for k in ("name", "file")} == {
                "name": "crate_tiny",
                "file": str(source),
            }
    with pytest.raises(CheckpointError, match=r"dim=576 \(checkpoint: 32\)"):
        ct.create_model("crate_small", pretrained_file=run / "model")  # a stored config that disagrees with the name


# --------------------------------------------------------------------------- this package's files under from_official
def test_from_official_on_this_packages_own_files_names_the_loader(tmp_path):
    _, run = trained_run(tmp_path)
    state_only = trained_run(tmp_path / "running", with_model=False)[1]
    for source, what in [
        (run / "model", "a save_pretrained folder of this package"),
        (state_only, "a run folder of this package"),
        (run / "checkpoints/last.pt", "a training state of this package"),
        (run / "model" / "model.safetensors", "the weights of a save_pretrained folder of this package"),
    ]:
        with pytest.raises(CheckpointError, match=f"{what}.*load it with load_model\\(path\\)") as e:
            ct.from_official(source, "crate_tiny", **TINY)
        assert "\n" not in str(e.value) and "matches no" not in str(e.value)


def test_a_file_under_another_formats_name_names_a_model_of_its_format(tmp_path):
    """A CRATE-α file under crate_alpha_mnist (arch crate + ODL, the ablation) named crate_alpha_base16."""
    alpha = OfficialCRATEAlpha(**TINY, dim_head=8).state_dict()
    fix = r"it is a CRATE-α checkpoint: pass a matching name, e.g. crate_alpha_base16$"
    with pytest.raises(CheckpointError, match=fix):
        ct.from_official(alpha, "crate_alpha_mnist")
    with pytest.raises(CheckpointError, match=r"is not a DINO ViT checkpoint .*e.g. crate_alpha_base16$"):
        ct.from_official(alpha, "vit_tiny")  # the ViT's authors' format is DINO's


# --------------------------------------------------------------------------- old import paths
# the modules that moved into models/ and loading/ (old dotted path below the package → new), and the two shims
# that went: each old path is gone, not an alias, and each name has one home
MOVED = {
    "model": "models.classifier", "base": "models.base", "mae": "models.mae", "lm": "models.lm",
    "bert": "models.bert", "alpha": "models.alpha", "tost": "models.tost", "dino": "models.dino",
    "registry": "models.registry", "_registry": "models._registry", "spec": "models.spec",
    "tokenizer": "models.tokenizer", "generation": "models.generation", "token_prior": "models.token_prior",
    "static_cache": "layers.static_cache", "_hub": "loading.hub", "official": "loading.official",
    "pretrained": "loading.pretrained", "runfiles": "loading.runfiles", "probe": "analysis.probe",
    "figures": "analysis.figures", "ablate": "train.ablate",
}  # fmt: skip


@pytest.mark.parametrize("old", [*MOVED, "checkpoint", "train.load"])
def test_a_moved_module_is_gone_from_its_old_path(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"crate_transformer.{old}")
    if old in MOVED:
        assert importlib.import_module(f"crate_transformer.{MOVED[old]}").__file__.endswith(
            MOVED[old].replace(".", "/") + ".py"
        )


def test_the_loaders_and_converters_have_one_home():
    from crate_transformer import train
    from crate_transformer.loading import official, pipeline

    assert pipeline.load_model is train.load_model is ct.load_model  # the trainer re-exports the one loader
    assert pipeline.from_official is ct.from_official and pipeline.from_pretrained is ct.from_pretrained
    for name in ("native_to_official", "official_to_native", "mae_native_to_official", "mae_official_to_native"):
        assert getattr(official, name).__module__ == "crate_transformer.loading.official", name
    assert set(official.MAE_KEY_MAP) and set(official.CLASSIFIER_KEY_MAP)
    assert (
        ct.probe.__name__ == "crate_transformer.analysis.probe" and ct.dino.__name__ == "crate_transformer.models.dino"
    )


# module prefixes the docs use for this package's modules ("config.", "io." and "model." are also the names of
# objects and of Python's io, so only their fully qualified forms are checked)
# the old module names stay listed so that a page still naming one (`official.x`) fails the check below
_SHORT = {"official", "checkpoint", "pretrained", "registry", "base", "analysis", "mae", "lm", "alpha", "bert",
          "loading", "runfiles", "_hub", "_registry", "data", "train", "probe", "dino", "theory", "layers",
          "objectives", "spec", "tokenizer", "models"}  # fmt: skip
_NOT_NAMES = {"train.loss"}  # an MLflow metric name
_NAME = re.compile(r"`((?:ct|crate_transformer|[a-z_]+)(?:\.[A-Za-z_]\w*)+)(?:\(|`)")
_FILE_SUFFIXES = (
    ".py",
    ".md",
    ".json",
    ".safetensors",
    ".yaml",
    ".pt",
    ".pth",
    ".csv",
    ".html",
    ".jsonl",
    ".txt",
    ".parquet",
)


def _resolves(dotted: str) -> bool | None:
    """Whether a dotted name of the package exists (None: not a name of this package)."""
    parts = dotted.split(".")
    if parts[0] == "ct":
        parts[0] = "crate_transformer"
    elif parts[0] != "crate_transformer":
        if parts[0] not in _SHORT or dotted in _NOT_NAMES:
            return None
        parts = ["crate_transformer", *parts]
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ModuleNotFoundError:
            continue
    for attr in parts[i:]:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def test_every_package_name_the_docs_give_exists():
    """`official.mae_native_to_official`, `ct.load_model`, ... in the pages and the README resolve (the changelog
    keeps the names of its day)."""
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    missing = [
        f"{page.name}: {m.group(1)}"
        for page in pages
        for m in _NAME.finditer(page.read_text(encoding="utf-8"))
        if not m.group(1).endswith(_FILE_SUFFIXES) and _resolves(m.group(1)) is False
    ]
    assert not missing, missing
    assert _resolves("loading.official.mae_native_to_official") and _resolves("models.lm.CRATELanguageModel")
    assert _resolves("official.mae_native_to_official") is False and _resolves("checkpoint.MAE_KEY_MAP") is False
    assert _resolves("official.no_such_name") is False


# --------------------------------------------------------------------------- the Hugging Face cache, content checked
def _alpha_release(hub_cache: Path, tmp_path: Path) -> tuple[torch.nn.Module, Path, int]:
    """The zoo's crate_alpha_base16 entry with a tiny authors' file in the cache: ``(the authors' module, the blob,
    the offset of the first layer's qkv weight in it)``."""
    torch.manual_seed(0)
    off = OfficialCRATEAlpha(**TINY, dim_head=8).eval()
    torch.save(off.state_dict(), tmp_path / "b16.pth")
    src = pretrained.ZOO["crate_alpha_base16"]
    storage = put_in_hub_cache(hub_cache, src.repo_id, {src.filename: tmp_path / "b16.pth"})
    blob = blob_of(storage, src.filename)
    weight = off.state_dict()["transformer.layers.0.0.fn.qkv.weight"].numpy().tobytes()
    return off, blob, blob.read_bytes().index(weight)


def test_a_corrupt_release_in_the_hub_cache_is_refused_naming_the_file_and_the_fix(hub_cache, tmp_path, capsys):
    """50 bytes flipped inside a weight of the cached crate_alpha_B16.pth blob loaded silently, logits off; the blob's
    name is its SHA-256, so the load now checks it, and ``crate models --pretrained`` no longer calls it cached."""
    off, blob, at = _alpha_release(hub_cache, tmp_path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (ct.create_model("crate_alpha_base16", pretrained=True, **TINY)(x) - off(x)).abs().max() < 1e-5
    assert pretrained.cache_status("crate_alpha_base16")[0] == "cached"
    flip_bytes(blob, at + 8)
    assert torch.load(blob, weights_only=True)  # still a readable checkpoint: only the hash tells
    with pytest.raises(CheckpointError) as e:
        ct.create_model("crate_alpha_base16", pretrained=True, **TINY)
    msg = str(e.value)
    assert "\n" not in msg and str(blob) in msg and "is corrupt" in msg and "torch/crate_alpha_B16.pth" in msg
    assert "delete it and load again" in msg and "download('crate_alpha_base16', force_download=True)" in msg
    assert f"the Hub's is {blob.name[:12]}" in msg
    assert pretrained.cache_status("crate_alpha_base16") == ("corrupt", msg)
    assert pretrained.cached_file("crate_alpha_base16") is None
    main(["models", "--pretrained", "crate_alpha_*"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[2] for line in out.splitlines()[1:3]}
    assert rows == {"crate_alpha_base16": "corrupt", "crate_alpha_large14": "download"} and msg in out
    blob.unlink()  # what the message says: the next load fetches it again (offline here: says it is not cached)
    with pytest.raises(CheckpointError, match="is not in the Hugging Face cache"):
        ct.create_model("crate_alpha_base16", pretrained=True, **TINY)


def test_every_file_read_from_the_hub_cache_is_checked(hub_cache, tmp_path, monkeypatch):
    """A release's companion file (a git blob: named by git's SHA-1) and every file of an ``hf-hub:`` model."""
    port = _randomise(CrateForMaskedLM(CrateConfig(**BERT_TINY)), 0)
    folder = _save_as_port(port, tmp_path / "port", "bin")
    entry = dataclasses.replace(pretrained.ZOO["crate_bert_base"], repo_id="test-org/port")
    monkeypatch.setitem(pretrained.ZOO, "crate_bert_base", entry)
    storage = put_in_hub_cache(hub_cache, "test-org/port", {f.name: f for f in folder.iterdir()})
    assert len(blob_of(storage, "config.json").name) == 40 and len(blob_of(storage, "pytorch_model.bin").name) == 64
    assert in_eval_mode(ct.create_model("crate_bert_base", pretrained=True))
    flip_bytes(blob_of(storage, "config.json"), 2, 1)
    with pytest.raises(CheckpointError, match=r"crate_bert_base: config\.json of test-org/port in the Hugging Face "
                       r"cache is corrupt: .* has git-sha1 \w+…, the Hub's is"):  # fmt: skip
        ct.create_model("crate_bert_base", pretrained=True)
    model = ct.create_model("crate_tiny", **TINY)
    saved = model.save_pretrained(tmp_path / "mine")
    storage = put_in_hub_cache(hub_cache, "me/tiny", {f.name: f for f in saved.iterdir()})
    assert ct.from_pretrained("hf-hub:me/tiny").config == model.config
    for name in ("model.safetensors", "config.json"):
        blob = blob_of(storage, name)
        good = blob.read_bytes()
        flip_bytes(blob, len(good) - 20, 1)  # a weight's last bytes / the end of the JSON
        with pytest.raises(
            CheckpointError, match=f"hf-hub:me/tiny: {name} in the Hugging Face cache is corrupt: {blob}"
        ):
            ct.load_model("hf-hub:me/tiny")
        blob.write_bytes(good)


def test_a_published_checksum_is_checked_also_in_a_cache_without_links(hub_cache, tmp_path, monkeypatch):
    """A cache that holds copies (no symlinks: Windows without developer mode) names nothing by its hash; the zoo's
    published SHA-256, where an entry states one, is then the check."""
    off, blob, at = _alpha_release(hub_cache, tmp_path)
    pointer = next((blob.parent.parent / "snapshots").rglob("crate_alpha_B16.pth"))
    os.unlink(pointer)
    shutil.move(blob, pointer)  # the bytes under the file's own name, as huggingface_hub writes without symlinks
    good = hashlib.sha256(pointer.read_bytes()).hexdigest()
    src = pretrained.ZOO["crate_alpha_base16"]
    monkeypatch.setitem(pretrained.ZOO, src.name, dataclasses.replace(src, sha256=good))
    assert in_eval_mode(ct.create_model("crate_alpha_base16", pretrained=True, **TINY))
    flip_bytes(pointer, at + 8)
    with pytest.raises(CheckpointError, match=f"{pointer} has sha256 \\w+…, the published one is {good[:12]}…"):
        ct.create_model("crate_alpha_base16", pretrained=True, **TINY)


# --------------------------------------------------------------------------- hyperparameters a file does not store
WIDTH, HEADS = 48, 3  # 3 heads of 16: U is one (48 × 48) matrix, which also reads as 12 heads of 4 (crate_small's K)
IMG = dict(image_size=32, patch_size=8)
IMG_SIZES = dict(**IMG, depth=2)  # what the files fix beside the width


def _classifier_file(tmp_path: Path) -> tuple[object, str, dict, torch.nn.Module, torch.Tensor]:
    off = OfficialCRATE(**IMG, num_classes=5, dim=WIDTH, depth=2, heads=HEADS).eval()
    return off.state_dict(), "crate_small", {**IMG_SIZES, "num_classes": 5}, off, torch.randn(2, 3, 32, 32)


def _alpha_file(tmp_path: Path) -> tuple[object, str, dict, torch.nn.Module, torch.Tensor]:
    off = OfficialCRATEAlpha(**IMG, num_classes=5, dim=WIDTH, depth=2, heads=HEADS, dim_head=WIDTH // HEADS).eval()
    return off.state_dict(), "crate_alpha_base16", {**IMG_SIZES, "num_classes": 5}, off, torch.randn(2, 3, 32, 32)


def _mae_file(tmp_path: Path) -> tuple[object, str, dict, None, None]:
    from official.crate_ae import OfficialCRATEMAE

    off = OfficialCRATEMAE(img_size=32, patch_size=8, embed_dim=WIDTH, depth=2, num_heads=HEADS)
    return {"model": off.state_dict()}, "crate_mae_base", dict(IMG_SIZES), None, None


def _crate_lm_file(tmp_path: Path) -> tuple[object, str, dict, None, None]:
    from official import crate_lm_official as crate_lm

    ref = crate_lm.CRATEOvercomplete(crate_lm.CRATEConfig(block_size=16, vocab_size=61, n_layer=2, n_head=HEADS,
                                                          n_embd=WIDTH))  # fmt: skip
    return ref.state_dict(), "crate_gpt_12l_pile", {}, None, None  # a bare state dict: no model_args


def _gpt2_file(tmp_path: Path) -> tuple[object, str, dict, None, None]:
    from official import nanogpt_model as nanogpt
    from test_lm_release import _hf_state_dict

    ref = nanogpt.GPT(nanogpt.GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=HEADS, n_embd=WIDTH))
    return _hf_state_dict(ref), "gpt2_base", {}, None, None  # Hugging Face's layout stores no head count


def _bert_file(tmp_path: Path) -> tuple[object, str, dict, None, None]:
    port = CrateForMaskedLM(CrateConfig(**{**BERT_TINY, "hidden_size": WIDTH, "num_attention_heads": HEADS}))
    torch.save(port.state_dict(), tmp_path / "pytorch_model.bin")  # the weights without the port's config.json
    return tmp_path / "pytorch_model.bin", "crate_bert_base", {"block_size": 18}, None, None


@pytest.mark.parametrize("make", [_classifier_file, _alpha_file, _mae_file, _crate_lm_file, _gpt2_file, _bert_file])
def test_a_head_count_no_file_stores_is_required_for_another_width(make, tmp_path):
    """Every official format: U = [U_1 … U_K] is one (K·p × d) matrix, so following the size hint (dim=48) used to
    load a 3-head file as the name's 12 heads without an error.  The name's head count now applies only at the
    name's own width; at another one ``heads=`` is required, and with it the file loads as its authors' model."""
    source, name, sizes, off, x = make(tmp_path)
    with pytest.raises(CheckpointError) as e:
        ct.from_official(source, name, **sizes, dim=WIDTH)
    msg = str(e.value)
    assert "\n" not in msg and f"does not store heads, and with dim={WIDTH} it is not {name!r}" in msg
    assert f"whose heads={ct.model_config(name).heads} would be a guess; pass heads=" in msg
    model = ct.from_official(source, name, **sizes, dim=WIDTH, heads=HEADS)
    assert model.config.heads == HEADS and in_eval_mode(model)
    if off is not None:  # the authors' module, run here: the right head count gives its logits, the guess does not
        guess = ct.from_official(source, name, **sizes, dim=WIDTH, heads=12)
        with torch.no_grad():
            assert (model(x) - off(x)).abs().max() < 1e-5 < (guess(x) - off(x)).abs().max()


def test_the_size_hint_asks_for_the_head_count_and_the_registered_width_keeps_the_names(tmp_path):
    state, name, sizes, off, x = _classifier_file(tmp_path)
    with pytest.raises(CheckpointError, match=r"pass dim=48, .*heads=K, the head count it was trained with"):
        ct.from_official(state, name, **sizes)
    # a file at the name's own width is read with the name's head count (crate_mnist: 128 wide, 4 heads)
    mnist = OfficialCRATE(image_size=28, patch_size=7, num_classes=10, dim=128, depth=6, heads=4, channels=1).eval()
    loaded = ct.from_official(mnist.state_dict(), "crate_mnist")
    digits = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert loaded.config.heads == 4 and (loaded(digits) - mnist(digits)).abs().max() < 1e-5


# --------------------------------------------------------------------------- values that load_state_dict converts
def _spoil(w: torch.Tensor, how: str) -> torch.Tensor:
    """``w`` as integers, booleans, or with one row NaN / -inf."""
    if how in ("int64", "bool"):
        return (w * 100).long() if how == "int64" else w > 0
    out = w.clone()
    out[3] = torch.nan if how == "nan" else -torch.inf
    return out


@pytest.mark.parametrize("how", ["int64", "bool", "nan", "inf"])
def test_weights_of_the_wrong_kind_or_not_finite_are_refused_naming_the_tensor(how, tmp_path):
    """In every format a loader reads (an authors' file, a training state, a save_pretrained folder with valid
    checksums), an int64 or bool weight (cast to float by load_state_dict) or NaN / inf (kept) is one line naming
    the tensor."""
    torch.manual_seed(0)
    official = OfficialCRATE(**TINY).state_dict()
    key, native = "transformer.layers.1.0.fn.qkv.weight", "layers.1.attn.qkv.weight"
    model = ct.from_official(official, "crate_tiny", **TINY)
    torch.save({"state_dict": {**official, key: _spoil(official[key], how)}}, tmp_path / "off.pth")
    state = {**model.state_dict(), native: _spoil(model.state_dict()[native], how)}
    torch.save({"model_config": model.config.to_dict(), "model": state}, tmp_path / "last.pt")
    saved = model.save_pretrained(tmp_path / "saved")
    config = json.loads((saved / CONFIG_NAME).read_text())
    save_safetensors(state, saved / WEIGHTS_NAME, metadata={FILE_DIGESTS[CONFIG_NAME]: json_sha256(config)})
    what = "tensors of the wrong kind" if how in ("int64", "bool") else "NaN or infinite weights"
    for load in (
        lambda: ct.from_official(tmp_path / "off.pth", "crate_tiny", **TINY),
        lambda: ct.load_model(tmp_path / "last.pt"),
        lambda: ct.from_pretrained(saved),
    ):
        with pytest.raises(CheckpointError, match=f"holds {what}: {re.escape(native)} ") as e:
            load()
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_save_pretrained_of_a_half_precision_model_reloads_in_its_dtype(dtype, tmp_path):
    lm = ct.create_model("crate_bert_mini", depth=1, dim=32, heads=2).to(dtype)  # sinusoidal: a non-persistent table
    mixed = ct.create_model("crate_tiny", **TINY)
    mixed.head.to(dtype)  # weights saved in two dtypes keep each its own
    for model in (lm, mixed):
        back = ct.from_pretrained(model.save_pretrained(tmp_path / model.config.arch))
        assert {k: v.dtype for k, v in back.state_dict().items()} == {k: v.dtype for k, v in model.state_dict().items()}
    assert back.pos_embed.dtype == torch.float32 and back.head[1].weight.dtype == dtype
    lm_back = ct.load_model(tmp_path / "crate_lm")
    assert lm_back.wte.weight.dtype == lm_back.pos_table.dtype == dtype  # as after .to(dtype)


# --------------------------------------------------------------------------- outputs the user wrote
def test_write_hub_folder_keeps_the_users_readme(tmp_path):
    model = ct.create_model("crate_tiny", **TINY)
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "README.md").write_text("# my notes\n")
    with pytest.raises(ValueError, match=r"README\.md exists and is not a model card written by this package") as e:
        pretrained.write_hub_folder(model, folder, "me/tiny")
    assert "\n" not in str(e.value)
    assert (folder / "README.md").read_text() == "# my notes\n" and sorted(os.listdir(folder)) == ["README.md"]
    (folder / "README.md").unlink()
    pretrained.write_hub_folder(model, folder, "me/tiny", metrics={"top1": 0.5})
    pretrained.write_hub_folder(model, folder, "me/tiny", metrics={"top1": 0.6})  # its own card is rewritten
    assert "| top1 | 0.6 |" in (folder / "README.md").read_text()
