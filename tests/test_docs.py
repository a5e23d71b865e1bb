"""The documentation stays true: every ``crate …`` command in a code block of the README and docs/ parses with
the real command-line parser (each flag spelled exactly as the parser defines it), every benchmark command names
a script and flags that exist, every relative link and image resolves (anchors included), and the README's
quick start runs verbatim."""

from __future__ import annotations

import argparse
import linecache
import os
import re
import shlex
import sys
import types
import unicodedata
from pathlib import Path

import pytest

from crate_transformer import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
SHELL = {"bash", "sh", "shell", "console", ""}


def code_blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text())]


def printed_outputs(page: Path) -> list[str]:
    """The lines of the output blocks (```text) that directly follow a Python block: what it prints, in order."""
    matches = list(FENCE.finditer(page.read_text()))
    return [
        line
        for before, m in zip(matches, matches[1:])
        if before.group(1) == "python"
        and m.group(1) == "text"
        and not page.read_text()[before.end() : m.start()].strip()
        for line in m.group(2).splitlines()
    ]


def shell_commands(text: str) -> list[list[str]]:
    """Each simple command of a shell block as argv (continuations joined, comments and prompts dropped)."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip().removeprefix("$ ")
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # not shell (e.g. program output inside a block)
        current: list[str] = []
        for w in [*words, "&&"]:
            if w in ("&&", "||", ";", "|"):
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(w)
    return commands


def crate_argv(words: list[str]) -> list[str] | None:
    """The arguments given to the ``crate`` CLI: ``crate ARGS`` or ``torchrun … -m crate_transformer.cli ARGS``."""
    if words[0] == "crate":
        return words[1:]
    if words[0] == "torchrun" and "crate_transformer.cli" in words:
        return words[words.index("crate_transformer.cli") + 1 :]
    return None


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for lang, text in code_blocks(page):
            if lang in SHELL:
                for words in shell_commands(text):
                    found.append((f"{page.relative_to(ROOT)}: {shlex.join(words)}", words))
    return found


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return None


def check_flags_exact(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """argparse accepts unambiguous prefixes (``--val`` for ``--val-fraction``); the docs must spell flags out."""
    known = {s for a in parser._actions for s in a.option_strings}
    for i, word in enumerate(argv):
        sub = _subparser(parser, word) if not word.startswith("-") else None
        if sub is not None:
            check_flags_exact(sub, argv[i + 1 :])
            return
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            assert flag in known, f"{flag} is not an option of `{parser.prog}` (only a prefix of one?)"


COMMANDS = documented_commands()
CRATE = [(where, argv) for where, words in COMMANDS if (argv := crate_argv(words)) is not None]


def test_the_docs_show_commands_of_every_crate_subcommand() -> None:
    used = {argv[0] for _, argv in CRATE if argv and not argv[0].startswith("-")}
    assert set(cli.COMMANDS) <= used, f"no documented example for: {sorted(set(cli.COMMANDS) - used)}"


@pytest.mark.parametrize("where,argv", CRATE, ids=[w for w, _ in CRATE])
def test_documented_crate_command_parses(where: str, argv: list[str]) -> None:
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = cli.build_parser(command)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        assert e.code == 0, f"{where}: the parser rejects it (exit {e.code})"  # --version / --help exit 0
        return
    assert getattr(args, "_run", None) is not None or argv == [], f"{where}: names no runnable command"
    check_flags_exact(parser, argv)


BENCH = [(w, words) for w, words in COMMANDS if len(words) > 1 and words[0] == "python" and "benchmarks/" in words[1]]


@pytest.mark.parametrize("where,words", BENCH, ids=[w for w, _ in BENCH])
def test_documented_benchmark_command_exists(where: str, words: list[str]) -> None:
    script = ROOT / words[1]
    assert script.is_file(), f"{where}: no such script"
    source = script.read_text()
    for flag in (w.split("=", 1)[0] for w in words[2:] if w.startswith("--")):
        assert f'"{flag}"' in source, f"{where}: {script.name} defines no {flag}"


# --------------------------------------------------------------------------- links
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (what mkdocs uses) gives a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        s = slug(m.group(1))
        out.add(s if s not in seen else f"{s}_{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


LINKS = [(page, target) for page in PAGES for target in relative_links(page)]


def test_the_pages_have_relative_links() -> None:
    assert len(LINKS) > 50 and any(p.name == "README.md" for p, _ in LINKS)


@pytest.mark.parametrize("page,target", LINKS, ids=[f"{p.relative_to(ROOT)}->{t}" for p, t in LINKS])
def test_relative_link_resolves(page: Path, target: str) -> None:
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.relative_to(ROOT)}: {target} does not exist"
    if dest.is_dir():
        dest = dest / "index.md"
    if anchor:
        assert dest.suffix == ".md", f"{page.relative_to(ROOT)}: anchor into a non-Markdown file {target}"
        assert anchor in anchors(dest), f"{page.relative_to(ROOT)}: {dest.name} has no heading #{anchor}"


def test_slug_matches_the_toc_extension() -> None:
    markdown = pytest.importorskip("markdown", reason="the docs extra installs Python-Markdown")
    from markdown.extensions.toc import slugify

    for page in PAGES:
        for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", page.read_text()), re.M):
            html = markdown.markdown("# " + m.group(1))  # rendered as a heading, as the page does
            plain = re.sub(r"<[^>]+>", "", html)
            assert slug(m.group(1)) == slugify(plain, "-"), m.group(1)


# --------------------------------------------------------------------------- quick start
def test_the_readme_quick_start_runs_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [text for lang, text in code_blocks(ROOT / "README.md") if lang == "python"]
    assert blocks, "the README has no Python quick start"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md quick start", "exec"), namespace)  # our own README's code
    assert (tmp_path / "my_crate" / "model.safetensors").is_file()
    assert namespace["logits"].shape == (8, 10)


def test_adding_a_model_runs_block_by_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/adding_a_model.md's Python blocks, run in order as one program, make a family that every entry point
    reaches (each block compiled alone, so a failure names it)."""
    from crate_transformer.models import _registry

    for table in ("_ARCHS", "_MODELS", "ZOO"):
        monkeypatch.setattr(_registry, table, dict(getattr(_registry, table)))  # the example's lines are undone
    blocks = [text for lang, text in code_blocks(ROOT / "docs" / "adding_a_model.md") if lang == "python"]
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("adding_a_model")  # a real module: dataclasses look their class's module up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"docs/adding_a_model.md, Python block {i}", "exec"), namespace)  # our own docs' code
    assert namespace["logits"].shape == (2, 10) and (tmp_path / "my_model" / "config.json").is_file()
    import crate_transformer as ct

    assert _registry.arch_info("my_arch").official is namespace["MY_FORMAT"]
    assert type(ct.from_pretrained(tmp_path / "my_model")) is namespace["MyModel"]


def test_the_backbone_page_runs_block_by_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """docs/backbone.md's Python blocks, in order as one program, print exactly what the page's output blocks show."""
    blocks = [text for lang, text in code_blocks(ROOT / "docs" / "backbone.md") if lang == "python"]
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"docs/backbone.md, Python block {i}", "exec"), namespace)  # our own docs' code
    said = capsys.readouterr().out.splitlines()
    shown = printed_outputs(ROOT / "docs" / "backbone.md")  # the page's output blocks, not trailing comments
    assert shown == [
        "torch.Size([2, 17, 128]) [(2, 128, 4, 4), (2, 128, 4, 4)]",
        "torch.Size([2, 128]) 128",
        "3 torch.Size([1, 3])",
        "(1, 28, 28) (1, 28, 28)",
    ]
    assert said == shown


def run_and_check_output_blocks(page: Path, capsys: pytest.CaptureFixture, blocks: int) -> dict:
    """Run ``page``'s Python blocks in order as one program (our own docs' code); each must print exactly the
    output block (```text) directly after it, and nothing where none follows.  Returns the program's namespace.
    Each block's source is registered in ``linecache`` (as a file's would be): nnsight reads a ``with`` body
    back from it."""
    text = page.read_text()
    matches = list(FENCE.finditer(text))
    namespace: dict = {}
    ran = 0
    for before, after in zip(matches, [*matches[1:], None]):
        if before.group(1) != "python":
            continue
        ran += 1
        name = f"{page.relative_to(ROOT)}, Python block {ran}"
        code = before.group(2)
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        capsys.readouterr()
        exec(compile(code, name, "exec"), namespace)
        follows = after is not None and after.group(1) == "text" and not text[before.end() : after.start()].strip()
        shown = after.group(2).splitlines() if follows else []
        printed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("[torch.onnx]")]
        assert printed == shown, name
    assert ran == blocks
    return namespace


def test_the_hf_page_runs_block_by_block_and_prints_its_output_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """docs/hf.md's Python blocks, in order as one program (the real transformers), print what the text blocks
    after them show."""
    monkeypatch.chdir(tmp_path)
    run_and_check_output_blocks(ROOT / "docs" / "hf.md", capsys, 3)
    assert printed_outputs(ROOT / "docs" / "hf.md")


def test_the_hooks_page_runs_block_by_block_and_prints_its_output_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """docs/hooks.md's Python blocks, in order as one program (the real nnsight and TransformerLens): caching,
    ablation, patching, steering a decoded token, nnsight's patch equal to the package's, the TransformerLens
    bridge's logits; each prints what the output block after it shows."""
    # no .save() mounted on every object (nnsight's default, process-wide: it shadows onnx_program.save)
    os.environ.setdefault("NNSIGHT_CONFIG", str(ROOT / "tests" / "nnsight.yaml"))
    pytest.importorskip("nnsight", reason="the interp extra installs nnsight and transformer-lens")
    pytest.importorskip("transformer_lens", reason="the interp extra installs nnsight and transformer-lens")
    monkeypatch.chdir(tmp_path)
    run_and_check_output_blocks(ROOT / "docs" / "hooks.md", capsys, 4)
    assert "True" in printed_outputs(ROOT / "docs" / "hooks.md")


def test_no_file_cites_documents_outside_the_repository() -> None:
    # the names are joined here so that this file does not itself contain them
    pattern = re.compile("|".join(["paper" + "_spec", r"anchors\.md", "shared" + "/notes"]))
    roots = [ROOT / d for d in ("src", "tests", "docs", "benchmarks", ".ci")]
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "mkdocs.yml", ROOT / "pyproject.toml"]
    files += [
        p
        for r in roots
        for p in r.rglob("*")
        if p.is_file() and p.suffix in {".py", ".md", ".ipynb", ".yml", ""} and ".egg-info" not in str(p)
    ]
    me = Path(__file__).resolve()
    offenders = [str(p.relative_to(ROOT)) for p in files if p.resolve() != me and pattern.search(p.read_text())]
    assert not offenders, offenders


def test_the_site_does_not_present_the_authors_repository_as_its_own() -> None:
    import yaml

    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert "Ma-Lab-Berkeley" not in str(site.get("repo_url", "")) + str(site.get("repo_name", ""))
    # it credits this package, cites the paper and names the authors' code as the reference it is checked against
    assert site["copyright"].startswith("crate_transformer: a PyTorch implementation of CRATE")
    assert "White-Box Transformers via Sparse Rate Reduction" in site["copyright"]
    assert "Ma-Lab-Berkeley/CRATE</a>, is the reference" in site["copyright"]


def test_ci_builds_the_docs_strictly() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in ci and ".[dev,docs]" in ci


def test_the_export_page_runs_block_by_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """docs/export.md's Python blocks, in order as one program: the classifier and CRATE-GPT through torch.export
    and ONNX, onnxruntime agreeing with PyTorch at another batch size and length, as their comments say."""
    pytest.importorskip("onnxruntime", reason="the dev extra installs onnx, onnxscript and onnxruntime")
    pytest.importorskip("onnxscript", reason="the dev extra installs onnx, onnxscript and onnxruntime")
    monkeypatch.chdir(tmp_path)
    run_and_check_output_blocks(ROOT / "docs" / "export.md", capsys, 2)
    assert printed_outputs(ROOT / "docs" / "export.md") == ["True", "True", "(3, 13, 262) True"]
    assert {p.name for p in tmp_path.iterdir()} == {"crate_mnist.onnx", "crate_gpt_mini.onnx"}


def test_the_reading_page_runs_and_checks_the_layer_against_the_equations(capsys: pytest.CaptureFixture) -> None:
    """docs/reading-the-layer.md's Python blocks, in order as one program: the layer, MSSA and ISTA equal the paper's
    equations (their assertions), and every block prints what the output block after it shows."""
    run_and_check_output_blocks(ROOT / "docs" / "reading-the-layer.md", capsys, 7)
    shown = printed_outputs(ROOT / "docs" / "reading-the-layer.md")
    assert "CRATE 2 EncoderLayer" in shown and "MSSA ISTA False" in shown and len(shown) == 6


def test_the_readme_test_command_says_when_the_browser_tests_are_skipped() -> None:
    """The README's ``python -m pytest`` on a machine without Chromium: the session's last lines name the skipped
    browser tests and the install, not only a count among the dots."""
    import subprocess

    test = "tests/analysis/test_explorer.py::test_hovering_a_token_colours_the_tokens_it_attends_to"
    env = {**os.environ, "CRATE_CHROMIUM": str(ROOT / "no-chromium-here")}
    done = subprocess.run([sys.executable, "-m", "pytest", test, "-p", "no:cacheprovider"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines[-1].startswith("1 skipped"), done.stdout + done.stderr
    assert "not tested on this machine" in lines[-3]
    assert lines[-2] == (
        f"1 skipped: browser tests: {ROOT / 'no-chromium-here'} is absent; install the Debian package chromium "
        "(apt-get install -y chromium) or name your Chromium in CRATE_CHROMIUM"
    )
