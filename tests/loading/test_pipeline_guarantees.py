"""The loader pipeline's guarantees by construction (issue 41): every file read from the Hugging Face cache is checked
against the hash the cache names it by, whichever loader and name reach it; every value a reader takes off an authors'
file is typed and bounded by one rule; sizes given to a loader are bounded before anything is allocated; an authors'
file under the wrong name is called what it is."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import tiny
import torch
from hubcache import blob_of, flip_bytes, put_in_hub_cache
from official import crate_lm_official as crate_lm
from official import tost_lang
from official.crate_alpha_official import CRATE as OfficialCRATEAlpha
from official.crate_bert_hf import CrateConfig, CrateForMaskedLM
from test_bert_release import TINY as BERT_TINY
from test_bert_release import _randomise, _save_as_port
from test_lm_release import TINY as LM_TINY
from test_lm_release import _nanogpt_ckpt, _randomize
from test_tost_release import _lm_container, _main_py_container, _official_vision

import crate_transformer as ct
from crate_transformer.config_utils import field_types
from crate_transformer.io import CheckpointError
from crate_transformer.loading import pipeline, pretrained, values
from crate_transformer.loading.official import unwrap
from crate_transformer.models._registry import model_config, official_formats

TINY = tiny.IMAGE


# --------------------------------------------------------------------------- the Hugging Face cache, every route
def _alpha(folder: Path) -> tuple[dict[str, Path], dict]:
    torch.manual_seed(0)
    torch.save(OfficialCRATEAlpha(**TINY, dim_head=8).state_dict(), folder / "w.pth")
    return {"": folder / "w.pth"}, dict(TINY)


def _crate_gpt(folder: Path) -> tuple[dict[str, Path], dict]:
    ref = _randomize(crate_lm.CRATEOvercomplete(crate_lm.CRATEConfig(**LM_TINY)))
    return {"": _nanogpt_ckpt(ref, LM_TINY, folder / "ckpt.pt")}, {}


def _crate_bert(folder: Path) -> tuple[dict[str, Path], dict]:
    port = _save_as_port(_randomise(CrateForMaskedLM(CrateConfig(**BERT_TINY)), 0), folder / "port", "bin")
    return {"": port / "pytorch_model.bin", "config.json": port / "config.json"}, {}


# one tiny file in the authors' layout per format of a release on the Hub ("" stands for the release's own file name)
RELEASE_FILES = {"CRATE-α": _alpha, "CRATE-GPT (crate-lm)": _crate_gpt, "CRATE-BERT": _crate_bert}
HUB_RELEASES = [name for name, src in pretrained.ZOO.items() if src.on_hub]


def _inside_a_tensor(path: Path) -> int:
    """The offset of the largest tensor's bytes in a ``torch.save`` file (a flip there leaves the file readable)."""
    state = unwrap(torch.load(path, weights_only=True))
    big = max(state.values(), key=lambda t: t.numel())
    return path.read_bytes().index(big.contiguous().numpy().tobytes()[:64])


def test_every_format_released_on_the_hub_has_a_file_here():
    assert {pretrained.ZOO[n].loader for n in HUB_RELEASES} <= set(RELEASE_FILES)


@pytest.mark.parametrize("name", HUB_RELEASES)
def test_a_damaged_release_in_the_cache_is_refused_by_every_loader_that_reaches_it(name, hub_cache, tmp_path):
    """50 bytes flipped inside a weight tensor of a cached release: ``create_model(pretrained=True)`` refused it, but
    the same blob through its snapshot path (``load_model``, ``from_official``, ``pretrained_file=``, the snapshot
    folder) loaded silently.  Every file a loader reads now passes the one check of the cache's hash."""
    src = pretrained.ZOO[name]
    made, overrides = RELEASE_FILES[src.loader](tmp_path)
    storage = put_in_hub_cache(hub_cache, src.repo_id, {(f or src.filename): p for f, p in made.items()})
    pointer = next((storage / "snapshots").rglob(Path(src.filename).name))
    routes = {
        "load_model": lambda: ct.load_model(pointer, name, **overrides),
        "from_official": lambda: ct.from_official(pointer, name, **overrides),
        "pretrained_file": lambda: ct.create_model(name, pretrained_file=pointer, **overrides),
        "pretrained=True": lambda: ct.create_model(name, pretrained=True, **overrides),
    }
    if pointer.name in ("pytorch_model.bin", "model.safetensors"):  # a downloaded Hub folder of an authors' port
        routes["snapshot folder"] = lambda: ct.from_official(pointer.parent, name, **overrides)
    for route in routes.values():
        route()  # intact: every route loads it
    blob = blob_of(storage, src.filename)
    flip_bytes(blob, _inside_a_tensor(blob) + 8)
    assert torch.load(blob, weights_only=True)  # still a readable checkpoint: only the hash tells
    for what, route in routes.items():
        with pytest.raises(CheckpointError) as e:
            route()
        msg = str(e.value)
        assert "\n" not in msg and "in the Hugging Face cache is corrupt" in msg and str(blob) in msg, (what, msg)


def test_a_damaged_save_pretrained_folder_in_the_cache_is_refused_by_every_loader(hub_cache, tmp_path):
    """This package's own format in the cache, reached by its snapshot folder: the cache's hash is checked before the
    file's own checksums (a config.json saved before its checksum was stored has none)."""
    saved = ct.create_model("crate_tiny", **TINY).save_pretrained(tmp_path / "mine")
    storage = put_in_hub_cache(hub_cache, "me/tiny", {f.name: f for f in saved.iterdir()})
    folder = next((storage / "snapshots").iterdir())
    blob = blob_of(storage, "config.json")
    flip_bytes(blob, len(blob.read_bytes()) - 3, 1)
    for route in (ct.from_pretrained, ct.load_model, ct.CRATE.from_pretrained):
        with pytest.raises(CheckpointError, match=f"in the Hugging Face cache is corrupt: {blob}"):
            route(folder)


# --------------------------------------------------------------------------- values read from files
FORMATS_WITH_VALUES = [a.official for a in official_formats() if a.official.fields or a.official.config_file]


def _int_fields(name: str) -> list[str]:
    """The integer fields of ``name``'s config (``int`` or ``int | None``)."""
    types = field_types(type(model_config(name)))
    return [f for f, t in types.items() if t is int or (int in typing.get_args(t) and bool not in typing.get_args(t))]


@pytest.mark.parametrize("fmt", FORMATS_WITH_VALUES, ids=lambda f: f.name)
def test_every_value_a_format_reads_off_a_file_is_typed_and_bounded(fmt):
    """Whatever a format's readers return (tensors' sizes, nanoGPT's model_args, ToST's args, a config.json beside
    the weights) passes one rule in the one place the pipeline reads them: an integer field gets an int within
    0..limit — not a string, a float such as 32.0, a bool, a negative number or 10**9."""
    name = fmt.example
    fields = _int_fields(name)
    assert {"depth", "dim"} <= set(fields)
    for field in fields:
        for bad in ("abc", 32.0, True, -1, 10**9):
            fake = dataclasses.replace(fmt, fields=lambda raw, f=field, b=bad: {f: b}, config_file=None)
            with pytest.raises(CheckpointError) as e:
                pipeline._file_values(fake, {}, None, name, {}, "F.pth")
            msg = str(e.value)
            assert msg.startswith(f"F.pth holds {fmt.file_names.get(field, field)}=") and "\n" not in msg, msg
    good = {f: getattr(model_config(name), f) for f in fields if isinstance(getattr(model_config(name), f), int)}
    fine = dataclasses.replace(fmt, fields=lambda raw: good, config_file=None)
    assert pipeline._file_values(fine, {}, None, name, {}, "F.pth") == good


@pytest.mark.parametrize("size", [10**9, "abc", 32.0, -32])
def test_a_tost_file_whose_args_input_size_is_no_image_size_is_refused(size, tmp_path):
    """``args.input_size=10**9`` was accepted (``crate eval`` then overflowed); ``'abc'`` or ``32.0`` became 224."""
    path = _main_py_container(_official_vision(), tmp_path / "checkpoint.pth", size)
    with pytest.raises(CheckpointError) as e:
        ct.from_official(path, "tost_cab_tiny_12_p16")
    msg = str(e.value)
    assert "\n" not in msg and f"{path} holds args.input_size=" in msg and "pass image_size=" in msg
    assert ct.from_official(path, "tost_cab_tiny_12_p16", image_size=32).config.image_size == 32  # the fix it names
    good = _main_py_container(_official_vision(), tmp_path / "good.pth", 32)
    assert ct.from_official(good, "tost_cab_tiny_12_p16").config.image_size == 32


def test_a_crate_bert_config_json_of_other_types_is_refused(tmp_path):
    port = _save_as_port(_randomise(CrateForMaskedLM(CrateConfig(**BERT_TINY)), 0), tmp_path / "port", "bin")
    good = (port / "config.json").read_text()
    for key, bad in (("max_position_embeddings", 20.5), ("num_attention_heads", "4"), ("hidden_size", 10**9)):
        (port / "config.json").write_text(
            good.replace(f'"{key}": {BERT_TINY[key]}', f'"{key}": {bad!r}'.replace("'", '"'))
        )
        with pytest.raises(CheckpointError, match=r"holds \w+="):
            ct.from_official(port, "crate_bert_base")


# --------------------------------------------------------------------------- an authors' file named as what it is
def test_a_tost_language_model_under_another_name_is_called_a_tost_language_model(tmp_path):
    cfg = tost_lang.GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=4, n_embd=32, bias=False, TSSA=True)
    path = _lm_container(tost_lang.GPT(cfg), tmp_path / "ckpt.pt", cfg)
    for wrong in ("crate_gpt_12l_pile", "gpt2_base"):
        with pytest.raises(CheckpointError) as e:
            ct.from_official(path, wrong)
        msg = str(e.value)
        assert (
            "it is a ToST language model checkpoint" in msg
            and "tost_gpt_base" in msg
            and "GPT-2 checkpoint:" not in msg
        )
    with pytest.raises(pipeline.ArchitectureNeeded, match="e.g. tost_gpt_base$"):
        ct.load_model(path)


# --------------------------------------------------------------------------- sizes given to a loader
@pytest.mark.parametrize("family", sorted(set(tiny.family_builders()) - {"dino"}))
def test_an_override_too_large_to_build_is_one_line_before_any_allocation(family, tmp_path, monkeypatch):
    """``from_pretrained(run, image_size=10**6)`` asked the allocator for 8 TB; every integer override of every
    family is now refused in one line before anything is allocated."""
    folder = tiny.family_builders()[family]().save_pretrained(tmp_path / family)
    config = ct.from_pretrained(folder).config
    for field in _int_fields_of(config):
        with pytest.raises((CheckpointError, ValueError)) as e:
            ct.from_pretrained(folder, **{field: 10**9})
        assert "\n" not in str(e.value) and field in str(e.value), (field, str(e.value))
    if hasattr(config, "image_size"):
        with pytest.raises(CheckpointError, match=r"image_size=1,000,000 is more than 8,192"):
            ct.from_pretrained(folder, image_size=10**6)
    if hasattr(config, "num_classes"):  # within the limit, but more than this machine holds
        monkeypatch.setattr(values, "_memory", lambda: 2**20)
        with pytest.raises(CheckpointError, match=r"num_classes=100,000 would make a model of .* GiB of memory"):
            ct.from_pretrained(folder, num_classes=100_000)


def _int_fields_of(config: object) -> list[str]:
    types = field_types(type(config))
    return [f for f, t in types.items() if t is int and f != "seed"]
