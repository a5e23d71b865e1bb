"""save_pretrained / from_pretrained / from_official / load_model and their failure modes."""

import argparse
import errno
import json
import os
import pickle

import numpy as np
import pytest
import tiny
import torch
from official.crate import OfficialCRATE

import crate_transformer as ct
from crate_transformer.io import CheckpointError, atomic_write, load_pickle
from crate_transformer.loading.official import native_to_official, official_to_native
from crate_transformer.loading.pipeline import load_model

TINY = tiny.IMAGE


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


class TrainingArgs:  # a training script's own arguments class: not argparse.Namespace, so never allowed
    def __init__(self, **kw):
        self.__dict__.update(kw)


class CreatesFile:
    """Unpickling this runs ``os.system("touch PATH")`` or ``open(PATH, "w")``: either creates PATH."""

    def __init__(self, path, how):
        self.path, self.how = str(path), how

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",)) if self.how == "system" else (open, (self.path, "w"))


@pytest.mark.parametrize(
    "case,refused",
    [
        ("namespace_holding_os_system", "posix.system"),
        ("namespace_holding_open", r"\w*\.open"),
        ("custom_args_class", r"\w*\.TrainingArgs"),
        ("args_that_open_a_file", r"\w*\.open"),
    ],
)
def test_only_argparse_namespace_joins_the_safe_list(tmp_path, case, refused):
    """MAE-codebase checkpoints store an argparse.Namespace, which load_pickle allows; anything else — another
    class, or a Namespace holding a callable — is refused with the one-line error and its payload never runs."""
    marker = tmp_path / "payload_ran"
    args = {
        "namespace_holding_os_system": argparse.Namespace(lr=1e-3, hook=CreatesFile(marker, "system")),
        "namespace_holding_open": argparse.Namespace(lr=1e-3, hook=CreatesFile(marker, "open")),
        "custom_args_class": TrainingArgs(lr=1e-3, epochs=800),
        "args_that_open_a_file": CreatesFile(marker, "open"),
    }[case]
    path = tmp_path / "checkpoint-799.pth"
    torch.save({"model": official_tiny().state_dict(), "epoch": 799, "args": args}, path)
    for load in (
        load_pickle,
        lambda p: ct.from_official(p, "crate_tiny", **TINY),
        lambda p: load_model(p, "crate_tiny"),
    ):
        with pytest.raises(
            CheckpointError, match=f"cannot read checkpoint .*needs the global {refused}, .*refused"
        ) as e:
            load(path)
        assert "\n" not in str(e.value) and "weights_only=False" not in str(e.value)
    assert not marker.exists()
    # the same container with the Namespace of plain values loads
    torch.save({"model": official_tiny().state_dict(), "epoch": 799, "args": argparse.Namespace(lr=1e-3)}, path)
    assert vars(load_pickle(path)["args"]) == {"lr": 1e-3}
    assert isinstance(ct.from_official(path, "crate_tiny", **TINY), ct.CRATE)


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
    with pytest.raises(CheckpointError, match="pass the model name, e.g. crate_small$"):
        load_model(tmp_path / "off.pth")
    torch.testing.assert_close(load_model(tmp_path / "off.pth", "crate_tiny", **TINY)(x), off(x), rtol=1e-5, atol=1e-5)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="neither a model directory"):
        load_model(tmp_path / "empty")


# --------------------------------------------------------------------------- data description in config.json
def test_data_spec_round_trips_and_legacy_extra_configs_still_load(tmp_path, without_file_checksums):
    from crate_transformer.data import DataSpec

    spec = DataSpec(source="digits", kind="digits", name="digits", classes=list("abcde"), mean=[0.2] * 3, std=[0.3] * 3)
    m = ct.create_model("crate_tiny", **TINY)
    m.config.data = spec
    d = m.save_pretrained(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["data"] == spec.to_dict() and "extra" not in cfg
    assert ct.from_pretrained(d).config == m.config
    assert ct.ModelConfig.from_dict(m.config.to_dict()) == m.config
    # a config.json written before `data` existed (and before config.json was checksummed): the free-form
    # `extra` dict becomes a DataSpec
    without_file_checksums(d)
    legacy = {k: v for k, v in cfg.items() if k != "data"}
    legacy["extra"] = {
        "normalization": {"mean": [0.5], "std": [0.25]},
        "classes": list("abcde"),
        "dataset": "digits",
        "data": "/data/digits",
        "note": "free-form entries were never read",
    }
    (d / "config.json").write_text(json.dumps(legacy))
    old = ct.from_pretrained(d).config.data
    assert old == DataSpec(source="/data/digits", name="digits", classes=list("abcde"), mean=[0.5], std=[0.25])
    (d / "config.json").write_text(json.dumps({**legacy, "extra": {}}))  # what every old save without data had
    assert ct.from_pretrained(d).config.data is None
    # a training state holding a legacy model_config loads too
    mc = {**{k: v for k, v in m.config.to_dict().items() if k != "data"}, "extra": legacy["extra"]}
    torch.save({"model_config": mc, "model": m.state_dict()}, tmp_path / "last.pt")
    assert load_model(tmp_path / "last.pt").config.data.mean == [0.5]
    with pytest.raises(ValueError, match="both 'data' and the legacy 'extra'"):
        ct.ModelConfig.from_dict({"data": spec.to_dict(), "extra": {"dataset": "x"}})


def test_extra_is_no_longer_a_field():
    import dataclasses

    assert "extra" not in {f.name for f in dataclasses.fields(ct.ModelConfig)}
    assert not hasattr(ct.ModelConfig(**TINY), "extra")
    with pytest.raises(ValueError, match="unknown override"):
        ct.create_model("crate_tiny", **TINY, extra={})


def test_config_json_with_bad_values_is_one_line_error_naming_the_file(tmp_path, without_file_checksums):
    d = without_file_checksums(ct.create_model("crate_tiny", **TINY).save_pretrained(tmp_path / "m"))  # editable
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "lambd": "5e-2", "dim": "32"}))  # strings are coerced
    assert ct.from_pretrained(d).config.lambd == 0.05
    (d / "config.json").write_text(json.dumps({**cfg, "eta": float("nan")}))  # json.dumps writes NaN
    with pytest.raises(CheckpointError, match=r"config.json: eta must be a finite number > 0, got nan"):
        ct.from_pretrained(d)


# --------------------------------------------------------------------------- load_model refuses what it cannot apply
def test_load_model_refuses_overrides_it_cannot_apply(tmp_path):
    m = ct.create_model("crate_tiny", **TINY)
    m.save_pretrained(tmp_path / "run" / "model")
    torch.save({"model_config": m.config.to_dict(), "model": m.state_dict()}, tmp_path / "last.pt")
    for path in (tmp_path / "run" / "model", tmp_path / "run", tmp_path / "last.pt"):
        with pytest.raises(CheckpointError, match=r"dim=576 \(checkpoint: 32\).*official \.pth") as e:
            load_model(path, "crate_small")
        assert "\n" not in str(e.value)
        with pytest.raises(CheckpointError, match=r"eta=0.5 \(checkpoint: 0.1\).*comes from the checkpoint's config"):
            load_model(path, eta=0.5)
        # values equal to the stored config are fine (a command line that always passes --model)
        assert load_model(path, "crate_tiny", **TINY).config == m.config
        assert load_model(path, num_classes="5").config == m.config
    with pytest.raises(CheckpointError, match="eta must be a number"):
        load_model(tmp_path / "run", eta="fast")


# --------------------------------------------------------------------------- checksums
def test_weights_checksum_detects_flipped_bytes_and_old_files_still_load(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from crate_transformer.io import tree_sha256

    m = ct.create_model("crate_tiny", **TINY)
    d = m.save_pretrained(tmp_path / "m")
    with safe_open(d / "model.safetensors", "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and meta["sha256"] == tree_sha256(m.state_dict())
    data = bytearray((d / "model.safetensors").read_bytes())
    data[-3] ^= 0x01  # one bit of the last tensor's data: still a valid safetensors file
    (d / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=r"model.safetensors is corrupt: checksum mismatch; re-save or re-download"
    ):
        ct.from_pretrained(d)
    # a file written before checksums were stored (metadata {"format": "pt"} only) loads unverified
    save_file(
        {k: v.contiguous() for k, v in m.state_dict().items()}, d / "model.safetensors", metadata={"format": "pt"}
    )
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(ct.from_pretrained(d).eval()(x), m.eval()(x), rtol=0, atol=0)


def test_tree_sha256_is_deterministic_order_free_and_byte_sensitive():
    from crate_transformer.io import tree_sha256

    def payload():
        return {
            "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
            "b": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
            "step": 7,
            "lr": [1e-3, None, True],
            "name": "x",
            "t": (1, 2.0),
        }

    p = payload()
    h = tree_sha256(p)
    # pinned: the checksums stored in files must not change between versions
    assert h == "e58d4915ba835846a139da60e24f67faabb48249cac5375996a316ae6a7d38c8"
    assert tree_sha256(payload()) == h and tree_sha256(dict(reversed(list(p.items())))) == h  # insertion order
    flipped = payload()
    flipped["b"].view(torch.int16)[1] ^= 1  # the lowest mantissa bit of one bf16 value
    assert tree_sha256(flipped) != h
    for change in (
        {"w": p["w"].reshape(3, 2)},  # same bytes, other shape
        {"w": p["w"].view(torch.int32)},  # same bytes, other dtype
        {"t": [1, 2.0]},  # list vs tuple
        {"step": 7.0},  # int vs float
        {"lr": [1e-3, None, 1]},  # bool vs int
        {"name": b"x"},  # str vs bytes
    ):
        assert tree_sha256({**p, **change}) != h, change
    assert tree_sha256({1: "a", "1": "b"}) != tree_sha256({1: "b", "1": "a"})  # int and str keys kept apart
    assert tree_sha256(torch.zeros(0)) != tree_sha256(torch.zeros(0, dtype=torch.float64))
    assert tree_sha256(np.arange(3)) == tree_sha256(np.arange(3)) != tree_sha256(np.arange(3.0))
    with pytest.raises(ValueError, match="cannot hash a builtins.object"):
        tree_sha256({"x": object()})


# --------------------------------------------------------------------------- paths given as files
def test_from_pretrained_accepts_the_weights_or_config_file(tmp_path):
    m = ct.create_model("crate_tiny", **TINY).eval()
    d = m.save_pretrained(tmp_path / "m")
    x = torch.randn(1, 3, 32, 32)
    for f in ("model.safetensors", "config.json"):
        torch.testing.assert_close(ct.from_pretrained(d / f).eval()(x), m(x), rtol=0, atol=0)
        torch.testing.assert_close(load_model(d / f).eval()(x), m(x), rtol=0, atol=0)
    (d / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError, match="notes.txt is a file; pass the folder written by model.save_pretrained"):
        ct.from_pretrained(d / "notes.txt")


# --------------------------------------------------------------------------- unreadable files: our own messages
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_non_checkpoint_files_never_suggest_weights_only_false(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    rng = np.random.default_rng(0)
    files = {
        "text": (b"<html>404 Not Found</html>\n", "text file"),
        "random": (b"\x07" + rng.bytes(255), "not a torch checkpoint"),
        "empty": (b"", "empty \\(0 bytes\\)"),
        "pickled": (pickle.dumps({"state_dict": Evil()}), "pickle .*refused for safety"),
        "plain_pickle": (pickle.dumps({"a": 1}), "pickle .*refused for safety"),
    }
    torch.save({"state_dict": Evil()}, tmp_path / "torch_saved")
    paths = {name: tmp_path / name for name in files}
    for name, (data, _) in files.items():
        paths[name].write_bytes(data)
    expected = {name: msg for name, (_, msg) in files.items()}
    paths["torch_saved"], expected["torch_saved"] = tmp_path / "torch_saved", "needs the global posix.system.*refused"
    for name, path in paths.items():
        with pytest.raises(CheckpointError, match=f"cannot read checkpoint .*{name}: .*{expected[name]}") as e:
            ct.from_official(path, "crate_tiny", **TINY)
        text = str(e.value)
        assert "weights_only=False" not in text and "\n" not in text, name
        assert "torch.save" in text or "re-save" in text, name  # and the fix


# --------------------------------------------------------------------------- disk full, unwritable folders
@pytest.mark.parametrize(
    "err,msg",
    [
        (errno.ENOSPC, "no space left on device while writing .*f.txt; free space or write to another folder"),
        (errno.EDQUOT, "disk quota exceeded while writing .*f.txt; free space or write to another folder"),
        (errno.EACCES, "cannot write f.txt to folder .* \\(permission denied\\); write to another folder"),
        (errno.EROFS, "cannot write f.txt to folder .* \\(read-only file system\\)"),
    ],
)
def test_atomic_write_disk_full_and_permission_errors_are_one_line(tmp_path, err, msg):
    from crate_transformer.io import WriteError

    target = tmp_path / "f.txt"
    target.write_text("old")

    def full_disk(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise OSError(err, os.strerror(err))

    with pytest.raises(WriteError, match=msg) as e:
        atomic_write(target, full_disk)
    assert isinstance(e.value, ValueError) and isinstance(e.value, OSError) and e.value.errno == err
    assert "\n" not in str(e.value)
    assert os.listdir(tmp_path) == ["f.txt"] and target.read_text() == "old"  # no temp file, old file intact


def test_save_pretrained_on_a_full_disk_or_read_only_folder(tmp_path, monkeypatch):
    from crate_transformer.io import model_folder, writes

    def no_space(data):
        def write(tmp):
            raise OSError(errno.ENOSPC, "No space left on device")

        return write

    monkeypatch.setattr(model_folder, "_write_bytes", no_space)  # the writer save_pretrained calls
    m = ct.create_model("crate_tiny", **TINY)
    with pytest.raises(ValueError, match=r"no space left on device while writing .*config.json; free space"):
        m.save_pretrained(tmp_path / "m")  # config.json is written first, the weights (with its checksum) last
    assert os.listdir(tmp_path / "m") == []
    monkeypatch.undo()

    def read_only(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(writes, "_new_temp_file", read_only)  # the temporary file cannot be created
    with pytest.raises(ValueError, match=r"cannot write config.json to folder .*ro \(permission denied\)"):
        m.save_pretrained(tmp_path / "ro")


def test_save_torch_and_the_file_primitives_home(tmp_path):
    import crate_transformer.io as cio

    assert load_pickle is cio.load_pickle and ct.CheckpointError is cio.CheckpointError  # one home: io
    assert (cio.atomic_write.__module__, cio.load_pickle.__module__) == (
        "crate_transformer.io.writes",
        "crate_transformer.io.pickles",
    )  # the io package's modules, re-exported by it
    payload = {"model": {"w": torch.randn(3)}, "step": 4}
    cio.save_torch(payload, tmp_path / "last.pt")
    back = load_pickle(tmp_path / "last.pt")
    assert cio.tree_sha256(back) == cio.tree_sha256(payload)
