"""``crate models --pretrained --check``: which of a release's addresses answered, and what to do when none did.

No network: the addresses are local files (``file://``) and a port on this machine nothing listens on."""

from __future__ import annotations

import socket

import pytest
from clitools import crate, one_line_error

from crate_transformer.loading import pretrained
from crate_transformer.models._registry import ZOO, PretrainedSource


def closed_port() -> str:
    """``http://127.0.0.1:PORT/`` of a port just freed: a connection there is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/crate.pth"


def fake(url: str, *sources: str, **kw: object) -> PretrainedSource:
    return PretrainedSource(name="crate_tiny", title="a fake release", loader="CRATE classifier",
                            filename="crate.pth", url=url, sources=sources, size="12 bytes", **kw)  # fmt: skip


def test_source_addresses_take_the_page_then_every_source_that_starts_with_an_address(tmp_path):
    src = fake("https://example.invalid/page", "github.com/owner/repo/issues/1 (a mirror in the thread)",
               "a colleague's copy, no address", f"{(tmp_path / 'x.pth').as_uri()}, a local copy",
               "https://example.invalid/page (the same page again)")  # fmt: skip
    assert pretrained.source_addresses(src) == [
        "https://example.invalid/page",
        "https://github.com/owner/repo/issues/1",
        (tmp_path / "x.pth").as_uri(),
    ]


def test_probe_says_which_address_answered(tmp_path):
    there = tmp_path / "crate.pth"
    there.write_bytes(b"not a model")
    refused, gone = closed_port(), (tmp_path / "gone.pth").as_uri()
    src = fake(refused, f"{gone} (deleted)", f"{there.as_uri()} (a copy)")
    with pytest.MonkeyPatch.context() as m:
        m.setitem(ZOO, "crate_tiny", src)
        answers = pretrained.probe_sources("crate_tiny", timeout=2, offline=False)
        offline = pretrained.probe_sources("crate_tiny", timeout=2, offline=True)
    assert [a.address for a in answers] == [refused, gone, there.as_uri()]
    assert [a.answered for a in answers] == [False, False, True]
    assert "refused" in answers[0].detail.lower() and "no such file" in answers[1].detail.lower()
    assert [a.answered for a in offline] == [False, False, True] and "not tried: offline" in offline[0].detail


def test_cli_names_the_source_that_answered(tmp_path, monkeypatch, capsys):
    there = tmp_path / "crate.pth"
    there.write_bytes(b"x")
    refused = closed_port()
    monkeypatch.setitem(ZOO, "crate_tiny", fake(refused, f"{there.as_uri()} (a copy)"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert crate("models", "--pretrained", "crate_tiny", "--check") == 0
    said = capsys.readouterr().out.splitlines()
    line = next(x for x in said if x.startswith("crate_tiny: answered by"))
    assert line.startswith(f"crate_tiny: answered by {there.as_uri()}") and f"no answer from {refused}" in line


def test_cli_says_what_to_do_when_no_source_answers(tmp_path, monkeypatch, capsys):
    refused = closed_port()
    src = fake(refused, f"{(tmp_path / 'gone.pth').as_uri()} (deleted)", "github.com/o/r/issues/9 (a re-host)",
               status="reported dead (o/r#9)")  # fmt: skip
    monkeypatch.setitem(ZOO, "crate_tiny", src)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the github.com address is then not tried: no network in tests
    assert crate("models", "--pretrained", "crate_tiny", "--check") == 0
    said = capsys.readouterr().out
    assert f"crate_tiny: no answer from {refused}: not tried: offline" in said
    fix = next(x for x in said.splitlines() if x.startswith("crate_tiny: none of its sources answered"))
    assert "(reported dead (o/r#9))" in fix and "github.com/o/r/issues/9 (a re-host)" in fix and "12 bytes" in fix
    assert fix.endswith("create_model('crate_tiny', pretrained=True, pretrained_file='PATH')")
    one_line_error(capsys, "models", "--check", match="pass it with --pretrained")
