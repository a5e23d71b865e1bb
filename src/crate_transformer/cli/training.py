"""The commands that train a task (``crate train``, ``crate pretrain TASK``, ``crate train-lm``,
``crate finetune-text``), which are data: a description (:data:`TRAINING`) and the task they train
(:data:`~.messages.TASK_COMMANDS`); their flags are the training options that apply to that task
(:func:`~.options.training_options`) and the task's own.  Also what ``crate finetune`` shares with them:
``--print-config`` and the lines printed after a finished run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Any

from .messages import TASK_COMMANDS, step_command, task_command
from .options import add_options, add_training_options, given_options

# a training command -> its description; configure_training builds its flags from the declarations of the task it
# trains (messages.TASK_COMMANDS; `crate pretrain`: one sub-command per pre-training task)
TRAINING: dict[str, str] = {
    "train": "Train a classifier. With no arguments: CRATE (crate_mnist_p4) on the 4,000 built-in MNIST training "
    "digits, evaluated on the fixed 1,000 held-out digits. Works unchanged under torchrun --nproc_per_node=N.",
    "pretrain": "Self-supervised pre-training on the training engine: crate pretrain TASK --help",
    "train-lm": "Train a language model on the training engine (JMLR §4.1.4). With no arguments: CRATE-GPT "
    "(crate_gpt_mini, 249k parameters, byte-level tokens, context 128) on Python's documentation (built in), a tenth "
    "held out; --objective mlm trains CRATE-BERT (crate_bert_mini). Reports held-out loss and perplexity.",
    "finetune-text": "Fine-tune a language model on a CSV/TSV of texts (or text pairs) and labels (or scores), "
    "GLUE-style (JMLR Table 5): a fresh head on the pooled tokens; reports accuracy, F1 (two classes) or Spearman "
    "(scores).\n\n--from takes a crate train-lm run dir, a save_pretrained language-model dir (with its "
    "tokenizer.json) or hf-hub:ORG/NAME.",
}


def print_config(args: argparse.Namespace, base: Any, options: Mapping[str, Any]) -> bool:
    """With ``--print-config``: print the configuration that ``base`` (a :class:`TrainConfig`: the command's
    defaults) updated with ``options`` (``--config`` file, then flags) resolves to, as YAML (what ``config.yaml``
    records and ``--config`` reads back); returns whether it did."""
    if not getattr(args, "print_config", False):
        return False
    import yaml

    if getattr(args, "resume", None):
        raise ValueError(
            f"--print-config shows a new run's configuration; the resumed run's is {args.resume}/config.yaml "
            "(drop --resume)"
        )
    cfg = type(base).from_dict(options, base)
    yaml.safe_dump(cfg.to_dict(), sys.stdout, sort_keys=False)
    return True


def pretraining_tasks() -> list[str]:
    """The registered tasks run by ``crate pretrain`` (others have their own command, e.g. train-lm)."""
    from ..train.task import TASKS

    return [name for name in TASKS if task_command(name).startswith("pretrain")]


def configure_training(parser: argparse.ArgumentParser, command: str, description: str, task: str = "") -> None:
    """``command``, which trains ``task`` (:data:`~.messages.TASK_COMMANDS`'s), as data: ``--resume``, the training
    options that apply to its task (:func:`training_options`) with the task's own defaults, and the task's options;
    ``crate pretrain`` has one such sub-command per pre-training task."""
    from ..train import TrainConfig
    from ..train.task import task_class

    parser.description = description
    task = task or next((t for t, c in TASK_COMMANDS.items() if c == command), "")
    if not task:
        sub = parser.add_subparsers(dest="task_name", metavar="TASK")
        for name in pretraining_tasks():
            doc = (task_class(name).__doc__ or name).strip().splitlines()[0]
            configure_training(sub.add_parser(name, help=doc), command, doc, name)
        return
    cls = task_class(task)
    add_training_options(parser, command, task, f"{task} run", cls.defaults)
    if cls.Options is not None:
        clash = {f.name for f in dataclasses.fields(cls.Options)} & set(TrainConfig().flat())  # flags by name
        assert not clash, f"{task} options shadow training options {sorted(clash)}"
        add_options(parser.add_argument_group(f"{task} options"), cls.Options)
    parser.set_defaults(_task=task)


def run_training(args: argparse.Namespace) -> int:
    """A command of :func:`configure_training`: train (or ``--resume``) its task with the options given (the
    ``--config`` file, the training flags, the task's flags as ``task_args``): 0 on completion, 130 when
    interrupted (checkpoint saved)."""
    from ..train import TrainConfig, train
    from ..train.config import GROUPS
    from ..train.task import task_class

    name = getattr(args, "_task", None)
    if name is None:
        raise ValueError(f"name the pre-training task: crate pretrain {{{','.join(pretraining_tasks())}}} ...")
    cls = task_class(name)
    options = given_options(args)  # --config file (all keys) + training flags
    fields = {f.name for f in dataclasses.fields(cls.Options)} if cls.Options is not None else set()
    task_args = dict(options.pop("task_args", None) or {})
    for key in [k for k in options if k in fields and not (k in GROUPS and isinstance(options[k], dict))]:
        task_args[key] = options.pop(key)  # task keys of the --config file (a mapping is the group of that name)
    task_args.update({k: v for k, v in vars(args).items() if k in fields})  # task flags
    if task_args:
        options["task_args"] = cls.check_options(task_args)
    resume = getattr(args, "resume", None)
    base = TrainConfig.from_dict({**cls.defaults, "task": name})
    if print_config(args, base, options):
        return 0
    return finished(train(None if resume else base, resume=resume, overrides=options, expect_task=name))


def finished(result: dict) -> int:
    """Print the commands worth running after a finished run (``next: ...``, once: by the process of rank 0, as
    torchrun numbers them) and return the exit code: 0 on completion, 130 when interrupted (checkpoint saved)."""
    if result["interrupted"]:
        if os.environ.get("RANK", "0") == "0":  # after the engine's "checkpoint saved to ..." line, on stderr
            command = task_command(result["task"], bool(result["init_from"]))
            print(f"continue with: crate {command} --resume {result['run_dir']}", file=sys.stderr, flush=True)
        return 130
    steps = result.get("next")
    if steps and os.environ.get("RANK", "0") == "0":
        steps = [steps] if isinstance(steps, str) else steps  # a task may give one line of its own
        print("next: " + "    |    ".join(str(s) if isinstance(s, str) else step_command(s) for s in steps), flush=True)
    return 0
