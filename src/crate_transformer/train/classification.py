"""Supervised image classification (JMLR §4.1.1): the task behind ``crate train`` and ``crate finetune``."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import ImageSource, default_augmentation
from .config import TrainConfig
from .evaluation import evaluate
from .images import ImageData, image_classifier, load_splits
from .task import RunSummary, Task, TaskResult

__all__ = ["ClassificationTask", "load_splits"]


class ClassificationTask(Task):
    """Supervised image classification with cross-entropy (and label smoothing); pre-training or fine-tuning."""

    name = "classification"

    def resume_command(self, cfg: TrainConfig) -> str:
        return "finetune" if cfg.init_from else "train"

    def setup(self, state: dict | None) -> None:
        cfg = self.cfg
        model, self.data = image_classifier(cfg, state, self._load_data)
        self.train_data, self.eval_data, self.test_data = self.data.train, self.data.eval, self.data.test
        self.image_size, self.mean, self.std = self.data.image_size, self.data.mean, self.data.std
        self.model = model.to(self.rt.device)
        kind = cfg.augment
        if kind == "auto":
            kind = default_augmentation(self.data.name, finetune=cfg.init_from is not None)
        self.augment_kind = kind
        self.augment = self.data.augmentation(kind)

    def _load_data(self, image_size: int) -> ImageData:
        data = ImageData(self.cfg, image_size, self.rt.device)
        if len(data.classes) < 2:
            raise ValueError(
                f"{data.name} has a single class ({data.classes[0]!r}); a classifier needs at least two "
                "(one folder per class)"
            )
        return data

    def prepare(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        images, labels = batch
        return self.data.inputs(images, self.augment), labels.to(self.rt.device, non_blocking=True)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        x, y = batch
        logits = model(x).float()
        loss = F.cross_entropy(logits, y, label_smoothing=self.cfg.label_smoothing)
        with torch.no_grad():
            n = torch.tensor(float(len(y)), device=y.device)
            stats = {"loss": loss.detach() * n, "acc": (logits.argmax(-1) == y).sum().float(), "n": n}
        return loss, stats

    def evaluate(self, split: str, *, dataset: ImageSource | None = None) -> dict[str, float]:
        ds = dataset or (self.test_data if split == "test" else self.eval_data)
        r = evaluate(
            self.model, ds, mean=self.mean, std=self.std, image_size=self.image_size,
            channels=self.model.config.in_chans, batch_size=self.cfg.eval_batch_size, runtime=self.rt,
        )  # fmt: skip
        self.last_result = r
        return {"loss": r.loss, "acc": r.top1, "top5": r.top5}

    def hooks(self) -> list:
        if not self.cfg.measure_every:
            return []
        from ..analysis import measure_hook

        return [measure_hook(every=self.cfg.measure_every)]

    def fixed_batch(self) -> tuple[Tensor, Tensor]:
        images, labels = next(iter(self.eval_data.batches(64, shuffle=False)))
        return self.data.inputs(images), labels.to(self.rt.device)

    def describe(self) -> RunSummary:
        facts = {
            "augment": self.augment_kind,
            "image_size": self.image_size,
            "train_images": len(self.train_data),
            "eval_split": self.cfg.eval_split,
            "eval_images": len(self.eval_data),
            "parameters": self.model.num_params(),
        }
        return RunSummary(
            model=f"{self.model.num_params():,} params, {self.model.config.arch}",
            data=f"on {self.train_data.name}: {len(self.train_data)} train / {len(self.eval_data)} "
            f"{self.cfg.eval_split} images, {self.image_size}px, augment={self.augment_kind}",
            facts=facts,
            verb="fine-tuning" if self.cfg.init_from else "training",
        )

    def finish(self, run_dir: Path) -> TaskResult:
        metrics = self.evaluate("test")
        r = self.last_result
        if self.rt.main:
            self.model.save_pretrained(run_dir / "model")
        return TaskResult(
            record=metrics,
            message=f"final test accuracy: {100 * r.top1:.2f}% ({round(r.top1 * r.num_samples)}/{r.num_samples}), "
            f"top-{r.k} {100 * r.top5:.2f}%, {self.model.num_params():,} params",
            numbers={"test_acc": r.top1, "test_top5": r.top5, "params": self.model.num_params()},
            next=f"crate analyze {run_dir}    |    crate eval {run_dir}",
        )

    def figures(self, run_dir: Path, metrics_path: Path) -> None:
        super().figures(run_dir, metrics_path)
        if self.cfg.measure_every:
            from ..analysis import load_measure_records, plot_measure_history

            records = load_measure_records(metrics_path)
            if records:
                plot_measure_history(records, run_dir / "measure.png", step_key="epoch")
