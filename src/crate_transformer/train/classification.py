"""Supervised image classification (JMLR §4.1.1): training from scratch and fine-tuning (``init_from``)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data import ImageSource, Position, default_augmentation, to_device
from ..errors import OptionWarning, Step
from ..layers import set_drop_path
from .evaluation import evaluate
from .images import ImageData, image_classifier, load_splits
from .mix import MixupCutmix, random_erasing, soft_target_cross_entropy
from .optim import ModelEma
from .recipes import Choice, chance_level, changed_settings, choose_augmentation, near_chance, recipe_note
from .task import RunSummary, StepContext, Task, TaskResult, given_once

CHANCE_IMAGES = 512  # training images the first epoch after the warm-up is checked on (against chance)

__all__ = ["ClassificationTask", "load_splits"]


class ClassificationTask(Task):
    """Supervised image classification with cross-entropy (and label smoothing); pre-training or fine-tuning."""

    name = "classification"

    def setup(self, state: dict | None) -> None:
        cfg = self.cfg
        model, self.data = image_classifier(cfg, state, self._load_data)
        self.train_data, self.eval_data, self.test_data = self.data.train, self.data.eval, self.data.test
        self.image_size, self.mean, self.std = self.data.image_size, self.data.mean, self.data.std
        self.model = model.to(self.rt.device)
        self.augment_choice = self._choose_augmentation(state)
        self.augment_kind = kind = self.augment_choice.value
        self.augment = self.data.augmentation(kind)
        self._setup_recipe(len(self.data.classes), state)

    def _choose_augmentation(self, state: dict | None) -> Choice:
        """``augment``, or for ``'auto'`` the choice that fits the data (:func:`.recipes.choose_augmentation`); a
        resumed run that recorded ``'auto'`` (started before the choice was written to config.yaml) keeps the
        rule it started with."""
        cfg, finetune = self.cfg, self.cfg.init_from is not None
        kind = cfg.augmentation.augment
        if kind != "auto":
            return Choice(kind, "as given")
        if state is not None:
            return Choice(default_augmentation(self.data.name, finetune=finetune), "the rule the run started with")
        return choose_augmentation(
            channels=self.train_data.channels,
            num_images=len(self.train_data),
            finetune=finetune,
            recipe=cfg.recipe,
            changed=changed_settings(cfg.augmentation),
        )

    def settled(self) -> dict:
        """The augmentation chosen for ``'auto'``, which config.yaml then records (with what it reads)."""
        return {"augment": self.augment_kind} if self.cfg.augmentation.augment == "auto" else {}

    def _setup_recipe(self, num_classes: int, state: dict | None) -> None:
        """The recipe pieces the options turn on: drop path on a new or fine-tuned model (a resumed one has it in
        its config), mixup / cutmix, random erasing, a weight EMA (each None when off, so a run without them
        draws no extra random numbers)."""
        cfg = self.cfg
        if cfg.optim.drop_path:
            given_once(cfg.model_args, "drop_path", cfg.optim.drop_path, f"drop_path={cfg.optim.drop_path!r}")
        if cfg.optim.drop_path and state is None:
            set_drop_path(self.model, cfg.optim.drop_path)
        self.mixer = self.eraser = self.ema = None
        if cfg.augmentation.mixup > 0 or cfg.augmentation.cutmix > 0:
            aug, local = cfg.augmentation, cfg.optim.batch_size // self.rt.world
            if local < 2:  # an image mixed with itself is the image: the option would do nothing
                raise ValueError(
                    f"mixup / cutmix mix the images of a batch, and each process's batch holds {local} image "
                    f"(batch_size {cfg.optim.batch_size} over {self.rt.world} process(es)): nothing would be "
                    "mixed; use a batch_size of at least 2 per process, or set mixup and cutmix to 0"
                )
            self.mixer = MixupCutmix(
                num_classes, aug.mixup, aug.cutmix, aug.mixup_prob, aug.mixup_switch_prob, cfg.optim.label_smoothing
            )
        if cfg.augmentation.random_erasing > 0:
            self.eraser = random_erasing(cfg.augmentation.random_erasing).to(self.rt.device)
        if cfg.optim.ema > 0:
            self.ema = ModelEma(self.model, cfg.optim.ema)

    def _load_data(self, image_size: int) -> ImageData:
        data = ImageData(self.cfg, image_size, self.rt.device)
        if len(data.classes) < 2:
            raise ValueError(
                f"{data.name} has a single class ({data.classes[0]!r}); a classifier needs at least two "
                "(one folder per class)"
            )
        return data

    def prepare(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """uint8 images → augmented, normalised inputs (then random erasing, then mixup / cutmix: the labels become
        soft targets ``(b, classes)``) and labels on the device."""
        images, labels = batch
        x, y = self.data.inputs(images, self.augment), to_device(labels, self.rt.device)
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
            loss = F.cross_entropy(logits, y, label_smoothing=self.cfg.optim.label_smoothing)
        with torch.no_grad():
            n = torch.full((), len(y), dtype=torch.float32, device=y.device)
            stats = {"loss": loss.detach() * n, "acc": (logits.argmax(-1) == y).sum().float(), "n": n}
        return loss, stats

    def evaluate(self, split: str, *, dataset: ImageSource | None = None) -> dict[str, float]:
        """Loss, top-1 and top-5 of the model on ``split`` (and ``ema_*`` of the EMA weights, when kept)."""
        ds = dataset or (self.test_data if split == "test" else self.eval_data)
        kw = dict(
            mean=self.mean,
            std=self.std,
            image_size=self.image_size,
            channels=self.model.config.in_chans,
            batch_size=self.cfg.logging.eval_batch_size,
            runtime=self.rt,
        )
        r = evaluate(self.model, ds, **kw)
        self.last_result = r
        out = {"loss": r.loss, "acc": r.top1, **({"top5": r.top5} if r.has_top_k else {})}
        if self.ema is not None:
            e = self.last_ema = evaluate(self.ema.module, ds, **kw)
            out.update(ema_loss=e.loss, ema_acc=e.top1, **({"ema_top5": e.top5} if e.has_top_k else {}))
        return out

    def hooks(self) -> list:
        hooks = [self._update_ema] if self.ema is not None else []
        hooks.append(self._chance_check)
        if not self.cfg.logging.measure_every:
            return hooks
        from ..analysis import measure_hook

        return [*hooks, measure_hook(every=self.cfg.logging.measure_every)]

    def _update_ema(self, ctx: StepContext) -> None:
        """The weight EMA after optimizer step ``ctx.step`` (the engine also calls the hooks once before step 1)."""
        if ctx.step > 0:
            self.ema.update(ctx.model)

    @torch.no_grad()
    def _chance_check(self, ctx: StepContext) -> list[dict] | None:
        """At the end of the first epoch after the warm-up, the accuracy on (at most :data:`CHANCE_IMAGES`) training
        images against always answering the most frequent class; an :class:`~crate_transformer.errors.OptionWarning`
        naming the options to try when it is still near that chance level (:func:`.recipes.near_chance`)."""
        if ctx.step != self._chance_step():
            return None
        n = min(CHANCE_IMAGES, len(self.train_data))
        draw = self.train_data.batches(n, at=Position(seed=self.cfg.system.seed), drop_last=False)  # a random draw
        images, labels = next(draw)
        draw.close()  # a streamed source's workers stop here
        was = ctx.model.training
        ctx.model.eval()
        logits = ctx.model(self.data.inputs(images)).float()
        ctx.model.train(was)
        acc = float((logits.argmax(-1).cpu() == labels).float().mean())
        chance = chance_level(labels)
        low = near_chance(acc, chance)
        if low and ctx.is_main:
            warnings.warn(self._chance_warning(acc, chance), stacklevel=2)
        record = {"split": "chance_check", "step": ctx.step, "epoch": ctx.epoch}
        return [{**record, "train_acc": acc, "chance": chance, "near_chance": low}]

    def _chance_step(self) -> int:
        """The last step of the first epoch that ends after the warm-up (during it the lr is not yet at its peak)."""
        o = self.cfg.optim
        per_epoch = self.train_data.steps_per_epoch(o.batch_size)
        total = per_epoch * o.epochs
        warm = max(1, round(o.warmup_fraction * total)) if o.warmup_fraction > 0 else round(o.warmup_epochs * per_epoch)
        return per_epoch * max(1, math.ceil(warm / per_epoch))

    def _chance_warning(self, acc: float, chance: float) -> OptionWarning:
        cfg, epoch = self.cfg, self._chance_step() // self.train_data.steps_per_epoch(self.cfg.optim.batch_size)
        when = "the first epoch" if epoch == 1 else f"epoch {epoch}, the first after the warm-up,"
        tries = ["a higher lr", "more epochs"]
        if self.augment_kind in ("randaugment", "crop-flip"):
            tries.insert(1, "augment='translate' (or 'none')")
        if cfg.init_from is not None and cfg.recipe != "small-data":
            tries.insert(0, "recipe='small-data'")
        return OptionWarning(
            f"training accuracy {100 * acc:.1f}% after {when} is near chance ({100 * chance:.1f}%, the most "
            f"frequent class) at lr {cfg.optim.lr:g} with augment {self.augment_kind}: try " + ", ".join(tries),
            option=("recipe", "lr", "augment", "epochs"),
        )

    def warnings(self, steps: int) -> list[str]:
        warning = self.ema.warmup_warning(steps) if self.ema is not None else None
        return [warning] if warning else []

    def state_dict(self) -> dict:
        return {"ema": self.ema.module.state_dict()} if self.ema is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.ema is not None and state.get("ema") is not None:
            self.ema.module.load_state_dict(state["ema"])

    def fixed_batch(self) -> tuple[Tensor, Tensor]:
        images, labels = next(iter(self.eval_data.batches(64, shuffle=False)))
        return self.data.inputs(images), labels.to(self.rt.device)

    def describe(self) -> RunSummary:
        facts = {
            "augment": self.augment_kind,
            "image_size": self.image_size,
            "train_images": len(self.train_data),
            "eval_split": self.cfg.data.eval_split,
            "eval_images": len(self.eval_data),
            "parameters": self.model.num_params(),
        }
        return RunSummary(
            model=f"{self.model.num_params():,} params, {self.model.config.arch}",
            data=f"on {self.train_data.name}: {len(self.train_data)} train / {len(self.eval_data)} "
            f"{self.cfg.data.eval_split} images, {self.image_size}px, augment={self.augment_kind}",
            facts=facts,
            verb="fine-tuning" if self.cfg.init_from else "training",
            notes=[
                recipe_note(self.cfg, len(self.train_data)),
                f"augmentation {self.augment_kind}: {self.augment_choice.reason}",
            ],
        )

    def finish(self, run_dir: Path) -> TaskResult:
        metrics = self.evaluate("test")
        r = self.last_result
        if self.rt.main:
            self.model.save_pretrained(run_dir / "model")
        ema, numbers = "", {"test_acc": r.top1, "test_top5": r.top5, "params": self.model.num_params()}
        if self.ema is not None:
            if self.rt.main:
                self.ema.module.config = self.model.config  # the same data record (classes, normalisation)
                self.ema.module.save_pretrained(run_dir / "model_ema")
            numbers["ema_test_acc"] = self.last_ema.top1
            ema = f"; EMA weights (model_ema/): {100 * self.last_ema.top1:.2f}%"
        return TaskResult(
            record=metrics,
            message=f"final test accuracy: {100 * r.top1:.2f}% ({round(r.top1 * r.num_samples)}/{r.num_samples})"
            f"{r.top_k_text()}, {self.model.num_params():,} params{ema}",
            numbers=numbers,
            next=(Step("analyze", str(run_dir)), Step("evaluate", str(run_dir))),
        )

    def figures(self, run_dir: Path, metrics_path: Path) -> None:
        super().figures(run_dir, metrics_path)
        if self.cfg.logging.measure_every:
            from ..analysis import load_measure_records, plot_measure_history

            records = load_measure_records(metrics_path)
            if records:
                plot_measure_history(records, run_dir / "measure.png", step_key="epoch")
