"""Device hygiene and sync-free steps, proven without a GPU.

Every model family's forward and backward, and steady-state training steps of every task, run with the model and
the batch on the ``meta`` device under :class:`devicecheck.DeviceWatch`: a tensor made on the CPU inside a forward,
a loss, an augmentation or a step fails with a mixed-device error, as it would on a GPU, and the watch records every
host synchronisation (a value read from the device, a device→host copy) and every host→device copy besides the
batch's own.  Outside logging steps there must be none: each would stall a GPU every step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tiny
import torch
from devicecheck import DeviceWatch, batch_tensors

FAMILIES = tiny.family_builders()


def _inputs(model: torch.nn.Module, device: str) -> Any:
    return tiny.family_inputs(model, device)


def _output(out: Any) -> torch.Tensor:
    return tiny.family_loss(out)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_runs_forward_and_backward_on_the_device_alone(family: str) -> None:
    """On ``meta``: no tensor made on the CPU, no value read, no copy in the forward and the backward."""
    model = FAMILIES[family]().to("meta").train()
    x = _inputs(model, "meta")
    with DeviceWatch("meta") as watch:
        _output(model(x)).backward()
    assert not watch.events, "\n\n".join(map(str, watch.events))
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in model.parameters() if p.requires_grad)


def test_the_watch_sees_what_a_gpu_waits_for() -> None:
    """The watch itself: each kind of host wait and transfer is recorded (or, on meta, stopped)."""
    from devicecheck import HostSync

    x = torch.ones(3, device="meta")
    for wait in (lambda: x.sum().item(), lambda: bool(x.any()), lambda: x.tolist(), lambda: x.cpu(), lambda: x[x > 0]):
        with pytest.raises(HostSync), DeviceWatch("meta"):
            wait()
    with DeviceWatch("meta") as watch:
        torch.tensor([1.0, 2.0], device="meta")
        torch.as_tensor([0.5], device="meta")
        torch.arange(3).to("meta")
        torch.full((), 2.0, device="meta") + x  # made on the device: no copy
    assert [e.kind for e in watch.events] == ["host→device copy"] * 3
    batch = torch.arange(4)
    with DeviceWatch("meta", allowed=[batch]) as watch:
        batch.to("meta", non_blocking=True)
    assert not watch.events
    with pytest.raises(RuntimeError, match="device"):
        x + torch.ones(3)  # a CPU tensor in a device computation
    with DeviceWatch("cpu") as watch:  # on a real device the values are read, and counted
        y = torch.ones(2)
        float(y.sum()), int(y.argmax())
    assert [e.kind for e in watch.events] == ["reads the device"] * 2


def _explain(fn: Any, *args: Any, **kwargs: Any) -> Any:
    torch._dynamo.reset()
    try:
        return torch._dynamo.explain(fn)(*args, **kwargs)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_forward_compiles_to_one_graph(family: str, device: torch.device) -> None:
    """torch.compile traces each family's training forward whole: no graph break (each break is a return to Python
    between two compiled graphs, and usually a host sync)."""
    model = FAMILIES[family]().train().to(device)
    report = _explain(model, _inputs(model, device))
    assert report.graph_break_count == 0, report.break_reasons
    assert report.graph_count == 1


@pytest.mark.parametrize("family", ["crate_gpt", "crate_lm_bidirectional", "crate_bert"])
def test_a_padded_language_model_batch_compiles_to_one_graph(family: str, device: torch.device) -> None:
    """Padding masks (classification of right-padded texts, a masked forward) compile without a break too."""
    model = FAMILIES[family]()
    model.reset_classifier(3)
    model = model.to(device)
    ids, lengths = torch.randint(0, 50, (2, 8)).to(device), torch.tensor([8, 5]).to(device)
    report = _explain(model.classify, ids, lengths)
    assert report.graph_break_count == 0, report.break_reasons
    mask = torch.arange(8, device=device)[None] < lengths[:, None]
    report = _explain(model.forward_features, ids, key_mask=mask)
    assert report.graph_break_count == 0, report.break_reasons


# --------------------------------------------------------------------------- training steps of every task
def _meta_loop(out: Path, **options: Any) -> Any:
    """The engine's loop for a run configured by ``options``, built as ``train`` builds it but on ``meta``."""
    from crate_transformer.train import TrainConfig, loop
    from crate_transformer.train.runtime import Interrupt, Runtime

    base = dict(threads=1, progress=False, epochs=1, eval_every=0, amp="none", out=str(out), log_every=1000,
                max_steps=1000)  # fmt: skip
    if options.get("task", "classification") == "classification":
        base["measure_every"] = 0  # the classification task's layer-wise measurements (other tasks have none)
    cfg, task, _ = loop._configure(TrainConfig(**{**base, **options}), None, None, None, None)
    rt = Runtime(device=torch.device("meta"))
    run = loop.RunDir.create(out)
    engine = loop._Loop(cfg, task, rt, run, None, [])
    engine.bar, engine.stop = rt.progress(False, total=engine.total), Interrupt()
    engine.model.train()
    return engine, run


def _steady_steps(engine: Any, steps: int = 3) -> list:
    """The events of ``steps`` iterations after a first (warm-up: the optimizer's state is made there)."""
    cfg = engine.cfg
    batches = engine.task.train_data.batches(cfg.optim.batch_size, shuffle=True)  # epoch 0 from its start
    engine.iteration(next(batches))
    events = []
    for _ in range(steps):
        batch = next(batches)
        with DeviceWatch("meta", allowed=batch_tensors(batch)) as watch:
            engine.iteration(batch)
        events += watch.events
    return events


@pytest.fixture(scope="module")
def lm_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level language model saved for fine-tuning, a small corpus and a labelled table."""
    from crate_transformer.models.lm import LMConfig, build_lm
    from crate_transformer.models.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("lm")
    model = build_lm(LMConfig(dim=32, depth=1, heads=2, block_size=24))
    model.tokenizer = Tokenizer.byte_level()
    model.save_pretrained(root / "lm")
    (root / "corpus.txt").write_text("def f(x):\n    return x + 1\n" * 200)
    (root / "table.csv").write_text("text,label\n" + "".join(f"row {'ab' * (i % 5)} {i},{i % 2}\n" for i in range(64)))
    return root


DIGITS = dict(data="digits", image_size=8, batch_size=16, model_args=dict(dim=32, depth=1, heads=2, patch_size=4))
SSL = dict(data="digits", batch_size=16, model_args=dict(image_size=8, patch_size=2, dim=32, depth=1, heads=2))
TASKS = {
    "classification": dict(DIGITS, augment="none"),
    "classification-recipe": dict(
        DIGITS,
        augment="none",
        mixup=0.8,
        cutmix=1.0,
        random_erasing=0.25,
        ema=0.99,
        drop_path=0.1,
        label_smoothing=0.1,
        accum_steps=2,
    ),  # fmt: skip
    "mae": dict(SSL, task="mae", model="crate_mae_mnist"),
    "dino": dict(SSL, task="dino", model="crate_mnist", task_args=dict(out_dim=32, hidden_dim=16, bottleneck_dim=8)),
    "classification-translate": dict(DIGITS, augment="translate"),
    "classification-crop-flip": dict(DIGITS, augment="crop-flip"),
    "dino-paper": dict(
        SSL,
        task="dino",
        model="crate_mnist",
        task_args=dict(
            preset="paper", out_dim=32, hidden_dim=16, bottleneck_dim=8, local_crops_number=2, local_crop_size=4
        ),
    ),  # fmt: skip
    "lm-clm": dict(
        task="lm",
        model="crate_gpt_mini",
        batch_size=8,
        model_args=dict(dim=32, depth=1, heads=2, block_size=16),
        task_args=dict(sample_tokens=0),
        val_fraction=0.1,
    ),  # fmt: skip
    "lm-mlm": dict(
        task="lm",
        model="crate_bert_mini",
        batch_size=8,
        model_args=dict(dim=32, depth=1, heads=2, block_size=16),
        task_args=dict(objective="mlm"),
        val_fraction=0.1,
    ),  # fmt: skip
    "text-classification": dict(task="text-classification", batch_size=8, accum_steps=2, val_fraction=0.25),
}


@pytest.mark.parametrize("name", TASKS)
def test_steady_training_steps_of_every_task_are_sync_free(name: str, tmp_path: Path, lm_files: Path) -> None:
    """Three optimizer steps of each task, on ``meta``, outside logging steps: no value read from the device, no
    copy to the host, no host→device copy but the batch's, no CPU tensor in a device computation."""
    options = dict(TASKS[name])
    if name.startswith("lm"):
        options["data"] = str(lm_files / "corpus.txt")
    if name == "text-classification":
        options.update(init_from=str(lm_files / "lm"), data=str(lm_files / "table.csv"))
    engine, run = _meta_loop(tmp_path / "run", **options)
    try:
        events = _steady_steps(engine)
    finally:
        run.close()
    assert not events, "\n\n".join(map(str, events))
