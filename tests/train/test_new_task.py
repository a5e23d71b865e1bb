"""A sixth training task is one file: a ``Task`` subclass registered with ``register_task`` trains with the engine.

The task below is defined here, derives from ``Task`` only, and is registered under a module path; the engine
trains it from ``TrainConfig(task=...)``.  Its model is linear and its loss is the mean squared error on a fixed
batch, so the weights after each plain SGD-like step can be computed independently (closed-form gradient in
float64) and compared with what the engine produced.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from crate_transformer.data import Position
from crate_transformer.train import RunSummary, Task, TaskResult, TrainConfig, register_task, train
from crate_transformer.train.task import TASKS

N, D = 64, 4
G = torch.Generator().manual_seed(3)
X = torch.randn(N, D, generator=G)
Y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1


class _Rows:
    """Every step is the whole (fixed) batch: the engine's data protocol at its smallest."""

    name = "rows"

    def __len__(self) -> int:
        return N

    def steps_per_epoch(self, batch_size: int) -> int:
        return N // batch_size

    def batches(self, batch_size: int, *, shuffle: bool, at: Position):
        for _ in range(at.start, N // batch_size):
            yield X, Y


class LeastSquares(Task):
    """y ≈ w·x + b by mean squared error; reports the loss, saves nothing but the record."""

    name = "least-squares"
    metric = "mse"

    def setup(self, state: dict | None) -> None:
        self.model = nn.Linear(D, 1)
        self.train_data = _Rows()

    def prepare(self, batch):  # noqa: ANN001, ANN201
        return batch

    def loss(self, model: nn.Module, batch):  # noqa: ANN001, ANN201
        x, y = batch
        loss = ((model(x)[:, 0] - y) ** 2).mean()
        n = torch.tensor(float(len(x)))
        return loss, {"loss": loss.detach() * n, "mse": loss.detach() * n, "n": n}

    def evaluate(self, split: str) -> dict[str, float]:
        with torch.no_grad():
            return {"loss": float(((self.model(X)[:, 0] - Y) ** 2).mean())}

    def describe(self) -> RunSummary:
        return RunSummary(model=f"{D + 1} params, linear", data=f"on {N} fixed rows")

    def finish(self, run_dir: Path) -> TaskResult:
        m = self.evaluate("test")
        return TaskResult(record=m, message=f"mse {m['loss']:.4f}", numbers={"mse": m["loss"]}, next="look at it")


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TASKS, "least-squares", TASKS.get("least-squares", ""))  # restored after the test
    register_task("least-squares", f"{__name__}:LeastSquares")


def _sgd_reference(w: torch.Tensor, b: torch.Tensor, lr: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """AdamW with no weight decay and a constant lr, by hand in float64: grad of mean((Xw + b - Y)^2)."""
    x, y = X.double(), Y.double()
    params = [w.double().clone(), b.double().clone()]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    b1, b2, eps = 0.9, 0.999, 1e-8
    for t in range(1, steps + 1):
        r = x @ params[0] + params[1] - y
        grads = [2 * x.T @ r / N, 2 * r.mean().reshape(1)]
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            params[i] = params[i] - lr * (m[i] / (1 - b1**t)) / ((v[i] / (1 - b2**t)).sqrt() + eps)
    return params[0], params[1]


def test_a_task_defined_in_a_file_trains_with_the_engine(tmp_path: Path, registered: None, capsys) -> None:
    torch.manual_seed(0)
    w0 = nn.Linear(D, 1)  # the engine seeds with cfg.system.seed before setup: the same initial weights
    cfg = TrainConfig(task="least-squares", epochs=40, batch_size=N, lr=0.05, min_lr=0.05, warmup_epochs=0,
                      weight_decay=0.0, grad_clip=0, eval_every=0, progress=False, threads=1,
                      out=str(tmp_path / "ls"))  # fmt: skip
    result = train(cfg)
    said = capsys.readouterr()
    out = said.out + said.err
    assert "least-squares crate_mnist_p4 (5 params, linear) on 64 fixed rows, 40 epochs x 1 steps" in out
    assert result["next"] == "look at it" and "next:" not in out  # the Python API returns the hints
    state = torch.load(tmp_path / "ls" / "checkpoints" / "last.pt", weights_only=True)["model"]
    w, b = _sgd_reference(w0.weight.detach()[0], w0.bias.detach(), 0.05, 40)
    torch.testing.assert_close(state["weight"][0].double(), w, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state["bias"].double(), b, rtol=1e-4, atol=1e-5)
    train_r = [json.loads(r) for r in (tmp_path / "ls" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["mse"] for r in train_r if r["split"] == "train"]
    assert losses[-1] < losses[0] / 4 and result["mse"] == pytest.approx(train_r[-1]["loss"])
