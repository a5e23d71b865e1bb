"""The one side-file reader and the one folder writer decide by what the path is (docs/robustness.md, "What a path
is"): every kind of path, made for real, under each reader and writer of ``crate_transformer.io``; a device or a FIFO
is named and never opened (a read of either would never end, which the deadline turns into a failure)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny
from pathkinds import NOT_A_FILE, NOT_A_FOLDER, deadline, make

import crate_transformer as ct
from crate_transformer import io


def test_path_kind_names_each_kind_without_opening_it(tmp_path: Path) -> None:
    expected = {
        "a folder": "folder",
        "a broken link": "broken link",
        "a link to a device": "device",
        "a FIFO": "FIFO",
        "a socket": "socket",
        "a file": "file",
    }
    with deadline(30):
        for kind, word in expected.items():
            path = make(tmp_path / kind.replace(" ", "_"), kind)
            assert io.path_kind(path) == word, kind
            said = io.describe_path(path)
            assert said.startswith((NOT_A_FILE | NOT_A_FOLDER)[kind]), (kind, said)
        assert io.path_kind("") == "empty path" and io.path_kind(tmp_path / "none") == "missing"
        assert io.path_kind(tmp_path / "a_file" / "under") == "missing"  # a path under a file
        assert "(a symbolic link to /dev/zero)" in io.describe_path(tmp_path / "a_link_to_a_device")


@pytest.mark.parametrize("form", io.SIDE_FORMS)
@pytest.mark.parametrize("kind", NOT_A_FILE)
def test_read_side_file_names_what_the_path_is_and_never_reads_it(tmp_path: Path, kind: str, form: str) -> None:
    path = make(tmp_path / "trackers.json", kind)
    with deadline(30), pytest.raises(io.DamagedFileError) as e:
        io.read_side_file(path, "delete it", form=form, missing={})  # a default for a missing file: not this one
    message = str(e.value)
    assert message.startswith(f"{path} {NOT_A_FILE[kind]}") and message.endswith(", not a file; delete it")
    assert len(message.splitlines()) == 1


def test_read_side_file_missing_is_refused_or_the_default(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert io.read_side_file(path, "fix", form="jsonl", missing=[]) == []
    with pytest.raises(io.DamagedFileError, match=f"cannot read {path} .*; fix$"):
        io.read_side_file(path, "fix")
    path.write_text('{"a": 1}\n')
    assert io.read_side_file(path, "fix", form="jsonl", missing=[]) == [{"a": 1}]


@pytest.mark.parametrize("kind", NOT_A_FILE)
def test_every_weights_reader_names_what_the_path_is(tmp_path: Path, kind: str) -> None:
    path = make(tmp_path / "model.safetensors", kind)
    readers = {
        "load_pickle": lambda: io.load_pickle(path),
        "load_state": lambda: io.load_state(path),
        "load_safetensors": lambda: io.load_safetensors(path),
        "read_safetensors_metadata": lambda: io.read_safetensors_metadata(path),
    }
    for name, read in readers.items():
        with deadline(30), pytest.raises(io.CheckpointError) as e:
            read()
        assert str(path) in str(e.value) and NOT_A_FILE[kind] in str(e.value), (name, str(e.value))


@pytest.mark.parametrize("kind", NOT_A_FILE)
@pytest.mark.parametrize("name", io.MODEL_FILES)
def test_from_pretrained_names_each_model_file_that_is_not_a_file(tmp_path: Path, name: str, kind: str) -> None:
    folder = ct.create_model("crate_mnist", **tiny.DIGITS_ONE_LAYER).save_pretrained(tmp_path / "m")
    path = make(folder / name, kind)
    with deadline(30), pytest.raises(io.CheckpointError) as e:
        ct.from_pretrained(folder)
    assert str(e.value).startswith(f"{path} {NOT_A_FILE[kind]}"), str(e.value)
    with deadline(30), pytest.raises(io.CheckpointError, match=f"^{path} "):
        ct.load_model(folder)


@pytest.mark.parametrize("kind", NOT_A_FOLDER)
def test_make_folder_and_save_pretrained_name_a_target_that_is_no_folder(tmp_path: Path, kind: str) -> None:
    target = make(tmp_path / "out", kind)
    model = ct.create_model("crate_mnist", **tiny.DIGITS_ONE_LAYER)
    for write in (io.make_folder, model.save_pretrained, lambda t: io.write_json(t / "x.json", {})):
        with deadline(30), pytest.raises(io.WriteError) as e:
            write(target)
        assert NOT_A_FOLDER[kind] in str(e.value) and str(target) in str(e.value), str(e.value)
        assert len(str(e.value).splitlines()) == 1
    with pytest.raises(io.WriteError, match=f"cannot create folder {target / 'sub'}: {target} "):
        io.make_folder(target / "sub")  # a path under it


def test_save_pretrained_into_a_broken_link_says_so_and_writes_nothing(tmp_path: Path) -> None:
    link = make(tmp_path / "model", "a broken link")
    with pytest.raises(io.WriteError, match="is a broken symbolic link .*; remove it or pass another path$"):
        ct.create_model("crate_mnist", **tiny.DIGITS_ONE_LAYER).save_pretrained(link)
    assert not (tmp_path / "nothing-here").exists()


def test_an_empty_path_is_refused_by_every_writer_and_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # "" would be this folder: nothing may be written into it
    model = ct.create_model("crate_mnist", **tiny.DIGITS_ONE_LAYER)
    for write in (model.save_pretrained, io.make_folder, lambda p: io.write_json(p, {})):
        with pytest.raises(io.WriteError, match="empty path"):
            write("")
    for load in (ct.from_pretrained, ct.load_model):
        with pytest.raises(io.CheckpointError, match="^an empty path names no model"):
            load("")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", NOT_A_FILE)
def test_atomic_write_names_a_target_file_that_is_not_a_file(tmp_path: Path, kind: str) -> None:
    target = make(tmp_path / "x.json", kind)
    with deadline(30), pytest.raises(io.WriteError, match=f"^{target} {NOT_A_FILE[kind]}.*remove it"):
        io.write_json(target, {})
    assert io.path_kind(target) == io.path_kind(make(tmp_path / "again", kind))  # left as it was
    link = tmp_path / "to_file.json"  # a link to a regular file is replaced by the file, as before
    link.symlink_to(make(tmp_path / "file.json", "a file"))
    io.write_json(link, {"a": 1})
    assert io.read_side_file(link, "fix") == {"a": 1} and not link.is_symlink()
