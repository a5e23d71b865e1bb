"""Training: one engine (:mod:`.loop`) for every task, the run directory, evaluation and figures.

::

    from crate_transformer.train import TrainConfig, train
    summary = train(TrainConfig(model="crate_mnist", data="mnist", epochs=5))
    summary = train(resume="runs/crate_mnist-mnist-...", overrides={"epochs": 10})

* :mod:`.config` — :class:`TrainConfig` (saved as ``config.yaml``), the fine-tuning recipe.
* :mod:`.runtime` — device, distributed group, RNG state, mixed precision, interrupts.
* :mod:`.rundir` — the locked run directory: metrics log, checksummed training state.
* :mod:`.task` — the :class:`Task` interface (a new task is a module: see :func:`register_task`);
  :mod:`.classification` — :class:`ClassificationTask`; :mod:`.images` — the image data of the image tasks.
* :mod:`.loop` — :func:`train`, the loop.
* :mod:`.evaluation` — accuracy, confusion matrix, curves.
"""

from ..data import epoch_permutation
from ..loading.pipeline import load_model
from .classification import ClassificationTask
from .config import TrainConfig, load_config
from .evaluation import EvalResult, evaluate, plot_confusion_matrix, plot_curves, prepare_batch
from .loop import TrainState, train
from .optim import WarmupCosine
from .recipes import FINETUNE_DEFAULTS
from .rundir import RunDir, load_training_state, read_metrics
from .runtime import Runtime, resolve_device
from .task import Hook, RunSummary, StepContext, Task, TaskResult, register_task

__all__ = [
    "TrainConfig",
    "FINETUNE_DEFAULTS",
    "load_config",
    "train",
    "TrainState",
    "WarmupCosine",
    "Task",
    "TaskResult",
    "RunSummary",
    "register_task",
    "ClassificationTask",
    "StepContext",
    "Hook",
    "EvalResult",
    "evaluate",
    "prepare_batch",
    "plot_curves",
    "plot_confusion_matrix",
    "RunDir",
    "read_metrics",
    "load_training_state",
    "load_model",
    "Runtime",
    "resolve_device",
    "epoch_permutation",
]
