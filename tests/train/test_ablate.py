"""`crate ablate`: the paper's ablation tables trained with the one engine, summarised honestly, resumable."""

import json
import statistics

import pytest
import tiny

from crate_transformer.cli import main
from crate_transformer.train.ablate import RECIPE, TABLES, plan, read_results, resolve_tables, run_ablation

TINY_ARGS = ["--model-args", "dim=16", "depth=1", "heads=2", "--train-args", "train_subset=64", "batch_size=32",
             "max_steps=2", "eval_batch_size=1000", "--epochs", "1", "--threads", "1", "--measure-images", "16",
             "--no-progress"]  # fmt: skip
TINY = tiny.ABLATE


def test_sweep_writes_mean_std_from_the_results_and_never_retrains(tmp_path):
    out = tmp_path / "sweep"
    assert main(["ablate", "13", "--seeds", "2", "--out", str(out), *TINY_ARGS]) == 0
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == 4 and {r["seed"] for r in results} == {0, 1}
    md = (out / "ablate.md").read_text()
    for row in TABLES["13"].rows:
        rs = [r for r in results if r["row"] == row.name]
        accs = [100 * r["acc"] for r in rs]
        line = next(x for x in md.splitlines() if x.startswith(f"| {row.name} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == f"{statistics.mean(accs):.2f} ± {statistics.stdev(accs):.2f} (n=2)"
        assert cells[3] == f"{rs[0]['params']:,}" and cells[5] == f"{row.paper:.1f}"
        assert cells[4] == f"{statistics.median(r['images_per_s'] for r in rs):,.0f}"
    assert (out / "layerwise-13.png").stat().st_size > 0 and "ablate 13 --seeds 2" in md

    # a second sweep trains nothing and leaves every run directory untouched
    files = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()}
    calls = []
    kw = dict(overrides=TINY, measure_images=16, progress=False)
    run_ablation(["13"], out=out, seeds=2, trainer=lambda run, log: calls.append(run), **kw)
    assert calls == [] and files == {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()}
    assert len(read_results(out)) == 4

    # a run whose summary was lost (killed after training) is continued by the engine's resume, not retrained
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    lost = json.loads(lines[-1])
    assert main(["ablate", "13", "--seeds", "2", "--out", str(out), *TINY_ARGS]) == 0
    again = read_results(out)[lost["key"], lost["seed"]]
    assert again["acc"] == lost["acc"] and len(read_results(out)) == 4
    log = (out / "logs" / f"{again['run_dir'].rsplit('/', 1)[-1]}.log").read_text()
    assert "resuming at step 2" in log

    # --report-only refreshes the report without training
    (out / "ablate.md").unlink()
    assert main(["ablate", "13", "--seeds", "2", "--out", str(out), "--report-only", *TINY_ARGS]) == 0
    assert (out / "ablate.md").read_text().count("(n=2)") == 2


def test_rows_shared_between_tables_are_planned_once_and_table_11_scales_the_recipe(tmp_path):
    runs = plan(resolve_tables(["13", "15", "12"]), 2, tmp_path, dict(RECIPE))
    assert len(runs) == 2 * (1 + 1 + 1 + 2)  # the default row once for all three tables
    by_row = {r.row: r.options for r in plan(resolve_tables(["11"]), 1, tmp_path, {**RECIPE, "lr": 1e-3})}
    assert by_row["learning rate ×2 (paper 4.8e-4)"]["lr"] == pytest.approx(2e-3)
    assert by_row["weight decay ×0.1 (paper 0.05)"]["weight_decay"] == pytest.approx(0.005)
    assert by_row["η = 0.5"]["model_args"] == {"eta": 0.5}
    assert resolve_tables(["all"]) == list(TABLES.values())
    one, two = (plan(resolve_tables(["13"]), 1, tmp_path, {**RECIPE, "threads": t}) for t in (1, 2))
    assert [r.key for r in one] == [r.key for r in two]  # threads do not change what is trained


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ablate", "99"], "unknown ablation table(s) ['99']; choose from 17, 12, 13, 15, 11, 11e or all"),
        (["ablate", "17", "--model-args", "mlp=moe"], "unknown mlp 'moe'"),
        (["ablate", "13", "--train-args", "optimizer=adagrad"], "unknown optimizer 'adagrad'"),
        (["ablate", "13", "--seeds", "0"], "--seeds must be a positive integer"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not (tmp_path / "s" / "runs").exists()
