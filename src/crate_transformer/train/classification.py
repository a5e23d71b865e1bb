"""Supervised image classification (JMLR §4.1.1): the task behind ``crate train`` and ``crate finetune``."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import config_from_dict
from ..data import (
    DataSpec,
    ImageDataset,
    ImageSource,
    build_augmentation,
    canonical_source,
    default_augmentation,
    fit_normalization,
    open_source,
)
from ..model import ImageClassifier
from ..operators import set_drop_path
from ..registry import build, is_language_model, model_config
from .config import TrainConfig
from .evaluation import evaluate, prepare_batch
from .load import load_model
from .mix import MixupCutmix, random_erasing, soft_target_cross_entropy
from .optim import ModelEma
from .runtime import Runtime
from .task import StepContext, Task

__all__ = ["ClassificationTask", "load_splits"]


class ClassificationTask(Task):
    """Supervised image classification with cross-entropy (and label smoothing); pre-training or fine-tuning."""

    name = "classification"
    min_classes = 2  # a classifier needs two; DINO, which uses no labels, trains on one

    def resume_command(self, cfg: TrainConfig) -> str:
        return "finetune" if cfg.init_from else "train"

    def setup(self, cfg: TrainConfig, rt: Runtime, state: dict | None) -> None:
        self.cfg, self.rt = cfg, rt
        if state is not None:  # resuming: the checkpoint holds the exact architecture (weights loaded by the engine)
            model = build(config_from_dict(dict(state["model_config"])))  # by its arch: CRATE, ViT, CRATE-α, ...
            image_size = model.config.image_size
        elif cfg.init_from is not None:  # fine-tuning: the checkpoint fixes the architecture
            model = load_model(cfg.init_from, name=cfg.model, as_classifier=True, **cfg.model_args)
            if not isinstance(model, ImageClassifier):
                raise ValueError(f"{cfg.init_from} is a language model; fine-tune it with crate finetune-text")
            image_size = cfg.image_size or model.config.image_size
        else:
            if cfg.model is None:
                raise ValueError("no model given; pass --model NAME (see `crate models`)")
            if is_language_model(cfg.model):
                raise ValueError(f"{cfg.model} is a language model; train it with crate train-lm --model {cfg.model}")
            image_size = cfg.image_size or model_config(cfg.model, **cfg.model_args).image_size
        self.image_size = image_size
        self.train_data, self.eval_data, self.test_data = self._load_data(image_size)
        classes = self.train_data.classes
        if len(classes) < self.min_classes:
            raise ValueError(
                f"{self.train_data.name} has a single class ({classes[0]!r}); a classifier needs at least two "
                "(one folder per class)"
            )
        if state is None and cfg.init_from is not None:
            if not (cfg.keep_head and model.config.num_classes == len(classes)):
                model.reset_classifier(len(classes))  # the transfer protocol: a fresh head for the new classes
            if model.config.image_size != image_size:
                model.resize_pos_embed(image_size)  # bicubic interpolation of the learned position grid
        elif state is None:
            overrides = {"in_chans": self.train_data.channels, **cfg.model_args}
            overrides.update(num_classes=len(classes), image_size=image_size)
            model = build(model_config(cfg.model, **overrides))
            if not isinstance(model, ImageClassifier):
                raise ValueError(f"{cfg.model} is not an image classifier; see `crate models` for the classifiers")
        channels = model.config.in_chans
        norm = fit_normalization(self.train_data.mean, self.train_data.std, channels)
        if norm is None:
            raise ValueError(f"cannot use {self.train_data.channels}-channel data with a {channels}-channel model")
        self.mean, self.std = norm
        data = canonical_source(cfg.data)
        model.config.data = DataSpec(
            source=data, kind=getattr(self.train_data, "kind", ""), name=self.train_data.name,
            classes=classes, mean=self.mean, std=self.std,
        )  # fmt: skip
        self.model = model.to(rt.device)
        kind = cfg.augment
        if kind == "auto":
            kind = default_augmentation(self.train_data.name, finetune=cfg.init_from is not None)
        self.augment_kind = kind
        native = getattr(self.train_data, "image_size", None) or image_size  # translations act before resizing
        self.augment = build_augmentation(
            kind,
            image_size,
            translate=round(cfg.translate * native),
            input_size=native,
            crop_scale=(cfg.crop_scale, 1.0),
            hflip=cfg.hflip,
            randaugment_n=cfg.randaugment_n,
            randaugment_m=cfg.randaugment_m,
        ).to(rt.device)
        self._setup_recipe(cfg, len(classes), state)

    def _setup_recipe(self, cfg: TrainConfig, num_classes: int, state: dict | None) -> None:
        """The recipe pieces the options turn on: drop path on a new or fine-tuned model (a resumed one has it in
        its config), mixup / cutmix, random erasing, a weight EMA (each None when off, so a run without them
        draws no extra random numbers)."""
        if cfg.drop_path and state is None:
            set_drop_path(self.model, cfg.drop_path)
        self.mixer = self.eraser = self.ema = None
        if cfg.mixup > 0 or cfg.cutmix > 0:
            self.mixer = MixupCutmix(num_classes, cfg.mixup, cfg.cutmix, cfg.mixup_prob, cfg.mixup_switch_prob,
                                     cfg.label_smoothing)  # fmt: skip
        if cfg.random_erasing > 0:
            self.eraser = random_erasing(cfg.random_erasing).to(self.rt.device)
        if cfg.ema > 0:
            self.ema = ModelEma(self.model, cfg.ema)

    def _load_data(self, image_size: int) -> tuple[ImageSource, ImageSource, ImageSource]:
        return load_splits(self.cfg, image_size)

    def _inputs(self, images: Tensor, augment: nn.Module | None = None) -> Tensor:
        c = self.model.config
        return prepare_batch(
            images, device=self.rt.device, image_size=self.image_size, channels=c.in_chans,
            mean=self.mean, std=self.std, augment=augment,
        )  # fmt: skip

    def prepare(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """uint8 images → augmented, normalised inputs (then random erasing, then mixup / cutmix: the labels become
        soft targets ``(b, classes)``) and labels on the device."""
        images, labels = batch
        x, y = self._inputs(images, self.augment), labels.to(self.rt.device, non_blocking=True)
        if self.eraser is not None:
            x = self.eraser(x)
        if self.mixer is not None:
            x, y = self.mixer(x, y)
        return x, y

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        x, y = batch
        logits = model(x).float()
        if y.ndim == 2:  # mixed soft targets (label smoothing already in them); accuracy against the larger part
            loss, y = soft_target_cross_entropy(logits, y), y.argmax(-1)
        else:
            loss = F.cross_entropy(logits, y, label_smoothing=self.cfg.label_smoothing)
        with torch.no_grad():
            n = torch.tensor(float(len(y)), device=y.device)
            stats = {"loss": loss.detach() * n, "acc": (logits.argmax(-1) == y).sum().float(), "n": n}
        return loss, stats

    def evaluate(self, split: str, *, dataset: ImageSource | None = None) -> dict[str, float]:
        """Loss, top-1 and top-5 of the model on ``split`` (and ``ema_*`` of the EMA weights, when kept)."""
        ds = dataset or (self.test_data if split == "test" else self.eval_data)
        kw = dict(mean=self.mean, std=self.std, image_size=self.image_size, channels=self.model.config.in_chans,
                  batch_size=self.cfg.eval_batch_size, runtime=self.rt)  # fmt: skip
        r = evaluate(self.model, ds, **kw)
        self.last_result = r
        out = {"loss": r.loss, "acc": r.top1, "top5": r.top5}
        if self.ema is not None:
            self.last_ema = evaluate(self.ema.module, ds, **kw)
            out.update(ema_loss=self.last_ema.loss, ema_acc=self.last_ema.top1, ema_top5=self.last_ema.top5)
        return out

    def hooks(self, cfg: TrainConfig) -> list:
        hooks = [self._update_ema] if self.ema is not None else []
        if not cfg.measure_every:
            return hooks
        from ..analysis import measure_hook

        return [*hooks, measure_hook(every=cfg.measure_every)]

    def _update_ema(self, ctx: StepContext) -> None:
        """The weight EMA after optimizer step ``ctx.step`` (the engine also calls the hooks once before step 1)."""
        if ctx.step > 0:
            self.ema.update(ctx.model)

    def state_dict(self) -> dict:
        return {"ema": self.ema.module.state_dict()} if self.ema is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.ema is not None and state.get("ema") is not None:
            self.ema.module.load_state_dict(state["ema"])

    def fixed_batch(self) -> tuple[Tensor, Tensor]:
        images, labels = next(iter(self.eval_data.batches(64, shuffle=False)))
        return self._inputs(images), labels.to(self.rt.device)

    def describe(self) -> dict[str, Any]:
        return {
            "augment": self.augment_kind,
            "image_size": self.image_size,
            "train_images": len(self.train_data),
            "eval_split": self.cfg.eval_split,
            "eval_images": len(self.eval_data),
            "parameters": self.model.num_params(),
            "summary": (
                f"{self.model.num_params():,} params, {self.model.config.arch}) on {self.train_data.name}: "
                f"{len(self.train_data)} train / {len(self.eval_data)} {self.cfg.eval_split} images, "
                f"{self.image_size}px, augment={self.augment_kind}"
            ),
        }

    def finish(self, run_dir: Path, rt: Runtime) -> dict[str, Any]:
        t0 = time.time()
        metrics = self.evaluate("test")
        r = self.last_result
        if rt.main:
            self.model.save_pretrained(run_dir / "model")
        ema = ""
        if self.ema is not None:
            if rt.main:
                self.ema.module.config = self.model.config  # the same data record (classes, normalisation)
                self.ema.module.save_pretrained(run_dir / "model_ema")
            ema = f"; EMA weights (model_ema/): {100 * self.last_ema.top1:.2f}%"
        return {
            "test_acc": r.top1,
            "test_top5": r.top5,
            **({"ema_test_acc": self.last_ema.top1} if self.ema is not None else {}),
            "params": self.model.num_params(),
            "record": metrics,
            "message": (
                f"final test accuracy: {100 * r.top1:.2f}% ({round(r.top1 * r.num_samples)}/{r.num_samples}), "
                f"top-{r.k} {100 * r.top5:.2f}%, {self.model.num_params():,} params{ema}"
            ),
            "eval_seconds": time.time() - t0,
            "next": f"crate analyze {run_dir}    |    crate eval {run_dir}",
        }

    def figures(self, run_dir: Path, metrics_path: Path) -> None:
        super().figures(run_dir, metrics_path)
        if self.cfg.measure_every:
            from ..analysis import load_measure_records, plot_measure_history

            records = load_measure_records(metrics_path)
            if records:
                plot_measure_history(records, run_dir / "measure.png", step_key="epoch")


def load_splits(cfg: TrainConfig, image_size: int) -> tuple[ImageSource, ImageSource, ImageSource]:
    """(train, per-epoch eval, test) splits of ``cfg.data`` from :func:`open_source` (``--data-mode``, ``--workers``).

    Shared by every image task (classification, masked autoencoding, DINO).  Files (image folders,
    shards, HF datasets) are decoded at ``image_size``; built-in and CIFAR tensors keep their size and
    are resized per batch.
    """
    kw = dict(
        image_size=image_size, val_fraction=cfg.val_fraction, seed=cfg.seed, on_bad_image=cfg.on_bad_image,
        mode=cfg.data_mode, num_workers=cfg.workers,
    )  # fmt: skip
    train_set = open_source(cfg.data, "train", **kw)
    if cfg.train_subset and not isinstance(train_set, ImageDataset):
        raise ValueError(
            f"--train-subset works on in-memory data only and {cfg.data} is streamed; "
            "pass --data-mode memory (image folders) or drop --train-subset"
        )
    kw["stats"] = (train_set.mean, train_set.std)  # streamed splits: the training pool's, not a new estimate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a skipped-images warning was already shown for the train split
        test_set = open_source(cfg.data, "test", **kw)
        eval_set = test_set if cfg.eval_split == "test" else open_source(cfg.data, cfg.eval_split, **kw)
    if cfg.train_subset and cfg.train_subset < len(train_set):
        g = torch.Generator().manual_seed(cfg.seed)
        keep = torch.randperm(len(train_set), generator=g)[: cfg.train_subset].sort().values
        t = train_set
        train_set = ImageDataset(t.images[keep], t.labels[keep], t.classes, t.mean, t.std, t.name, "train")
    return train_set, eval_set, test_set
