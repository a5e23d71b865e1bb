"""CRATE-DINO pre-training (JMLR §4.1.3, Table 4, App. C.3): the ``dino`` task.

The student (:class:`~crate_transformer.models.dino.DINOModel`: a registry backbone + DINO head) is the model the
engine optimises; the teacher is its EMA, updated by a per-step hook after every optimizer step with
DINO's cosine momentum schedule (Caron et al. 2021).  Centering, the per-epoch teacher-temperature warm-up,
the cosine weight-decay schedule and the frozen last layer of the first epoch (no gradient, so no AdamW
step) follow DINO's ``main_dino.py``; see :mod:`crate_transformer.models.dino`.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..config_utils import NON_NEGATIVE, Range, fields_applicability, option
from ..data import augment as A
from ..errors import Step
from ..models.classifier import ImageClassifier
from ..models.contract import IMAGE_CLASSIFIER
from ..models.dino import (
    DINO_ONLY,
    SIMDINO_ONLY,
    DINOHead,
    DINOHeadConfig,
    DINOLoss,
    DINOModel,
    SimDINOLoss,
    cancel_gradients_last_layer,
    collapse_words,
    cosine_schedule,
    ema_update,
    feature_health,
    global_coding_rate,
    teacher_temperature,
)
from .config import TrainConfig
from .evaluation import save_figure, subplots
from .images import ImageData, image_classifier
from .recipes import recipe_note
from .rundir import read_metrics
from .task import RunSummary, StepContext, Task, TaskResult, given_once

__all__ = ["DINOTask", "DINOOptions", "PRESETS", "MultiCropAugmentation", "EXPORT_KEY", "plot_dino_curves"]

OBJECTIVE_NAMES = {"dino": "DINO", "simdino": "SimDINO"}
EXPORT_KEY = "export_model"  # task-state key: the weights of the model that ``model_config`` describes


# --------------------------------------------------------------------------- options and presets
POS, UNIT = Range(0, lo_open=True), Range(0, 1)  # temperatures; momenta and probabilities
AREA = Range(0, 1, lo_open=True, note="each of the two area fractions LO HI")  # crop areas
EPOCHS = Range(0, integer=True, note="whole epochs")
PRESET_NAMES = ("digits", "paper")  # PRESETS below
SIMDINO_EPS = 0.7071067811865476  # sqrt(0.5): SimDINO's --eps 0.5 is eps^2 of the coding rate (ours is eps, eq. (8))


@dataclass
class DINOOptions(DINOHeadConfig):
    """The ``dino`` task's options (names as in DINO's ``main_dino.py``): the model's head settings
    (:class:`~crate_transformer.models.dino.DINOHeadConfig`, which this class extends) and the training's —
    temperatures,
    centre, teacher momentum, the frozen last layer, the weight-decay schedule and the multi-crop augmentation.
    The defaults are the ``digits`` preset; :meth:`from_preset` starts from ``"paper"`` (DINO's defaults, JMLR
    App. C.3) or ``"digits"``.
    """

    preset: str = option(
        "digits",
        "start from this preset: digits (28 px, 2 CPU cores) | paper (DINO's defaults)",
        choices=("digits", "paper"),
        basic=True,
    )
    # temperatures and centre
    student_temp: float = option(0.1, "student temperature tau_s", range=POS, applies=DINO_ONLY)
    teacher_temp: float = option(
        0.04, "teacher temperature tau_t after the warm-up", range=POS, basic=True, applies=DINO_ONLY
    )
    warmup_teacher_temp: float = option(
        0.04, "teacher temperature at the start of the warm-up", range=POS, applies=DINO_ONLY
    )
    warmup_teacher_temp_epochs: int = option(
        0,
        "epochs of linear teacher-temperature warm-up (per epoch, reaching `teacher_temp` in the last one)",
        range=EPOCHS,  # whole epochs, as DINO
        applies=DINO_ONLY,
    )
    center_momentum: float = option(0.9, "EMA momentum of the teacher centre", range=UNIT, applies=DINO_ONLY)
    # SimDINO's coding rate (Wu et al. 2025; the authors' --eps is eps**2, their default 0.5 is eps 0.7071)
    eps: float = option(
        SIMDINO_EPS,
        "precision eps of SimDINO's coding rate R = 1/2 logdet(I + d/(n eps^2) Z^T Z) (the authors' eps is eps^2: "
        "their 0.5 is 0.7071)",
        range=POS,
        basic=True,
        applies=SIMDINO_ONLY,
    )
    coeff: float = option(
        1.0,
        "weight of SimDINO's compression (view alignment) term against the coding rate",
        range=Range(0),
        applies=SIMDINO_ONLY,
    )
    expa_type: int = option(
        1,
        "SimDINO's coding rate of: 1 the mean of student and teacher features, 0 the student's",
        choices=(0, 1),
        applies=SIMDINO_ONLY,
    )
    patch_coding_rate: float = option(
        0.0,
        "weight of a coding-rate term on the student's global-view patch tokens (0 = off; SimDINO#46)",
        range=Range(0),
        applies=SIMDINO_ONLY,
    )
    # teacher EMA and the student's first epoch
    momentum_teacher: float = option(
        0.99, "teacher EMA momentum at the start; cosine schedule to 1 (DINO: 0.996)", range=UNIT
    )
    freeze_last_layer: int = option(
        1,
        "epochs during which the head's last layer gets no gradient (nor AdamW step)",
        range=EPOCHS,
        applies=DINO_ONLY,
    )
    weight_decay_end: float | None = option(
        0.4,
        "cosine weight-decay schedule per step from `weight_decay` to this value (none = constant)",
        range=Range(0, note="or none: constant weight decay"),
    )
    # multi-crop (sizes as fractions of the input side when <= 1, else pixels)
    global_crop_size: int = option(
        0, "side of the 2 global views in pixels (0 = the model's image size)", range=NON_NEGATIVE
    )
    local_crop_size: int = option(
        0, "side of the local views in pixels (0 = 96/224 of the global side)", range=NON_NEGATIVE
    )
    local_crops_number: int = option(0, "number of local views (DINO: 8)", range=NON_NEGATIVE, basic=True)
    global_crops_scale: list[float] = option(
        [0.6, 1.0], "area fraction range of the global crops, LO HI (DINO: 0.4 1.0)", range=AREA
    )
    local_crops_scale: list[float] = option(
        [0.05, 0.4], "area fraction range of the local crops, LO HI (DINO: 0.05 0.4)", range=AREA
    )
    flip: float = option(
        0.0, "probability of a horizontal flip (DINO: 0.5; digits: 0, a flip changes the digit)", range=UNIT
    )
    color_jitter: float = option(
        0.8, "probability of colour jitter (brightness, contrast 0.4, saturation 0.2, hue 0.1)", range=UNIT
    )
    grayscale: float = option(0.2, "probability of grey-scale conversion (RGB data only)", range=UNIT)
    blur: list[float] = option(
        [0.5, 0.1, 0.5], "Gaussian-blur probability: global views 1, 2 and local views (DINO: 1 0.1 0.5)", range=UNIT
    )
    solarize: float = option(0.2, "probability of solarisation of the second global view", range=UNIT)

    def validate(self) -> None:
        """Raise a one-line ValueError for an inconsistent setting (after :class:`Config`'s coercion and
        finiteness check)."""
        for name in ("global_crops_scale", "local_crops_scale"):
            if len(getattr(self, name)) != 2:
                raise ValueError(
                    f"{name} takes two area fractions LO HI, got {getattr(self, name)}; e.g. {name}=[0.4, 1]"
                )
            lo, hi = getattr(self, name)
            if not 0.0 < lo <= hi <= 1.0:
                raise ValueError(f"{name} must be two area fractions 0 < lo <= hi <= 1, got {getattr(self, name)}")
        if len(self.blur) != 3:
            raise ValueError(f"blur takes 3 probabilities (global 1, global 2, local), got {self.blur}")

    @classmethod
    def from_preset(cls, name: str = "digits", **overrides: Any) -> DINOOptions:
        """The preset ``name`` with ``overrides`` (fields of this class) applied; for ``objective="simdino"``
        the preset's SimDINO form (:func:`preset`)."""
        known = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"unknown DINO option(s) {bad}; valid options: {sorted(known)}")
        objective = overrides.get("objective", cls.__dataclass_fields__["objective"].default)
        return cls(**{**preset(name, objective), **overrides, "preset": name})  # an unknown preset: the choices' error


# DINO main_dino.py defaults (ViT-S/16 column of its README except the teacher-temperature warm-up, which
# main_dino.py leaves at 0.04 → 0.04); JMLR App. C.3 states CRATE-DINO matches them.  TrainConfig side of the
# recipe (C.3): --optimizer adamw --lr 0.001 --weight-decay 0.005 --epochs 100 --warmup-epochs 10 --grad-clip 3.
# C.3 sets DINO's --weight_decay (the start of its cosine weight-decay schedule) and leaves --weight_decay_end
# at DINO's default 0.4, so the schedule stays on: 0.005 → 0.4.
PAPER: dict[str, Any] = dict(
    out_dim=65536,
    hidden_dim=2048,
    bottleneck_dim=256,
    head_layers=3,
    use_bn_in_head=False,
    norm_last_layer=True,
    pool="cls",
    student_temp=0.1,
    teacher_temp=0.04,
    warmup_teacher_temp=0.04,
    warmup_teacher_temp_epochs=0,
    center_momentum=0.9,
    momentum_teacher=0.996,
    freeze_last_layer=1,
    weight_decay_end=0.4,
    global_crop_size=0,
    local_crop_size=0,
    local_crops_number=8,
    global_crops_scale=[0.4, 1.0],
    local_crops_scale=[0.05, 0.4],
    flip=0.5,
    color_jitter=0.8,
    grayscale=0.2,
    blur=[1.0, 0.1, 0.5],
    solarize=0.2,
)
# The built-in 28x28 digits on 2 CPU cores: a small head with BatchNorm (without it the small CRATE's teacher
# drifted to the uniform collapse on the digits: entropy -> log K; with it the teacher stays sharp), mean-pooled
# features, no local crops (a 14-px crop of a digit rarely shows which digit it is), no flips, milder crops,
# and teacher momentum 0.99: the run has ~310 steps (DINO ~125,000), over which a 0.996 teacher lags the
# student too long (k-NN after 5 epochs: 84.3% with 0.996 in a 12-epoch run, 86.7% with 0.99 in a 10-epoch one).
DIGITS: dict[str, Any] = {
    **PAPER,
    **dict(
        out_dim=1024,
        hidden_dim=256,
        bottleneck_dim=64,
        use_bn_in_head=True,
        pool="avg",
        local_crops_number=0,
        global_crops_scale=[0.6, 1.0],
        flip=0.0,
        blur=[0.5, 0.1, 0.5],
        momentum_teacher=0.99,
    ),
}
PRESETS: dict[str, dict[str, Any]] = {"digits": DIGITS, "paper": PAPER}
# SimDINO's changes to a preset (RobinWu218/SimDINO main_dino.py keeps DINO's other defaults): no BatchNorm in the
# head (their default; batch statistics per process would also make the loss depend on the number of processes).
SIMDINO: dict[str, Any] = dict(use_bn_in_head=False, eps=SIMDINO_EPS, coeff=1.0, expa_type=1)


def preset(name: str, objective: str = "dino") -> dict[str, Any]:
    """The options of preset ``name`` for ``objective``: DINO's as in :data:`PRESETS`; SimDINO's without the options
    that apply to DINO only (prototypes, temperatures, centre, frozen last layer) and with :data:`SIMDINO`."""
    values = dict(PRESETS.get(name, {}))
    if objective == "dino":
        return values
    dino_only = {n for n, where in fields_applicability(DINOOptions).items() if where == DINO_ONLY}
    return {**{k: v for k, v in values.items() if k not in dino_only}, **SIMDINO}


# --------------------------------------------------------------------------- multi-crop
class MultiCropAugmentation(nn.Module):
    """DINO's ``DataAugmentationDINO`` as batched ops on the device (:mod:`~crate_transformer.data.augment`) on float
    images in [0, 1]: two global views (RandomResizedCrop ``global_crops_scale``; view 1 always blurred, view 2
    blurred with p 0.1 and solarised with p 0.2) and ``local_crops_number`` local views (``local_crops_scale``,
    blur p 0.5), each with a flip, colour jitter (p 0.8) and grey-scale (p 0.2).  On grey-scale images the colour
    jitter is brightness and contrast, and grey-scale conversion is skipped.

    The default local side is 96/224 of the global side rounded to a ``multiple`` (the patch size).
    ``views`` holds one module per view, ``sizes`` their sides; ``forward(x)`` returns the list of views.
    """

    def __init__(self, cfg: DINOOptions, global_size: int, channels: int, multiple: int = 1) -> None:
        super().__init__()
        g = cfg.global_crop_size or global_size
        loc = cfg.local_crop_size or max(multiple, round(g * 96 / 224 / multiple) * multiple)

        def view(size: int, scale: Sequence[float], blur: float, solarize: float) -> nn.Module:
            ops: list[nn.Module] = [A.RandomResizedCropFlip(size, tuple(float(s) for s in scale), flip=cfg.flip)]
            if cfg.color_jitter > 0:
                ops.append(A.ColorJitter(0.4, 0.4, 0.2, 0.1, p=cfg.color_jitter))
            if cfg.grayscale > 0 and channels == 3:
                ops.append(A.RandomGrayscale(cfg.grayscale))
            if blur > 0:
                k = max(3, (size // 10) | 1)  # odd kernel, ~10% of the side as in BYOL/DINO
                ops.append(A.GaussianBlur(k, (0.1, 2.0), p=blur))
            if solarize > 0:
                ops.append(A.Solarize(solarize))
            return nn.Sequential(*ops)

        b1, b2, bl = (float(p) for p in cfg.blur)
        mods = [view(g, cfg.global_crops_scale, b1, 0.0), view(g, cfg.global_crops_scale, b2, cfg.solarize)]
        mods += [view(loc, cfg.local_crops_scale, bl, 0.0) for _ in range(cfg.local_crops_number)]
        self.views = nn.ModuleList(mods)
        self.sizes = [g, g] + [loc] * cfg.local_crops_number

    def forward(self, x: Tensor) -> list[Tensor]:
        return [v(x) for v in self.views]


# --------------------------------------------------------------------------- the task
class DINOTask(Task):
    """Self-supervised DINO pre-training of a registry backbone; evaluated by weighted k-NN on teacher features.

    Data, normalisation, the backbone and its ``DataSpec`` are set up as for classification
    (:func:`~crate_transformer.train.images.image_classifier`); labels are used only by the k-NN /
    linear-probe evaluations, never for training.
    """

    name = "dino"
    metric = "knn"
    Options = DINOOptions
    model_kind = IMAGE_CLASSIFIER
    shardable = False  # the EMA teacher follows the student's full weights every step
    # the task's defaults: the digits recipe on 2 CPU cores (the paper's recipe: see PAPER in dino.py)
    defaults: dict[str, Any] = dict(
        model="crate_mnist",
        lr=1e-3,
        min_lr=1e-5,
        weight_decay=0.04,
        epochs=10,
        warmup_epochs=3.0,
        batch_size=128,
        grad_clip=3.0,
        eval_every=5,
    )

    # ------------------------------------------------------------------ setup
    def parse_options(self, cfg: TrainConfig) -> DINOOptions:
        """``cfg.task_args`` (the options given) on top of their ``preset`` (``digits`` by default)."""
        args = self.check_options(cfg.task_args)
        return self.Options.from_preset(str(args.pop("preset", "digits")), **args)

    def setup(self, state: dict | None) -> None:
        cfg, rt = self.cfg, self.rt
        self.options = opts = self.parse_options(cfg)
        given_once(cfg.model_args, "pool", opts.pool, f"pool={opts.pool!r}")  # the DINO feature sets the backbone's
        load = functools.partial(ImageData, cfg, device=rt.device)
        backbone, self.data = image_classifier(cfg, state, load)  # data, normalisation, the backbone (DataSpec)
        self.train_data, self.eval_data, self.test_data = self.data.train, self.data.eval, self.data.test
        self.image_size = self.data.image_size
        backbone = backbone.to(rt.device)
        self.labelled = len(self.train_data.classes) >= 2
        if not self.labelled:
            rt.log(
                f"notice: {self.train_data.name} has a single class; DINO trains without labels, but its k-NN and "
                "linear-probe evaluations need two or more classes and are skipped"
            )
        if "pool" in {f.name for f in dataclasses.fields(backbone.config)}:  # the DINO feature, saved with it
            backbone.config = dataclasses.replace(backbone.config, pool=opts.pool)
        self.student = DINOModel(backbone, self._head(backbone.config.dim), pool=opts.pool)
        self.teacher = copy.deepcopy(self.student).requires_grad_(False)  # θ_t = θ_s at the start (DINO)
        self.model = self.student
        self.criterion = self._criterion()
        self.steps_per_epoch = self.train_data.steps_per_epoch(cfg.optim.batch_size)
        self.total_steps = self.steps_per_epoch * cfg.optim.epochs
        self.step = 0
        self.multicrop = MultiCropAugmentation(
            opts, self.image_size, backbone.config.in_chans, multiple=backbone.config.patch_size
        ).to(rt.device)

    def _criterion(self) -> nn.Module:
        """DINO's cross-entropy with its centre, or SimDINO's coding-rate loss (whose batch is checked here: its
        covariance is of the whole global batch, which chunks of gradient accumulation would split)."""
        opts, cfg, rt = self.options, self.cfg, self.rt
        if opts.objective == "dino":
            return DINOLoss(opts.out_dim, student_temp=opts.student_temp, center_momentum=opts.center_momentum).to(
                rt.device
            )
        if cfg.optim.accum_steps != 1:
            raise ValueError(
                f"SimDINO's coding rate is of the whole batch, which accum_steps={cfg.optim.accum_steps} would split "
                "into chunks; use accum_steps=1 (a smaller batch_size, or more processes)"
            )
        per_process = cfg.optim.batch_size // max(rt.world, 1)
        if per_process < 2:
            raise ValueError(
                f"SimDINO needs at least 2 images per process for its covariance, got batch_size "
                f"{cfg.optim.batch_size} over {rt.world} process(es); raise batch_size to >= {2 * rt.world}"
            )
        return SimDINOLoss(eps=opts.eps, coeff=opts.coeff, smooth=opts.expa_type == 1)

    def _head(self, dim: int) -> nn.Module:
        """The student's DINO head on ``dim``-dimensional features (synchronised batch norm across GPUs)."""
        opts, rt = self.options, self.rt
        head = DINOHead.from_config(dim, opts)
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
        if self.options.objective == "simdino":
            loss, stats = self._simdino_loss(model, views, t_out)
        else:
            s_out = model(views)
            temp = self.teacher_temp(self.step)
            loss = self.criterion(s_out, t_out, temp, n_global=2)
            with torch.no_grad():
                p = torch.softmax((t_out.float() - self.criterion.center) / temp, dim=-1)
                stats = {"teacher_entropy": -(p * p.clamp_min(1e-12).log()).sum(-1).mean()}
        with torch.no_grad():
            n = torch.full((), len(views[0]), dtype=torch.float32, device=loss.device)
            stats.update(feature_health(t_feat, self.options.eps))
            stats = {"loss": loss.detach(), **stats}
            stats = {k: v.float() * n for k, v in stats.items()}
        return loss, {**stats, "n": n}

    def _simdino_loss(self, model: nn.Module, views: list[Tensor], t_out: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """SimDINO's loss (:class:`~crate_transformer.models.dino.SimDINOLoss`) and, with ``patch_coding_rate``
        w > 0, minus w times the coding rate of the student's patch tokens of the two global views (each view's
        tokens of the whole global batch, ℓ2-normalised, the views' rates averaged; RobinWu218/SimDINO#46)."""
        w = self.options.patch_coding_rate
        s_out, patches = model(views, patch_views=2) if w > 0 else (model(views), None)
        loss, terms = self.criterion(s_out, t_out, n_global=2)
        if patches is not None:
            z = nn.functional.normalize(patches.float(), dim=-1).chunk(2)
            rate = torch.stack([global_coding_rate(v.reshape(-1, v.shape[-1]), self.options.eps)[0] for v in z])
            terms["patch_coding_rate"] = rate.mean().detach().float()
            loss = loss - w * rate.mean().to(loss.dtype)
        return loss, terms

    def _after_step(self, ctx: StepContext) -> list[dict] | None:
        """The EMA teacher update after optimizer step ``ctx.step`` (JMLR eq. (79), DINO's momentum schedule)."""
        if ctx.step == 0:  # the engine's call before the first step
            return None
        m = self.momentum(ctx.step - 1)
        ema_update(self.teacher, self.student, m)
        self.step = ctx.step
        if ctx.step % self.cfg.logging.log_every == 0 or ctx.step == self.total_steps:
            s = ctx.step - 1  # the values step s used
            sched = dict(momentum=m, weight_decay=self.weight_decay(s))
            if self.options.objective == "dino":
                sched["teacher_temp"] = self.teacher_temp(s)
            return [dict(split="schedule", step=ctx.step, epoch=ctx.epoch, **sched)]
        return None

    def hooks(self) -> list:
        return [self._after_step]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        state = {
            EXPORT_KEY: self.teacher.backbone.state_dict(),  # what load_model(last.pt) returns
            "teacher_head": self.teacher.head.state_dict(),
            "step": self.step,
            "options": self.options.to_dict(),
        }
        if self.options.objective == "dino":  # SimDINO's loss has no state
            state["center"] = self.criterion.center.detach().cpu()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.teacher.backbone.load_state_dict(state[EXPORT_KEY])
        self.teacher.head.load_state_dict(state["teacher_head"])
        if self.options.objective == "dino":
            self.criterion.center.copy_(state["center"])
        self.step = int(state["step"])

    # ------------------------------------------------------------------ evaluation
    def _features(self, model: ImageClassifier, split: str) -> tuple[Tensor, Tensor]:
        from ..analysis.probe import extract_features

        ds = {"train": self.train_data, "test": self.test_data}.get(split, self.eval_data)
        c = model.config
        return extract_features(
            model,
            ds,
            mean=self.data.mean,
            std=self.data.std,
            image_size=self.image_size,
            channels=c.in_chans,
            pool=self.options.pool,
            batch_size=self.cfg.logging.eval_batch_size,
            device=self.rt.device,
        )

    def evaluate(self, split: str) -> dict[str, float]:
        """Weighted k-NN (k = 20, T = 0.07) of the teacher's features: train split → ``split``."""
        from ..analysis.probe import knn_classify

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
        what = f"{o.out_dim} prototypes" if o.objective == "dino" else f"coding rate eps {o.eps:.4g}"
        return RunSummary(
            model=f"{OBJECTIVE_NAMES[o.objective]} preset {o.preset}: {backbone.num_params():,} params, "
            f"{backbone.config.arch}",
            data=f"+ head {head:,} ({what}), pool {o.pool}, views {views}; {self.train_data.name}: "
            f"{len(self.train_data)} train images (labels unused), {len(self.eval_data)} {self.cfg.data.eval_split}",
            facts=facts,
            notes=[
                recipe_note(self.cfg, len(self.train_data), f"the {self.name} task's defaults"),
                self._views_note(views),
            ],
        )

    def _views_note(self, views: str) -> str:
        """The header line on the multi-crop augmentation: the preset's views and flips, and why."""
        o, channels = self.options, self.train_data.channels
        line = f"augmentation: DINO multi-crop, preset {o.preset}: views {views}, flip p={o.flip:g}"
        if o.preset != "digits":
            return f"{line} (DINO's own, for natural images)"
        why = "no flips and no local crops: a mirrored digit or a 14-px crop of one is often another digit"
        other = "; preset='paper' (flips, 8 local crops) fits natural images" if channels == 3 else ""
        return f"{line} ({why}{other})"

    def finish(self, run_dir: Path) -> TaskResult:
        """Save the teacher backbone as ``model/``; k-NN sweep and linear probe on the test split."""
        from ..analysis.probe import KNN_KS, fit_probe, knn_sweep, pool_words, usable_ks

        teacher = self.teacher.backbone
        if self.rt.main:
            teacher.save_pretrained(run_dir / "model")
        ex, ey = self._features(teacher, "test")
        health = {k: float(v) for k, v in feature_health(ex, self.options.eps).items()}
        std, rank = health["feature_std"], health["effective_rank"]
        said = f"teacher features ({pool_words(self.options.pool)}) on the {len(ey)} test images:"
        shape = (rank, len(ex), ex.shape[-1])
        monitors = f"feature std {std:.3f}, {collapse_words(*shape)}, coding rate {health['coding_rate']:.2f}"
        if not self.labelled:
            return TaskResult(
                record=health,
                message=f"{said} {monitors} (k-NN and linear probe skipped: a single class)",
                numbers={**health, "params": teacher.num_params()},
            )
        tx, ty = self._features(teacher, "train")
        n_cls = len(self.train_data.classes)
        ks, above = usable_ks(KNN_KS, len(ty))
        knn = knn_sweep(tx, ty, ex, ey, ks=ks, temperature=0.07, num_classes=n_cls) if ks else {}
        probe = fit_probe(tx, ty, ex, ey)  # the probe of crate eval --linear-probe
        record = {f"knn_{k}": float(v) for k, v in knn.items()}
        record.update(probe=float(probe.acc), **health)
        if 20 in knn:
            record["knn"] = float(knn[20])
        shown = ", ".join(f"k={k} {100 * v:.2f}%" for k, v in knn.items())
        if above:
            shown += f"{', ' if knn else ''}k={', '.join(map(str, above))} not run (only {len(ty)} train images)"
        knn_accs = {int(k): float(v) for k, v in knn.items()}
        return TaskResult(
            record=record,
            message=f"{said} k-NN {shown}; linear probe {100 * probe.acc:.2f}%; {monitors}",
            numbers={"knn": knn_accs, "probe": float(probe.acc), **health, "params": teacher.num_params()},
            next=(Step("evaluate", str(run_dir), (("knn", True), ("linear_probe", True))),),
        )

    def figures(self, run_dir: Path, metrics_path: Path) -> None:
        plot_dino_curves(metrics_path, run_dir / "curves.png", objective=self.options.objective)


def plot_dino_curves(metrics_path: str | os.PathLike, out_png: str | os.PathLike, *, objective: str = "dino") -> Path:
    """Four panels against the step: the loss (SimDINO: with its compression and expansion terms); the collapse
    monitors (teacher feature std and effective rank; DINO: the teacher entropy too); k-NN accuracy of the
    teacher's features; learning rate, teacher momentum, weight decay (and DINO's temperature)."""
    records = read_metrics(metrics_path)
    train_r = [r for r in records if r.get("split") == "train"]
    sched = [r for r in records if r.get("split") == "schedule"]
    evals = [r for r in records if r.get("split") in ("val", "test") and "knn" in r]
    fig, (ax_loss, ax_std, ax_knn, ax_s) = subplots(1, 4, figsize=(17, 3.6))
    steps = [r["step"] for r in train_r]
    ax_loss.plot(steps, [r["loss"] for r in train_r], lw=1, label="loss")
    for term in ("compression", "expansion") if objective == "simdino" else ():
        ax_loss.plot(steps, [r.get(term, np.nan) for r in train_r], lw=1, label=term)
    if objective == "simdino":
        ax_loss.legend()
    ax_loss.set(title=f"{OBJECTIVE_NAMES.get(objective, objective)} loss (train)", xlabel="step")
    _plot_monitors(ax_std, steps, train_r, objective)
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
    if objective == "dino":
        ax_t = ax_s.twinx()
        ax_t.plot([r["step"] for r in sched], [r["teacher_temp"] for r in sched], color="tab:red", lw=1)
        ax_t.set_ylabel("teacher temperature", color="tab:red")
    ax_s.legend(loc="lower left")
    ax_s.set(title="schedules", xlabel="step")
    for ax in (ax_loss, ax_std, ax_knn, ax_s):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out_png)


def _plot_monitors(ax: Any, steps: list, train_r: list[dict], objective: str) -> None:
    """The collapse panel: teacher feature std (left axis) and effective rank (right; DINO: the entropy too)."""
    ax.plot(steps, [r.get("feature_std", np.nan) for r in train_r], lw=1, label="feature std")
    ax.set(title="teacher features (collapse: std → 0, rank → 1)", xlabel="step")
    ax_r = ax.twinx()
    ax_r.plot(steps, [r.get("effective_rank", np.nan) for r in train_r], lw=1, color="tab:green")
    ax_r.set_ylabel("effective rank (green)", color="tab:green")
    if objective == "dino":
        ax_r.plot(steps, [r.get("teacher_entropy", np.nan) for r in train_r], lw=1, color="tab:orange")
        ax_r.set_ylabel("effective rank (green), teacher entropy (orange, nats)")
