"""Masked autoencoding with CRATE-MAE (JMLR §3.6 and §4.2, pp.37-41): the ``mae`` task.

The engine (:mod:`.loop`) owns the optimisation, checkpoints, resume, DDP, logging and the progress
bar; this task builds a :class:`~crate_transformer.models.mae.CRATEMAE` and the data, turns a batch into the
masked-patch loss (eq. (71) on Ω), and at the end writes

* ``model/`` — the CRATE-MAE (``config.json`` with ``arch: crate_mae``);
* ``reconstruction.png`` — original / masked / reconstruction of held-out images (Fig. 11 style);
* ``recognition.json`` — how recognisable the reconstructions are: a raw-pixel k-NN fitted on the
  training images labels held-out originals, mean-filled masked images and reconstructions
  (:func:`~crate_transformer.analysis.reconstruction_recognition`);
* ``probe.json`` — a linear probe (scikit-learn logistic regression,
  :func:`~crate_transformer.analysis.probe.linear_probe`)
  on pooled encoder features of the unmasked images, for the trained encoder and for a randomly
  initialised encoder of the same architecture (the baseline).

The held-out loss is measured with a fixed mask per image (seeded), so epochs are comparable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import Config
from ..config_utils import Range
from ..data import BUILTIN_DATASETS, ImageSource
from ..data.base import rank_slice
from ..errors import OptionError, Step
from ..io import atomic_write
from ..layers.inference import evaluating
from ..loading.pipeline import config_from_dict, load_model
from ..models.base import POOLS, Model
from ..models.contract import MASKED_AUTOENCODER, FamilyConfig
from ..models.mae import CRATEMAE
from ..models.registry import build, model_config
from .evaluation import prepare_batch, require_evaluated
from .images import ImageData
from .recipes import Choice, choose_mae_augmentation, recipe_note
from .runtime import Runtime
from .task import RunSummary, Task, TaskError, TaskResult, given_once, task_option

__all__ = ["MAETask", "MAEOptions", "masked_eval"]


@dataclass
class MAEOptions(Config):
    """Options of the ``mae`` task (besides the engine's)."""

    mask_ratio: float | None = task_option(
        None,
        "fraction of patches masked (default: the model's, 0.75)",
        range=Range(0, 1, lo_open=True, hi_open=True),
        fixed="mask_ratio",
        basic=True,
        applies="always",
    )
    augmentation: str = task_option(
        "auto",
        "augmentation of the pre-training images: auto (none for grey-scale images such as digits, crop-flip for "
        "colour ones, as in MAE; the header says which) | none | translate | crop-flip",
        choices=("auto", "none", "translate", "crop-flip"),
        applies="always",
    )
    probe: bool = task_option(
        True,
        "at the end, linear-probe the encoder and a random-init encoder (probe.json)",
        basic=True,
        applies="always",
    )
    probe_pool: str = task_option(
        "avg",
        "probe features: avg of the patch tokens (eq. (72)) | cls | mean of all tokens",
        choices=POOLS,
        applies={"probe": "on"},
    )
    probe_c: float = task_option(
        1.0,
        "inverse L2 strength C of the logistic-regression probe",
        range=Range(0, lo_open=True),
        applies={"probe": "on"},
    )
    figure_images: int = task_option(
        8,
        "held-out images in reconstruction.png (a readable figure holds at most 64)",
        range=Range(0, 64, integer=True),
        applies="always",
    )
    recognition: bool = task_option(
        True,
        "at the end, classify the held-out reconstructions with a raw-pixel k-NN (recognition.json)",
        applies="always",
    )


@torch.no_grad()
def masked_eval(
    model: CRATEMAE,
    dataset: ImageSource,
    *,
    mean: list[float],
    std: list[float],
    image_size: int,
    batch_size: int = 500,
    seed: int = 0,
    runtime: Runtime | None = None,
) -> dict[str, float]:
    """Held-out masked-patch loss (and visible-patch loss) with a fixed, seeded mask per image.

    Under torch.distributed each process evaluates its share of every batch and the sums are reduced.
    """
    rt = runtime or Runtime(device=next(model.parameters()).device)
    c = model.config
    n_patches = (image_size // c.patch_size) ** 2
    noise = torch.rand(len(dataset), n_patches, generator=torch.Generator().manual_seed(seed))
    sums = torch.zeros(3, dtype=torch.float64, device=rt.device)  # masked loss, visible loss, images
    with evaluating(model):
        for b, (images, _) in enumerate(dataset.batches(batch_size, shuffle=False, at=rt.position())):
            idx = rank_slice(torch.arange(b * batch_size, min((b + 1) * batch_size, len(dataset))), rt.rank, rt.world)
            x = prepare_batch(images, device=rt.device, image_size=image_size, channels=c.in_chans, mean=mean, std=std)
            with rt.autocast():
                pred, mask = model(x, noise=noise[idx].to(rt.device))[1:]
            masked, visible = _per_image_losses(model, x, pred, mask)
            sums += torch.stack([masked.sum(), visible.sum(), masked.new_full((), len(x))]).double()
    rt.all_reduce(sums)
    n = float(sums[2])
    require_evaluated(n, "images", dataset)
    return {"loss": float(sums[0]) / n, "visible_loss": float(sums[1]) / n}


def _per_image_losses(model: CRATEMAE, x: Tensor, pred: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per image: mean squared error over its masked patches, and over its visible patches."""
    per_patch = (pred.float() - model.target(x).float()).pow(2).mean(-1)
    masked = (per_patch * mask).sum(1) / mask.sum(1)
    visible = (per_patch * (1 - mask)).sum(1) / (1 - mask).sum(1)
    return masked, visible


def recognition_text(rec: dict[str, Any], fmt: str) -> str:
    """How recognisable the reconstructions are, in words (``fmt``: the format of the percentages)."""
    pct = {key: format(100 * rec[key], fmt) + "%" for key in ("reconstruction", "original", "mean_fill")}
    return (
        f"{pct['reconstruction']} of {rec['images']:,} held-out reconstructions (originals {pct['original']}, "
        f"the mean image in the masked patches {pct['mean_fill']})"
    )


def _write_json(path: Path, obj: Any) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=1)))


def _unwrap(model: nn.Module) -> CRATEMAE:
    return getattr(model, "module", model)


class MAETask(Task):
    """Masked autoencoding: pre-train a CRATE-MAE (JMLR §4.2); reconstruction figure and linear probe at the end."""

    name = "mae"
    metric = "visible_loss"
    # The digits default (≤ 5 min on 2 CPU cores), chosen by measurement (docs/results.md).  AdamW (0.9, 0.95)
    # as MAE; small batches and a high learning rate because the model is under-trained at this budget.
    defaults = {
        "model": "crate_mae_mnist",
        "lr": 4e-3,
        "min_lr": 1e-5,
        "weight_decay": 0.05,
        "epochs": 40,
        "warmup_epochs": 2.0,
        "batch_size": 32,
        "betas": [0.9, 0.95],
        "eval_every": 4,
    }
    Options = MAEOptions
    model_kind = MASKED_AUTOENCODER

    def setup(self, state: dict | None) -> None:
        cfg = self.cfg
        self.options: MAEOptions = self.parse_options(cfg)
        config, image_size, init = self._config(state)
        self.data = ImageData(cfg, image_size, self.rt.device)
        self.train_data, self.eval_data, self.test_data = self.data.train, self.data.eval, self.data.test
        self.image_size = self.data.image_size
        if self.options.probe and len(self.train_data.classes) < 2:  # checked before training, not after it
            raise OptionError(
                f"{self.train_data.name} has a single class; the final linear probe needs two or more "
                "(one folder per class): pass probe=False to pre-train without it"
            )
        if state is None:
            fields = config.to_dict()
            if cfg.init_from is None:
                fields["in_chans"] = self.train_data.channels if "in_chans" not in cfg.model_args else config.in_chans
            fields.update(image_size=image_size)
            if self.options.mask_ratio is not None:
                ratio = self.options.mask_ratio
                given_once(cfg.model_args, "mask_ratio", ratio, f"mask_ratio={ratio!r}")
                fields["mask_ratio"] = ratio
            config = type(config).from_dict(fields)
        model = build(config)
        if init is not None:
            model.load_state_dict(init.state_dict())
        self.data.fit(model)
        self.mean, self.std = self.data.mean, self.data.std
        self.model = model.to(self.rt.device)
        self.augment_choice = self._choose_augmentation(state)
        self.augment_kind = kind = self.augment_choice.value
        self.augment = self.data.augmentation(kind, min_crop_scale=0.2)

    def _choose_augmentation(self, state: dict | None) -> Choice:
        """``augmentation``, or for ``'auto'`` the one that fits the data (:func:`.recipes.choose_mae_augmentation`);
        a resumed run that recorded ``'auto'`` keeps the rule it started with (none for the built-in digits)."""
        kind = self.options.augmentation
        if kind != "auto":
            return Choice(kind, "as given")
        if state is not None:
            legacy = "none" if self.train_data.name in BUILTIN_DATASETS else "crop-flip"
            return Choice(legacy, "the rule the run started with")
        return choose_mae_augmentation(self.train_data.channels)

    def settled(self) -> dict:
        """The augmentation chosen for ``'auto'``, recorded in config.yaml's task_args."""
        if self.options.augmentation != "auto":
            return {}
        return {"task_args": {**self.cfg.task_args, "augmentation": self.augment_kind}}

    def _config(self, state: dict | None) -> tuple[FamilyConfig, int, Model | None]:
        """The CRATE-MAE's configuration and the run's image size: the checkpoint's (resuming), those of the
        CRATE-MAE continued (``--init-from``, also returned) or ``--model``'s."""
        cfg, init = self.cfg, None
        if state is not None:  # resuming: the checkpoint holds the exact architecture (weights loaded by the engine)
            config = config_from_dict(dict(state["model_config"]))
            image_size = config.image_size
        elif cfg.init_from is not None:  # continue pre-training a CRATE-MAE checkpoint
            init = load_model(cfg.init_from)
            if init.kind != MASKED_AUTOENCODER:
                raise TaskError(f"{cfg.init_from} is not a CRATE-MAE; task='mae' continues only CRATE-MAEs")
            config, image_size = init.config, cfg.data.image_size or init.config.image_size
        else:
            if cfg.model is None:
                raise OptionError("no model given; pass model='crate_mae_mnist' (ct.list_models() lists them)")
            config = model_config(cfg.model, written=cfg.model_args, **cfg.model_args)
            if cfg.data.image_size:
                given_once(cfg.model_args, "image_size", cfg.data.image_size, f"image_size={cfg.data.image_size!r}")
            image_size = cfg.data.image_size or config.image_size
        if config.kind != MASKED_AUTOENCODER:
            raise OptionError(
                f"{cfg.model!r} is not a masked autoencoder; pass model='crate_mae_mnist' (or crate_mae_small, ...)"
            )
        return config, image_size, init

    def prepare(self, batch: tuple[Tensor, Tensor]) -> tuple[Tensor]:
        return (self.data.inputs(batch[0], self.augment),)

    def loss(self, model: nn.Module, batch: tuple[Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        (x,) = batch
        out = model(x)
        with torch.no_grad():
            masked, visible = _per_image_losses(_unwrap(model), x, out.pred.detach(), out.mask)
            n = torch.full((), len(x), dtype=torch.float32, device=x.device)
            stats = {"loss": out.loss.detach().float() * n, "visible_loss": visible.sum(), "n": n}
        return out.loss, stats

    def evaluate(self, split: str) -> dict[str, float]:
        ds = self.test_data if split == "test" else self.eval_data
        return masked_eval(
            self.model,
            ds,
            mean=self.mean,
            std=self.std,
            image_size=self.image_size,
            batch_size=self.cfg.logging.eval_batch_size,
            seed=self.cfg.system.seed,
            runtime=self.rt,
        )

    def describe(self) -> RunSummary:
        c, m = self.model.config, self.model
        facts = {
            "augment": self.augment_kind,
            "image_size": self.image_size,
            "mask_ratio": c.mask_ratio,
            "train_images": len(self.train_data),
            "eval_images": len(self.eval_data),
            "parameters": m.num_params(),
        }
        return RunSummary(
            model=f"CRATE-MAE, {m.num_params():,} params, L={c.depth} d={c.dim} K={c.heads}, {c.grid**2} patches, "
            f"{100 * c.mask_ratio:.0f}% masked{' (visible-only encoder)' if c.visible_only else ''}",
            data=f"on {self.train_data.name}: {len(self.train_data)} train / {len(self.eval_data)} held-out images, "
            f"{self.image_size}px, augment={self.augment_kind}",
            facts=facts,
            notes=[
                recipe_note(self.cfg, len(self.train_data), "the mae task's defaults"),
                f"augmentation {self.augment_kind}: {self.augment_choice.reason}",
            ],
        )

    def finish(self, run_dir: Path) -> TaskResult:
        metrics = self.evaluate("test")
        numbers: dict[str, Any] = {
            "test_loss": metrics["loss"],
            "test_visible_loss": metrics["visible_loss"],
            "params": self.model.num_params(),
        }
        msg = f"held-out masked-patch loss {metrics['loss']:.4f} (visible patches {metrics['visible_loss']:.4f})"
        if self.rt.main:
            msg += self._artefacts(run_dir, numbers)
        self.rt.barrier()
        return TaskResult(
            record=metrics,
            message=msg + f", {self.model.num_params():,} params",
            numbers=numbers,
            next=(Step("fine-tune", str(run_dir), (("data", self.cfg.data.source),)), Step("analyze", str(run_dir))),
        )

    def _artefacts(self, run_dir: Path, numbers: dict[str, Any]) -> str:
        """Write ``model/``, recognition.json, reconstruction.png and probe.json; their results go into
        ``numbers``, and the words reporting them are returned."""
        self.model.save_pretrained(run_dir / "model")
        rec, msg = None, ""
        if self.options.recognition:
            rec = self.recognition()
            _write_json(run_dir / "recognition.json", rec)
            numbers["recognition"] = rec
            msg += "; a raw-pixel k-NN recognises " + recognition_text(rec, ".1f")
        self.reconstruction_figure(run_dir / "reconstruction.png", recognition=rec)
        if self.options.probe:
            probe = self.probe()
            _write_json(run_dir / "probe.json", probe)
            numbers["probe_acc"], numbers["probe_random_acc"] = probe["encoder"]["acc"], probe["random_init"]["acc"]
            msg += (
                f"; linear probe on the {probe['features']} {100 * numbers['probe_acc']:.2f}% (random-init encoder "
                f"{100 * numbers['probe_random_acc']:.2f}%)"
            )
        return msg

    # ---------------------------------------------------------------- artefacts
    @torch.no_grad()
    def reconstruction_figure(self, path: Path, recognition: dict[str, Any] | None = None) -> Path:
        """Original / masked / reconstruction of the first held-out images (fixed mask), as a PNG."""
        from ..analysis.plots import plot_reconstructions

        data = self.test_data
        k = max(1, min(self.options.figure_images, len(data)))  # never more rows than held-out images
        if isinstance(getattr(data, "images", None), Tensor):  # in memory: spread over the split (all classes)
            images = data.images[torch.linspace(0, len(data) - 1, k).round().long()]
        else:
            images = next(iter(data.batches(k, shuffle=False)))[0]
        x = self.data.inputs(images)
        n = (self.image_size // self.model.config.patch_size) ** 2
        noise = torch.rand(len(x), n, generator=torch.Generator().manual_seed(self.cfg.system.seed)).to(x.device)
        with evaluating(self.model):
            recon, mask_img, losses = self.model.reconstruct(x, noise=noise)
        mean = torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, -1, 1, 1)
        orig, recon = x * std + mean, recon * std + mean
        masked = orig * (1 - mask_img) + 0.5 * mask_img
        c = self.model.config
        title = (
            f"CRATE-MAE on held-out {self.test_data.name} ({100 * c.mask_ratio:.0f}% of {n} patches masked; "
            "masked-patch MSE under each)"
        )
        if recognition is not None:
            title += f"\na raw-pixel k-NN recognises {recognition_text(recognition, '.0f')}"
        plot_reconstructions(orig.cpu(), masked.cpu(), recon.cpu(), path, title=title, losses=losses.tolist())
        return path

    def recognition(self, train_images: int = 10_000, test_images: int = 2_000) -> dict[str, Any]:
        """Raw-pixel k-NN accuracy on held-out originals, mean-filled masked images and reconstructions.

        At most ``train_images`` / ``test_images`` images, and at most ~128 MB of pixels per split (large images)."""
        from ..analysis import reconstruction_recognition

        per_image = self.model.config.in_chans * self.image_size**2
        train_images, test_images = (max(1, min(n, 2**25 // per_image)) for n in (train_images, test_images))
        (train_x, train_y), (test_x, test_y) = (
            data.first(k) for data, k in ((self.train_data, train_images), (self.test_data, test_images))
        )
        inputs = self.data.inputs
        result = reconstruction_recognition(
            self.model,
            inputs(train_x),
            train_y,
            inputs(test_x),
            test_y,
            mean=self.mean,
            std=self.std,
            seed=self.cfg.system.seed,
        )
        return {**result, "mask_ratio": self.model.config.mask_ratio, "train_images": len(train_x)}

    def probe(self) -> dict[str, Any]:
        """Linear probe on pooled features of the trained encoder and of a random-init one (same architecture), by
        the one frozen-feature probe (:func:`~crate_transformer.analysis.probe.frozen_probe`) that ``crate eval
        --linear-probe`` runs too; the record names the pooling."""
        from ..analysis.probe import frozen_probe, pool_words

        pool = self.options.probe_pool
        kw = dict(mean=self.mean, std=self.std, image_size=self.image_size, batch_size=self.cfg.logging.eval_batch_size)
        result: dict[str, Any] = {
            "pool": pool,
            "features": pool_words(pool),
            "C": self.options.probe_c,
            "train": self.train_data.name,
            "test_images": len(self.test_data),
        }
        with torch.random.fork_rng():
            torch.manual_seed(self.cfg.system.seed + 1)
            random_init = build(self.model.config).to(self.rt.device)
        for key, model in (("encoder", self.model), ("random_init", random_init)):
            probe, _ = frozen_probe(model, self.train_data, self.test_data, pool=pool, C=self.options.probe_c, **kw)
            result[key] = probe.to_dict()
        return result
