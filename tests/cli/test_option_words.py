"""A bad value is named where the user typed it: the flag on the command line (``--epochs``, ``--model-args
dim``), the keyword in Python (``epochs=``, ``dim=``), the key of the file it came from (``config.json: depth``).

Each case here once named a Python class field on the command line (``OptimOptions.epochs must be an integer``)
or let a bad value through to fail later.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny
from clitools import one_line_error

import crate_transformer as ct
from crate_transformer.errors import OptionError
from crate_transformer.models.registry import config_classes
from crate_transformer.train import TrainConfig

TRAIN = ["--threads", "1", "--no-progress"]


# --------------------------------------------------------------------------- 1. flags, not class fields
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--epochs", "x"], "--epochs must be an integer, got 'x' (str); e.g. --epochs 40"),
        (["--epochs", "2.5"], "--epochs must be an integer, got '2.5' (str); e.g. --epochs 40"),
        (["--lr", "abc"], "--lr must be a number, got 'abc' (str); e.g. --lr 0.004"),
        (["--batch-size", "0"], "--batch-size must be a positive integer, got 0; e.g. --batch-size 64"),
        (["--betas", "0.9", "x"], "--betas must be a list whose items are each a number, got ['0.9', 'x']"),
        (["--image-size", "0"], "--image-size must be a positive integer, got 0"),
        # a model config's field is an entry of --model-args, even where a flag of the same name exists
        (
            ["--model-args", "dim=abc"],
            "--model-args dim must be an integer, got 'abc' (str); e.g. --model-args dim=384",
        ),
        (
            ["--model-args", "depth=0"],
            "--model-args depth must be a positive integer, got 0; e.g. --model-args depth=12",
        ),
        (["--model-args", "image_size=0"], "--model-args image_size must be a positive integer, got 0"),
    ],
)
def test_a_bad_training_value_names_its_flag(capsys: pytest.CaptureFixture, argv: list[str], expected: str) -> None:
    err = one_line_error(capsys, "train", *TRAIN, *argv)
    assert f"error: {expected}" in err, err
    assert "Options." not in err and "ModelConfig" not in err, err


def test_a_bad_task_option_names_its_flag(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lm = ["--model-args", *tiny.kv(tiny.LM), "--out", tmp_path / "r"]
    err = one_line_error(capsys, "train-lm", *TRAIN, "--sample-tokens", "-5", *lm)
    assert "--sample-tokens must be a non-negative integer (0 = no sample), got -5; e.g. --sample-tokens 200" in err
    err = one_line_error(capsys, "train-lm", *TRAIN, "--eval-blocks", "x", *lm)
    assert "--eval-blocks must be an integer, got 'x' (str)" in err, err
    assert not (tmp_path / "r").exists()


def test_the_python_api_names_the_keyword() -> None:
    for make, expected in [
        (lambda: TrainConfig(epochs="x"), "epochs must be an integer, got 'x' (str); e.g. epochs=40"),
        (lambda: TrainConfig(batch_size=0), "batch_size must be a positive integer, got 0; e.g. batch_size=64"),
        (lambda: TrainConfig(optim={"lr": "abc"}), "lr must be a number, got 'abc' (str); e.g. lr=0.004"),
        (lambda: ct.create_model("crate_tiny", dim="abc"), "dim must be an integer, got 'abc' (str); e.g. dim=384"),
        (lambda: ct.create_model("crate_tiny", depth=0), "depth must be a positive integer, got 0; e.g. depth=12"),
    ]:
        with pytest.raises(OptionError) as e:
            make()
        assert str(e.value) == expected
    assert TrainConfig(betas=["0.9", "0.99"]).optim.betas == [0.9, 0.99]  # "0.9" from the command line is 0.9
    with pytest.raises(OptionError, match=r"betas must be a list whose items are each a number"):
        TrainConfig(betas=[0.9, "x"])  # was kept as given, to fail inside the optimizer after the run folder


def test_every_model_config_names_its_fields_as_model_args_entries() -> None:
    """A family's config names its fields as ``--model-args`` entries on the command line (its class says so, as its
    ``kind`` says what it is) and says which numbered blocks its depth counts."""
    classes = config_classes()
    assert classes
    for cls in classes:
        assert (cls.GIVEN_IN == "model_args") == bool(cls.kind), cls
        assert "depth" in cls.BLOCK_COUNTS, cls  # a config.json's depth is bounded by the weights' keys


def _folder_saved_before_checksums(tmp_path: Path, **edits: object) -> Path:
    """A digits classifier's ``save_pretrained`` folder as a release before file checksums wrote it (the weights'
    header records no checksum of ``config.json``), with ``edits`` made to its ``config.json`` by hand."""
    import json

    from safetensors.torch import save_file

    from crate_transformer.io import load_safetensors

    d = ct.create_model("crate_mnist", **tiny.DIGITS_ONE_LAYER).save_pretrained(tmp_path / "m")
    tensors, meta = load_safetensors(d / "model.safetensors")
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt", "sha256": meta["sha256"]})
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **edits}))
    return d


def test_a_bad_value_in_a_file_is_named_as_the_file_names_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    d = _folder_saved_before_checksums(tmp_path, depth=0)
    expected = f"{d / 'config.json'}: depth must be a positive integer, got 0; e.g. depth=12"
    with pytest.raises(ValueError) as e:
        ct.from_pretrained(d)
    assert str(e.value) == expected
    err = one_line_error(capsys, "eval", d, "--data", "digits", "--threads", "1")
    assert err.endswith(f"error: {expected}"), err  # the file's key, not --model-args depth


# --------------------------------------------------------------------------- 2. an integer is an int
def test_an_integer_range_refuses_floats_and_bools_by_type() -> None:
    from crate_transformer.config_utils import NON_NEGATIVE, POSITIVE, Range

    for rule in (POSITIVE, NON_NEGATIVE, Range(0, 64, integer=True)):
        assert rule.ok(8) and not rule.ok(8.0) and not rule.ok(True) and not rule.ok(2.5)
    with pytest.raises(ValueError) as e:
        POSITIVE.check("top_k", 8.0)
    assert str(e.value) == "top_k must be a positive integer, got 8.0 (float)"
    # a number given as text (the command line, YAML) still becomes the int it spells
    assert TrainConfig(epochs="8", batch_size=8.0).optim.epochs == 8


def test_an_api_size_given_as_a_float_is_one_line_not_a_traceback() -> None:
    import torch

    from crate_transformer.models.lm import LMConfig, build_lm

    model = build_lm(LMConfig(**tiny.LM)).eval()
    ids = torch.tensor([[1, 2, 3]])
    assert model.generate(ids, max_new_tokens=2).shape == (1, 5)
    for kwargs, name in [({"max_new_tokens": 2.0}, "max_new_tokens"), ({"max_new_tokens": 2, "top_k": 5.0}, "top_k")]:
        with pytest.raises(ValueError, match=rf"^{name} must be a (positive|non-negative) integer, got .* \(float\)$"):
            model.generate(ids, **kwargs)


# --------------------------------------------------------------------------- 3. one way to choose the tokenizer
LM_RUN = ["--threads", "1", "--no-progress", "--batch-size", "4", "--eval-every", "0", "--sample-tokens", "0",
          "--max-steps", "1", "--model-args", *tiny.kv(tiny.LM)]  # fmt: skip


def test_train_lm_refuses_a_tokenizer_in_model_args_naming_the_tokenizer_option(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--model-args tokenizer=bpe`` was replaced by the tokenizer the run trained (byte), silently."""
    from crate_transformer.train.lm import LMTask

    out = tmp_path / "r"
    err = one_line_error(capsys, "train-lm", *LM_RUN, "tokenizer=bpe", "--out", out)
    assert "not --model-args tokenizer=bpe; pass --tokenizer bpe instead" in err, err
    assert not out.exists()  # refused before the run folder (and before a vocabulary is trained)
    err = one_line_error(capsys, "train-lm", *LM_RUN, "tokenizer=bpe", "--tokenizer", "wordpiece", "--out", out)
    assert "(--tokenizer wordpiece), not --model-args tokenizer=bpe" in err, err
    with pytest.raises(OptionError) as e:
        LMTask().check_model(TrainConfig(task="lm", model="crate_gpt_mini", model_args={"tokenizer": "bpe"}))
    assert str(e.value).endswith(
        "(tokenizer='byte'), not model_args={'tokenizer': 'bpe'}; pass tokenizer='bpe' instead"
    )
    # the same tokenizer both ways is no contradiction
    LMTask().check_model(TrainConfig(task="lm", model="crate_gpt_mini", model_args={"tokenizer": "byte"}))


# --------------------------------------------------------------------------- 4. sizes of config.json bounded
def _without_file_checksums(d: Path, **edits: object) -> Path:
    """``d`` (a ``save_pretrained`` folder) as a release before file checksums wrote it, ``config.json`` edited."""
    import json

    from safetensors.torch import save_file

    from crate_transformer.io import load_safetensors

    tensors, meta = load_safetensors(d / "model.safetensors")
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt", "sha256": meta["sha256"]})
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **edits}))
    return d


HUGE = [
    ({"depth": 10**9}, "depth=1,000,000,000 does not fit the weights beside it: their keys number 1 block layers.N"),
    ({"dim": 10**6}, "dim=1,000,000 does not fit the weights beside it ("),
    ({"num_classes": 10**8}, "num_classes=100,000,000 does not fit the weights beside it (head.1.weight: [10, 16]"),
    ({"image_size": 800_000}, "image_size=800,000 does not fit the weights beside it (pos_embed: [1, 5, 16] in model"),
]


@pytest.mark.parametrize(("edits", "expected"), HUGE)
def test_a_huge_size_in_an_unverified_config_json_is_refused_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture, edits: dict, expected: str
) -> None:
    """A folder saved before checksums, whose config.json was edited by hand, built a billion layers (or a
    10**12-weight matrix) before any weight was compared."""
    model = ct.create_model("crate_mnist", **tiny.DIGITS_ONE_LAYER)
    d = _without_file_checksums(model.save_pretrained(tmp_path / "m"), **edits)
    with pytest.raises(ValueError) as e:
        ct.from_pretrained(d)
    assert str(e.value).startswith(f"{d / 'config.json'}: ") and expected in str(e.value), e.value
    assert str(e.value).endswith("restore the file saved with them") and "\n" not in str(e.value)
    err = one_line_error(capsys, "eval", d, "--data", "digits", "--threads", "1")
    assert expected in err, err


@pytest.mark.parametrize("family", ["crate_mae", "crate_gpt", "crate_bert", "tost", "tost_lm", "crate_alpha", "vit"])
def test_every_family_bounds_the_sizes_of_its_config_json(tmp_path: Path, family: str) -> None:
    model = tiny.family_builders()[family]()
    d = _without_file_checksums(model.save_pretrained(tmp_path / "m"))
    saved = (d / "config.json").read_text()
    assert ct.from_pretrained(d).state_dict().keys() == model.state_dict().keys()  # an intact folder loads
    counts = {"tost": ["cls_layers"]}.get(family, [])
    for field in ("depth", *counts, "dim", *(["block_size"] if model.config.kind == "language model" else [])):
        (d / "config.json").write_text(saved)
        _without_file_checksums(d, **{field: 10**9})
        with pytest.raises(ValueError, match=rf"config\.json: {field}=1,000,000,000 does not fit the weights") as e:
            ct.from_pretrained(d)
        if field in ("depth", *counts):  # a count of blocks is named with the blocks the keys number
            assert f"their keys number {getattr(model.config, field)} blocks" in str(e.value)


def test_ablate_names_a_training_option_as_its_train_args_entry(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``crate ablate`` takes most training options as ``--train-args KEY=VALUE``: a bad one is named so, not as a
    flag it does not have; one of its own flags (``--epochs``) keeps its flag."""
    out = ["--out", tmp_path / "sweep"]
    err = one_line_error(capsys, "ablate", "13", "--train-args", "batch_size=0", *out)
    assert "--train-args batch_size must be a positive integer, got 0; e.g. --train-args batch_size=64" in err, err
    err = one_line_error(capsys, "ablate", "13", "--train-args", "lr=abc", *out)
    assert "--train-args lr must be a number, got 'abc' (str)" in err, err
    err = one_line_error(capsys, "ablate", "13", "--train-args", "epochs=x", *out)
    assert "--train-args epochs must be an integer, got 'x' (str); e.g. --train-args epochs=40" in err, err
    err = one_line_error(capsys, "ablate", "13", "--model-args", "depth=0", *out)
    assert "--model-args depth must be a positive integer, got 0" in err, err
    from clitools import flags_of

    from crate_transformer.cli.ablate import _flags
    from crate_transformer.cli.messages import cli_message

    flags = _flags(
        flags_of("ablate").actions, {"lr"}
    )  # lr given in --train-args: named there; epochs has a flag of ablate's
    text = "epochs=3, lr=0.1, max_steps, task='lm', ct.list_models(), split='val', seeds"
    assert cli_message(text, flags, ("max_steps", "seeds")) == (
        "--epochs 3, --train-args lr=0.1, --train-args max_steps, crate train-lm, crate models, split='val', --seeds"
    )
