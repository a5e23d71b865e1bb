"""The model zoo and the Hugging Face Hub, offline.

The Hub is exercised through the real ``huggingface_hub.hf_hub_download`` / ``snapshot_download`` /
``try_to_load_from_cache`` with ``HF_HUB_OFFLINE=1`` against a cache built here in the layout
``huggingface_hub`` writes (``models--ORG--NAME/{blobs,snapshots/<commit>,refs/<branch>}``, snapshot files
being relative symlinks to content-addressed blobs); ``huggingface_hub.scan_cache_dir`` checks that layout.
Nothing is mocked; the one call that needs the network (``upload_folder``) is not run.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest
import tiny
import torch
from hubcache import COMMIT_1, COMMIT_2, put_in_hub_cache
from huggingface_hub import ModelCard
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects
from official import crate_lm_official as crate_lm
from official.crate import OfficialCRATE
from official.crate_alpha_official import CRATE as OfficialCRATEAlpha
from test_lm_release import TINY as LM_TINY
from test_lm_release import _nanogpt_ckpt, _randomize, _tokens

import crate_transformer as ct
from crate_transformer.io import CheckpointError
from crate_transformer.loading import pretrained
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.registry import arch_info

TINY = tiny.IMAGE


def official_tiny_file(path: Path) -> tuple[OfficialCRATE, Path]:
    """A tiny official ``model/crate.py`` classifier saved as the official main.py does."""
    off = OfficialCRATE(image_size=32, patch_size=8, num_classes=5, dim=32, depth=2, heads=4).eval()
    torch.save({"epoch": 1, "state_dict": {"module." + k: v for k, v in off.state_dict().items()}}, path)
    return off, path


def test_cache_layout_is_the_one_huggingface_hub_reads(hub_cache, tmp_path):
    _, f = official_tiny_file(tmp_path / "w.pth")
    put_in_hub_cache(hub_cache, "test-org/crate-tiny", {"weights/w.pth": f})
    info = huggingface_hub.scan_cache_dir(hub_cache)
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == "test-org/crate-tiny" and repo.repo_type == "model"
    (rev,) = repo.revisions
    assert rev.commit_hash == COMMIT_1 and rev.refs == frozenset({"main"})
    assert [x.file_name for x in rev.files] == ["w.pth"] and rev.size_on_disk == f.stat().st_size


def test_create_model_pretrained_downloads_through_the_offline_hub_cache(hub_cache, tmp_path, monkeypatch):
    """A zoo entry on the Hub, loaded by create_model(pretrained=True) with the real hf_hub_download offline;
    the logits are the official model's.  The entry is crate_small's, pointed at a test repository."""
    off, f = official_tiny_file(tmp_path / "crate_s.pth")
    storage = put_in_hub_cache(hub_cache, "test-org/crate-small", {"torch/crate_s.pth": f})
    entry = dataclasses.replace(
        pretrained.ZOO["crate_small"], repo_id="test-org/crate-small", filename="torch/crate_s.pth"
    )
    monkeypatch.setitem(pretrained.ZOO, "crate_small", entry)

    path = pretrained.download("crate_small")
    assert path == storage / "snapshots" / COMMIT_1 / "torch" / "crate_s.pth"
    assert path.resolve().parent == storage / "blobs" and path.read_bytes() == f.read_bytes()
    assert pretrained.cached_file("crate_small") == path

    model = ct.create_model("crate_small", pretrained=True, **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), off(x), rtol=1e-5, atol=1e-5)
    cfg = model.pretrained_cfg
    assert (
        cfg["repo_id"] == "test-org/crate-small"
        and cfg["file"] == str(path)
        and cfg["mean"] == pretrained.IMAGENET_MEAN
    )


def test_crate_alpha_release_entry_loads_from_the_hub_cache(hub_cache, tmp_path):
    """The zoo's crate_alpha_base16 entry as it stands (UCSC-VLAA/CRATE-alpha, torch/crate_alpha_B16.pth) with a
    tiny file in the authors' format in the cache: the logits are those of the authors' module."""
    torch.manual_seed(0)
    off = OfficialCRATEAlpha(**TINY, dim_head=8).eval()
    torch.save(off.state_dict(), tmp_path / "b16.pth")  # the release is a bare state dict
    src = pretrained.ZOO["crate_alpha_base16"]
    put_in_hub_cache(hub_cache, src.repo_id, {src.filename: tmp_path / "b16.pth"})
    model = ct.create_model("crate_alpha_base16", pretrained=True, **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model(x) - off(x)).abs().max() <= 1e-5 and off(x).std() > 0.1
    assert model.pretrained_cfg["loader"] == "CRATE-α" and model.pretrained_cfg["repo_id"] == "UCSC-VLAA/CRATE-alpha"


def test_crate_gpt_release_entry_loads_from_the_hub_cache(hub_cache, tmp_path):
    """The zoo's crate_gpt_12l_pile entry as it stands (JackBAI/CRATE-GPT-12L-Pile-600000steps) with a tiny
    crate-lm training checkpoint (model, AdamW state, model_args) in the cache: the logits are those of
    crate-lm's crate_overcomplete.py, the released model's code."""
    ref = _randomize(crate_lm.CRATEOvercomplete(crate_lm.CRATEConfig(**LM_TINY)))
    src = pretrained.ZOO["crate_gpt_12l_pile"]
    put_in_hub_cache(hub_cache, src.repo_id, {src.filename: _nanogpt_ckpt(ref, LM_TINY, tmp_path / "ckpt.pt")})
    model = ct.create_model("crate_gpt_12l_pile", pretrained=True).eval()
    idx = _tokens(LM_TINY["vocab_size"])
    with torch.no_grad():
        assert (model(idx) - ref(idx, idx)[0]).abs().max() <= 1e-5
    assert model.pretrained_cfg["loader"] == "CRATE-GPT (crate-lm)"


def test_pinned_revision_is_read_from_its_snapshot(hub_cache, tmp_path, monkeypatch):
    """An entry with ``revision`` set reads that commit's file, not the one refs/main points to."""
    _, old = official_tiny_file(tmp_path / "old.pth")
    new_model, new = official_tiny_file(tmp_path / "new.pth")
    put_in_hub_cache(hub_cache, "test-org/crate-small", {"w.pth": old}, commit=COMMIT_1, ref="v1")
    put_in_hub_cache(hub_cache, "test-org/crate-small", {"w.pth": new}, commit=COMMIT_2, ref="main")
    entry = dataclasses.replace(
        pretrained.ZOO["crate_small"], repo_id="test-org/crate-small", filename="w.pth", revision=COMMIT_1
    )
    monkeypatch.setitem(pretrained.ZOO, "crate_small", entry)
    assert pretrained.download("crate_small").read_bytes() == old.read_bytes() != new.read_bytes()


def test_companion_files_are_fetched_beside_the_weights(hub_cache, tmp_path, monkeypatch):
    """An entry's ``also`` files (the CRATE-BERT port's config.json) land in the same snapshot folder as the
    weights, where the loader looks for them; the entry counts as cached only when all of them are."""
    _, f = official_tiny_file(tmp_path / "w.bin")
    (tmp_path / "config.json").write_text('{"hidden_size": 32}')
    entry = dataclasses.replace(
        pretrained.ZOO["crate_small"], repo_id="test-org/port", filename="w.bin", also=("config.json",)
    )
    monkeypatch.setitem(pretrained.ZOO, "crate_small", entry)
    put_in_hub_cache(hub_cache, "test-org/port", {"w.bin": f})
    assert pretrained.cached_file("crate_small") is None
    with pytest.raises(CheckpointError, match=r"w\.bin \+ config\.json of test-org/port is not in the Hugging Face"):
        pretrained.download("crate_small")
    put_in_hub_cache(hub_cache, "test-org/port", {"config.json": tmp_path / "config.json"})
    path = pretrained.download("crate_small")
    assert json.loads((path.parent / "config.json").read_text()) == {"hidden_size": 32}
    assert pretrained.cached_file("crate_small") == path


def test_missing_file_offline_is_one_line_with_the_url_and_the_fix(hub_cache):
    with pytest.raises(CheckpointError) as e:
        ct.create_model("crate_alpha_base16", pretrained=True)
    msg = str(e.value)
    assert "\n" not in msg
    assert "https://huggingface.co/UCSC-VLAA/CRATE-alpha/resolve/main/torch/crate_alpha_B16.pth" in msg
    assert "HF_HUB_OFFLINE=1" in msg and "pretrained_file='PATH'" in msg
    assert pretrained.cached_file("crate_alpha_base16") is None


@pytest.fixture
def unreachable_hub(hub_cache, monkeypatch):
    """The cache of ``hub_cache`` with HF_HUB_OFFLINE unset and the Hub's endpoint a closed local port: a machine
    whose network is down, where huggingface_hub would retry each request five times."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # discard: nothing listens
    return hub_cache


def test_an_unreachable_hub_fails_at_once_without_retries(unreachable_hub, tmp_path, caplog, capfd):
    import time

    t0 = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        ct.create_model("crate_alpha_base16", pretrained=True)
    with pytest.raises(CheckpointError) as snapshot:
        ct.from_pretrained("hf-hub:me/not-downloaded")
    model = ct.create_model("crate_tiny", **TINY)
    with pytest.raises(CheckpointError) as push:
        model.push_to_hub("me/crate-tiny")
    seconds = time.perf_counter() - t0
    assert seconds < 8, seconds  # huggingface_hub's retries alone take ~25 s per request
    said = caplog.text + "".join(capfd.readouterr())
    assert "Retry" not in said and "thrown while requesting" not in said
    assert str(e.value) == (
        "crate_alpha_base16: torch/crate_alpha_B16.pth of UCSC-VLAA/CRATE-alpha is not in the Hugging Face cache and "
        "the Hub cannot be reached (no network); download "
        "https://huggingface.co/UCSC-VLAA/CRATE-alpha/resolve/main/torch/crate_alpha_B16.pth and pass "
        "create_model('crate_alpha_base16', pretrained=True, pretrained_file='PATH')"
    )
    assert str(snapshot.value).startswith("hf-hub:me/not-downloaded is not in the Hugging Face cache and the Hub")
    assert str(push.value) == (
        "cannot push me/crate-tiny: the Hub cannot be reached (no network); write the files with "
        "crate_transformer.loading.pretrained.write_hub_folder(model, folder, repo_id) to upload later"
    )
    # the cache still answers: a downloaded file loads with the network down
    _, f = official_tiny_file(tmp_path / "b16.pth")
    put_in_hub_cache(unreachable_hub, "UCSC-VLAA/CRATE-alpha", {"torch/crate_alpha_B16.pth": f})
    assert pretrained.download("crate_alpha_base16").read_bytes() == f.read_bytes()


@pytest.mark.parametrize("name", ["crate_small", "crate_mae_base"])
def test_google_drive_entry_is_one_line_with_the_url_and_the_fix(hub_cache, name):
    with pytest.raises(CheckpointError) as e:
        ct.create_model(name, pretrained=True)
    msg = str(e.value)
    assert "\n" not in msg and "Google Drive" in msg
    assert pretrained.ZOO[name].url in msg and f"create_model({name!r}, pretrained=True, pretrained_file=" in msg


def test_pretrained_file_loads_a_downloaded_file(tmp_path):
    off, f = official_tiny_file(tmp_path / "downloaded from drive.pth")
    model = ct.create_model("crate_small", pretrained_file=f, **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), off(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(CheckpointError, match=r"^pretrained_file not found: .*missing\.pth; pass the downloaded file"):
        ct.create_model("crate_small", pretrained=True, pretrained_file=tmp_path / "missing.pth")


def test_unknown_zoo_name_lists_the_zoo():
    with pytest.raises(ValueError) as e:
        ct.create_model("crate_tiny", pretrained=True)
    msg = str(e.value)
    assert "\n" not in msg and "no released weights for 'crate_tiny'" in msg
    assert all(n in msg for n in pretrained.ZOO) and "pretrained_file=" in msg


# --------------------------------------------------------------------------- this package's format on the Hub
def test_hf_hub_native_round_trip_with_revisions(hub_cache, tmp_path):
    """save_pretrained → a Hub snapshot → from_pretrained("hf-hub:...") (and load_model, the CLI's resolver)
    gives the same outputs; revision= picks another commit."""
    m1 = ct.create_model("crate_tiny", **TINY, eta=0.3).eval()
    m2 = ct.create_model("crate_tiny", **TINY, eta=0.3).eval()
    d1, d2 = m1.save_pretrained(tmp_path / "v1"), m2.save_pretrained(tmp_path / "v2")
    put_in_hub_cache(hub_cache, "me/crate-tiny", {n: d1 / n for n in ("config.json", "model.safetensors")}, COMMIT_1)
    put_in_hub_cache(
        hub_cache, "me/crate-tiny", {n: d2 / n for n in ("config.json", "model.safetensors")}, COMMIT_2, "v2"
    )

    x = torch.randn(2, 3, 32, 32)
    r1 = ct.from_pretrained("hf-hub:me/crate-tiny").eval()
    assert r1.config == m1.config
    torch.testing.assert_close(r1(x), m1(x), rtol=0, atol=0)
    assert r1.pretrained_cfg["source"] == "hf-hub:me/crate-tiny" and "source" not in m1.pretrained_cfg
    for revision in ("v2", COMMIT_2):
        torch.testing.assert_close(ct.from_pretrained("hf-hub:me/crate-tiny", revision=revision).eval()(x), m2(x))
    assert not torch.allclose(m1(x), m2(x))
    torch.testing.assert_close(load_model("hf-hub:me/crate-tiny").eval()(x), m1(x), rtol=0, atol=0)


def test_hf_hub_language_model_keeps_its_tokenizer(hub_cache, tmp_path):
    lm = ct.create_model("crate_gpt_mini", depth=1, dim=32, heads=2).eval()
    lm.tokenizer = ct.Tokenizer.byte_level()
    d = lm.save_pretrained(tmp_path / "lm")
    put_in_hub_cache(hub_cache, "me/gpt", {p.name: p for p in d.iterdir()})
    r = ct.from_pretrained("hf-hub:me/gpt")
    assert r.tokenizer is not None and r.tokenizer.encode("white box") == lm.tokenizer.encode("white box")
    ids = torch.randint(0, 262, (1, 8))
    torch.testing.assert_close(r(ids), lm(ids), rtol=0, atol=0)


def test_hf_hub_errors_are_one_line(hub_cache, tmp_path):
    with pytest.raises(CheckpointError) as e:
        ct.from_pretrained("hf-hub:me/not-downloaded")
    assert "\n" not in str(e.value) and "https://huggingface.co/me/not-downloaded" in str(e.value)
    assert "HF_HUB_OFFLINE=1" in str(e.value)
    _, f = official_tiny_file(tmp_path / "w.pth")
    put_in_hub_cache(hub_cache, "authors/release", {"w.pth": f})
    with pytest.raises(CheckpointError, match=r"hf-hub:authors/release has no config\.json: .*pretrained=True"):
        ct.from_pretrained("hf-hub:authors/release")
    for bad in ("hf-hub:no-slash", "hf-hub:a/b/c", "hf-hub:/x"):
        with pytest.raises(ValueError, match="write hf-hub:ORG/NAME"):
            ct.from_pretrained(bad)
    with pytest.raises(ValueError, match="revision='v2' applies to hf-hub:ORG/NAME models only"):
        ct.from_pretrained(tmp_path, revision="v2")


# --------------------------------------------------------------------------- push_to_hub, up to the upload
def test_hub_folder_and_model_card(tmp_path):
    model = ct.create_model("crate_tiny", **TINY).eval()
    folder = pretrained.write_hub_folder(
        model,
        tmp_path / "up",
        "me/crate-tiny-c10",
        metrics={"top1": 0.875, "loss": 0.41},
        dataset="cifar10",
        license="mit",
    )
    files = sorted(p.name for p in folder.iterdir())
    # what upload_folder sends: every file of the folder minus huggingface_hub's default ignore patterns
    sent = sorted(filter_repo_objects(files, ignore_patterns=DEFAULT_IGNORE_PATTERNS))
    assert sent == files == ["README.md", "config.json", "model.safetensors"]
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ct.from_pretrained(folder).eval()(x), model(x), rtol=0, atol=0)

    card = ModelCard.load(folder / "README.md")  # huggingface_hub's own parser of the YAML header
    data = card.data.to_dict()
    assert data["library_name"] == "crate-transformer" and data["license"] == "mit"
    assert data["pipeline_tag"] == "image-classification" and data["datasets"] == ["cifar10"]
    assert "crate" in data["tags"]
    results = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert results == {"top1": 0.875, "loss": 0.41}
    assert {r.dataset_name for r in card.data.eval_results} == {"cifar10"}
    text = card.text
    assert 'ct.from_pretrained("hf-hub:me/crate-tiny-c10")' in text
    assert "| top1 | 0.875 |" in text and "@article{yu2024white" in text and "number  = {300}" in text
    stored = json.loads(re.search(r"```json\n(.*?)\n```", text, re.S).group(1))
    assert stored == json.loads(json.dumps(model.config.to_dict(), default=str))
    n = sum(p.numel() for p in model.parameters())
    assert f"{n:,} parameters" in text
    # the card credits the authors' code as theirs, not as this package's home
    assert "saved by the `crate_transformer` package" in text and "[crate_transformer](" not in text
    assert "the authors' code, https://github.com/Ma-Lab-Berkeley/CRATE, is the reference" in text


def test_model_card_without_metrics_and_for_other_model_kinds():
    lm_card = ModelCard(pretrained.model_card(ct.create_model("crate_bert_mini", depth=1), "me/bert"))
    assert lm_card.data.pipeline_tag == "fill-mask" and not lm_card.data.eval_results
    assert "## Metrics" not in lm_card.text and lm_card.data.license is None
    gpt = ModelCard(pretrained.model_card(ct.create_model("crate_gpt_mini", depth=1), "me/gpt", {"loss": 2.1}))
    assert gpt.data.pipeline_tag == "text-generation" and "| loss | 2.1 |" in gpt.text
    assert not gpt.data.eval_results  # a model-index result needs a dataset
    mae = ModelCard(pretrained.model_card(ct.create_model("crate_mae_mnist", depth=1), "me/mae"))
    assert mae.data.pipeline_tag == "image-feature-extraction"


def test_push_to_hub_offline_is_one_line(hub_cache):
    model = ct.create_model("crate_tiny", **TINY)
    with pytest.raises(ValueError) as e:
        model.push_to_hub("me/crate-tiny")
    assert "\n" not in str(e.value) and "HF_HUB_OFFLINE=1" in str(e.value) and "write_hub_folder" in str(e.value)
    with pytest.raises(ValueError, match="write hf-hub:ORG/NAME"):
        model.push_to_hub("no-org")


# --------------------------------------------------------------------------- the table
# Zoo entries whose reader is not in this checkout yet, with the format their name resolves to today.  When one
# lands, the test below fails until its entry is removed here.
NOT_YET_WIRED: dict[str, str] = {}
EMERGENCE = ("crate_base_demo", "crate_small_21k", "crate_base_21k")
EMERGENCE_COLAB = "https://colab.research.google.com/drive/1rYn_NlepyW7Fu5LDliyBDmFZylHco7ss?usp=sharing"


def test_emergence_checkpoints_are_the_demo_codes_models_with_their_sizes():
    """The emergence zoo entries build the models of the demo code's factories (crate.py: CRATE_base_demo with
    mlp_head 768 -> 768, CRATE_small_21k, CRATE_base_21k; 8x8 patches) and state the sizes their tensors imply."""
    shapes = {"crate_base_demo": (768, 6, 768), "crate_small_21k": (384, 6, 21842), "crate_base_21k": (768, 12, 21842)}
    for name, (dim, heads, classes) in shapes.items():
        c = ct.model_config(name)
        assert (c.patch_size, c.dim, c.depth, c.heads, c.num_classes, c.image_size) == (8, dim, 12, heads, classes, 224)
        with torch.device("meta"):
            n = sum(p.numel() for p in ct.create_model(name).parameters())
        extra = 768 * 21842 + 21842 if name == "crate_base_demo" else 0  # the demo file's unused head
        assert f"{(n + extra) / 1e6:.1f}M float32 values" in pretrained.ZOO[name].size, (name, n)
        assert f"{(n + extra) * 4 / 1e6:.0f} MB" in pretrained.ZOO[name].size, name
    assert pretrained.ZOO["crate_base_demo"].filename == "crate-demo.pth"
    assert "issues/30" in pretrained.ZOO["crate_small"].status and "dead" in pretrained.ZOO["crate_small"].status


def test_the_demo_file_loads_without_its_unused_21k_head(tmp_path):
    """crate-demo.pth's layout: {'model': ...} of the official classes with mlp_head LN + Linear(d, d) and a
    ``head`` Linear(d, 21842) its forward never calls; the loaded model computes the demo's forward."""
    torch.manual_seed(0)
    off = OfficialCRATE(image_size=32, patch_size=8, num_classes=32, dim=32, depth=2, heads=4).eval()
    state = {**off.state_dict(), "head.weight": torch.randn(7, 32), "head.bias": torch.randn(7)}
    torch.save({"model": state, "epoch": 90}, tmp_path / "crate-demo.pth")
    model = ct.from_official(
        tmp_path / "crate-demo.pth", "crate_base_demo", image_size=32, dim=32, depth=2, heads=4, num_classes=32
    )
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model.eval()(x), off(x), rtol=1e-5, atol=1e-5)
    assert model.config.num_classes == 32 and model.config.patch_size == 8


def _registered_format(name: str) -> str | None:
    """The name of the checkpoint format registered for ``name``'s architecture (None: not registered / none)."""
    if name not in ct.list_models():
        return None
    fmt = arch_info(ct.model_config(name).arch).official
    return None if fmt is None else fmt.name


def test_every_zoo_entry_is_consistent():
    formats = {name: _registered_format(name) for name in pretrained.ZOO}
    assert {n: formats[n] for n in NOT_YET_WIRED} == NOT_YET_WIRED
    for name, s in pretrained.ZOO.items():
        assert s.name == name
        if name not in NOT_YET_WIRED:  # the table names the format that from_official will use for this name
            assert s.loader == formats[name] and s.loader in pretrained.loader_formats(), (name, s.loader)
        assert s.licence and s.input and s.classes and s.reference and s.title
        assert (s.mean is None) == (s.std is None)
        if s.on_hub:
            assert s.filename and not s.url and re.fullmatch(r"[\w.-]+/[\w.-]+", s.repo_id)
            assert s.page == f"https://huggingface.co/{s.repo_id}/resolve/main/{s.filename}"  # the file, not a viewer
        elif name in EMERGENCE:  # fetched by the official README's emergence Colab, not a Drive file page
            assert s.url == EMERGENCE_COLAB and s.page == s.url and s.sources and s.size and s.status
        elif s.direct:  # DINO's and DINOv2's links (their hub code): the file itself, named as the link names it
            assert re.match(r"https://dl\.fbaipublicfiles\.com/dino(v2)?/", s.url) and s.url.endswith("/" + s.filename)
            assert s.page == s.url and s.source == "dl.fbaipublicfiles.com" and s.size and s.status
        else:
            assert s.url.startswith("https://drive.google.com/file/d/") and s.page == s.url
    assert pretrained.ZOO["crate_small"].url.split("/")[5] == "1hYgDJl4EKHYfKprwhEjmWmWHuxnK6_h8"
    assert pretrained.ZOO["crate_mae_base"].url.split("/")[5] == "11i5BMwymqOsunq44WD3omN5mS6ZREQPO"
    assert ct.list_pretrained("crate_alpha_*") == ["crate_alpha_base16", "crate_alpha_large14"]


def test_cli_lists_the_zoo_with_its_cache_status(hub_cache, tmp_path):
    """``crate models --pretrained`` in a fresh process, told where the cache is only by HF_HUB_CACHE."""
    _, f = official_tiny_file(tmp_path / "b16.pth")
    put_in_hub_cache(hub_cache, "UCSC-VLAA/CRATE-alpha", {"torch/crate_alpha_B16.pth": f})
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1", "TORCH_HOME": str(tmp_path / "torch")}
    out = subprocess.run(
        [sys.executable, "-m", "crate_transformer.cli", "models", "--pretrained"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    header, *lines = out.splitlines()
    at = header.index("status")  # columns are padded to a common width
    rows = {line.split()[0]: line[at:].split()[0] for line in lines if line.split()[0] in pretrained.ZOO}
    assert rows == {
        "crate_alpha_base16": "cached",
        "crate_alpha_large14": "download",
        "crate_bert_base": "download",
        "crate_gpt_12l_pile": "download",
        "crate_mae_base": "manual",
        "crate_small": "manual",
        "crate_base_demo": "manual",  # the emergence checkpoints: fetched by hand (the Colab, CRATE #30)
        "crate_small_21k": "manual",
        "crate_base_21k": "manual",
        "dino_vits16": "download",  # DINO's direct links (torch's hub cache, here empty)
        "dino_vits8": "download",
        "dino_vitb16": "download",
        "dino_vitb8": "download",
        "simdino_vitb16": "manual",  # SimDINO's Drive view links
        "simdino_vitl16": "manual",
        "simdino_dino_vitb16": "manual",
        "simdinov2_vitb16": "manual",  # SimDINOv2's and its DINOv2 baselines: Drive view links too
        "simdinov2_vitl16": "manual",
        "simdino_dinov2_vitb16": "manual",
        "simdino_dinov2_vitl16": "manual",
        "dinov2_vits14": "download",  # DINOv2's direct links (torch's hub cache)
        "dinov2_vitb14": "download",
        "dinov2_vitl14": "download",
        "dinov2_vits14_reg": "download",
        "dinov2_vitb14_reg": "download",
        "dinov2_vitl14_reg": "download",
    }
    assert "torch/crate_alpha_B16.pth" in out and "ImageNet mean/std" in out
    assert f"download {pretrained.ZOO['crate_small'].url} and load it with create_model('crate_small'" in out


def test_importing_the_package_does_not_import_huggingface_hub():
    code = "import sys, crate_transformer; print('huggingface_hub' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
