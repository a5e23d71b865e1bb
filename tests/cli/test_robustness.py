"""Corrupt, truncated, hostile and contradictory inputs: each is caught where it is read, named in one line.

Every case here was once accepted silently (or crashed with a traceback): a bit-flipped training state read by
``crate eval`` / ``finetune`` / ``analyze``, a truncated WebDataset shard, a decompression-bomb image, a second
``crate ablate`` deleting the first one's live run, an evaluation over nothing reported as a score, a flipped
bit in ``config.json`` / ``tokenizer.json``, and a resumed run that skipped the checks of a new one.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import tiny
import torch
from clitools import crate, one_line_error, warnings_shown
from PIL import Image

import crate_transformer as ct
from crate_transformer.data import ImageDataset, load_dataset, open_source
from crate_transformer.io import CheckpointError
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.lm import LMConfig, build_lm
from crate_transformer.models.tokenizer import Tokenizer
from crate_transformer.train import RunDir, TrainConfig, load_training_state

TINY = tiny.DIGITS_ONE_LAYER
LM_TINY = tiny.LM


def flip_bit(path: Path, at: int, bit: int = 0x02) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= bit
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- 1. training states, every reader
@pytest.fixture
def corrupt_state(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    """A run folder whose ``checkpoints/last.pt`` (a crate_mnist-like model on digits) has one flipped bit."""
    model = ct.create_model("crate_mnist", **TINY).eval()
    run = tmp_path / "run"
    cfg = TrainConfig(data="digits", image_size=8, model="crate_mnist", out=str(run))
    RunDir(run).save_state({"model_config": model.config.to_dict(), "model": model.state_dict(),
                            "train_config": cfg.to_dict(), "step": 1})  # fmt: skip
    ckpt = run / "checkpoints" / "last.pt"
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(load_model(ckpt)(x), model(x), rtol=0, atol=0)  # intact, it loads as saved
    weight = model.state_dict()["layers.0.attn.qkv.weight"].numpy().tobytes()
    at = ckpt.read_bytes().find(weight[:64])
    assert at > 0
    flip_bit(ckpt, at + 9, 0x01)  # the lowest mantissa bit of one weight: a valid archive with other weights
    return run, model


@pytest.mark.parametrize("reader", ["load_model(last.pt)", "load_model(run)", "eval", "finetune", "analyze"])
def test_a_bit_flipped_training_state_is_refused_by_every_reader(
    corrupt_state: tuple[Path, torch.nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture, reader: str
) -> None:
    run, _ = corrupt_state
    ckpt = run / "checkpoints" / "last.pt"
    if reader.startswith("load_model"):
        with pytest.raises(CheckpointError, match="is corrupt") as e:
            load_model(ckpt if "last.pt" in reader else run)
        assert str(ckpt) in str(e.value) and "\n" not in str(e.value)
        return
    argv = {
        "eval": ["eval", ckpt, "--data", "digits", "--out", tmp_path / "ev"],
        "finetune": ["finetune", "--from", ckpt, "--data", "digits", "--out", tmp_path / "ft", "--no-progress"],
        "analyze": ["analyze", ckpt, "--data", "digits", "--num-images", 8, "--out", tmp_path / "an", "--no-progress"],
    }[reader]
    err = one_line_error(capsys, *argv)
    assert "is corrupt" in err and str(ckpt) in err
    with pytest.raises(ValueError, match="is corrupt"):  # the resume reader says the same
        load_training_state(run)


# --------------------------------------------------------------------------- 2. truncated WebDataset shards
def _jpeg(rng: np.random.Generator, c: int) -> bytes:
    a = rng.integers(0, 80, (16, 16, 3), dtype=np.uint8)
    a[:, :, c] += 150
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _shard(path: Path, n: int, seed: int) -> list:
    """Write ``n`` samples (a .cls and a .jpg each); returns the tar members (with their byte offsets)."""
    import tarfile

    import webdataset as wds

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as w:
        for i in range(n):
            w.write({"__key__": f"{path.stem}-{i:03d}", "jpg": _jpeg(rng, i % 3), "cls": str(i % 3).encode()})
    with tarfile.open(path) as tar:
        return tar.getmembers()


@pytest.mark.parametrize("where, complete", [("inside an image", 12), ("on a header boundary", 11)])
def test_a_truncated_shard_is_named_warned_under_skip_and_refused_under_error(
    tmp_path: Path, capsys: pytest.CaptureFixture, where: str, complete: int
) -> None:
    root = tmp_path / "shards"
    _shard(root / "train" / "a.tar", 12, 0)
    t = root / "test" / "t.tar"
    sample_12 = [m for m in _shard(t, 20, 1) if m.name.startswith("t-012.")]
    if where == "inside an image":  # samples 0-11 are whole, sample 12 lost part of its image
        cut = next(m for m in sample_12 if m.name.endswith(".jpg")).offset_data + 100
    else:  # cut before sample 12's first header: whether sample 11 had more files is unknown, so it is dropped
        cut = min(m.offset for m in sample_12)
    t.write_bytes(t.read_bytes()[:cut])
    with pytest.warns(UserWarning, match=r"t\.tar is truncated") as w:
        test = open_source(root, "test", image_size=16, num_workers=0)
    assert str(t) in str(w[0].message) and f"first {complete} complete samples" in str(w[0].message)
    assert len(test) == complete and sum(len(y) for _, y in test.batches(5, shuffle=False)) == complete
    with pytest.raises(ValueError) as e:
        open_source(root, "test", image_size=16, num_workers=0, on_bad_image="error")
    assert str(t) in str(e.value) and "truncated" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"t\.tar is truncated"):  # any split of the source; the index is cached
        open_source(root, "train", image_size=16, num_workers=0, on_bad_image="error")
    # crate eval reads the shards the same way
    model = ct.create_model("crate_mnist", **{**TINY, "image_size": 16, "in_chans": 3, "num_classes": 3})
    model.save_pretrained(tmp_path / "m")
    err = one_line_error(capsys, "eval", tmp_path / "m", "--data", root, "--on-bad-image", "error",
                         "--out", tmp_path / "ev", "--workers", "0")  # fmt: skip
    assert str(t) in err and "truncated" in err
    capsys.readouterr()
    with warnings_shown():
        assert crate("eval", tmp_path / "m", "--data", root, "--out", tmp_path / "ev", "--workers", "0") == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert (
        len(warned) == 1 and warned[0].startswith("crate eval: warning: shard ") and "t.tar is truncated" in warned[0]
    )
    assert "--on-bad-image error" in warned[0]  # the CLI words the fix as its flag
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["num_samples"] == complete


# --------------------------------------------------------------------------- 3. decompression bombs
def _bomb_png(side: int = 40_000) -> bytes:
    """A valid 1x1 PNG whose header claims ``side`` x ``side`` pixels: PIL refuses it as a decompression bomb."""
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    struct.pack_into(">II", data, 16, side, side)  # IHDR width, height
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def test_a_decompression_bomb_is_an_unreadable_image_streamed_and_in_memory(tmp_path: Path) -> None:
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(_bomb_png()))  # what the file is: neither an OSError nor a ValueError
    root = tmp_path / "folder"
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(5):
            (root / f"c{c}" / f"{i}.jpg").write_bytes(_jpeg(rng, c))
    bomb = root / "c1" / "0.png"
    bomb.write_bytes(_bomb_png())
    with pytest.warns(UserWarning, match=r"c1/0\.png") as w:
        stream = open_source(root, "train", image_size=16, mode="stream", num_workers=0)
        batches = list(stream.batches(4))  # a training epoch: the bomb is replaced, the schedule kept
    assert [len(y) for _, y in batches] == [4, 4, 4] and "skipped unreadable image" in str(w[-1].message)
    with pytest.raises(ValueError) as e:
        strict = open_source(root, "train", image_size=16, mode="stream", num_workers=0, on_bad_image="error")
        list(strict.batches(4))
    assert str(bomb) in str(e.value) and "DecompressionBombError" in str(e.value) and "\n" not in str(e.value)
    with pytest.warns(UserWarning, match=r"skipped 1 unreadable image.*c1/0\.png"):
        memory = load_dataset(root, "train", image_size=16)
    assert len(stream) == 13 and len(memory) == 12  # 13 training files listed, 12 of them readable
    with pytest.raises(ValueError, match=r"cannot read image .*c1/0\.png \(DecompressionBombError"):
        load_dataset(root, "train", image_size=16, on_bad_image="error")


# --------------------------------------------------------------------------- 4. two sweeps on one folder
ABLATE = tiny.ABLATE


def test_a_second_ablate_never_deletes_a_live_run_and_a_sweep_folder_has_one_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from crate_transformer.train.ablate import RECIPE, plan, resolve_tables, run_ablation
    from crate_transformer.train.rundir import FolderLock

    out = tmp_path / "sweep"
    live = plan(resolve_tables(["13"]), 1, out, {**RECIPE, **ABLATE})[0].run_dir
    owner = RunDir.create(live)  # a run in progress (another process), no checkpoint yet
    (live / "metrics.jsonl").write_text('{"step": 1}\n')
    try:
        with pytest.raises(ValueError, match=f"run directory {live} is in use"):
            run_ablation(["13"], out=out, seeds=1, overrides=ABLATE, progress=False, measure_images=16)
        assert (live / "metrics.jsonl").read_text() == '{"step": 1}\n'  # not deleted, not overwritten
    finally:
        owner.close()
    first = FolderLock(out, "sweep folder")  # a first `crate ablate --out sweep` still running
    try:
        err = one_line_error(capsys, "ablate", "13", "--seeds", "1", "--out", out, "--no-progress")
        assert f"sweep folder {out} is in use by crate process" in err
        assert not (out / "results.jsonl").exists() and (live / "metrics.jsonl").is_file()
    finally:
        first.close()
    summaries = []
    run_ablation(["13"], out=out, seeds=1, overrides=ABLATE, progress=False, measure_images=16,
                 trainer=lambda run, log: summaries.append(run) or {"test_acc": 0.5, "params": 1})  # fmt: skip
    assert len(summaries) == 2  # free again once the first sweep is gone


# --------------------------------------------------------------------------- 5. evaluating nothing
LM_ARGS = ["--threads", 1, "--no-progress", "--batch-size", 4, "--eval-every", 0, "--sample-tokens", 0,
           "--model-args", "dim=16", "depth=1", "heads=2", "block_size=16"]  # fmt: skip


def test_task_options_are_validated_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from crate_transformer.train import train

    for flag, value, msg in [
        ("--eval-blocks", -1, "--eval-blocks must be a non-negative integer (0 = every held-out block), got -1"),
        ("--sample-tokens", -5, "--sample-tokens must be a non-negative integer"),
        ("--mask-prob", 1.5, "--mask-prob must be a finite number in (0, 1)"),
        ("--vocab-size", 0, "--vocab-size must be an integer >= 1"),
    ]:
        err = one_line_error(capsys, "train-lm", *LM_ARGS, flag, value, "--max-steps", 1, "--out", tmp_path / "r")
        assert msg in err, err
        assert not (tmp_path / "r").exists()
    err = one_line_error(capsys, "pretrain", "mae", "--probe-c", 0, "--out", tmp_path / "m")
    assert "--probe-c must be a finite number > 0" in err and not (tmp_path / "m").exists()
    # what argparse's choices check for flags, a config file (or a resumed run's stored options) meets here
    with pytest.raises(ValueError, match="unknown objective 'xyz'; choose one of \\('clm', 'mlm'\\)"):
        train(TrainConfig(task="lm", task_args={"objective": "xyz"}, out=str(tmp_path / "y")))
    assert not (tmp_path / "y").exists()


def _lm_task(split: str):  # noqa: ANN202
    from crate_transformer.data.text import LabelledTexts, TokenBlocks
    from crate_transformer.train.lm import LMOptions, LMTask
    from crate_transformer.train.runtime import Runtime
    from crate_transformer.train.text_classification import TextClassificationTask

    tok = Tokenizer.byte_level()
    if split == "lm":
        task = LMTask()
        task.options, task.tokenizer = LMOptions(), tok
        task.model = build_lm(LMConfig(**LM_TINY))
        task.special = torch.tensor(tok.special_ids)
        task.eval_data = TokenBlocks(np.arange(200) % 256, 16, 100, 100, "text", "held-out")  # no window
    else:
        task = TextClassificationTask()
        task.regression, task.model = False, build_lm(LMConfig(**LM_TINY, num_labels=2))
        task.eval_data = LabelledTexts([], torch.empty(0, dtype=torch.long), tok.pad_id, "t.csv", "val")
    task.cfg, task.rt = TrainConfig(eval_batch_size=8), Runtime()
    return task


@pytest.mark.parametrize("evaluator", ["classification", "mae", "lm", "text", "probe"])
def test_no_evaluator_reports_a_score_for_zero_samples(evaluator: str) -> None:
    empty = ImageDataset(torch.empty(0, 1, 8, 8, dtype=torch.uint8), torch.empty(0, dtype=torch.long),
                         [str(i) for i in range(10)], [0.5], [0.25], name="digits", split="test")  # fmt: skip
    with pytest.raises(ValueError, match=r"no (samples|tokens|rows|images|features)") as e:
        if evaluator == "classification":
            from crate_transformer.train import evaluate

            evaluate(ct.create_model("crate_mnist", **TINY), empty, mean=[0.5], std=[0.25], image_size=8, channels=1)
        elif evaluator == "mae":
            from crate_transformer.train.mae import masked_eval

            mae = ct.create_model("crate_mae_tiny", image_size=8, patch_size=4, in_chans=1, dim=16, depth=1, heads=2)
            masked_eval(mae, empty, mean=[0.5], std=[0.25], image_size=8)
        elif evaluator in ("lm", "text"):
            _lm_task(evaluator).evaluate("val")
        else:
            from crate_transformer.analysis.probe import extract_features, knn_classify

            x, y = extract_features(ct.create_model("crate_mnist", **TINY), empty, mean=[0.5], std=[0.25])
            knn_classify(torch.randn(4, 16), torch.arange(4) % 2, x, y)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- 6./7. every file of a saved model
def _family(name: str) -> torch.nn.Module:
    if name == "classifier":
        return ct.create_model("crate_mnist", **TINY)
    if name == "mae":
        return ct.create_model("crate_mae_tiny", image_size=8, patch_size=4, in_chans=1, dim=16, depth=1, heads=2)
    model = build_lm(LMConfig(**LM_TINY))
    model.tokenizer = Tokenizer.byte_level()
    return model


@pytest.mark.parametrize("family", ["classifier", "mae", "lm"])
def test_a_flipped_bit_in_config_json_is_caught_for_every_family(tmp_path: Path, family: str) -> None:
    d = _family(family).save_pretrained(tmp_path / "m")
    reformatted = json.dumps(json.loads((d / "config.json").read_text()), indent=7, sort_keys=True)
    (d / "config.json").write_text(reformatted)  # the checksum covers the content, not the layout
    assert ct.from_pretrained(d).config.eta == 0.1
    flip_bit(d / "config.json", reformatted.index('"eta": 0.1') + len('"eta": 0.'))  # 0.1 -> 0.3: still valid
    assert json.loads((d / "config.json").read_text())["eta"] == 0.3
    for load in (ct.from_pretrained, load_model):
        with pytest.raises(CheckpointError, match=r"config\.json is corrupt") as e:
            load(d)
        assert str(d / "config.json") in str(e.value) and "\n" not in str(e.value)


def test_a_flipped_bit_in_tokenizer_json_is_caught(tmp_path: Path) -> None:
    model = _family("lm")
    d = model.save_pretrained(tmp_path / "m")
    at = (d / "tokenizer.json").read_bytes().index(b'"A": ') + len(b'"A": ')
    flip_bit(d / "tokenizer.json", at, 0x01)  # the id of "A" in the vocabulary: 65 -> 75, still valid JSON
    changed = Tokenizer.from_file(d / "tokenizer.json")
    assert changed.encode("A") != model.tokenizer.encode("A")  # what loading it silently would have meant
    with pytest.raises(CheckpointError, match=r"tokenizer\.json is corrupt") as e:
        ct.from_pretrained(d)
    assert str(d / "tokenizer.json") in str(e.value) and "\n" not in str(e.value)
    (d / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"no tokenizer\.json"):
        ct.from_pretrained(d)


def test_folders_saved_before_file_checksums_still_load_with_the_weights_checksum(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from crate_transformer.io import load_safetensors

    model = _family("lm")
    d = model.save_pretrained(tmp_path / "m")
    tensors, meta = load_safetensors(d / "model.safetensors")
    assert set(meta) == {"format", "sha256", "config_sha256", "tokenizer_sha256"}
    old = {"format": "pt", "sha256": meta["sha256"]}  # what a save before file checksums wrote
    save_file(tensors, d / "model.safetensors", metadata=old)
    (d / "config.json").write_text((d / "config.json").read_text().replace('"eta": 0.1', '"eta": 0.3'))
    assert ct.from_pretrained(d).config.eta == 0.3  # not verifiable, so loaded as before
    assert ct.from_pretrained(d).tokenizer.encode("A") == model.tokenizer.encode("A")
    flip_bit(d / "model.safetensors", len((d / "model.safetensors").read_bytes()) - 3, 0x01)
    with pytest.raises(CheckpointError, match=r"model\.safetensors is corrupt: checksum mismatch"):
        ct.from_pretrained(d)  # the weights' own checksum is still verified


# --------------------------------------------------------------------------- 8. resume runs a new run's checks
def test_resume_runs_the_checks_a_new_run_makes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i}: the value of x is {i * i}.\n" for i in range(120)))
    run = tmp_path / "gpt"
    args = ["--data", corpus, *LM_ARGS]
    assert crate("train-lm", *args, "--max-steps", 1, "--out", run) == 0
    cut = args.index("--sample-tokens")  # a clm-only option: given with mlm it is refused (before the model's check)
    fresh = args[:cut] + args[cut + 2 :]
    new = one_line_error(
        capsys, "train-lm", *fresh, "--model", "crate_gpt_mini", "--objective", "mlm", "--out", tmp_path / "new"
    )
    assert "crate_gpt_mini is a causal (GPT) model; use --objective clm" in new
    step = load_training_state(run)["step"]
    for extra, msg in [
        (["--objective", "mlm"], "is a causal (GPT) model; use --objective clm"),
        (["--tokenizer", "bpe"], "keeps the tokenizer of its checkpoint ('byte'), not 'bpe'"),
        (["--model", "crate_bert_mini"], "--model crate_bert_mini (run: 'crate_gpt_mini')"),
        (["--model-args", "dim=24"], "--model-args dim=24 (run: 16)"),
    ]:
        err = one_line_error(capsys, "train-lm", "--resume", run, "--max-steps", 3, *extra)
        assert msg in err, err
    assert load_training_state(run)["step"] == step  # nothing was trained
    assert crate("train-lm", "--resume", run, "--max-steps", 2, "--model-args", "dim=16") == 0  # equal: fine


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_write_gives_the_usual_permissions_and_leaves_the_umask_alone(
    tmp_path: Path, umask: int, mode: int
) -> None:
    """A file written atomically gets 0o666 less the umask, as ``open`` gives, and neither importing the package
    nor writing changes the process umask (another thread creating a file meanwhile would get the wrong mode)."""
    import os
    import subprocess
    import sys

    code = (
        "import os, sys; os.umask(int(sys.argv[2]))\n"
        "import crate_transformer.io as io\n"
        "p = io.atomic_write(sys.argv[1] + '/f.json', lambda t: open(t, 'w').write('{}'))\n"
        "assert os.umask(0) == int(sys.argv[2]), 'the umask changed'\n"
        "print(os.stat(p).st_mode & 0o777)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(ct.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(umask)], env=env, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert int(out) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]  # no temporary file left behind


def test_figures_leave_the_matplotlib_backend_alone(tmp_path: Path) -> None:
    """Writing a run's figures neither chooses a backend nor registers pyplot figures: a notebook user's
    interactive backend stays as it was (the figures render with Agg on their own)."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("pdf")  # what a user chose (any backend but the Agg the figures render with)
    try:
        _write_figures(tmp_path)
        assert matplotlib.get_backend() == "pdf"
    finally:
        matplotlib.use(before)
    pyplot = __import__("sys").modules.get("matplotlib.pyplot")
    assert pyplot is None or not pyplot.get_fignums()  # no figure left open in pyplot's registry


def _write_figures(tmp_path: Path) -> None:
    from crate_transformer.train.evaluation import plot_confusion_matrix, plot_curves, plot_knn

    records = [{"split": "train", "step": s, "loss": 1.0 / s, "lr": 0.1, "acc": 0.5} for s in (1, 2, 3)]
    (tmp_path / "m.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
    for path in (
        plot_curves(tmp_path / "m.jsonl", tmp_path / "c.png"),
        plot_knn({10: 0.5, 20: 0.6}, tmp_path / "k.png"),
        plot_confusion_matrix([[3, 1], [0, 4]], ["a", "b"], tmp_path / "cm.png"),
    ):
        assert path.read_bytes()[:4] == b"\x89PNG"
