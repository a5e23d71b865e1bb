"""`crate analyze` on runs of every kind names its reference: an untrained network of the same architecture built
with the run's seed (or a stated seed), measured on the same images; a fine-tuned run also says how each claim moved
from its starting checkpoint, labelled so, never "At initialisation" — measured on the same images when the
checkpoint still loads, from the run's step-0 records when it is gone, and a one-line note when neither exists.
Tiny real runs made by the commands themselves: a scratch run, fine-tuning runs from it (with and without step-0
records, from a checkpoint deleted afterwards), an MAE-pretrained run, its continued pre-training and an official
(authors' layout) file.
"""

import html
import json
import re
import shutil
import subprocess
import sys
import time

import pytest
import tiny
import torch
from official.crate import OfficialCRATE

from crate_transformer import analysis
from crate_transformer.analysis._common import PARTIAL_MARKER
from crate_transformer.analysis.decoder import decoder_inversion
from crate_transformer.analysis.report_sections import initial_model
from crate_transformer.cli import main as cli_main
from crate_transformer.data import load_dataset
from crate_transformer.loading.pipeline import load_model
from crate_transformer.train import TrainConfig
from crate_transformer.train import train as run_training

RUN = ["--max-steps", "2", "--epochs", "1", "--train-subset", "128", "--threads", "1", "--no-progress"]
ANALYZE = ["--num-images", "8", "--num-vis", "1", "--no-progress"]
SIGNED = re.compile(r"(changed|increased|reduced|moved) the drop by [-+]")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A scratch run (seed 3), a fine-tuning run from it, an MAE-pretrained run and an official .pth file."""
    root = tmp_path_factory.mktemp("runs")
    arch = ["dim=32", "depth=2", "heads=2", "patch_size=4"]
    train = ["train", "--data", "digits", "--image-size", "8", *RUN, "--seed", "3", "--model-args", *arch]
    assert cli_main([*train, "--out", str(root / "scratch")]) == 0
    finetune = ["finetune", "--from", str(root / "scratch"), "--data", "digits", "--image-size", "8", *RUN]
    assert cli_main([*finetune, "--out", str(root / "ft")]) == 0
    assert cli_main([*finetune, "--measure-every", "0", "--out", str(root / "ft0")]) == 0  # no step-0 records
    for name, extra in (("gone", []), ("gone0", ["--measure-every", "0"])):  # from a checkpoint deleted after
        shutil.copytree(root / "scratch", root / f"{name}-start")
        start = ["finetune", "--from", str(root / f"{name}-start"), *finetune[3:]]
        assert cli_main([*start, *extra, "--out", str(root / name)]) == 0
        shutil.rmtree(root / f"{name}-start")
    mae = ["pretrain", "mae", "--data", "digits", *RUN, "--model-args", *tiny.SSL_ARCH, "--no-probe"]
    assert cli_main([*mae, "--no-recognition", "--out", str(root / "mae")]) == 0
    # continued pre-training of that CRATE-MAE (init_from; the Python API, which crate pretrain mae has no flag for)
    more = dict(task="mae", init_from=str(root / "mae"), data="digits", max_steps=2, epochs=1, train_subset=128)
    more.update(threads=1, progress=False, out=str(root / "mae2"), task_args={"probe": False, "recognition": False})
    run_training(TrainConfig(**more))
    off = OfficialCRATE(image_size=8, patch_size=2, num_classes=10, dim=32, depth=2, heads=4, channels=1).eval()
    torch.save({"epoch": 1, "state_dict": {"module." + k: v for k, v in off.state_dict().items()}}, root / "w.pth")
    return root


def analyze(capsys, checkpoint, out, *extra) -> tuple[dict, str, str]:
    """report.json, the printed output and report.html of `crate analyze CHECKPOINT --out OUT`."""
    capsys.readouterr()
    assert cli_main(["analyze", str(checkpoint), *ANALYZE, "--out", str(out), *extra]) == 0
    return json.loads((out / "report.json").read_text()), capsys.readouterr().out, (out / "report.html").read_text()


def untrained_rc(checkpoint, seed: int, images: torch.Tensor, normalization) -> list[float]:
    """R^c per layer of the untrained network of the checkpoint's architecture with ``seed``, measured here."""
    model = load_model(str(checkpoint)).eval()
    table = analysis.measure(initial_model(model, seed), images, normalize=normalization, progress=False)
    return [float(v) for v in table.mean("rc_in")]


def digits_subset() -> torch.Tensor:
    """The 8 test digits `crate analyze --num-images 8` measures: a subset of the test split drawn with seed 0."""
    ds = load_dataset("digits", "test")
    idx = torch.as_tensor(sorted(torch.randperm(len(ds), generator=torch.Generator().manual_seed(0))[:8].tolist()))
    return ds.images[idx].float() / 255


def check_layer_verdicts(report: dict, printed: str, page: str, seed_words: str) -> None:
    """Every layer verdict names the untrained network with ``seed_words``, says its direction in words and is one
    printed line with its figures; the rules are one click away on the page."""
    layer = [v for v in report["verdicts"] if v["name"] in ("compression", "sparsity")]
    assert layer, report["verdicts"]
    reference = f"an untrained network of the same architecture ({seed_words}) on the same images"
    for v in layer:
        assert v["reference"] == reference or v["reference"].startswith(f"{reference}; beside it the starting ")
        assert f"Reference, {reference}: " in v["explanation"]
        assert "untrained " in v["summary"] and "the joint noise" in v["summary"]
        assert re.search(r"training (increased|reduced) the drop by [0-9]", v["summary"])
        assert not SIGNED.search(v["explanation"]) and "At initialisation" not in v["explanation"]
        tag = {"holds": "[holds]", "fails": "[FAILS]"}.get(v["verdict"], "[n/a]")
        assert f"{tag} {v['section']}, {v['name']}: {v['summary']}\n" in printed
    assert f"compared with: {reference}" in printed
    assert "At initialisation" not in printed and "At initialisation" not in page
    rules = page.index("<details class='rules'>")
    assert page.index("figures/layerwise.png") < page.index("<ul class='claims'>") < rules
    assert all(html.escape(v["rule"]) in page[rules:] for v in layer)  # one click away
    assert page.index("<ul class='claims'>") < page.index("<table>")  # the figures and one line per claim first


def test_a_scratch_run_compares_with_an_untrained_network_of_its_own_seed(runs, tmp_path, capsys):
    report, printed, page = analyze(capsys, runs / "scratch", tmp_path / "an")
    check_layer_verdicts(report, printed, page, "seed 3, the run's seed")
    assert "starting_checkpoint" not in report and "starting checkpoint" not in printed  # from scratch: no start
    # the reference is the untrained network with the run's seed on the report's own test images
    comp = next(v for v in report["verdicts"] if v["section"] == "classifier (test)" and v["name"] == "compression")
    curve = [r["rc_in"] for r in report["initialisation"]["test untrained"]]
    assert comp["measured"]["initialisation"]["per_layer_mean"] == pytest.approx(curve)
    imgs = digits_subset()
    here = untrained_rc(runs / "scratch", 3, imgs, report["normalization"])
    assert curve == pytest.approx(here, rel=1e-5)
    assert untrained_rc(runs / "scratch", 0, imgs, report["normalization"]) != pytest.approx(here, rel=1e-5)


def start_clauses(report: dict) -> list[dict]:
    """The layer verdicts (compression, sparsity) of a report."""
    return [v for v in report["verdicts"] if v["name"] in ("compression", "sparsity")]


def test_a_finetuned_run_measures_its_starting_checkpoint_on_the_same_images(runs, tmp_path, capsys):
    report, printed, page = analyze(capsys, runs / "ft", tmp_path / "an")
    check_layer_verdicts(report, printed, page, "seed 0, the run's seed")
    start = report["starting_checkpoint"]
    assert start["measured_on"] == "the same images" and start["path"] == str(runs / "scratch")
    # the starting checkpoint (the scratch run), loaded and measured here on the report's own test images
    scratch = load_model(str(runs / "scratch"), as_classifier=True)
    table = analysis.measure(scratch, digits_subset(), normalize=report["normalization"], progress=False)
    for v in start_clauses(report):
        metric = "rc_in" if v["name"] == "compression" else "nonzero"
        want = f"the starting checkpoint ({runs / 'scratch'}), measured on the same 8 images"
        assert v["measured"]["starting_checkpoint"]["source"] == want and v["reference"].endswith(f"beside it {want}")
        assert f"From {want}: " in v["explanation"] and "step-0 records" not in v["explanation"]
        assert re.search(r"starting checkpoint .*: fine-tuning (increased|reduced) the drop by [0-9]", v["summary"])
        assert v["measured"]["initialisation"]["source"].startswith("an untrained network")  # it decides
        if v["section"] == "classifier (test)":
            got = v["measured"]["starting_checkpoint"]
            assert got["per_layer_mean"] == pytest.approx([float(x) for x in table.mean(metric)], rel=1e-5)
            values = table.values[metric].astype("float64")
            assert got["drop"] == pytest.approx(float((values[:, 0] - values[:, -1]).mean()), rel=1e-5, abs=1e-9)
    assert start["measure"]["test"][0]["rc_in"] == pytest.approx(float(table.mean("rc_in")[0]), rel=1e-5)
    caption = report["figures"]["layerwise.png"]["caption"]
    assert "Dashed and labelled 'train starting checkpoint', 'test starting checkpoint': the starting" in caption
    # the incoherence claim: the starting checkpoint's coherence (the scratch run's model, read here) beside
    coh = next(v for v in report["verdicts"] if v["name"] == "incoherence")
    want = [r["mean_cross_coherence"] for r in analysis.incoherence(scratch)]
    assert coh["measured"]["starting_checkpoint"]["per_layer"] == pytest.approx(want, rel=1e-9)
    assert re.search(
        r"starting checkpoint [0-9., ]+ \(fine-tuning (raised|lowered) the mean coherence by", coh["summary"]
    )
    assert not any(n.startswith("starting checkpoint") for n in report["notes"])


def test_a_finetune_without_step0_records_still_states_the_move_from_its_starting_checkpoint(runs, tmp_path, capsys):
    assert not [r for r in analysis.load_measure_records(runs / "ft0" / "metrics.jsonl") if r.get("step") == 0]
    report, printed, _ = analyze(capsys, runs / "ft0", tmp_path / "an")
    for v in start_clauses(report) + [v for v in report["verdicts"] if v["name"] == "incoherence"]:
        assert "starting_checkpoint" in v["measured"] and "starting checkpoint " in v["summary"]
        assert v["summary"] in printed
    assert report["starting_checkpoint"]["measured_on"] == "the same images"


def test_a_deleted_starting_checkpoint_falls_back_to_the_step0_records_and_says_so(runs, tmp_path, capsys):
    report, printed, _ = analyze(capsys, runs / "gone", tmp_path / "an")
    path = runs / "gone-start"
    step0 = [r for r in analysis.load_measure_records(runs / "gone" / "metrics.jsonl") if r.get("step") == 0]
    assert report["starting_checkpoint"]["measured_on"] == "the run's step-0 records"
    for v in start_clauses(report):
        metric = "rc_in" if v["name"] == "compression" else "nonzero"
        got = v["measured"]["starting_checkpoint"]
        assert got["per_layer_mean"] == pytest.approx([r[metric] for r in step0])
        assert got["source"].startswith(f"the starting checkpoint ({path}), from the run's step-0 records (")
        assert "measured on the same" not in got["source"]
    coh = next(v for v in report["verdicts"] if v["name"] == "incoherence")
    assert "starting_checkpoint" not in coh["measured"]  # nothing to compare the subspaces with
    note = next(n for n in report["notes"] if n.startswith("starting checkpoint"))
    assert note.startswith(f"starting checkpoint: {path} (config.yaml's init_from) does not load: ")
    assert "checkpoint file not found" in note and f"note: {note}\n" in printed


def test_no_starting_checkpoint_and_no_step0_records_is_said_in_one_line(runs, tmp_path, capsys):
    report, printed, _ = analyze(capsys, runs / "gone0", tmp_path / "an")
    assert "starting_checkpoint" not in report
    assert not any("starting_checkpoint" in v["measured"] or "starting checkpoint" in v["summary"]
                   for v in report["verdicts"])  # fmt: skip
    notes = [n for n in report["notes"] if "starting checkpoint" in n]
    assert len(notes) == 1 and f"note: {notes[0]}\n" in printed and "\n" not in notes[0]
    assert notes[0].startswith(f"starting checkpoint unavailable: {runs / 'gone0-start'} (config.yaml's init_from)")
    assert "no step-0 records (measure_every 0)" in notes[0]


def test_a_continued_mae_states_the_decoders_move_from_its_starting_checkpoint(runs, tmp_path, capsys):
    report, printed, _ = analyze(capsys, runs / "mae2", tmp_path / "an")
    dec = next(v for v in report["verdicts"] if v["name"] == "decoder as inverse")
    start = dec["measured"]["starting_checkpoint"]
    assert start["source"] == f"the starting checkpoint ({runs / 'mae'}), measured on the same 8 test images"
    assert re.search(r"starting checkpoint [-+0-9., e]+: continued pre-training (raised|lowered) the mean CKA gain "
                     r"by [0-9.e-]+, (beyond|within) the joint noise", dec["summary"])  # fmt: skip
    assert dec["summary"] in printed and "initialisation" in dec["measured"]  # the untrained network beside too
    # the starting CRATE-MAE's CKA gains, measured here on the same (normalised) test images
    mean, std = (torch.tensor(s).view(1, -1, 1, 1) for s in report["normalization"])
    rows = decoder_inversion(load_model(str(runs / "mae")), (digits_subset() - mean) / std, per_image=True)
    gains = [sum(o - i for o, i in zip(r["cka_out_per_image"], r["cka_in_per_image"])) / 8 for r in rows]
    assert start["margin_per_layer"] == pytest.approx(gains, rel=1e-5, abs=1e-7)
    assert start["change"] == pytest.approx(
        sum(dec["measured"]["margin_per_layer"]) / len(gains) - sum(gains) / len(gains), rel=1e-4, abs=1e-7
    )
    for v in start_clauses(report):
        assert "continued pre-training" in v["summary"] and "measured on the same 8 images" in v["reference"]


def test_an_mae_run_and_an_official_file_compare_with_an_untrained_network(runs, tmp_path, capsys):
    report, printed, page = analyze(capsys, runs / "mae", tmp_path / "mae")
    check_layer_verdicts(report, printed, page, "seed 0, the run's seed")
    assert {v["section"].split(" (")[0] for v in report["verdicts"]} >= {"CRATE-MAE encoder", "CRATE-MAE decoder"}
    dec = next(v for v in report["verdicts"] if v["name"] == "decoder as inverse")
    assert "do-nothing baseline" in dec["reference"] and dec["summary"] in printed
    arch = ["image_size=8", "patch_size=2", "in_chans=1", "num_classes=10", "dim=32", "depth=2", "heads=4"]
    official = ["--data", "digits", "--model", "crate_tiny", "--model-args", *arch]
    report, printed, page = analyze(capsys, runs / "w.pth", tmp_path / "off", *official)
    check_layer_verdicts(report, printed, page, "seed 0; the checkpoint records no training seed")
    coh = next(v for v in report["verdicts"] if v["name"] == "incoherence")
    assert coh["reference"].startswith("random subspaces of the same sizes") and "untrained" in coh["summary"]


# --------------------------------------------------------------------------- a report killed midway
def test_a_report_killed_midway_is_replaced_by_a_plain_rerun_and_by_overwrite(runs, tmp_path, capsys):
    out = tmp_path / "an"
    cmd = [sys.executable, "-m", "crate_transformer.cli", "analyze", str(runs / "scratch"), *ANALYZE, "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # killed (SIGKILL: no cleanup runs) once the report has begun and before it ends
        deadline = time.time() + 120
        while not (out / PARTIAL_MARKER).exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        proc.kill()
    finally:
        proc.wait()
    assert (out / PARTIAL_MARKER).is_file() and not (out / "report.html").exists()
    report, printed, _ = analyze(capsys, runs / "scratch", out)  # a plain rerun into the same --out
    assert "did not finish; it is replaced" in printed and not (out / PARTIAL_MARKER).exists()
    assert report["verdicts"]
    # a fault injected midway, then --overwrite; then the default folder (no --out) is reused, not analysis-2
    (out / PARTIAL_MARKER).write_text("")
    (out / "report.json").unlink()
    analyze(capsys, runs / "scratch", out, "--overwrite")
    assert (out / "report.html").is_file() and not (out / PARTIAL_MARKER).exists()
    home = runs / "scratch" / "analysis"
    home.mkdir()
    (home / PARTIAL_MARKER).write_text("")
    (home / "figures").mkdir()
    capsys.readouterr()
    assert cli_main(["analyze", str(runs / "scratch"), *ANALYZE]) == 0
    assert (home / "report.html").is_file() and not (runs / "scratch" / "analysis-2").exists()


def test_a_folder_that_is_not_a_partial_report_is_still_refused(runs, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli_main(["analyze", str(runs / "scratch"), *ANALYZE, "--out", str(out)]) == 2
    assert "is not empty" in capsys.readouterr().err and (out / "notes.txt").read_text() == "mine"


def test_a_relative_starting_checkpoint_is_recorded_so_analyze_finds_it_from_anywhere(runs, monkeypatch):
    """``--from scratch`` typed in the runs' folder: config.yaml records the resolved path, so ``crate analyze``
    run from another folder still loads the starting checkpoint (a relative one would count as gone)."""
    import yaml

    monkeypatch.chdir(runs)
    finetune = ["finetune", "--from", "scratch", "--data", "digits", "--image-size", "8", *RUN]
    assert cli_main([*finetune, "--measure-every", "0", "--out", "rel"]) == 0
    recorded = yaml.safe_load((runs / "rel" / "config.yaml").read_text())["init_from"]
    assert recorded == str((runs / "scratch").resolve())
    monkeypatch.chdir(runs.parent)
    assert analysis_reference_loads(runs / "rel")


def analysis_reference_loads(run) -> bool:
    """Whether ``crate analyze``'s reference of ``run`` holds a starting checkpoint that loads."""
    from crate_transformer.cli.analyze import run_reference, starting_model

    ref = run_reference(str(run))
    return starting_model(ref, load_model(str(run), as_classifier=True)) is not None


def test_a_finetuned_language_model_states_each_claims_move_from_its_starting_checkpoint(tmp_path, capsys):
    """`crate finetune-text` from a saved language model, then `crate analyze RUN --data TEXT`: both layer claims
    state the move from the starting checkpoint, whose numbers are that model measured here on the same blocks;
    with the start deleted, one note says so."""
    import pydoc_data.topics

    from crate_transformer.analysis.language import measure_text
    from crate_transformer.models.lm import LMConfig, build_lm
    from crate_transformer.models.tokenizer import Tokenizer

    lm = build_lm(LMConfig(dim=16, depth=2, heads=2, block_size=32))
    lm.tokenizer = Tokenizer.byte_level()
    lm.save_pretrained(tmp_path / "lm")
    rows = "".join(f"row {i} was {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(40))
    (tmp_path / "t.csv").write_text("sentence,label\n" + rows)
    (tmp_path / "corpus.txt").write_text(pydoc_data.topics.topics["if"] * 20)
    tune = ["finetune-text", "--from", str(tmp_path / "lm"), "--data", str(tmp_path / "t.csv"), "--eval-every", "0"]
    assert cli_main([*tune, *RUN[:2], "--batch-size", "8", *RUN[6:], "--out", str(tmp_path / "ft")]) == 0
    text = ["--data", str(tmp_path / "corpus.txt"), "--num-blocks", "16", "--no-progress"]
    capsys.readouterr()
    assert cli_main(["analyze", str(tmp_path / "ft"), *text, "--out", str(tmp_path / "an")]) == 0
    report, printed = json.loads((tmp_path / "an" / "report.json").read_text()), capsys.readouterr().out
    start = report["starting_checkpoint"]
    assert start["source"] == f"the starting checkpoint ({tmp_path / 'lm'}), measured on the same 16 held-out blocks"
    assert f"beside it {start['source']}" in printed
    # the same 16 held-out blocks, chosen as crate analyze chooses them, and the starting model measured on them here
    from crate_transformer.cli.analyze import held_out_corpus
    from crate_transformer.data.text import TokenBlocks, load_tokens, split_tokens

    start_model = load_model(str(tmp_path / "lm"))
    data, val_fraction, columns = held_out_corpus(tmp_path / "ft", str(tmp_path / "corpus.txt"))
    tokens = load_tokens(data, start_model.tokenizer, columns)
    held = TokenBlocks(tokens, 32, split_tokens(len(tokens), val_fraction, 32), len(tokens), str(data), "held-out")
    table = measure_text(start_model, held.get(torch.arange(16))[:, :-1], eps=report["measure"]["held-out text"][
        "meta"]["eps"])  # fmt: skip
    for v in start_clauses(report):
        assert "starting checkpoint" in v["summary"] and "fine-tuning" in v["summary"], v["summary"]
        metric = "rc_in" if v["name"] == "compression" else "nonzero"
        assert [r[metric] for r in start["measure"]] == pytest.approx([float(x) for x in table.mean(metric)], rel=1e-5)
    shutil.rmtree(tmp_path / "lm")
    assert cli_main(["analyze", str(tmp_path / "ft"), *text, "--out", str(tmp_path / "an2")]) == 0
    notes = json.loads((tmp_path / "an2" / "report.json").read_text())["notes"]
    gone = [n for n in notes if n.startswith(f"starting checkpoint unavailable: {tmp_path / 'lm'} (config.yaml's")]
    assert len(gone) == 1 and "no claim states its move from it" in gone[0]
