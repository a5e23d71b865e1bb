"""Every message a user sees is found in the source by a plain text search (issue 47, item 3).

A library message is one plain string written where it is raised (an f-string naming Python arguments); the
command line translates its names into flags in one place (``cli/messages.py``).  For a bad invocation of every
``crate`` command and for a sample of Python API mistakes, each literal fragment of the library's sentence (the
text between the values interpolated into it) is searched for in ``src/``: a sentence assembled from pieces
elsewhere (the earlier ``Opt("lr")`` places, worded by a context) is not found, and the test fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from clitools import flags_of

import crate_transformer
from crate_transformer import cli
from crate_transformer.models.contract import KINDS

SRC = Path(crate_transformer.__file__).parent
# the library's own words that its messages interpolate: what a Range says of itself (Range.requirement: "must be
# {kind}{words}") and the kinds of model (train.task: "{model} is {_a(kind)}")
RANGE_WORDS = ("a positive integer", "a non-negative integer", "an integer", "a finite number", "a number")
KIND_WORDS = tuple(f"{'an' if k[0] in 'aeiou' else 'a'} {k}" for k in KINDS) + KINDS
VALUE = re.compile(
    r"(?<!\w)'(?:[^'\\]|\\.)*'|(?<!\w)\"(?:[^\"\\]|\\.)*\""  # quoted text
    r"|\[[^\]]*\]|\{[^}]*\}|\([^()]*\d[^()]*\)|\(\w+\)"  # [..], {..}, (1, 2), a type: (str)
    r"|[\w./~-]*/[\w./~…-]*|\b\d[\d.,:e+x%-]*\b|\b[\w-]+\.(?:txt|csv|json|yaml|pt)\b"  # paths, numbers, files
    r"|\b[\w-]+(?: /|,) [\w-]+(?:(?: /|,) [\w-]+)*\b"  # a listing of names: "sgd / lars", "all, ista, tweedie"
    + "".join(f"|{w}" for w in sorted(RANGE_WORDS + KIND_WORDS, key=len, reverse=True))
)


def corpus() -> str:
    """The text of every module, with a string literal split over lines joined back (``"... "\\n    "..."``)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py")))
    return re.sub(r"([\"'])\s*\n\s*[rf]*\1", "", text)


def fragments(message: str, values: tuple[str, ...] = ()) -> list[str]:
    """The literal pieces of ``message``: what lies between the values put into it (quoted text, numbers, paths,
    the invocation's own arguments ``values``), each of two words or more."""
    message = VALUE.sub("\0", message)
    for value in sorted((v for v in values if len(v) >= 2), key=len, reverse=True):  # whole words only
        message = re.sub(rf"(?<![\w-]){re.escape(value)}(?![\w-])", "\0", message)
    return [p.strip(" ;:,.()") for p in message.split("\0") if len(re.findall(r"[A-Za-z]{2,}", p)) >= 2]


def missing(message: str, values: tuple[str, ...] = ()) -> list[str]:
    text = SOURCE()
    return [f for f in fragments(message, values) if f not in text]


_SOURCE: list[str] = []


def SOURCE() -> str:  # noqa: N802 - read once per session
    if not _SOURCE:
        _SOURCE.append(corpus())
    return _SOURCE[0]


# --------------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A saved image classifier and a saved language model (with its tokenizer), built untrained."""
    import crate_transformer as ct

    root = tmp_path_factory.mktemp("models")
    image = ct.create_model("crate_mnist", image_size=8, patch_size=4, in_chans=1, dim=16, depth=1, heads=2)
    lm = ct.create_model("crate_gpt_mini", vocab_size=262, block_size=16, dim=16, depth=1, heads=2)
    lm.tokenizer = ct.Tokenizer.byte_level()
    return {"image": image.save_pretrained(root / "image"), "lm": lm.save_pretrained(root / "lm")}


def _cases(t: Path, f: dict[str, Path]) -> list[list[str]]:
    """A bad invocation of every command (each fails while its options are checked, before any training)."""
    out, img, lm = str(t / "run"), str(f["image"]), str(f["lm"])
    return [
        ["train", "--model", "crate_gpt_mini", "--out", out],
        ["train", "--data", "digits", "--image-size", "8", "--model-args", "depth=0", "--out", out],
        ["train", "--data", "digits", "--optimizer", "adamw", "--momentum", "0.5", "--out", out],
        ["finetune", "--from", lm, "--data", "digits", "--out", out],
        ["pretrain", "mae", "--model", "crate_gpt_mini", "--out", out],
        ["pretrain", "dino", "--model", "crate_gpt_mini", "--out", out],
        ["train-lm", "--model", "crate_mnist", "--out", out],
        ["train-lm", "--model-args", "tokenizer=bpe", "--out", out],
        ["finetune-text", "--out", out],
        ["eval", img, "--device", "cuda:7"],
        ["analyze", img, "--device", "cuda:7", "--out", out],
        ["generate", img, "--prompt", "a"],
        ["features", img, "--device", "cuda:7", "--out", out],
        ["ablate", "13", "--train-args", "batch_size=0", "--out", out],
        ["theory", "no_such_experiment"],
        ["models", "no_such_model_xyz"],
    ]


def _run(argv: list[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> tuple[str, object]:
    """The line ``crate`` printed for ``argv`` and the exception it came from."""
    caught: list[BaseException] = []
    shown = cli.error_message

    def record(e: BaseException, *rest: object, **kw: object) -> str:
        caught.append(e)
        return shown(e, *rest, **kw)

    monkeypatch.setattr(cli, "error_message", record)
    monkeypatch.delenv("CRATE_DEBUG", raising=False)
    capsys.readouterr()
    assert cli.main(argv) == 2, argv
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"crate {argv[0]}") and ": error: " in line, line
    assert len(caught) == 1, argv
    return line.split(": error: ", 1)[1], caught[0]


def _values(argv: list[str]) -> tuple[str, ...]:
    """What an invocation puts into a message: its arguments, the names of its options, KEY and VALUE of KEY=VALUE."""
    out = []
    for a in argv:
        out += [a[2:].replace("-", "_")] if a.startswith("--") else [a, *a.split("=", 1)]
    return tuple(v for v in out if v)


def test_every_command_shows_a_sentence_found_in_the_source(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures, library = [], 0
    for argv in _cases(tmp_path, folders):
        line, e = _run(argv, capsys, monkeypatch)
        raised = str(e)  # the library's sentence, as its f-string wrote it (the CLI's words undone)
        library += getattr(e, "options", None) is not None
        values = _values(argv)
        assert fragments(raised, values), (argv, raised)  # something to search for
        failures += [f"{argv}: {raised!r} lacks {m!r}" for m in missing(raised, values)]
    assert not failures, "\n".join(failures)
    assert library >= 10  # most cases are the library's messages, not the CLI's own


def test_the_line_shown_is_the_cli_translation_of_the_raised_sentence(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``crate`` prints is the library's sentence through the one translation, with the command's flags, and
    no option of the command is left in its Python words (``name=value``)."""
    from crate_transformer.cli.messages import cli_message
    from crate_transformer.errors import OptionError

    translated = 0
    for argv in _cases(tmp_path, folders):
        line, e = _run(argv, capsys, monkeypatch)
        if not isinstance(e, OptionError) or argv[0] == "ablate":  # ablate's own table: tested by EXPECTED_FLAGS
            assert line == str(e) or argv[0] == "ablate", argv  # the CLI's own messages are shown as raised
            continue
        flags = flags_of(*(argv[:2] if argv[0] == "pretrain" else argv[:1]))
        assert line == cli_message(str(e), flags, e.options, e.within), argv
        plain = re.sub(r"--(model|train)-args \S+", "", line)  # a KEY=VALUE entry is the flag's own words
        left = [m[1] for m in re.finditer(r"(?<![\w-])(\w+)=", plain) if m[1] in flags.actions]
        assert not left, (argv, line)
        translated += line != str(e)
    assert translated >= 10  # the translation did something in most cases


EXPECTED_FLAGS = {  # a few lines in full: the flags named as the command takes them
    ("train", "--model-args", "depth=0"): "--model-args depth must be a positive integer, got 0; e.g. --model-args",
    ("ablate", "--train-args", "batch_size=0"): "--train-args batch_size must be a positive integer, got 0",
    ("train-lm", "--model-args", "tokenizer=bpe"): "not --model-args tokenizer=bpe; pass --tokenizer bpe instead",
    ("pretrain", "mae", "--model"): "crate pretrain mae trains a masked autoencoder (e.g. --model",
    ("finetune-text", "--out"): "crate finetune-text needs --data TABLE",
}


def test_flags_are_named_on_the_command_line(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for argv in _cases(tmp_path, folders):
        for key, expected in EXPECTED_FLAGS.items():
            if argv[0] == key[0] and all(k in argv for k in key[1:]):
                line, _ = _run(argv, capsys, monkeypatch)
                assert expected in line, (argv, line)


# --------------------------------------------------------------------------- the Python API
def _python_mistakes() -> list[tuple[Callable[[], object], tuple[str, ...]]]:
    """Mistakes in Python, each with the names and values it gives (what the message interpolates)."""
    import crate_transformer as ct
    from crate_transformer.data import open_source
    from crate_transformer.train import TrainConfig
    from crate_transformer.train.sharding import check_strategy
    from crate_transformer.train.threads import resolve_threads

    return [
        (lambda: ct.create_model("crate_mnist", depth=0), ("depth",)),
        (lambda: TrainConfig(lr=-1.0), ("lr",)),
        (lambda: TrainConfig(optimizer="adamw", momentum=0.5), ("momentum", "optimizer", "adamw")),
        (lambda: TrainConfig(eval_split="val", val_fraction=0.0), ()),
        (lambda: TrainConfig(epochs="x"), ("epochs",)),
        (lambda: resolve_threads(-1), ("threads",)),
        (lambda: open_source("digits", "train", mode="fast"), ("fast",)),
        (lambda: check_strategy("fsdp", 1, "classification"), ()),
        (lambda: check_strategy("fsdp", 2, "dino", shardable=False), ("dino",)),
    ]


def test_python_api_messages_are_found_in_the_source_and_name_python_arguments() -> None:
    failures = []
    for mistake, values in _python_mistakes():
        with pytest.raises(ValueError) as info:
            mistake()
        text = str(info.value)
        assert "--" not in text and "crate " not in text, text  # Python's words: no flag, no command
        assert fragments(text, values), text
        failures += [f"{text!r} lacks {m!r}" for m in missing(text, values)]
    assert not failures, "\n".join(failures)


def test_the_search_fails_on_a_sentence_assembled_elsewhere() -> None:
    """The check can fail: a sentence whose words are joined from places (as ``Opt("lr")`` was) is not found."""
    assert not missing("the corpus has 10 tokens, too few for a 16-token context")
    assert missing("lower lr, keep grad_clip on (e.g. 1.0) or use amp='none' to keep going")  # not in the source
    assert missing("crate_x is a language model; train it with the lm task model='crate_x'", ("crate_x",))
