"""Tasks: what the engine trains.  A task builds the model and its data, turns a batch into a loss,
evaluates, and writes its artefacts; the engine (:mod:`.loop`) owns everything else — the optimizer
and schedule, accumulation, distributed training, checkpoints, resume, logging and the progress bar.

Tasks: :class:`~crate_transformer.train.classification.ClassificationTask` (supervised image
classification, JMLR §4.1.1); masked autoencoding, DINO and language modelling are further tasks on
the same engine, one module each.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..config import from_given
from ..config_utils import option
from ..errors import OptionError, TaskError, short_repr
from ..models.contract import IMAGE_CLASSIFIER, LANGUAGE_MODEL, MASKED_AUTOENCODER
from .config import TrainConfig
from .evaluation import plot_curves
from .runtime import Runtime

__all__ = [
    "Task",
    "TaskResult",
    "RunSummary",
    "StepContext",
    "Hook",
    "TASKS",
    "register_task",
    "make_task",
    "task_class",
    "task_option",
    "given_once",
    "TaskError",
]

# name → "module:Class"; ``TrainConfig.task`` names one, so a resumed run rebuilds its own task.
TASKS: dict[str, str] = {
    "classification": "crate_transformer.train.classification:ClassificationTask",
    "lm": "crate_transformer.train.lm:LMTask",
    "text-classification": "crate_transformer.train.text_classification:TextClassificationTask",
    "dino": "crate_transformer.train.dino:DINOTask",
    "simdino": "crate_transformer.train.simdino:SimDINOTask",
    "mae": "crate_transformer.train.mae:MAETask",
}


def register_task(name: str, target: str) -> None:
    """Make ``TrainConfig(task=name)`` (and the command line's pre-training of ``name``) build the Task at
    ``"module:Class"``."""
    TASKS[name] = target


def task_class(name: str) -> type[Task]:
    """The Task class registered as ``name`` (its module imported)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; registered tasks: {sorted(TASKS)}")
    module, _, cls = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_task(name: str) -> Task:
    """A fresh instance of the task registered as ``name``."""
    return task_class(name)()


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


# what trains each kind of model (``FamilyConfig.kind``), and a registered model of that kind for the messages
KIND_TASKS = {IMAGE_CLASSIFIER: "classification", MASKED_AUTOENCODER: "mae", LANGUAGE_MODEL: "lm"}
KIND_EXAMPLES = {
    IMAGE_CLASSIFIER: "crate_mnist_p4",
    MASKED_AUTOENCODER: "crate_mae_mnist",
    LANGUAGE_MODEL: "crate_gpt_mini",
}


# a field of a task's ``Options`` dataclass (help text, choices, range, ``fixed``): the one option helper, under the
# name task modules and user-defined tasks import; the command line makes it a ``--flag`` of the task's command
task_option = option


@dataclass
class StepContext:
    """What a per-step hook sees: the raw (unwrapped) model, the step, a fixed evaluation batch, the run dir.

    Hooks are ``(ctx) -> list[dict] | None`` callables run on every process after each optimizer step;
    the records they return (rank 0) are appended to ``metrics.jsonl`` (each with ``split`` and ``step``).
    """

    model: nn.Module
    step: int
    epoch: float  # step / steps_per_epoch, as in the train and eval records
    fixed_batch: Any
    run_dir: Path
    is_main: bool


Hook = Callable[[StepContext], "list[dict] | None"]


@dataclass
class RunSummary:
    """What a task tells the engine about the run it set up; the engine prints the start line from it.

    The line reads ``{verb} {model name} ({model}) {data}, {epochs} epochs x {steps} steps, ...``, e.g.
    ``training crate_mnist (309,356 params, crate) on mnist: 4000 train / 1000 test images, ...``.
    """

    model: str  # inside the parentheses: size and family of the model
    data: str  # after them: the data (and anything else the task trains beside the model)
    facts: dict[str, Any] = field(default_factory=dict)  # derived numbers recorded in config.yaml
    verb: str = ""  # how the line starts ("" = the task's name)
    notes: list[str] = field(default_factory=list)  # what the run chose and why (recipe, augmentation): printed
    # one per line below the start line and recorded in config.yaml


@dataclass
class TaskResult:
    """What :meth:`Task.finish` returns: the final record, the report line and the numbers ``train()`` returns."""

    record: dict[str, float]  # appended to metrics.jsonl as the final "test" record
    message: str  # the report line (the engine adds the time, the step and the run directory)
    numbers: dict[str, Any] = field(default_factory=dict)  # returned by train() (test_acc, params, ...)
    next: str = ""  # commands worth running next; the CLI prints them as "next: ..."


class Task:
    """One training objective.  Subclasses implement the methods that raise ``NotImplementedError``.

    The engine calls :meth:`start`, which keeps the run's configuration and runtime as ``self.cfg`` and
    ``self.rt`` and calls :meth:`setup`.  After it, ``model`` is the (unwrapped) model on the device and
    ``train_data`` has ``steps_per_epoch(batch_size)`` and ``batches(batch_size, epoch=, start=, seed=, rank=,
    world=)`` (see :class:`~crate_transformer.data.ImageSource`).
    """

    name = "task"
    metric = "acc"  # the per-sample statistic shown in the progress bar and curves, besides the loss
    defaults: ClassVar[dict[str, Any]] = {}  # TrainConfig values of this task that differ from the TrainConfig defaults
    Options: ClassVar[type | None] = None  # the task's own options (a Config dataclass of task_option fields)
    model_kind: ClassVar[str | None] = None  # the kind of model it trains (a FamilyConfig.kind), None: any
    shardable: ClassVar[bool] = True  # --strategy fsdp may shard its model (False: the task needs full weights)
    # the model's method that :meth:`loss` runs by calling the module it is given: the engine routes that call
    # through DDP (which averages the gradients of its own forward only), FSDP and torch.compile
    entry: ClassVar[str] = "forward"
    model: nn.Module
    train_data: Any
    cfg: TrainConfig
    rt: Runtime

    def parse_options(self, cfg: TrainConfig) -> Any:
        """``cfg.task_args`` as an ``Options`` instance (None for a task without options)."""
        args = self.check_options(cfg.task_args)
        return None if self.Options is None else self.Options(**args)

    @classmethod
    def check_options(cls, task_args: dict[str, Any]) -> dict[str, Any]:
        """``task_args`` with keys checked against ``Options`` and values coerced to the field types."""
        if cls.Options is None:
            if task_args:
                raise ValueError(f"the {cls.name} task takes no options, got {sorted(task_args)}")
            return {}
        from ..config_utils import coerce_fields

        known = {f.name for f in dataclasses.fields(cls.Options)}
        args = {str(k).replace("-", "_"): v for k, v in task_args.items()}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"unknown {cls.name} option(s) {unknown}; valid: {sorted(known)}")
        args = coerce_fields(cls.Options, args)
        from_given(cls.Options, **args)  # its choices, ranges and own checks now, before a run folder is made
        return args

    def check_model(self, cfg: TrainConfig) -> None:
        """A new run's ``--model`` is of :attr:`model_kind` (checked before a run folder is made); another kind
        (a language model given to the mae task) is a one-line :class:`TaskError` naming the task that trains it."""
        if self.model_kind is None or cfg.model is None or cfg.init_from is not None:
            return
        from ..models.registry import model_config

        kind = model_config(cfg.model, **cfg.model_args).kind
        if kind != self.model_kind:
            example = KIND_EXAMPLES.get(self.model_kind, "")
            eg = f" (e.g. model={example!r})" if example else ""
            other = (
                f"; train {cfg.model} with task={KIND_TASKS[kind]!r} model={cfg.model!r}" if kind in KIND_TASKS else ""
            )
            raise TaskError(
                f"{cfg.model} is {_a(kind)}, and task={self.name!r} trains {_a(self.model_kind)}{eg}{other}"
            )

    def resolve(self, cfg: TrainConfig) -> dict[str, Any]:
        """``TrainConfig`` values this task derives from the others (e.g. the LM's default model for its
        objective); the engine applies them before :meth:`start`, so config.yaml records them."""
        return {}

    def settled(self) -> dict[str, Any]:
        """``TrainConfig`` values the task chose in :meth:`setup`, once its data was read (e.g. ``augment='auto'``
        → ``'translate'`` for grey-scale images); the engine applies them before building the optimizer, so
        config.yaml records what took effect."""
        return {}

    def start(self, cfg: TrainConfig, rt: Runtime, state: dict | None) -> None:
        """Keep ``cfg`` and ``rt`` on the task and :meth:`setup` it (what the engine calls)."""
        self.cfg, self.rt = cfg, rt
        self.setup(state)

    def setup(self, state: dict | None) -> None:
        """Load the data and build the model (``state``: the training state being resumed, or None)."""
        raise NotImplementedError

    def prepare(self, batch: Any) -> Any:
        """A batch from ``train_data`` → what :meth:`loss` takes (on the device, augmented)."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """The mean loss of a (prepared) batch and per-sample statistics summed over it, with ``"n"``.

        Statistics stay on the device (no host sync); the engine averages them as sum / n over the
        logging window and over processes.
        """
        raise NotImplementedError

    def weight(self, batch: Any) -> int | Tensor:
        """How many units :meth:`loss` averages over (samples by default): the weights of accumulated chunks (a
        count known only on the device stays a tensor there)."""
        return len(batch[0])

    def chunks(self, batch: Any, n: int) -> list[Any]:
        """Split a prepared batch into ``n`` gradient-accumulation chunks (every tensor along dim 0)."""
        parts = [torch.tensor_split(t, n) for t in batch]
        return [tuple(p[i] for p in parts) for i in range(n) if len(parts[0][i])]

    def evaluate(self, split: str) -> dict[str, float]:
        """Metrics of the current model on ``split`` (``"val"`` or ``"test"``), summed over processes."""
        raise NotImplementedError

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Called once per optimizer step (``step``: its 0-based index) when the gradients are complete —
        accumulated over the chunks and all-reduced over processes — before clipping and the step itself.

        A task may drop gradients here (``p.grad = None``: the optimizer skips the parameter, as DINO's
        frozen last layer) or set per-step values in the param groups (group 0 holds the weight-decayed
        matrices, group 1 the rest; e.g. DINO's weight-decay schedule).
        """

    def hooks(self) -> list[Hook]:
        """Per-step hooks of this task (see :class:`StepContext`)."""
        return []

    def fixed_batch(self) -> Any:
        """A fixed model-ready batch the per-step hooks measure on (None: no hooks)."""
        return None

    def describe(self) -> RunSummary:
        """The model and data of the run: printed at the start, its ``facts`` recorded in config.yaml."""
        n = sum(p.numel() for p in self.model.parameters())
        return RunSummary(f"{n:,} params", f"on {getattr(self.train_data, 'name', 'data')}")

    def warnings(self, steps: int) -> list[str]:
        """What would make a run of ``steps`` optimizer steps go nowhere quietly (e.g. a weight EMA that cannot
        warm up); the engine prints each as a ``warning:`` line before the first step."""
        return []

    def state_dict(self) -> dict:
        """Task state beyond the model's weights that a resume needs (e.g. an EMA teacher)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def finish(self, run_dir: Path) -> TaskResult:
        """The final evaluation and artefacts (``model/`` and figures)."""
        raise NotImplementedError

    def figures(self, run_dir: Path, metrics_path: Path) -> None:
        plot_curves(metrics_path, run_dir / "curves.png", metric=self.metric)


def given_once(model_args: Mapping[str, Any], field: str, value: object, setter: str) -> None:
    """Refuse ``model_args[field]`` when a training option or the data (``setter``, which sets ``value``: a
    ``name=value`` or words) gives the model field another value: one of the two would win silently.  An equal
    value passes."""
    if field not in model_args or value is None:
        return
    try:
        same = float(model_args[field]) == float(value)  # "0.1" from the command line is 0.1
    except (TypeError, ValueError):
        same = str(model_args[field]) == str(value)
    if not same:
        given = short_repr({field: model_args[field]})
        raise OptionError(f"{field} is given twice: {setter} and model_args={given}; keep one")
