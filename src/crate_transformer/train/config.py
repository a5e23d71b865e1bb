"""The training configuration: defaults < ``--recipe`` < ``--config`` YAML/JSON file < command-line flags.

:class:`TrainConfig` holds the task, the model, the checkpoint to start from and five groups of options
(:data:`GROUPS`), each option one :func:`~crate_transformer.config_utils.option` field.  One layout, nested
(``config_version`` 2); the flat layout of version 1 (earlier runs, flat ``--config`` files) and the flat names of
keywords and flags (``TrainConfig(lr=0.01)``, ``--lr``) are placed in their groups by one function, :func:`upgrade_v1`.

The paper's ImageNet recipe and its fine-tuning (JMLR App. C.1, Table 1) are ``recipe="crate-paper"``
(:data:`~.recipes.RECIPES`, which states their values); the defaults of a new classification run are instead tuned
for the built-in MNIST digits on 2 CPU cores, and those of fine-tuning (``init_from``)
:data:`~.recipes.FINETUNE_DEFAULTS`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..config import Config, check_applicable, check_option, inapplicable, pop_version
from ..config_utils import (
    ALWAYS,
    NON_NEGATIVE,
    ON,
    POSITIVE,
    Range,
    coerce_fields,
    default_of,
    option,
    option_name,
)
from ..data import AUGMENTATIONS, DATA_MODES, default_augmentation
from ..errors import OptionError, short_repr
from ..io import load_yaml
from .recipes import READ_BY, RECIPES, reading_augmentation, recipe_options
from .sharding import STRATEGIES
from .trackers import LOGGERS

__all__ = ["TrainConfig", "DataOptions", "AugmentationOptions", "OptimOptions", "SystemOptions", "LoggingOptions"]
__all__ += ["GROUPS", "AMP_MODES", "load_config", "nest_options", "upgrade_v1", "flat_options", "read_options_file"]

AMP_MODES = ("auto", "none", "bf16", "fp16")
OPTIMIZERS = ("adamw", "lion", "sgd", "lars", "lamb")  # train.optim.build_optimizer builds each
VERSION = 2  # config.yaml layout: 1 = one flat mapping of options, 2 = the option groups below
# where an option applies (option(applies=...)): the tasks that read it
IMAGES = {"task": ("classification", "mae", "dino", "simdino")}  # the image tasks' data (train.images)
CLASSIFY = {"task": ("classification",)}  # the classification task's recipe pieces
TEXT = ("lm", "text-classification")
CROPS = ({**CLASSIFY, "augment": ("crop-flip", "randaugment")}, {"task": ("mae",)})  # RandomResizedCrop, flips
RANDAUGMENT = {**CLASSIFY, "augment": ("randaugment",)}
FRACTION = Range(0, 1, hi_open=True)  # a share or a probability below 1: [0, 1)
COLUMNS = ("text_columns", "label_column")  # task options of older configs, data options now


@dataclass
class DataOptions(Config):
    """What is trained on and how it is read (``cfg.data``)."""

    APPLIES: ClassVar[str] = ALWAYS  # a field without an applies= of its own is read by every run

    source: str = option(
        "mnist",
        "'mnist' | 'digits' | a CIFAR folder | a class-per-subfolder image folder | a folder of WebDataset "
        "shards | a Hugging Face dataset: an id such as ylecun/mnist or OWNER/NAME:CONFIG, data files, or a "
        "save_to_disk folder; language models: 'python-docs' (built in) | a UTF-8 text file or folder | a dataset id "
        "(wikitext:wikitext-103-raw-v1); text classification: a CSV/TSV file | a dataset id (glue:sst2)",
        name="data",
        basic=True,
    )
    data_mode: str = option(
        "auto",
        "image folders: memory (decode all once) | stream (decode per batch in DataLoader workers) | "
        "auto (stream above 20,000 images); shards and HF datasets always stream",
        choices=DATA_MODES,
        applies=IMAGES,
    )
    workers: int = option(
        -1,
        "DataLoader worker processes for streamed data (-1 = auto: this machine's CPUs per process, minus one)",
        range=Range(-1, integer=True, note="-1 = auto"),
        applies=IMAGES,
    )
    image_size: int | None = option(
        None, "resize batches to this image size", shown="the model's", range=POSITIVE, basic=True, applies=IMAGES
    )
    val_fraction: float = option(
        0.0,
        "hold out this fraction of the training pool as a 'val' split (stratified; language models: the corpus' tail)",
        range=FRACTION,
        basic=True,
        applies=({"eval_split": ("val",)}, {"task": TEXT}),  # an image task's held-out images are evaluated as val
    )
    eval_split: str = option(
        "test", "split evaluated every `eval_every` epochs: test | val", choices=("test", "val"), applies=IMAGES
    )
    train_subset: int = option(
        0, "train on a seeded subset of this many images (0 = all; in-memory data)", range=NON_NEGATIVE, applies=IMAGES
    )
    on_bad_image: str = option(
        "skip", "unreadable image files: skip (with a warning count) | error", choices=("skip", "error"), applies=IMAGES
    )
    # a dataset's columns, where the automatic choice does not find them
    image_column: str = option("", "a Hugging Face dataset's image column", shown="its Image feature", applies=IMAGES)
    label_column: str = option(
        "",
        "the label column of an image dataset or of a text table",
        shown="ClassLabel / label / score",
        applies={"task": (*IMAGES["task"], "text-classification")},
    )
    text_columns: list = option(
        [],
        "the text column(s) of a dataset: a language-model corpus (several are joined, one document per row) or a "
        "text-classification table (one text or a pair)",
        shown="text / GLUE names / the first string column",
        metavar="COLUMN",
        applies={"task": TEXT},
    )

    def validate(self) -> None:
        if self.eval_split == "val" and self.val_fraction <= 0:
            raise OptionError("eval_split 'val' needs a validation split; pass val_fraction=0.1 (for example)")


@dataclass
class AugmentationOptions(Config):
    """Training-time augmentation of image batches (kornia, batched on the device; ``cfg.augmentation``)."""

    augment: str = option(
        "auto",
        "augmentation: auto (translate for digits, crop-flip otherwise, + randaugment when fine-tuning) | "
        + " | ".join(AUGMENTATIONS),
        choices=("auto", *AUGMENTATIONS),
        basic=True,
        applies=CLASSIFY,  # the mae task's is its own option (augmentation)
    )
    translate: float = option(
        0.07,
        "max shift of the translate augmentation, as a fraction of the side (0.07: 2 px at 28 px)",
        range=Range(0, 0.5, hi_open=True),
        applies=({**CLASSIFY, "augment": ("translate",)}, {"task": ("mae",)}),
    )
    crop_scale: float = option(
        0.08, "minimum area fraction of RandomResizedCrop", range=Range(0, 1, lo_open=True), applies=CROPS
    )
    hflip: bool = option(True, "random horizontal flips in crop-flip / randaugment", applies=CROPS)
    randaugment_n: int = option(2, "RandAugment: ops per image", range=NON_NEGATIVE, applies=RANDAUGMENT)
    randaugment_m: int = option(14, "RandAugment: magnitude", range=Range(0, 30, integer=True), applies=RANDAUGMENT)
    mixup: float = option(0.0, "mixup Beta(a, a) concentration (0 = off; DeiT 0.8)", range=Range(0), applies=CLASSIFY)
    cutmix: float = option(0.0, "cutmix Beta(a, a) concentration (0 = off; DeiT 1.0)", range=Range(0), applies=CLASSIFY)
    mixup_prob: float = option(
        1.0, "probability to mix a batch (mixup or cutmix)", range=Range(0, 1), applies=({"mixup": ON}, {"cutmix": ON})
    )
    mixup_switch_prob: float = option(
        0.5, "probability of cutmix over mixup when both are on", range=Range(0, 1), applies={"mixup": ON, "cutmix": ON}
    )
    random_erasing: float = option(
        0.0, "random erasing probability per image (DeiT, MAE: 0.25)", range=Range(0, 1), applies=CLASSIFY
    )


@dataclass
class OptimOptions(Config):
    """The optimisation: optimizer, per-iteration linear warm-up then cosine decay to ``min_lr``, batches, length,
    and the regularisers of the loss and the weights: label smoothing, layer-wise lr decay, stochastic depth, an
    EMA of the weights (``cfg.optim``)."""

    APPLIES: ClassVar[str] = ALWAYS  # a field without an applies= of its own is read by every run

    optimizer: str = option(
        "adamw",
        "optimizer: adamw | lion (the paper pre-trains with Lion) | sgd (with `momentum`) | lars (MoCo v3 / MAE) | "
        "lamb (You et al. 2019)",
        choices=OPTIMIZERS,
        basic=True,
    )
    momentum: float = option(0.9, "sgd / lars momentum", range=FRACTION, applies={"optimizer": ("sgd", "lars")})
    lr: float = option(4e-3, "peak learning rate", range=Range(0, lo_open=True), basic=True)
    min_lr: float = option(1e-5, "learning rate at the end of the cosine decay", range=Range(0))
    weight_decay: float = option(
        0.01, "decoupled weight decay (matrices only; norms, biases, embeddings excluded)", range=Range(0), basic=True
    )
    betas: list[float] = option(
        [],
        "optimizer betas",
        shown="0.9 0.999 for AdamW, 0.9 0.99 for Lion",
        range=FRACTION,
        applies={"optimizer": ("adamw", "lion", "lamb")},
    )
    batch_size: int = option(
        64, "global batch size per optimizer step (split over processes and `accum_steps`)", range=POSITIVE, basic=True
    )
    accum_steps: int = option(
        1, "gradient accumulation: each process runs its share of a batch in this many chunks", range=POSITIVE
    )
    epochs: int = option(40, "training epochs", range=POSITIVE, basic=True)
    warmup_epochs: float = option(2.0, "linear warm-up in epochs (fractions allowed)", range=Range(0), basic=True)
    warmup_fraction: float = option(
        0.0,
        "linear warm-up as a share of the run's optimizer steps (0.05: the first twentieth; 0 = `warmup_epochs`); "
        "setting one of the two warm-ups sets the other to 0",
        range=FRACTION,
    )
    label_smoothing: float = option(0.05, "label smoothing of the cross-entropy", range=FRACTION, applies=CLASSIFY)
    grad_clip: float = option(1.0, "clip the global gradient norm to this value (0 = off)", range=Range(0))
    max_steps: int = option(
        0, "stop after this many optimizer steps (0 = all epochs; the schedule stays)", range=NON_NEGATIVE, basic=True
    )
    layer_decay: float = option(
        1.0,
        "layer-wise lr decay (MAE / BEiT): layer i of L trains at lr x decay^(L+1-i) (1 = off)",
        range=Range(0, 1, lo_open=True),
        applies={"task": ("classification", "mae", *TEXT)},  # DINO's weight-decay schedule sets group 0 (train.dino)
    )
    drop_path: float = option(
        0.0, "stochastic depth of the last layer, linear from 0 (timm, DeiT; 0 = off)", range=FRACTION, applies=CLASSIFY
    )
    ema: float = option(
        0.0,
        "keep an EMA of the weights with this decay, evaluated beside the model and saved as model_ema/ (0 = off; "
        "DeiT: 0.99996)",
        range=FRACTION,
        applies=CLASSIFY,
    )

    def validate(self) -> None:
        if self.min_lr > self.lr:
            raise ValueError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if self.warmup_epochs > 0 and self.warmup_fraction > 0:
            raise ValueError(
                f"two warm-ups: warmup_epochs={self.warmup_epochs} and warmup_fraction={self.warmup_fraction}; "
                "set one of them to 0"
            )
        if self.betas and len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")


@dataclass
class SystemOptions(Config):
    """Where and how the run executes: device, precision, threads, seed (``cfg.system``)."""

    APPLIES: ClassVar[str] = ALWAYS  # every field is read by every run (config_utils.fields_applicability)

    device: str = option("auto", "auto | cpu | cuda | cuda:N | mps (under torchrun: cuda:LOCAL_RANK)", basic=True)
    amp: str = option("auto", "mixed precision: auto = bf16 or fp16 on GPU, none on CPU", choices=AMP_MODES, basic=True)
    strategy: str = option(
        "ddp",
        "under torchrun: ddp (a full replica per process) | fsdp (parameters, gradients and optimizer state "
        "sharded over the processes: fully_shard per transformer block)",
        choices=STRATEGIES,
    )
    compile: bool = option(False, "torch.compile the model (first steps are slow while it compiles)")
    seed: int = option(0, "random seed (model init, data order, augmentation)", basic=True)
    deterministic: bool = option(False, "deterministic algorithms (bitwise reproducible on CPU; slower on GPU)")
    tf32: bool = option(
        True,
        "TF32 tensor cores for float32 matrix products on NVIDIA GPUs (Ampere and later; no effect on CPU): "
        "several times faster, inputs rounded to 10 mantissa bits; off for full float32",
    )
    threads: int = option(
        0,
        "torch CPU threads per process (0 = auto: the CPUs this process may use, minus the other work running "
        "now; 1 on a busy shared machine)",
        range=NON_NEGATIVE,
        basic=True,
    )


@dataclass
class LoggingOptions(Config):
    """The run directory, checkpoints, evaluation and what is logged (``cfg.logging``)."""

    APPLIES: ClassVar[str] = ALWAYS  # every field is read by every run (config_utils.fields_applicability)

    out: str | None = option(None, "run directory", shown="runs/<model>-<data>-<date-time>", path=True, basic=True)
    checkpoint_every: int = option(
        0, "also checkpoint every N steps (always at epoch ends, the end and on Ctrl-C)", range=NON_NEGATIVE
    )
    log_every: int = option(10, "write a train record to metrics.jsonl every N steps", range=POSITIVE)
    eval_every: int = option(1, "evaluate every N epochs (0 = only at the end)", range=NON_NEGATIVE)
    eval_batch_size: int = option(500, "batch size for evaluation", range=POSITIVE)
    measure_every: int = option(
        100,
        "every N steps (and before the first), record each layer's compression R^c and sparsity on a fixed "
        "batch (JMLR Fig. 15) in metrics.jsonl and plot them as measure.png (0 = off)",
        range=NON_NEGATIVE,
        applies=CLASSIFY,
    )
    logger: list = option(
        [],
        "also send every record, the hyperparameters and the figures to: tensorboard | wandb | mlflow | csv "
        "(several at once: `logger` csv wandb)",
        choices=LOGGERS,  # each name of the list (checked by the config, not by the command line's parser)
        metavar="NAME",
        basic=True,
    )
    tensorboard: bool = option(False, "the same as `logger` tensorboard")
    progress: bool = option(True, "show progress: a bar on a terminal, a line at each tenth of the run in a log")


# group name → its dataclass, in the order of config.yaml and of --help
GROUPS: dict[str, type] = {
    "data": DataOptions,
    "augmentation": AugmentationOptions,
    "optim": OptimOptions,
    "system": SystemOptions,
    "logging": LoggingOptions,
}


# flat option name → (group, field): how a flat (version 1) config file or a flag reaches its group
FLAT: dict[str, tuple[str, str]] = {
    option_name(f): (group, f.name) for group, cls in GROUPS.items() for f in dataclasses.fields(cls)
}


@dataclass(init=False)
class TrainConfig:
    """Everything that defines a training run (the module docstring); saved as ``config.yaml`` in the run directory.

    The constructor and :meth:`from_dict` take the groups (``cfg.optim``, ...: dataclasses or mappings) and any
    option by its flat name (``TrainConfig(lr=0.01, data="digits")``), as flags name them (:data:`FLAT`)."""

    GIVEN_IN: ClassVar[str] = ""  # each field is an option of its own (config_utils.field_place)
    APPLIES: ClassVar[str] = ALWAYS  # a field without an applies= of its own is read by every run

    # task (set by the command: train / finetune → classification, pretrain NAME → NAME)
    task: str = option("classification", "training objective", by_command=True)
    task_args: dict = option({}, "the task's own options (the fields of its Options)", by_command=True)
    # model
    model: str | None = option("crate_mnist_p4", "registered model name (ct.list_models() lists them)", basic=True)
    model_args: dict = option(
        {}, "model overrides as KEY=VALUE, e.g. dim=64 depth=4 patch_size=4", metavar="KEY=VALUE", basic=True
    )
    # a named published recipe: its values go under the options given with it (defaults < recipe < file < flags)
    recipe: str | None = option(
        None,
        "a named published recipe (its optimizer, lr, schedule, augmentation, ... values; docs/recipes.md): "
        "defaults < recipe < a config file < the options given",
        choices=tuple(RECIPES),
        basic=True,
        applies=CLASSIFY,  # classification recipes, for training and fine-tuning
    )
    # fine-tuning (set by `crate finetune`)
    init_from: str | None = option(None, "checkpoint to fine-tune from", path=True, metavar="CHECKPOINT", basic=True)
    keep_head: bool = option(
        False,
        "keep the pretrained head when the class count matches",
        applies={"init_from": ON, "task": ("classification", "dino", "simdino")},
    )
    # the option groups (each field of them states where it applies)
    data: DataOptions = field(default_factory=DataOptions)
    augmentation: AugmentationOptions = field(default_factory=AugmentationOptions)
    optim: OptimOptions = field(default_factory=OptimOptions)
    system: SystemOptions = field(default_factory=SystemOptions)
    logging: LoggingOptions = field(default_factory=LoggingOptions)

    def __init__(self, **options: Any) -> None:
        nested = nest_options(options)
        for f in dataclasses.fields(self):
            if f.name in GROUPS:
                setattr(self, f.name, GROUPS[f.name](**nested.get(f.name, {})))  # a copy: configs share no group
            else:  # coerced by nest_options, checked here
                setattr(self, f.name, nested.get(f.name, default_of(f)))
                check_option(type(self), f.name, getattr(self, f.name))
        check_applicable(*_where(self.to_dict()), given=_given(options, nested))  # also across groups (the task, ...)

    def validate(self) -> None:
        """Raise a one-line ValueError for any inconsistent setting."""
        for name in GROUPS:
            getattr(self, name).check_fields()
            getattr(self, name).validate()

    def to_dict(self) -> dict:
        """The nested mapping saved as ``config.yaml`` (with ``config_version``); :meth:`from_dict` reads it."""
        return {"config_version": VERSION, **dataclasses.asdict(self)}

    def flat(self) -> dict:
        """Every option by its flat name (``{"lr": ..., "data": ..., ...}``), as flags and version-1 files name them."""
        return flat_options(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], base: TrainConfig | None = None, *, saved: bool = False) -> TrainConfig:
        """``base`` (or the defaults) updated with ``d`` (any layout, :func:`nest_options`).  An option ``d`` gives
        (:func:`_given`) that cannot apply is refused; one of the layers below (``base``, the recipe), or of a
        ``saved`` run's ``d`` (which recorded every option, read or not), goes back to its default, which changes
        nothing."""
        nested = nest_options(d)
        recipe = {}
        if nested.get("recipe"):  # the recipe's values go under the options given with it
            finetune = (nested.get("init_from") or (base.init_from if base is not None else None)) is not None
            recipe = recipe_options(nested["recipe"], finetune)
        under = {k: v for k, v in base.to_dict().items() if k != "config_version"} if base is not None else {}
        return cls(**_applied(cls.merge(under, recipe, nested), set() if saved else _given(d, nested)))

    @staticmethod
    def merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
        """Layers of options, lowest first (defaults < recipe < file < flags; any layout) → one nested mapping,
        each layer's options winning over those below, group by group."""
        out: dict[str, Any] = {}
        for layer in layers:
            for key, value in nest_options(layer).items():
                out[key] = {**out.get(key, {}), **value} if key in GROUPS else value
        return out


# each field's name → the class declaring it (TrainConfig or a group): where the conditions find the fields they name
OWNERS: dict[str, type] = {
    **{f.name: TrainConfig for f in dataclasses.fields(TrainConfig) if f.name not in GROUPS},
    **{f.name: cls for cls in GROUPS.values() for f in dataclasses.fields(cls)},
}
FIELDS = {f.name: f for cls in set(OWNERS.values()) for f in dataclasses.fields(cls) if f.name in OWNERS}
GROUP_OF = {n: next((g for g, c in GROUPS.items() if c is cls), None) for n, cls in OWNERS.items()}


def _where(nested: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, type], dict[str, Any]]:
    """What the ``applies`` conditions read (:func:`~crate_transformer.config.check_applicable`'s arguments): every
    field's value (its default where ``nested`` has none), their classes, and ``augment`` as ``auto`` resolves it
    (the run's own choice, :func:`~.recipes.reading_augmentation`, else translations for the built-in digits)."""
    values = {n: default_of(f) for n, f in FIELDS.items()}
    for key, value in nested.items():
        values.update(value if key in GROUPS else {key: value} if key in OWNERS else {})
    if values["augment"] != "auto":
        return values, OWNERS, {}
    kind, _ = reading_augmentation(tuple(n for n in READ_BY if values[n] != default_of(FIELDS[n])))
    finetune = values["init_from"] is not None
    return values, OWNERS, {"augment": kind or default_augmentation(str(values["source"]), finetune=finetune)}


def _given(d: Mapping[str, Any], nested: Mapping[str, Any]) -> set[str]:
    """The options ``d`` gives, by field name (issue 48): every key it names (``nested``: ``d`` as :func:`nest_options`
    placed it) at any value, so ``momentum=0.9`` under adamw is refused as ``momentum=0.5`` is; but in a record of
    every option, read or not (:meth:`TrainConfig.to_dict`, ``flat()``, ``--print-config``, a run's config.yaml: it
    names them all or carries ``config_version``) and in a group given as its dataclass, those away from their
    default."""
    names = _set(nested)
    flat = {FLAT[k][1] for k in (str(k).replace("-", "_") for k in d) if k in FLAT}  # named on their own: given
    whole = {n for k, v in d.items() if dataclasses.is_dataclass(v) for n in _set(nested.get(k, {}))} - flat
    by_value = names if "config_version" in d or names >= set(OWNERS) else whole
    values = _where(nested)[0]
    return {n for n in names if n not in by_value or values[n] != default_of(FIELDS[n])}


def _set(nested: Mapping[str, Any]) -> set[str]:
    """The fields set in ``nested`` (the top-level keys and each group's)."""
    return {n for k, v in nested.items() for n in (v if k in GROUPS and isinstance(v, Mapping) else [k]) if n in OWNERS}


def _applied(nested: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """``nested`` less the options that cannot apply there and are not ``given`` (they came from a layer below, or
    a saved run recorded them): each back to its default, until every one left applies or was given."""
    while dropped := inapplicable(*_where(nested), given=_set(nested) - given):
        for name in dropped:
            group = GROUP_OF[name]
            if group is None:
                nested.pop(name, None)
            else:
                nested[group] = {k: v for k, v in nested.get(group, {}).items() if k != name}
    return nested


def upgrade_v1(d: Mapping[str, Any]) -> dict[str, Any]:
    """Options in the flat layout of version 1 (``lr``, ``data: mnist`` at the top: earlier runs' ``config.yaml``
    and checkpoints, flat ``--config`` files, keywords and flags) → the nested layout of version 2: the one placing of
    a flat name in its group (:data:`FLAT`).  Nested keys pass (the later key wins); dashes read as underscores; the
    text-classification columns of older configs (task options then) move to ``data``; a newer ``config_version`` is
    a one-line error; keys that are no option stay at the top for :func:`nest_options` to refuse."""
    d = {str(k).replace("-", "_"): v for k, v in d.items()}
    pop_version(d, VERSION)
    out: dict[str, Any] = {}
    for key, value in d.items():
        if key in GROUPS and (isinstance(value, (Mapping, GROUPS[key])) or value is None):
            value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value or {}  # a group given whole
            out[key] = {**out.get(key, {}), **{str(k).replace("-", "_"): v for k, v in value.items()}}
        elif key in FLAT:  # a flat option (version 1, a flag, a keyword)
            group, name = FLAT[key]
            out[group] = {**out.get(group, {}), name: value}
        elif key in GROUPS:  # a group's name with a single value: not an unknown option
            example = dataclasses.fields(GROUPS[key])[0].name
            raise ValueError(
                f"{key} is a group of options, not one value (got {short_repr(value)}); write its options under it, "
                f"e.g. {key}: {{{example}: ...}}, or each option on its own at the top"
            )
        else:
            out[key] = value
    task_args = out.get("task_args")
    if isinstance(task_args, Mapping) and (moved := {k: task_args[k] for k in COLUMNS if k in task_args}):
        out["task_args"] = {k: v for k, v in task_args.items() if k not in moved}
        out["data"] = {**out.get("data", {}), **moved}
    return out


def nest_options(d: Mapping[str, Any]) -> dict[str, Any]:
    """Options in any layout (keywords, flags, a file's mapping; :func:`upgrade_v1`) → the top-level fields and one
    mapping per group, every value coerced to its declared type: the one check every flag, config file and keyword
    goes through before any value is used.  Unknown keys are one-line errors (a run's config.yaml extras,
    ``model_config`` and ``derived``, are removed first by :func:`~.rundir.read_run_config`)."""
    out = upgrade_v1(d)
    top = {f.name for f in dataclasses.fields(TrainConfig)} - set(GROUPS)
    unknown = [k for k in out if k not in top and k not in GROUPS]
    for key, value in out.items():
        if key in GROUPS:
            unknown += [f"{key}.{b}" for b in sorted(set(value) - {f.name for f in dataclasses.fields(GROUPS[key])})]
    if unknown:
        valid = sorted({*top, *FLAT, *GROUPS})
        raise ValueError(f"unknown training option(s) {sorted(unknown)}; valid options: {valid}")
    typed = coerce_fields(TrainConfig, {k: v for k, v in out.items() if k not in GROUPS})
    for key, value in out.items():
        if key in GROUPS:
            typed[key] = coerce_fields(GROUPS[key], value)
    optim = typed.get("optim", {})
    if len(warmups := {"warmup_epochs", "warmup_fraction"} & set(optim)) == 1:  # one given replaces the one below
        typed["optim"] = {**optim, ({"warmup_epochs", "warmup_fraction"} - warmups).pop(): 0.0}
    return typed


def flat_options(d: Mapping[str, Any]) -> dict[str, Any]:
    """Options in any accepted layout → one flat mapping by option name (``{"lr": ..., "data": "mnist"}``)."""
    out = {}
    for key, value in nest_options(d).items():
        if key in GROUPS:
            names = {f.name: option_name(f) for f in dataclasses.fields(GROUPS[key])}
            out.update({names[k]: v for k, v in value.items()})
        else:
            out[key] = value
    return out


def read_options_file(path: str | os.PathLike) -> dict:
    """The options in a YAML or JSON file, in the nested layout whichever the file holds (:func:`upgrade_v1`;
    values still as written: TrainConfig coerces them)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}; pass a YAML or JSON file of training options")
    try:
        data = load_yaml(path.read_text(), str(path)) or {}  # YAML is a superset of JSON
    except yaml.YAMLError as e:
        raise ValueError(f"cannot parse config file {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of option: value, got {type(data).__name__}")
    return upgrade_v1(data)


def load_config(path: str | os.PathLike, base: TrainConfig | None = None) -> TrainConfig:
    """Read a YAML or JSON file of :class:`TrainConfig` options (nested or flat) on top of ``base`` (or the
    defaults)."""
    return TrainConfig.from_dict(read_options_file(path), base)
