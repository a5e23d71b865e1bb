"""CRATE-DINO pre-training (JMLR §4.1.3, Table 4, App. C.3): the ``dino`` task.

The student (:class:`~crate_transformer.dino.DINOModel`: a registry backbone + DINO head) is the model the
engine optimises; the teacher is its EMA, updated by a per-step hook after every optimizer step with
DINO's cosine momentum schedule (Caron et al. 2021).  Centering, the per-epoch teacher-temperature warm-up,
the cosine weight-decay schedule and the frozen last layer of the first epoch (no gradient, so no AdamW
step) follow DINO's ``main_dino.py``; see :mod:`crate_transformer.dino`.

What a run saves: ``model/`` is the **teacher backbone** as an ordinary classifier (its classifier head is
untrained; ``config.data`` records the data, ``config.pool`` the DINO feature), so ``crate eval --knn RUN``,
``crate eval --linear-probe RUN``, ``crate analyze RUN`` and ``crate finetune --init-from RUN`` take it
unchanged; the training state (``checkpoints/last.pt``) also holds the student, both heads, the centre
and the step, and ``load_model`` on it returns the teacher backbone too.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..config import IMAGE_CLASSIFIER
from ..dino import (
    DINOConfig,
    DINOHead,
    DINOLoss,
    DINOModel,
    MultiCropAugmentation,
    cancel_gradients_last_layer,
    cosine_schedule,
    ema_update,
    teacher_temperature,
)
from ..model import ImageClassifier
from .config import TrainConfig
from .evaluation import save_figure, subplots
from .images import ImageData, image_classifier
from .rundir import read_metrics
from .task import RunSummary, StepContext, Task, TaskResult

__all__ = ["DINOTask", "EXPORT_KEY", "plot_dino_curves"]

EXPORT_KEY = "export_model"  # task-state key: the weights of the model that ``model_config`` describes


class DINOTask(Task):
    """Self-supervised DINO pre-training of a registry backbone; evaluated by weighted k-NN on teacher features.

    Data, normalisation, the backbone and its ``DataSpec`` are set up as for classification
    (:func:`~crate_transformer.train.images.image_classifier`); labels are used only by the k-NN /
    linear-probe evaluations, never for training.
    """

    name = "dino"
    metric = "knn"
    Options = DINOConfig
    model_kind = IMAGE_CLASSIFIER
    shardable = False  # the EMA teacher follows the student's full weights every step
    # the task's defaults: the digits recipe on 2 CPU cores (the paper's recipe: see PAPER in dino.py)
    defaults: dict[str, Any] = dict(
        model="crate_mnist", lr=1e-3, min_lr=1e-5, weight_decay=0.04, epochs=10, warmup_epochs=3.0,
        batch_size=128, grad_clip=3.0, measure_every=0, eval_every=5, label_smoothing=0.0,
    )  # fmt: skip

    # ------------------------------------------------------------------ setup
    def parse_options(self, cfg: TrainConfig) -> DINOConfig:
        """``cfg.task_args`` (the options given) on top of their ``preset`` (``digits`` by default)."""
        args = self.check_options(cfg.task_args)
        return DINOConfig.from_preset(str(args.pop("preset", "digits")), **args)

    def setup(self, state: dict | None) -> None:
        cfg, rt = self.cfg, self.rt
        self.options = opts = self.parse_options(cfg)
        load = functools.partial(ImageData, cfg, device=rt.device)
        backbone, self.data = image_classifier(cfg, state, load)  # data, normalisation, the backbone (DataSpec)
        self.train_data, self.eval_data, self.test_data = self.data.train, self.data.eval, self.data.test
        self.image_size = self.data.image_size
        backbone = backbone.to(rt.device)
        self.labelled = len(self.train_data.classes) >= 2
        if not self.labelled:
            rt.log(f"notice: {self.train_data.name} has a single class; DINO trains without labels, but its k-NN and "
                   "linear-probe evaluations need two or more classes and are skipped")  # fmt: skip
        backbone.config = dataclasses.replace(backbone.config, pool=opts.pool)  # the DINO feature, saved with it
        self.student = DINOModel(backbone, self._head(backbone.config.dim), pool=opts.pool)
        self.teacher = copy.deepcopy(self.student).requires_grad_(False)  # θ_t = θ_s at the start (DINO)
        self.model = self.student
        self.criterion = DINOLoss(
            opts.out_dim, student_temp=opts.student_temp, center_momentum=opts.center_momentum
        ).to(rt.device)
        self.steps_per_epoch = self.train_data.steps_per_epoch(cfg.optim.batch_size)
        self.total_steps = self.steps_per_epoch * cfg.optim.epochs
        self.step = 0
        self.multicrop = MultiCropAugmentation(
            opts, self.image_size, backbone.config.in_chans, multiple=backbone.config.patch_size
        ).to(rt.device)

    def _head(self, dim: int) -> nn.Module:
        """The student's DINO head on ``dim``-dimensional features (synchronised batch norm across GPUs)."""
        opts, rt = self.options, self.rt
        head = DINOHead(
            dim, opts.out_dim, hidden_dim=opts.hidden_dim, bottleneck_dim=opts.bottleneck_dim,
            nlayers=opts.head_layers, use_bn=opts.use_bn_in_head, norm_last_layer=opts.norm_last_layer,
        )  # fmt: skip
        if opts.use_bn_in_head and rt.distributed and rt.device.type == "cuda":
            head = nn.SyncBatchNorm.convert_sync_batchnorm(head)  # as DINO: batch statistics over all GPUs
        return head.to(rt.device)

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """DINO's per-iteration settings of step ``step``: the weight decay of the regularized group (group 0,
        cosine ``weight_decay`` → ``weight_decay_end``), and no gradient for the head's last layer during the
        first ``freeze_last_layer`` epochs (``cancel_gradients_last_layer``; DDP has already all-reduced)."""
        if self.options.weight_decay_end is not None:
            optimizer.param_groups[0]["weight_decay"] = self.weight_decay(step)
        cancel_gradients_last_layer(self.student.head, step // self.steps_per_epoch, self.options.freeze_last_layer)

    # ------------------------------------------------------------------ training
    def prepare(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, ...]:
        """uint8 images → the multi-crop views, each normalised (labels are dropped)."""
        images, _ = batch
        views = zip(self.multicrop.views, self.multicrop.sizes)
        return tuple(self.data.inputs(images, view, image_size=size) for view, size in views)

    def teacher_temp(self, step: int) -> float:
        """τ_t of optimizer step ``step`` (0-based): DINO's per-epoch table at epoch ``step // steps_per_epoch``."""
        return teacher_temperature(self.options, step // self.steps_per_epoch)

    def momentum(self, step: int) -> float:
        """Teacher EMA momentum of optimizer step ``step`` (0-based): cosine from ``momentum_teacher`` to 1."""
        return cosine_schedule(self.options.momentum_teacher, 1.0, step, self.total_steps)

    def weight_decay(self, step: int) -> float:
        """Weight decay of the matrices at optimizer step ``step`` (0-based): DINO's cosine schedule from
        ``--weight-decay`` to ``--weight-decay-end`` (constant ``--weight-decay`` when that is none)."""
        start, end = self.cfg.optim.weight_decay, self.options.weight_decay_end
        return start if end is None else cosine_schedule(start, end, step, self.total_steps)

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> tuple[Tensor, dict[str, Tensor]]:
        views = list(batch)
        with torch.no_grad():
            t_feat = self.teacher.features(torch.cat(views[:2]))
            t_out = self.teacher.head(t_feat)
        s_out = model(views)
        temp = self.teacher_temp(self.step)
        loss = self.criterion(s_out, t_out, temp, n_global=2)
        with torch.no_grad():
            n = torch.full((), len(views[0]), dtype=torch.float32, device=loss.device)
            p = torch.softmax((t_out.float() - self.criterion.center) / temp, dim=-1)
            entropy = -(p * p.clamp_min(1e-12).log()).sum(-1).mean()
            std = nn.functional.normalize(t_feat.float(), dim=-1).std(dim=0).mean()  # collapse → 0
            stats = {"loss": loss.detach() * n, "teacher_entropy": entropy * n, "feature_std": std * n, "n": n}
        return loss, stats

    def _after_step(self, ctx: StepContext) -> list[dict] | None:
        """The EMA teacher update after optimizer step ``ctx.step`` (JMLR eq. (79), DINO's momentum schedule)."""
        if ctx.step == 0:  # the engine's call before the first step
            return None
        m = self.momentum(ctx.step - 1)
        ema_update(self.teacher, self.student, m)
        self.step = ctx.step
        if ctx.step % self.cfg.logging.log_every == 0 or ctx.step == self.total_steps:
            s = ctx.step - 1  # the values step s used
            sched = dict(momentum=m, teacher_temp=self.teacher_temp(s), weight_decay=self.weight_decay(s))
            return [dict(split="schedule", step=ctx.step, epoch=ctx.epoch, **sched)]
        return None

    def hooks(self) -> list:
        return [self._after_step]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {
            EXPORT_KEY: self.teacher.backbone.state_dict(),  # what load_model(last.pt) returns
            "teacher_head": self.teacher.head.state_dict(),
            "center": self.criterion.center.detach().cpu(),
            "step": self.step,
            "options": self.options.to_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.teacher.backbone.load_state_dict(state[EXPORT_KEY])
        self.teacher.head.load_state_dict(state["teacher_head"])
        self.criterion.center.copy_(state["center"])
        self.step = int(state["step"])

    # ------------------------------------------------------------------ evaluation
    def _features(self, model: ImageClassifier, split: str) -> tuple[Tensor, Tensor]:
        from ..probe import extract_features

        ds = {"train": self.train_data, "test": self.test_data}.get(split, self.eval_data)
        c = model.config
        return extract_features(
            model, ds, mean=self.data.mean, std=self.data.std, image_size=self.image_size, channels=c.in_chans,
            pool=self.options.pool, batch_size=self.cfg.logging.eval_batch_size, device=self.rt.device,
        )  # fmt: skip

    def evaluate(self, split: str) -> dict[str, float]:
        """Weighted k-NN (k = 20, T = 0.07) of the teacher's features: train split → ``split``."""
        from ..probe import knn_classify

        if not self.labelled or len(self.train_data) < 20:  # k = 20 needs 20 neighbours (finish says it is skipped)
            return {}
        tx, ty = self._features(self.teacher.backbone, "train")
        ex, ey = self._features(self.teacher.backbone, split)
        acc = knn_classify(tx, ty, ex, ey, k=20, temperature=0.07, num_classes=len(self.train_data.classes))
        return {"knn": float(acc)}

    def describe(self) -> RunSummary:
        o, backbone = self.options, self.student.backbone
        views = f"2x{self.multicrop.sizes[0]}px" + (
            f" + {o.local_crops_number}x{self.multicrop.sizes[2]}px" if o.local_crops_number else ""
        )
        head = sum(p.numel() for p in self.student.head.parameters())
        facts = {
            "image_size": self.image_size,
            "train_images": len(self.train_data),
            "eval_split": self.cfg.data.eval_split,
            "eval_images": len(self.eval_data),
            "parameters": backbone.num_params(),
            "head_parameters": head,
            "views": views,
            "dino": o.to_dict(),
        }
        return RunSummary(
            model=f"DINO preset {o.preset}: {backbone.num_params():,} params, {backbone.config.arch}",
            data=f"+ head {head:,} ({o.out_dim} prototypes), pool {o.pool}, views {views}; {self.train_data.name}: "
            f"{len(self.train_data)} train images (labels unused), {len(self.eval_data)} {self.cfg.data.eval_split}",
            facts=facts,
        )

    def finish(self, run_dir: Path) -> TaskResult:
        """Save the teacher backbone as ``model/``; k-NN sweep and linear probe on the test split."""
        from ..probe import KNN_KS, knn_sweep, linear_probe, usable_ks

        teacher = self.teacher.backbone
        if self.rt.main:
            teacher.save_pretrained(run_dir / "model")
        ex, ey = self._features(teacher, "test")
        std = float(nn.functional.normalize(ex.float(), dim=-1).std(dim=0).mean())
        said = f"teacher features on the {len(ey)} test images:"
        if not self.labelled:
            return TaskResult(
                record={"feature_std": std},
                message=f"{said} feature std {std:.3f} (k-NN and linear probe skipped: a single class)",
                numbers={"feature_std": std, "params": teacher.num_params()},
            )
        tx, ty = self._features(teacher, "train")
        n_cls = len(self.train_data.classes)
        ks, above = usable_ks(KNN_KS, len(ty))
        knn = knn_sweep(tx, ty, ex, ey, ks=ks, temperature=0.07, num_classes=n_cls) if ks else {}
        probe = linear_probe(tx, ty, ex, ey)
        record = {f"knn_{k}": float(v) for k, v in knn.items()}
        record.update(probe=float(probe.acc), feature_std=std)
        if 20 in knn:
            record["knn"] = float(knn[20])
        shown = ", ".join(f"k={k} {100 * v:.2f}%" for k, v in knn.items())
        if above:
            shown += f"{', ' if knn else ''}k={', '.join(map(str, above))} not run (only {len(ty)} train images)"
        knn_accs = {int(k): float(v) for k, v in knn.items()}
        return TaskResult(
            record=record,
            message=f"{said} k-NN {shown}; linear probe {100 * probe.acc:.2f}%; feature std {std:.3f}",
            numbers={"knn": knn_accs, "probe": float(probe.acc), "feature_std": std, "params": teacher.num_params()},
            next=f"crate eval --knn --linear-probe {run_dir}",
        )

    def figures(self, run_dir: Path, metrics_path: Path) -> None:
        plot_dino_curves(metrics_path, run_dir / "curves.png")


def plot_dino_curves(metrics_path: str | os.PathLike, out_png: str | os.PathLike) -> Path:
    """Four panels against the step: DINO loss; teacher feature std and entropy (collapse monitors);
    k-NN accuracy of the teacher's features; learning rate, teacher momentum, weight decay and temperature."""
    records = read_metrics(metrics_path)
    train_r = [r for r in records if r.get("split") == "train"]
    sched = [r for r in records if r.get("split") == "schedule"]
    evals = [r for r in records if r.get("split") in ("val", "test") and "knn" in r]
    fig, (ax_loss, ax_std, ax_knn, ax_s) = subplots(1, 4, figsize=(17, 3.6))
    steps = [r["step"] for r in train_r]
    ax_loss.plot(steps, [r["loss"] for r in train_r], lw=1)
    ax_loss.set(title="DINO loss (train)", xlabel="step")
    ax_std.plot(steps, [r.get("feature_std", np.nan) for r in train_r], lw=1, label="feature std")
    ax_std.set(title="teacher feature std (collapse → 0)", xlabel="step")
    ax_e = ax_std.twinx()
    ax_e.plot(steps, [r.get("teacher_entropy", np.nan) for r in train_r], lw=1, color="tab:orange")
    ax_e.set_ylabel("teacher entropy (nats)", color="tab:orange")
    for split in sorted({r["split"] for r in evals}):
        rs = [r for r in evals if r["split"] == split]
        ax_knn.plot([r["step"] for r in rs], [100 * r["knn"] for r in rs], "o-", ms=3, label=f"{split} (k=20)")
    if evals:
        ax_knn.legend()
    ax_knn.set(title="k-NN accuracy of teacher features (%)", xlabel="step")
    ax_s.plot(steps, [r["lr"] / max(r2["lr"] for r2 in train_r) for r in train_r], color="tab:gray", label="lr / max")
    ax_s.plot([r["step"] for r in sched], [r["momentum"] for r in sched], label="teacher momentum")
    wd = [r.get("weight_decay", np.nan) for r in sched]
    if sched and np.nanmax(wd, initial=0.0) > 0:
        ax_s.plot([r["step"] for r in sched], np.array(wd) / np.nanmax(wd), ls="--", label="weight decay / max")
    ax_t = ax_s.twinx()
    ax_t.plot([r["step"] for r in sched], [r["teacher_temp"] for r in sched], color="tab:red", lw=1)
    ax_t.set_ylabel("teacher temperature", color="tab:red")
    ax_s.legend(loc="lower left")
    ax_s.set(title="schedules", xlabel="step")
    for ax in (ax_loss, ax_std, ax_knn, ax_s):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out_png)
