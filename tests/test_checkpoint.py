"""save_pretrained / from_pretrained / from_official / load_model and their failure modes."""

import json
import os
import pickle

import pytest
import torch

import crate_transformer as ct
from crate_transformer.checkpoint import (
    CheckpointError,
    atomic_write,
    load_model,
    load_pickle,
    native_to_official,
    official_to_native,
)
from crate_transformer.reference import OfficialCRATE

TINY = dict(image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)


def official_tiny(pool="cls"):
    return OfficialCRATE(image_size=32, patch_size=8, num_classes=5, dim=32, depth=2, heads=4, pool=pool).eval()


def test_save_load_roundtrip_keeps_every_hyperparameter(tmp_path):
    m = ct.create_model("crate_tiny", **TINY, eta=0.3, lambd=0.07, pool="mean", layer_form="jmlr").eval()
    m.save_pretrained(tmp_path / "m")
    assert sorted(os.listdir(tmp_path / "m")) == ["config.json", "model.safetensors"]
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["eta"] == 0.3 and cfg["lambd"] == 0.07 and cfg["crate_transformer_version"] == ct.__version__
    r = ct.from_pretrained(tmp_path / "m").eval()
    assert r.config == m.config
    assert r.layers[1].ista.eta == 0.3 and r.layers[1].ista.lambd == 0.07
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(r(x), m(x), rtol=0, atol=0)


@pytest.mark.parametrize("container", ["state_dict", "model", "bare", "file"])
def test_from_official_reproduces_official_logits(tmp_path, container):
    off = official_tiny()
    sd = off.state_dict()
    if container == "state_dict":  # what official main.py writes (DDP-wrapped, module. prefix)
        src = {"epoch": 3, "arch": "CRATE_tiny", "state_dict": {"module." + k: v for k, v in sd.items()}}
    elif container == "model":
        src = {"model": sd}
    elif container == "bare":
        src = sd
    else:
        src = tmp_path / "checkpoint.pth.tar"
        torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}, "best_acc1": torch.tensor(1.0)}, src)
    m = ct.from_official(src, "crate_tiny", **TINY).eval()
    x = torch.randn(3, 3, 32, 32)
    torch.testing.assert_close(m(x), off(x), rtol=1e-5, atol=1e-5)


def test_from_official_full_size_crate_small():
    """The released official checkpoint is CRATE-S: the full-size model reproduces its logits."""
    torch.manual_seed(1)
    off = OfficialCRATE(image_size=224, patch_size=16, num_classes=1000, dim=576, depth=12, heads=12).eval()
    m = ct.from_official({"state_dict": {"module." + k: v for k, v in off.state_dict().items()}}, "crate_small").eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(m(x), off(x), rtol=1e-5, atol=1e-5)


def test_official_mean_pool_and_resave_roundtrip(tmp_path):
    off = official_tiny(pool="mean")
    m = ct.from_official(off.state_dict(), "crate_tiny", **TINY, pool="mean").eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(m(x), off(x), rtol=1e-5, atol=1e-5)
    m.save_pretrained(tmp_path / "imported")
    r = ct.from_pretrained(tmp_path / "imported").eval()
    torch.testing.assert_close(r(x), m(x), rtol=0, atol=0)


def test_key_maps_are_inverse():
    sd = official_tiny().state_dict()
    native = official_to_native(sd)
    assert set(native) == set(ct.create_model("crate_tiny", **TINY).state_dict())
    assert native_to_official(native).keys() == sd.keys()


def test_from_official_mismatch_errors_list_keys_and_fix():
    sd = official_tiny().state_dict()
    with pytest.raises(CheckpointError, match="shape mismatches: head.1.bias.*pass num_classes=5$"):
        ct.from_official(sd, "crate_tiny", **{**TINY, "num_classes": 10})
    broken = dict(sd)
    del broken["transformer.layers.1.1.fn.weight"]
    broken["extra.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match="missing keys: layers.1.ista.weight.*unexpected keys: extra.weight"):
        ct.from_official(broken, "crate_tiny", **TINY)
    with pytest.raises(CheckpointError, match="pass patch_size=8$"):
        ct.from_official(sd, "crate_tiny", **{**TINY, "image_size": 32, "patch_size": 4})  # 8x8 grid vs 4x4
    with pytest.raises(CheckpointError, match="not an official CRATE checkpoint"):
        ct.from_official({"state_dict": {"a": 1}}, "crate_tiny", **TINY)
    with pytest.raises(ValueError, match="unknown model"):
        ct.from_official(sd, "crate_huge")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_untrusted_pickle_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump({"state_dict": Evil()}, f)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_pickle(path)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        ct.from_official(tmp_path / "nope.pth", "crate_tiny")
    (tmp_path / "trunc.pth").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        ct.from_official(tmp_path / "trunc.pth", "crate_tiny")
    with pytest.raises(CheckpointError, match="model directory not found"):
        ct.from_pretrained(tmp_path / "missing")
    m = ct.create_model("crate_tiny", **TINY)
    d = m.save_pretrained(tmp_path / "m")
    (d / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="corrupt"):
        ct.from_pretrained(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        ct.from_pretrained(d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        ct.from_pretrained(d)


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")

    def failing(tmp):
        with open(tmp, "w") as f:
            f.write("half-writ")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic_write(target, failing)
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.txt"]
    atomic_write(target, lambda tmp: open(tmp, "w").write("new"))
    assert target.read_text() == "new"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600


def test_load_model_resolves_every_layout(tmp_path):
    m = ct.create_model("crate_tiny", **TINY).eval()
    x = torch.randn(1, 3, 32, 32)
    m.save_pretrained(tmp_path / "run" / "model")
    torch.testing.assert_close(load_model(tmp_path / "run" / "model")(x), m(x))
    torch.testing.assert_close(load_model(tmp_path / "run")(x), m(x))
    torch.save({"model_config": m.config.to_dict(), "model": m.state_dict(), "step": 7}, tmp_path / "last.pt")
    torch.testing.assert_close(load_model(tmp_path / "last.pt")(x), m(x))
    off = official_tiny()
    torch.save({"state_dict": {"module." + k: v for k, v in off.state_dict().items()}}, tmp_path / "off.pth")
    with pytest.raises(CheckpointError, match="--model crate_small"):
        load_model(tmp_path / "off.pth")
    torch.testing.assert_close(load_model(tmp_path / "off.pth", "crate_tiny", **TINY)(x), off(x), rtol=1e-5, atol=1e-5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="neither a model directory"):
        load_model(tmp_path / "empty")
