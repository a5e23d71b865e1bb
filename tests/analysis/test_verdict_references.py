"""`crate analyze` on runs of every kind names its reference: an untrained network of the same architecture built
with the run's seed (or a stated seed), measured on the same images; a fine-tuned run also says how each claim moved
from its starting checkpoint, labelled so, never "At initialisation".  Tiny real runs made by the commands
themselves: a scratch run, a fine-tuning run from it, an MAE-pretrained run and an official (authors' layout) file.
"""

import html
import json
import re
import subprocess
import sys
import time

import pytest
import tiny
import torch
from official.crate import OfficialCRATE

from crate_transformer import analysis
from crate_transformer.analysis._common import PARTIAL_MARKER
from crate_transformer.analysis.report_sections import initial_model
from crate_transformer.cli import main as cli_main
from crate_transformer.loading.pipeline import load_model

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
    mae = ["pretrain", "mae", "--data", "digits", *RUN, "--model-args", *tiny.SSL_ARCH, "--no-probe"]
    assert cli_main([*mae, "--no-recognition", "--out", str(root / "mae")]) == 0
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


def check_layer_verdicts(report: dict, printed: str, page: str, seed_words: str) -> None:
    """Every layer verdict names the untrained network with ``seed_words``, says its direction in words and is one
    printed line with its figures; the rules are one click away on the page."""
    layer = [v for v in report["verdicts"] if v["name"] in ("compression", "sparsity")]
    assert layer, report["verdicts"]
    reference = f"an untrained network of the same architecture ({seed_words}) on the same images"
    for v in layer:
        assert v["reference"] == reference
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
    from crate_transformer.data import load_dataset

    ds = load_dataset("digits", "test")
    idx = torch.as_tensor(sorted(torch.randperm(len(ds), generator=torch.Generator().manual_seed(0))[:8].tolist()))
    imgs = ds.images[idx].float() / 255
    here = untrained_rc(runs / "scratch", 3, imgs, report["normalization"])
    assert curve == pytest.approx(here, rel=1e-5)
    assert untrained_rc(runs / "scratch", 0, imgs, report["normalization"]) != pytest.approx(here, rel=1e-5)


def test_a_finetuned_run_compares_with_untrained_and_states_the_move_from_its_starting_checkpoint(
    runs, tmp_path, capsys
):
    report, printed, page = analyze(capsys, runs / "ft", tmp_path / "an")
    check_layer_verdicts(report, printed, page, "seed 0, the run's seed")
    step0 = [r for r in analysis.load_measure_records(runs / "ft" / "metrics.jsonl") if r.get("step") == 0]
    assert report["starting_checkpoint"]["layers"][0]["rc_in"] == step0[0]["rc_in"]
    for v in (v for v in report["verdicts"] if v["name"] in ("compression", "sparsity")):
        metric = "rc_in" if v["name"] == "compression" else "nonzero"
        start = v["measured"]["starting_checkpoint"]
        assert start["per_layer_mean"] == pytest.approx([r[metric] for r in step0])
        assert "From the starting checkpoint (step 0 of this fine-tuning run" in v["explanation"]
        assert re.search(r"starting checkpoint .*: fine-tuning (increased|reduced) the drop by [0-9]", v["summary"])
        # the untrained network decides; the start is a second, labelled comparison
        assert v["measured"]["initialisation"]["source"].startswith("an untrained network")
    assert "step 0 of this fine-tuning run" in report["figures"]["layerwise.png"]["caption"]
    # the incoherence claim: the starting checkpoint's coherence (the scratch run's model, read here) beside
    coh = next(v for v in report["verdicts"] if v["name"] == "incoherence")
    start_rows = analysis.incoherence(load_model(str(runs / "scratch")))
    want = [r["mean_cross_coherence"] for r in start_rows]
    assert coh["measured"]["starting_checkpoint"]["per_layer"] == pytest.approx(want, rel=1e-9)
    assert re.search(
        r"starting checkpoint [0-9., ]+ \(fine-tuning (raised|lowered) the mean coherence by", coh["summary"]
    )


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
