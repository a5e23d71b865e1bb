"""The training configuration: one dataclass, defaults < ``--recipe`` < ``--config`` YAML/JSON file < flags.

The paper's ImageNet recipe (JMLR App. C.1): Lion, lr 2.4e-4, weight decay 0.5, batch 2048,
5 warm-up epochs then cosine, label smoothing 0.1, random crop + flip.  Fine-tuning (C.1,
Table 1): new head, AdamW lr 5e-5, weight decay 0.01, crop + flip + RandAugment(2, 14).  The
defaults of ``crate train`` are instead tuned for the built-in MNIST digits on 2 CPU cores.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config_utils import Range, check_ranges, coerce_fields
from ..data import AUGMENTATIONS, DATA_MODES
from .optim import OPTIMIZERS
from .recipes import RECIPES, recipe_options
from .sharding import STRATEGIES
from .trackers import LOGGERS

__all__ = ["TrainConfig", "FINETUNE_DEFAULTS", "OPTIMIZERS", "AMP_MODES", "DATA_MODES", "load_config"]

AMP_MODES = ("auto", "none", "bf16", "fp16")


IMAGES = ("train", "finetune", "pretrain")  # options of the image tasks
ALL = (*IMAGES, "train-lm", "finetune-text")
SUPERVISED = ("train", "finetune")  # options of classification only


def _opt(default: Any, help: str, commands: tuple[str, ...] = ALL, **kw: Any) -> Any:
    """A config field carrying its ``--help`` text (the CLI is generated from the dataclass)."""
    meta = {"help": help, "commands": commands, **kw}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    """Everything that defines a training run; saved as ``config.yaml`` in the run directory."""

    # task (set by the command: train / finetune → classification, pretrain NAME → NAME)
    task: str = _opt("classification", "training objective", commands=())
    task_args: dict = _opt({}, "the task's own options (crate pretrain NAME --help lists them)", commands=())
    # model
    model: str | None = _opt("crate_mnist", "registered model name (see `crate models`)")
    model_args: dict = _opt({}, "model overrides as KEY=VALUE, e.g. dim=64 depth=4 patch_size=4", metavar="KEY=VALUE")
    # data
    data: str = _opt(
        "mnist",
        "'mnist' | 'digits' | a CIFAR folder | a class-per-subfolder image folder | a folder of WebDataset "
        "shards | a Hugging Face dataset: an id such as ylecun/mnist or OWNER/NAME:CONFIG, data files, or a "
        "save_to_disk folder; train-lm: 'python-docs' (built in) | a UTF-8 text file or folder | a dataset id "
        "(wikitext:wikitext-103-raw-v1); finetune-text: a CSV/TSV file | a dataset id (glue:sst2)",
    )
    data_mode: str = _opt(
        "auto",
        "image folders: memory (decode all once) | stream (decode per batch in DataLoader workers) | "
        "auto (stream above 20,000 images); shards and HF datasets always stream",
        choices=DATA_MODES,
        commands=IMAGES,
    )
    workers: int = _opt(
        -1, "DataLoader worker processes for streamed data (-1 = auto: min(4, CPU cores))", commands=IMAGES
    )
    image_size: int | None = _opt(
        None, "train at this image size; batches are resized", shown="the model's", commands=IMAGES
    )
    val_fraction: float = _opt(
        0.0, "hold out this fraction of the training pool as a 'val' split (stratified; train-lm: the corpus' tail)"
    )
    eval_split: str = _opt(
        "test",
        "split evaluated after every --eval-every epochs: test | val",
        choices=("test", "val"),
        commands=SUPERVISED,
    )
    train_subset: int = _opt(
        0, "train on a seeded random subset of this many images (0 = all; in-memory data)", commands=IMAGES
    )
    on_bad_image: str = _opt(
        "skip",
        "unreadable image files: skip (with a warning count) | error",
        choices=("skip", "error"),
        commands=IMAGES,
    )
    # augmentation (kornia, batched on the device)
    augment: str = _opt(
        "auto",
        "augmentation: auto (translate for digits, crop-flip otherwise, + randaugment when fine-tuning) | "
        + " | ".join(AUGMENTATIONS),
        choices=("auto", *AUGMENTATIONS),
        commands=SUPERVISED,
    )
    translate: float = _opt(
        0.07, "max shift of --augment translate, as a fraction of the side (0.07: 2 px at 28 px)", commands=SUPERVISED
    )
    crop_scale: float = _opt(
        0.08, "minimum area fraction of RandomResizedCrop (crop-flip, randaugment)", commands=SUPERVISED
    )
    hflip: bool = _opt(True, "random horizontal flips in crop-flip / randaugment", commands=SUPERVISED)
    randaugment_n: int = _opt(2, "RandAugment: number of ops per image", commands=SUPERVISED)
    randaugment_m: int = _opt(14, "RandAugment: magnitude (0-30)", commands=SUPERVISED)
    # optimisation (per-iteration linear warm-up, then cosine decay to --min-lr)
    optimizer: str = _opt(
        "adamw",
        "optimizer: adamw | lion (the paper pre-trains with Lion) | sgd (with --momentum) | lars (MoCo v3 / MAE) | "
        "lamb (You et al. 2019)",
        choices=OPTIMIZERS,
    )
    lr: float = _opt(2e-3, "peak learning rate")
    min_lr: float = _opt(1e-5, "learning rate at the end of the cosine decay")
    weight_decay: float = _opt(0.05, "decoupled weight decay (matrices only; norms, biases, embeddings excluded)")
    betas: list = _opt([], "optimizer betas", shown="0.9 0.999 for AdamW, 0.9 0.99 for Lion")
    batch_size: int = _opt(128, "global batch size per optimizer step (split over processes and --accum-steps)")
    accum_steps: int = _opt(1, "gradient accumulation: each process runs its share of a batch in this many chunks")
    epochs: int = _opt(40, "training epochs")
    warmup_epochs: float = _opt(2.0, "linear warm-up length in epochs (fractions allowed)")
    label_smoothing: float = _opt(0.1, "label smoothing of the cross-entropy", commands=SUPERVISED)
    grad_clip: float = _opt(1.0, "clip the global gradient norm to this value (0 = off)")
    max_steps: int = _opt(0, "stop after this many optimizer steps (0 = all epochs; the schedule is unchanged)")
    # training recipes (docs/recipes.md): a named preset, and the pieces the published recipes use
    recipe: str | None = _opt(
        None,
        "a named published recipe (its optimizer, lr, schedule, augmentation, ... values; docs/recipes.md): "
        "defaults < recipe < --config < flags",
        choices=tuple(RECIPES),
        commands=SUPERVISED,
    )
    momentum: float = _opt(0.9, "momentum of --optimizer sgd / lars", range=Range(0, 1, hi_open=True))
    layer_decay: float = _opt(
        1.0,
        "layer-wise lr decay (MAE / BEiT): layer i of L trains at lr x decay^(L+1-i) (1 = off)",
        range=Range(0, 1, lo_open=True),
        commands=SUPERVISED,
    )
    drop_path: float = _opt(
        0.0,
        "stochastic depth of the last layer, rising linearly from 0 over depth (timm / DeiT; 0 = off)",
        range=Range(0, 1, hi_open=True),
        commands=SUPERVISED,
    )
    mixup: float = _opt(0.0, "mixup Beta(a, a) concentration (0 = off; DeiT: 0.8)", range=Range(0), commands=SUPERVISED)
    cutmix: float = _opt(
        0.0, "cutmix Beta(a, a) concentration (0 = off; DeiT: 1.0)", range=Range(0), commands=SUPERVISED
    )
    mixup_prob: float = _opt(
        1.0, "probability that a batch is mixed (mixup or cutmix)", range=Range(0, 1), commands=SUPERVISED
    )
    mixup_switch_prob: float = _opt(
        0.5, "probability of cutmix rather than mixup when both are on", range=Range(0, 1), commands=SUPERVISED
    )
    random_erasing: float = _opt(
        0.0, "random erasing probability per image (DeiT, MAE: 0.25)", range=Range(0, 1), commands=SUPERVISED
    )
    ema: float = _opt(
        0.0,
        "keep an EMA of the weights with this decay, evaluated beside the model and saved as model_ema/ (0 = off; "
        "DeiT: 0.99996)",
        range=Range(0, 1, hi_open=True),
        commands=SUPERVISED,
    )
    # system
    device: str = _opt("auto", "auto | cpu | cuda | cuda:N | mps (under torchrun: cuda:LOCAL_RANK)")
    amp: str = _opt(
        "auto", "mixed precision: auto (bf16 or fp16 on GPU, none on CPU) | none | bf16 | fp16", choices=AMP_MODES
    )
    strategy: str = _opt(
        "ddp",
        "under torchrun: ddp (a full replica per process) | fsdp (parameters, gradients and optimizer state "
        "sharded over the processes: fully_shard per transformer block)",
        choices=STRATEGIES,
    )
    compile: bool = _opt(False, "torch.compile the model (first steps are slow while it compiles)")
    seed: int = _opt(0, "random seed (model init, data order, augmentation)")
    deterministic: bool = _opt(False, "deterministic algorithms (bitwise reproducible on CPU; slower on GPU)")
    threads: int = _opt(
        0,
        "torch CPU threads per process (0 = auto: the CPUs this process may use, minus the other work running "
        "now; 1 on a busy shared machine)",
        commands=(*ALL, "eval", "analyze", "generate", "features"),
    )
    # run directory and logging
    out: str | None = _opt(None, "run directory", shown="runs/<model>-<data>-<date-time>")
    checkpoint_every: int = _opt(0, "also checkpoint every N steps (always at epoch ends, the end and on Ctrl-C)")
    log_every: int = _opt(10, "write a train record to metrics.jsonl every N steps")
    eval_every: int = _opt(1, "evaluate every N epochs (0 = only at the end)")
    eval_batch_size: int = _opt(500, "batch size for evaluation")
    measure_every: int = _opt(
        100,
        "every N steps (and before the first), record each layer's compression R^c and sparsity on a fixed "
        "batch (JMLR Fig. 15) in metrics.jsonl and plot them as measure.png (0 = off)",
        commands=SUPERVISED,
    )
    logger: list = _opt(
        [],
        "also send every record, the hyperparameters and the figures to: tensorboard | wandb | mlflow | csv "
        "(several at once: --logger csv wandb)",
        metavar="NAME",
    )
    tensorboard: bool = _opt(False, "the same as --logger tensorboard")
    progress: bool = _opt(True, "show a tqdm progress bar")
    # fine-tuning (set by `crate finetune`)
    init_from: str | None = _opt(None, "checkpoint to fine-tune from", commands=())
    keep_head: bool = _opt(False, "keep the pretrained head when the class count matches", commands=("finetune",))

    def __post_init__(self) -> None:
        current = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in coerce_fields(type(self), current).items():
            setattr(self, name, value)
        self.validate()

    def validate(self) -> None:
        """Raise a one-line ValueError for any inconsistent setting."""
        for name in ("batch_size", "epochs", "log_every", "eval_batch_size", "accum_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("max_steps", "checkpoint_every", "eval_every", "train_subset", "threads", "measure_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")
        check_ranges(self)  # every float finite, every metadata["range"] obeyed
        if self.workers < -1:
            raise ValueError(f"workers must be >= 0 or -1 (auto), got {self.workers}")
        if self.image_size is not None and self.image_size <= 0:
            raise ValueError(f"image_size must be a positive integer, got {self.image_size}")
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if self.weight_decay < 0 or self.grad_clip < 0 or self.warmup_epochs < 0:
            raise ValueError("weight_decay, grad_clip and warmup_epochs must be >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0.0 <= self.translate < 0.5:
            raise ValueError(f"translate is a fraction of the image side in [0, 0.5), got {self.translate}")
        if not 0.0 < self.crop_scale <= 1.0:
            raise ValueError(f"crop_scale must be in (0, 1], got {self.crop_scale}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        for name, allowed in (
            ("optimizer", OPTIMIZERS),
            ("amp", AMP_MODES),
            ("strategy", STRATEGIES),
            ("data_mode", DATA_MODES),
            ("augment", ("auto", *AUGMENTATIONS)),
            ("eval_split", ("test", "val")),
            ("on_bad_image", ("skip", "error")),
            ("recipe", (None, *RECIPES)),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; choose one of {allowed}")
        if self.betas and (len(self.betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in self.betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        unknown = [name for name in self.logger if name not in LOGGERS]
        if unknown:
            raise ValueError(f"unknown logger {unknown[0]!r}; choose from {', '.join(LOGGERS)} (--logger)")
        if self.eval_split == "val" and self.val_fraction <= 0:
            raise ValueError("eval_split 'val' needs a validation split; pass --val-fraction 0.1 (for example)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, base: TrainConfig | None = None) -> TrainConfig:
        """``base`` (or the defaults) updated with ``d``; keys may use dashes or underscores."""
        known = {f.name for f in dataclasses.fields(cls)}
        d = {str(k).replace("-", "_"): v for k, v in d.items()}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training option(s) {unknown}; valid options: {sorted(known)}")
        if d.get("recipe"):  # the recipe's values go under the options given with it
            finetune = (d.get("init_from") or (base.init_from if base is not None else None)) is not None
            d = {**recipe_options(d["recipe"], finetune), **d}
        return dataclasses.replace(base, **d) if base is not None else cls(**d)


# Fine-tuning recipe (JMLR App. C.1, transfer protocol of Table 1): new head, AdamW lr 5e-5, wd 0.01,
# crop + flip + RandAugment(2, 14), plain cross-entropy.
FINETUNE_DEFAULTS: dict[str, Any] = {
    "optimizer": "adamw",
    "lr": 5e-5,
    "min_lr": 1e-6,
    "weight_decay": 0.01,
    "label_smoothing": 0.0,
    "epochs": 10,
    "warmup_epochs": 1.0,
    "batch_size": 64,
}


def read_options_file(path: str | os.PathLike) -> dict:
    """The mapping of options in a YAML or JSON file (values still as written; TrainConfig coerces them)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}; pass a YAML or JSON file of training options")
    try:
        data = yaml.safe_load(path.read_text()) or {}  # YAML is a superset of JSON
    except yaml.YAMLError as e:
        raise ValueError(f"cannot parse config file {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of option: value, got {type(data).__name__}")
    return data


def load_config(path: str | os.PathLike, base: TrainConfig | None = None) -> TrainConfig:
    """Read a YAML or JSON file of :class:`TrainConfig` options on top of ``base`` (or the defaults)."""
    return TrainConfig.from_dict(read_options_file(path), base)
