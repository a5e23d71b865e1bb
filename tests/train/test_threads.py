"""The default thread count (what is free: affinity, cgroup quota, other running work) and the collapse warning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from clitools import flags_of

from crate_transformer import cli
from crate_transformer.train import TrainConfig, train
from crate_transformer.train import threads as th


@pytest.mark.parametrize(
    "affinity, quota, runnable, expected",
    [
        (2, None, 0, 2),  # idle 2-core machine: both cores, the idle speed is kept
        (2, None, 0.4, 2),  # a little background noise rounds away
        (2, None, 1, 1),  # one other busy process: one core is free
        (2, None, 0.6, 1),
        (2, None, 7, 1),  # never below one
        (8, None, 3, 5),
        (8, 1.5, 0, 1),  # a fractional quota: the second thread would be throttled
        (8, 4.0, 1, 3),
        (8, 0.0, 0, 8),  # a zero/unset quota means none
        (1, None, 0, 1),
        (0, None, 0, 1),  # an empty affinity report still gives a thread
    ],
)
def test_choose_threads(affinity: int, quota: float | None, runnable: float, expected: int) -> None:
    assert th.choose_threads(affinity, quota, runnable) == expected


def test_cgroup_quota_v2_v1_and_none(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert th.cgroup_cpu_quota(v2) == 1.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert th.cgroup_cpu_quota(v2) is None
    v1 = tmp_path / "v1" / "cpu,cpuacct"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert th.cgroup_cpu_quota(tmp_path / "v1") == 2.0
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert th.cgroup_cpu_quota(tmp_path / "v1") is None
    assert th.cgroup_cpu_quota(tmp_path / "missing") is None


def test_reader_gives_sane_inputs() -> None:
    affinity, quota, runnable = th.free_cpu_inputs()
    assert affinity >= 1 and (quota is None or quota > 0) and runnable >= 0


def test_auto_uses_free_cpus_and_respects_omp_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(th, "_torch_default", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(th, "free_cpu_inputs", lambda: (2, None, 0.0))
    assert th.resolve_threads(0) == 2
    monkeypatch.setattr(th, "free_cpu_inputs", lambda: (2, None, 1.0))
    assert th.resolve_threads(0) == th.resolve_threads(None) == 1
    monkeypatch.setattr(th, "free_cpu_inputs", lambda: (16, None, 0.0))
    assert th.auto_threads() == 2  # never above torch's own default (physical cores)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert th.auto_threads() == 2  # the user's OMP_NUM_THREADS wins over the load
    assert th.resolve_threads(3) == 3 and th.resolve_threads("3") == 3
    for bad in (-1, "abc", "auto"):
        with pytest.raises(ValueError, match=r"^threads must be a non-negative integer \(0 = auto\)"):
            th.resolve_threads(bad)


def test_collapse_detector_on_constructed_timings() -> None:
    steady = [0.10, 0.11, 0.09, 0.12, 0.10, 0.11]
    assert not th.collapsed(steady)
    assert not th.collapsed([0.1, 0.1, 0.5, 0.1, 0.1])  # one slow window (data-loader start, eval) is not a collapse
    assert not th.collapsed([0.1, 0.1, 0.5, 0.5, 0.25])  # 2.5x is within k = 3
    assert th.collapsed([0.1, 0.1, 0.5, 0.6, 0.9])  # three windows above 3x the best
    assert not th.collapsed([0.9, 0.9, 0.9])  # nothing to compare with yet
    assert th.collapsed([0.1, 0.2, 0.2], k=1.5, run=2)


def test_slowdown_watch_warns_once_naming_threads_1() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        watch, lines = th.SlowdownWatch(), []
        for seconds in (1.0, 1.1, 1.0, 5.0, 6.0, 7.0, 8.0, 9.0):  # 10-step windows: 0.1 s/step, then 0.5-0.9
            lines.append(watch.add(seconds, 10))
    finally:
        torch.set_num_threads(before)
    warnings = [str(w) for w in lines if w]
    assert len(warnings) == 1 and str(lines[5]) == warnings[0]
    assert "threads=1" in warnings[0] and "6x" in warnings[0] and "\n" not in warnings[0]
    shown = cli.cli_message(str(lines[5]), flags_of("train"))
    assert "rerun or resume with --threads 1" in shown  # the training loop prints it while a command runs: the flag
    assert watch.add(0.0, 0) is None  # an empty window is ignored


def test_training_loop_prints_the_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The loop feeds the watch its step times: with k = 0 every window after the first counts as slow."""
    import crate_transformer.train.loop as loop

    monkeypatch.setattr(loop, "SlowdownWatch", lambda: th.SlowdownWatch(k=0.0, run=1))
    cfg = TrainConfig(model_args=dict(dim=32, depth=1, heads=2, patch_size=4), data="digits", image_size=8,
                      epochs=1, max_steps=3, log_every=1, progress=False, out=str(tmp_path / "r"), threads=1,
                      measure_every=0)  # fmt: skip
    train(cfg)
    out = capsys.readouterr()
    assert (out.out + out.err).count("warning: training slowed") == 1


@pytest.mark.parametrize("command", ["eval", "analyze", "generate"])
def test_eval_analyze_generate_take_threads(command: str, tmp_path: Path, capsys) -> None:
    from crate_transformer.cli.options import resolve_options

    args = cli.build_parser(command).parse_args([command, str(tmp_path), "--threads", "1"])
    assert args.threads == "1"  # as typed; the command's options class types it
    resolve_options(args)
    assert args.threads == 1
    args = cli.build_parser(command).parse_args([command, str(tmp_path)])
    assert not hasattr(args, "threads")  # not given: absent, then the declared default 0 = auto
    resolve_options(args)
    assert args.threads == 0
    errors = {}
    for value in ("-2", "x"):  # refused before the checkpoint is looked at, in the words training uses
        assert cli.main([command, str(tmp_path / "missing"), "--threads", value]) == 2
        errors[value] = capsys.readouterr().err.strip()
        assert "\n" not in errors[value] and "missing" not in errors[value], errors[value]
        assert cli.main(["train", "--threads", value, "--out", str(tmp_path / "never")]) == 2
        assert capsys.readouterr().err.strip().replace("crate train", f"crate {command}") == errors[value]
    assert errors["-2"] == f"crate {command}: error: --threads must be a non-negative integer, got -2; e.g. --threads 0"


def test_apply_threads_sets_torch() -> None:
    from crate_transformer.cli.options import apply_threads

    before = torch.get_num_threads()
    try:
        assert apply_threads(cli.build_parser("generate").parse_args(["generate", "x", "--threads", "2"])) == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
