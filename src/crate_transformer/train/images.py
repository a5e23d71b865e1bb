"""The image data of a training task, shared by classification, masked autoencoding and DINO.

:class:`ImageData` loads the (train, per-epoch eval, test) splits of ``--data`` at one image size, fits
the normalisation to the model's channels, records what the model was trained on (its ``DataSpec``),
builds the augmentation pipeline and turns uint8 batches into normalised model inputs.
:func:`image_classifier` builds (or loads, or resumes) the classifier that classification and DINO train.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..data import (
    DataSpec,
    ImageDataset,
    ImageSource,
    build_augmentation,
    canonical_source,
    fit_normalization,
    open_source,
)
from ..errors import OptionError, TaskError
from ..loading.pipeline import config_from_dict, load_model
from ..models.classifier import ImageClassifier
from ..models.contract import IMAGE_CLASSIFIER, LANGUAGE_MODEL
from ..models.registry import build, model_config
from .config import TrainConfig
from .evaluation import prepare_batch
from .task import given_once

__all__ = ["ImageData", "image_classifier", "load_splits"]


class ImageData:
    """The splits of ``cfg.data.source`` decoded or resized to ``image_size``, and their normalisation."""

    mean: list[float]
    std: list[float]

    def __init__(self, cfg: TrainConfig, image_size: int, device: torch.device) -> None:
        self.cfg, self.image_size, self.device = cfg, image_size, device
        self.train, self.eval, self.test = load_splits(cfg, image_size)

    @property
    def name(self) -> str:
        return self.train.name

    @property
    def classes(self) -> list[str]:
        return self.train.classes

    def fit(self, model: nn.Module) -> None:
        """Fit the normalisation to the model's input channels and record the data in ``model.config.data``."""
        channels = model.config.in_chans
        norm = fit_normalization(self.train.mean, self.train.std, channels)
        if norm is None:
            raise ValueError(f"cannot use {self.train.channels}-channel data with a {channels}-channel model")
        self.mean, self.std, self.channels = norm[0], norm[1], channels
        cfg = self.cfg
        model.config.data = DataSpec(
            source=canonical_source(cfg.data.source),
            kind=getattr(self.train, "kind", ""),
            name=self.train.name,
            classes=self.classes,
            mean=self.mean,
            std=self.std,
            image_column=cfg.data.image_column,
            label_column=cfg.data.label_column,
        )

    def augmentation(self, kind: str, min_crop_scale: float = 0.0) -> nn.Module:
        """The batched augmentation ``kind`` on the device, with the ``--translate`` / ``--crop-scale`` /
        ``--hflip`` / ``--randaugment-*`` settings (crop scales below ``min_crop_scale`` are raised to it)."""
        cfg = self.cfg
        native = getattr(self.train, "image_size", None) or self.image_size  # translations act before resizing
        return build_augmentation(
            kind,
            self.image_size,
            translate=round(cfg.augmentation.translate * native),
            crop_scale=(max(cfg.augmentation.crop_scale, min_crop_scale), 1.0),
            hflip=cfg.augmentation.hflip,
            randaugment_n=cfg.augmentation.randaugment_n,
            randaugment_m=cfg.augmentation.randaugment_m,
        ).to(self.device)

    def inputs(self, images: Tensor, augment: nn.Module | None = None, image_size: int | None = None) -> Tensor:
        """uint8 images → normalised float inputs on the device (augmented, then resized, when asked)."""
        return prepare_batch(
            images,
            device=self.device,
            image_size=image_size or self.image_size,
            channels=self.channels,
            mean=self.mean,
            std=self.std,
            augment=augment,
        )


def image_classifier(
    cfg: TrainConfig, state: dict | None, load_data: Callable[[int], ImageData]
) -> tuple[ImageClassifier, ImageData]:
    """The classifier a run trains, on the device's data: resumed from ``state`` (the checkpoint's
    architecture), fine-tuned from ``--init-from`` (a fresh head for the data's classes, the position grid
    interpolated to ``--image-size``) or new (``--model`` sized to the data's classes and channels)."""
    model = None
    if state is not None:  # the checkpoint holds the exact architecture (weights loaded by the engine)
        model = build(config_from_dict(dict(state["model_config"])))  # by its arch: CRATE, ViT, CRATE-α, ...
        image_size = model.config.image_size
    elif cfg.init_from is not None:  # fine-tuning: the checkpoint fixes the architecture
        model = load_model(cfg.init_from, name=cfg.model, as_classifier=True, **cfg.model_args)
        if model.kind == LANGUAGE_MODEL:
            raise TaskError(f"{cfg.init_from} is a language model; fine-tune it with task='text-classification'")
        if model.kind != IMAGE_CLASSIFIER:
            raise ValueError(f"{cfg.init_from} is {model.kind!r}, not an image classifier, and cannot be fine-tuned")
        image_size = cfg.data.image_size or model.config.image_size
    else:
        if cfg.model is None:
            raise OptionError("no model given; pass model='NAME' (ct.list_models() lists them)")
        if model_config(cfg.model).kind == LANGUAGE_MODEL:
            raise TaskError(f"{cfg.model} is a language model; train it with task='lm' model={cfg.model!r}")
        if cfg.data.image_size:
            given_once(cfg.model_args, "image_size", cfg.data.image_size, f"image_size={cfg.data.image_size!r}")
        image_size = cfg.data.image_size or model_config(cfg.model, **cfg.model_args).image_size
    data = load_data(image_size)
    classes = data.classes
    if state is None and cfg.init_from is not None:
        if not (cfg.keep_head and model.config.num_classes == len(classes)):
            model.reset_classifier(len(classes))  # the transfer protocol: a fresh head for the new classes
        if model.config.image_size != image_size:
            model.resize_pos_embed(image_size)  # bicubic interpolation of the learned position grid
    elif state is None:
        given_once(cfg.model_args, "num_classes", len(classes), f"the data's {len(classes)} classes")
        overrides = {"in_chans": data.train.channels, **cfg.model_args}
        overrides.update(num_classes=len(classes), image_size=image_size)
        model = build(model_config(cfg.model, written=cfg.model_args, **overrides))
        if model.kind != IMAGE_CLASSIFIER:
            raise OptionError(
                f"{cfg.model} is not an image classifier; ct.list_models() lists the models and their kinds"
            )
    data.fit(model)
    return model, data


def load_splits(cfg: TrainConfig, image_size: int) -> tuple[ImageSource, ImageSource, ImageSource]:
    """(train, per-epoch eval, test) splits of ``cfg.data.source`` from :func:`open_source` (``--data-mode``,
    ``--workers``).

    Files (image folders, shards, HF datasets) are decoded at ``image_size``; built-in and CIFAR tensors keep
    their size and are resized per batch.
    """
    if cfg.data.text_columns:
        raise OptionError(
            "text_columns names the text of a language-model corpus or table; images need no text",
            option="text_columns",
        )
    kw = dict(
        image_size=image_size,
        val_fraction=cfg.data.val_fraction,
        seed=cfg.system.seed,
        on_bad_image=cfg.data.on_bad_image,
        mode=cfg.data.data_mode,
        num_workers=cfg.data.workers,
        image_column=cfg.data.image_column,
        label_column=cfg.data.label_column,
    )
    train_set = open_source(cfg.data.source, "train", **kw)
    if cfg.data.train_subset and not isinstance(train_set, ImageDataset):
        raise OptionError(
            f"train_subset works on in-memory data only and {cfg.data.source} is streamed; pass "
            "data_mode='memory' (image folders) or drop train_subset",
            option="train_subset",
        )
    kw["stats"] = (train_set.mean, train_set.std)  # streamed splits: the training pool's, not a new estimate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a skipped-images warning was already shown for the train split
        test_set = open_source(cfg.data.source, "test", **kw)
        eval_set = (
            test_set if cfg.data.eval_split == "test" else open_source(cfg.data.source, cfg.data.eval_split, **kw)
        )
    if cfg.data.train_subset and cfg.data.train_subset < len(train_set):
        g = torch.Generator().manual_seed(cfg.system.seed)
        keep = torch.randperm(len(train_set), generator=g)[: cfg.data.train_subset].sort().values
        t = train_set
        train_set = ImageDataset(t.images[keep], t.labels[keep], t.classes, t.mean, t.std, t.name, "train")
    return train_set, eval_set, test_set
