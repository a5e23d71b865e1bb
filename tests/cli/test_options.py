"""Numeric options: one rule (:class:`~crate_transformer.config_utils.Range`) for the command line and the API.

Each option is checked when the command line is read, before a model is loaded, data is read or a run folder is
made: a value out of range or not finite is a one-line error naming the option, its range and the value given.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import tiny
import torch
from clitools import one_line_error

from crate_transformer import cli
from crate_transformer.analysis.segmentation import cosine_affinity
from crate_transformer.config_utils import Range
from crate_transformer.models.lm import LMConfig, build_lm, sample_next
from crate_transformer.models.tokenizer import Tokenizer
from crate_transformer.train.dino import DINOOptions

LM_TINY = tiny.LM


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = build_lm(LMConfig(**LM_TINY))
    model.tokenizer = Tokenizer.byte_level()
    return model.save_pretrained(tmp_path_factory.mktemp("lm") / "m")


def test_range_words_and_checks() -> None:
    r = Range(0, 1, lo_open=True, note="1 = off")
    assert r.words() == " in (0, 1]"
    assert [r.ok(v) for v in (0.0, 1e-9, 1.0, 1.5, float("nan"), float("inf"), True)] == [
        False, True, True, False, False, False, False,
    ]  # fmt: skip
    assert Range(0, integer=True).ok(3) and not Range(0, integer=True).ok(2.5)
    with pytest.raises(ValueError, match=r"^top_p must be a finite number in \(0, 1\] \(1 = off\), got 1.5$"):
        r.check("top_p", 1.5)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["pretrain", "mae", "--probe-c", "0"], "--probe-c must be a finite number > 0, got 0.0"),
        (["pretrain", "mae", "--probe-c", "-1"], "--probe-c must be a finite number > 0, got -1.0"),
        (["pretrain", "mae", "--mask-ratio", "nan"], "--mask-ratio must be a finite number in (0, 1), got nan"),
        (
            ["train-lm", "--sample-tokens", "-5"],
            "--sample-tokens must be a non-negative integer (0 = no sample), got -5",
        ),
        (["train-lm", "--model-args", "eta=inf"], "--model-args eta must be a finite number > 0, got inf"),
        (["train", "--model-args", "eta=nan"], "--model-args eta must be a finite number > 0, got nan"),
        (["pretrain", "dino", "--global-crops-scale", "0.5"], "global_crops_scale takes two area fractions LO HI"),
        (["pretrain", "dino", "--global-crops-scale", "0.5", "nan"], "--global-crops-scale must be a finite number"),
        (["pretrain", "dino", "--teacher-temp", "nan"], "--teacher-temp must be a finite number > 0, got nan"),
        (["pretrain", "dino", "--flip", "2"], "--flip must be a finite number in [0, 1], got 2.0"),
        (["train", "--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    ],
)
def test_training_options_are_refused_before_a_run_folder_exists(
    argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    err = one_line_error(capsys, *argv, "--out", out)
    assert expected in err
    assert not out.exists()  # refused when the command line was read, not after setup or training


@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("--temperature", "nan", "--temperature must be a finite number >= 0 (0 = greedy), got nan"),
        ("--temperature", "-1", "--temperature must be a finite number >= 0 (0 = greedy), got -1.0"),
        ("--top-p", "1.5", "--top-p must be a finite number in (0, 1] (1 = off), got 1.5"),
        ("--top-p", "95", "--top-p must be a finite number in (0, 1] (1 = off), got 95.0"),
        ("--top-p", "nan", "--top-p must be a finite number in (0, 1] (1 = off), got nan"),
        ("--top-k", "-3", "--top-k must be a non-negative integer, got -3"),
    ],
)
def test_generate_options(lm_dir: Path, flag: str, value: str, expected: str, capsys: pytest.CaptureFixture) -> None:
    assert expected in one_line_error(capsys, "generate", lm_dir, flag, value, "--max-new-tokens", 2)


def test_the_api_refuses_what_the_cli_refuses() -> None:
    logits = torch.randn(2, 10)
    for kw, msg in (({"temperature": float("nan")}, "temperature must be"), ({"top_p": 1.5}, "top_p must be"),
                    ({"top_p": float("nan")}, "top_p must be")):  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            sample_next(logits, **kw)
    with pytest.raises(ValueError, match="eta must be a finite number > 0, got inf"):
        LMConfig(**LM_TINY, eta=float("inf"))
    with pytest.raises(ValueError, match="global_crops_scale takes two area fractions"):
        DINOOptions(global_crops_scale=[0.5])
    with pytest.raises(ValueError, match="tau must be a finite number in"):
        cosine_affinity(torch.randn(4, 3), tau=float("nan"))


@pytest.mark.parametrize("value", ["nan", "1.5", "inf"])
def test_analyze_tau(lm_dir: Path, value: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = one_line_error(capsys, "analyze", lm_dir, "--tau", value, "--out", tmp_path / "a")
    assert "--tau must be a finite number in (-1, 1)" in err
    assert not (tmp_path / "a").exists()


def test_help_shows_the_range(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cli.main(["pretrain", "mae", "--help"])
    assert "> 0)" in capsys.readouterr().out  # --probe-c's range, from the same Range the check uses


# --------------------------------------------------------------------------- options that cannot apply are refused
def test_model_args_given_twice_are_merged(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from crate_transformer.cli import build_parser
    from crate_transformer.cli.options import given_options

    argv = ["train", "--model-args", "dim=16", "heads=2", "--model-args", "depth=1"]
    args = build_parser("train").parse_args(argv)
    assert given_options(args)["model_args"] == {"dim": 16, "heads": 2, "depth": 1}  # not only depth
    args = build_parser("eval").parse_args(["eval", "x", "--model-args", "dim=16", "--model-args", "depth=1"])
    assert args.model_args == ["dim=16", "depth=1"]
    err = one_line_error(capsys, "train", "--model-args", "dim=16", "--model-args", "dim=24", "--out", tmp_path / "r")
    assert "--model-args sets dim twice (16 and 24); keep one" in err
    assert not (tmp_path / "r").exists()


def _refused_on_resume(capsys: pytest.CaptureFixture, command: list[str], run: Path, extra: list, msg: str) -> None:
    """``extra`` given with ``--resume run`` is refused in one line; config.yaml and the state are untouched."""
    from crate_transformer.train import load_training_state

    before, step = (run / "config.yaml").read_text(), load_training_state(run)["step"]
    err = one_line_error(capsys, *command, "--resume", run, *extra)
    assert msg in err, err
    assert (run / "config.yaml").read_text() == before  # not recorded
    assert load_training_state(run)["step"] == step


MAE_ARGS = ["--data", "digits", "--threads", 1, "--no-progress", "--no-probe", "--no-recognition", "--eval-every",
            0, "--figure-images", 0, "--model-args", "image_size=8", "patch_size=4", "dim=16", "depth=1",
            "heads=2"]  # fmt: skip


def test_mae_resume_refuses_another_mask_ratio(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "mae"
    assert cli.main(["pretrain", "mae", *map(str, MAE_ARGS), "--max-steps", "1", "--out", str(run)]) == 0
    msg = "keeps the mask_ratio of its checkpoint (0.75), not 0.5; drop --mask-ratio 0.5 to continue it"
    _refused_on_resume(capsys, ["pretrain", "mae"], run, ["--mask-ratio", 0.5], msg)
    assert cli.main(["pretrain", "mae", "--resume", str(run), "--mask-ratio", "0.75", "--max-steps", "1"]) == 0


def test_lm_resume_refuses_another_tokenizer_or_vocabulary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i}: the value of x is {i * i}.\n" for i in range(120)))
    run = tmp_path / "gpt"
    args = ["--data", corpus, "--threads", 1, "--no-progress", "--batch-size", 4, "--eval-every", 0, "--sample-tokens",
            0, "--model-args", "dim=16", "depth=1", "heads=2", "block_size=16"]  # fmt: skip
    assert cli.main([str(a) for a in ["train-lm", *args, "--max-steps", 1, "--out", run]]) == 0
    other = tmp_path / "other.json"
    Tokenizer.byte_level().save(other)
    for extra, msg in [
        (["--tokenizer", other], f"keeps the tokenizer of its checkpoint ('byte'), not '{other}'; drop --tokenizer"),
        (["--tokenizer", "bpe"], "keeps the tokenizer of its checkpoint ('byte'), not 'bpe'"),
        # a byte-level run's vocab_size is read by no tokenizer: refused as an option that cannot apply
        (["--vocab-size", 512], "--vocab-size applies only when --tokenizer is bpe / wordpiece; --tokenizer is byte"),
    ]:
        _refused_on_resume(capsys, ["train-lm"], run, extra, msg)


def test_dino_resume_refuses_another_head(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "dino"
    args = ["--data", "digits", "--threads", 1, "--no-progress", "--batch-size", 64, "--eval-every", 0,
            "--train-subset", 128, "--model-args", "image_size=8", "patch_size=4", "dim=16", "depth=1", "heads=2",
            "--out-dim", 64, "--hidden-dim", 32, "--bottleneck-dim", 16]  # fmt: skip
    assert cli.main([str(a) for a in ["pretrain", "dino", *args, "--max-steps", 1, "--out", run]]) == 0
    msg = "keeps the out_dim of its checkpoint (64), not 128; drop --out-dim 128 to continue it"
    _refused_on_resume(capsys, ["pretrain", "dino"], run, ["--out-dim", 128], msg)


def test_analyze_refuses_options_of_the_other_kind_of_model(
    lm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import crate_transformer as ct

    (tmp_path / "imgs").mkdir()
    err = one_line_error(capsys, "analyze", lm_dir, "--images", tmp_path / "imgs", "--out", tmp_path / "a")
    assert "--images does not apply to a language model" in err
    err = one_line_error(capsys, "analyze", lm_dir, "--masks", 5, "--out", tmp_path / "a")
    assert "--masks does not apply to a language model" in err
    image = ct.create_model("crate_mnist", image_size=8, patch_size=4, dim=16, depth=1, heads=2, num_classes=10)
    d = image.save_pretrained(tmp_path / "img")
    err = one_line_error(capsys, "analyze", d, "--num-blocks", 8, "--data", "digits", "--out", tmp_path / "a")
    assert "--num-blocks does not apply to an image model" in err
    err = one_line_error(capsys, "analyze", d, "--num-blocks", 64, "--data", "digits", "--out", tmp_path / "a")
    assert "--num-blocks does not apply to an image model" in err  # at its default too: given is what is written
    assert not (tmp_path / "a").exists()


# --------------------------------------------------------------------------- report folders are never replaced silently
@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import crate_transformer as ct

    torch.manual_seed(0)
    model = ct.create_model(
        "crate_mnist", image_size=8, patch_size=4, dim=16, depth=1, heads=2, num_classes=10, in_chans=1
    )
    return model.save_pretrained(tmp_path_factory.mktemp("img") / "m")


def test_eval_never_replaces_an_earlier_report_without_overwrite(
    image_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "ev"
    base = ["eval", str(image_dir), "--data", "digits", "--batch-size", "256"]
    assert cli.main([*base, "--out", str(out)]) == 0
    first = (out / "eval.json").read_text()
    assert "top1" in first and (out / "confusion.png").is_file()
    err = one_line_error(capsys, *base, "--knn", "--out", out)
    assert f"--out {out} is not empty; pass --overwrite" in err
    assert (out / "eval.json").read_text() == first  # the top-1, per-class and confusion numbers are kept
    assert cli.main([*base, "--knn", "--out", str(out), "--overwrite"]) == 0
    assert "knn" in json.loads((out / "eval.json").read_text())
    assert not (out / "confusion.png").exists()  # no stale figure of the earlier report beside the new one
    assert (out / "knn.png").is_file()
    # --overwrite replaces only an earlier report of the same command
    other = tmp_path / "notes"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    err = one_line_error(capsys, *base, "--out", other, "--overwrite")
    assert "holds no earlier crate eval report (eval.json)" in err
    assert (other / "notes.txt").read_text() == "mine" and len(list(other.iterdir())) == 1
    # the default folder: a fresh one per evaluation
    assert cli.main(base) == 0 and cli.main(base) == 0
    assert (image_dir / "eval-digits-test" / "eval.json").is_file()
    assert (image_dir / "eval-digits-test-2" / "eval.json").is_file()


def test_analyze_never_replaces_an_earlier_report_without_overwrite(
    lm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i}: the value of x is {i * i}.\n" for i in range(200)))
    model = Path(shutil.copytree(lm_dir, tmp_path / "m"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    base = ["analyze", str(model), "--data", str(corpus), "--num-blocks", "4", "--batch-size", "4"]
    assert cli.main(base) == 0 and cli.main(base) == 0  # m/analysis, then m/analysis-2: nothing replaced
    assert f"wrote {model / 'analysis-2' / 'report.html'}" in capsys.readouterr().out
    assert (model / "analysis" / "report.json").is_file() and (model / "analysis-2" / "report.json").is_file()
    assert not any((tmp_path / "elsewhere").iterdir())  # nothing in the folder the command ran from
    monkeypatch.chdir(tmp_path)
    assert cli.main([*base, "--out", "analysis"]) == 0  # --out chooses another place
    first = (tmp_path / "analysis" / "report.json").read_text()
    err = one_line_error(capsys, *base, "--out", "analysis")
    assert "--out analysis is not empty; pass --overwrite" in err
    assert (tmp_path / "analysis" / "report.json").read_text() == first
    (tmp_path / "analysis" / "stale.png").write_bytes(b"x")
    (tmp_path / "analysis" / "mine.txt").write_text("mine")
    assert cli.main([*base, "--out", "analysis", "--overwrite"]) == 0
    assert not (tmp_path / "analysis" / "stale.png").exists()  # an earlier figure is not left beside the report
    assert (tmp_path / "analysis" / "mine.txt").read_text() == "mine"  # files of others stay


def test_reports_go_inside_what_they_describe(tmp_path: Path) -> None:
    from crate_transformer.cli.reports import report_home

    run, model = tmp_path / "run", tmp_path / "run" / "model"
    model.mkdir(parents=True)
    (run / "config.yaml").write_text("task: classification\n")
    (run / "checkpoints").mkdir()
    (tmp_path / "loose").mkdir()
    assert report_home(run) == run and report_home(model) == model
    assert report_home(model / "model.safetensors") == model
    assert report_home(run / "checkpoints" / "last.pt") == run  # a training state: its run
    assert report_home(tmp_path / "loose" / "last.pt") == tmp_path / "loose" / "last"  # not in a run
    assert report_home(tmp_path / "crate_small.pth") == tmp_path / "crate_small"  # an official file: beside it
    assert report_home("hf-hub:my-org/crate-small") == Path("my-org--crate-small")  # not in the Hub cache


# --------------------------------------------------------------------------- the wrong kind of model for a command
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["pretrain", "mae", "--model", "crate_gpt_mini"],
         "crate_gpt_mini is a language model, and crate pretrain mae trains a masked autoencoder (e.g. --model "
         "crate_mae_mnist); train crate_gpt_mini with crate train-lm --model crate_gpt_mini"),
        (["pretrain", "mae", "--model", "crate_mnist"], "crate_mnist is an image classifier, and crate pretrain mae"),
        (["pretrain", "dino", "--model", "crate_mae_mnist"],
         "crate_mae_mnist is a masked autoencoder, and crate pretrain dino trains an image classifier"),
        (["train-lm", "--model", "crate_mnist"], "crate_mnist is an image classifier, and crate train-lm trains a "
         "language model"),
        (["train-lm", "--vocab-size", "512"], "--vocab-size applies only when --tokenizer is bpe / wordpiece; "
         "--tokenizer is byte: drop --vocab-size or pass --tokenizer bpe"),
    ],
)  # fmt: skip
def test_the_wrong_kind_of_model_is_refused_before_a_run_folder_exists(
    argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert expected in one_line_error(capsys, *argv, "--out", tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_generate_reads_the_tokenizer_of_a_training_state(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from crate_transformer.loading.pipeline import load_model

    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i}: the value of x is {i * i}.\n" for i in range(120)))
    run = tmp_path / "gpt"
    args = ["--data", corpus, "--threads", 1, "--no-progress", "--batch-size", 4, "--eval-every", 0, "--sample-tokens",
            0, "--model-args", "dim=16", "depth=1", "heads=2", "block_size=16", "--tokenizer", "bpe", "--vocab-size",
            300]  # fmt: skip
    assert cli.main([str(a) for a in ["train-lm", *args, "--max-steps", 1, "--out", run]]) == 0
    state = load_model(run / "checkpoints" / "last.pt")
    saved = load_model(run)
    assert state.tokenizer is not None and state.tokenizer.to_str() == saved.tokenizer.to_str()  # the trained BPE
    gen = ["generate", "--prompt", "line 3", "--max-new-tokens", 6, "--seed", 1]
    texts = []
    for source in (run / "checkpoints" / "last.pt", run):
        capsys.readouterr()
        assert cli.main([str(a) for a in [gen[0], source, *gen[1:]]]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].startswith("line 3")


def test_a_language_model_refuses_an_empty_batch_in_one_line() -> None:
    model = build_lm(LMConfig(**LM_TINY))
    empty = torch.zeros(0, 4, dtype=torch.long)
    for call in (lambda: model(empty), lambda: model.generate(empty, 2)):
        with pytest.raises(ValueError, match=r"^empty batch \(0 sequences of tokens\); pass at least one sequence$"):
            call()


# the words of Range.message / Range.requirement ("must be a finite number in (0, 1]", "must be a positive
# integer", "must be >= 1", ...): a string of the package that says them itself checks a range by hand
RANGE_WORDS = re.compile(
    r"must be (a (finite )?number|an? (positive|non-negative) (integer|number)|an integer(?! index)|[<>]=? ?-?\d"
    r"|in [\[(]-?\d|between)"
)


def _range_strings(path: Path) -> list[str]:
    import ast

    return [
        f"{path.name}:{node.lineno}: {node.value.strip()[:80]}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and RANGE_WORDS.search(node.value)
    ]


def test_the_range_words_are_found() -> None:  # the scan below cannot pass by matching nothing
    found = (
        "batch_size must be >= 1, got ",
        "val_fraction must be in [0, 1), got",
        " must be a positive integer",
        "mask_ratio must be a number in (0, 1)",
        "x must be a finite number > 0",
        "n must be >= 0 or -1",
    )
    for text in found:
        assert RANGE_WORDS.search(text), text
    for text in ("layer must be an integer index, got", "data must be a DataSpec", "must be a multiple of 4"):
        assert not RANGE_WORDS.search(text), text


def test_one_numeric_range_implementation() -> None:
    """Every numeric range check of the package words its error through ``Range`` (``config_utils``): no module
    writes "must be >= 1" or "must be in (0, 1)" itself, so the API and the command line say the same thing."""
    import crate_transformer

    src = Path(crate_transformer.__file__).parent
    found = [s for p in sorted(src.rglob("*.py")) if p.name != "config_utils.py" for s in _range_strings(p)]
    assert not found, "\n".join(found)


def _erase() -> None:
    from crate_transformer.train.mix import random_erasing

    random_erasing(float("nan"))


def _batches() -> None:
    from crate_transformer.analysis._common import iter_batches

    next(iter_batches(torch.zeros(2, 1, 8, 8), float("nan"), None))


def _top_k() -> None:
    sample_next(torch.zeros(1, 5), top_k=float("nan"))


def _seed() -> None:
    from crate_transformer.theory.runner import run_experiment

    run_experiment("tweedie", seed=1.5)


@pytest.mark.parametrize(
    "call, message",
    [  # a NaN batch size or top_k got past the hand-written "< 1" checks (a TypeError later); now Range refuses it
        (_batches, r"^batch_size must be a positive integer, got nan$"),
        (_top_k, r"^top_k must be a positive integer, got nan$"),
        (_erase, r"^p must be a finite number in \[0, 1\], got nan; p is the probability of erasing a box$"),
        (_seed, r"^seed must be a non-negative integer, got 1.5$"),
    ],
)
def test_range_checks_refuse_non_finite_values_in_ranges_words(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()
