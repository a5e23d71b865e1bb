"""``crate pretrain TASK``: self-supervised pre-training (``mae``, ``dino``, ...) on the one training engine.

Every task registered in :data:`crate_transformer.train.task.TASKS` other than classification is a
sub-command.  Its flags are the engine's (the ``TrainConfig`` options that :data:`.options.COMMAND_OPTIONS`
lists for ``pretrain``, with the task's own defaults) plus the task's ``Options``; the latter are saved as
``task_args`` in config.yaml.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib

from . import task_command
from .options import add_options, add_resume_option, add_training_options, given_options, print_config


def _task_class(name: str) -> type:
    from ..train.task import TASKS

    module, _, cls = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def pretraining_tasks() -> list[str]:
    """The registered tasks run by ``crate pretrain`` (others have their own command, e.g. train-lm)."""
    from ..train.task import TASKS

    return [name for name in TASKS if task_command(name).startswith("pretrain")]


def configure_pretrain(parser: argparse.ArgumentParser) -> None:

    parser.description = "Self-supervised pre-training on the training engine: crate pretrain TASK --help"
    sub = parser.add_subparsers(dest="task_name", metavar="TASK")
    for name in pretraining_tasks():
        cls = _task_class(name)
        doc = (cls.__doc__ or name).strip().splitlines()[0]
        p = sub.add_parser(name, help=doc, description=doc)
        add_task_arguments(p, name, "pretrain")


def add_task_arguments(parser: argparse.ArgumentParser, name: str, command: str) -> None:
    """``--resume``, the engine's flags for ``command`` (with the task's defaults) and the task's options."""
    from ..train import TrainConfig

    cls = _task_class(name)
    add_resume_option(parser, f"{name} run")
    add_training_options(parser, command, cls.defaults)
    if cls.Options is not None:
        names = {f.name for f in dataclasses.fields(cls.Options)}
        clash = names & set(TrainConfig().flat())  # every training option by its flag's name
        assert not clash, f"{name} options shadow training options {sorted(clash)}"
        add_options(parser.add_argument_group(f"{name} options"), cls.Options)


def run_pretrain(args: argparse.Namespace) -> int:
    """``crate pretrain TASK``: 0 on completion, 130 when interrupted (checkpoint saved)."""
    name = getattr(args, "task_name", None)
    if not name:
        raise ValueError(f"name the pre-training task: crate pretrain {{{','.join(pretraining_tasks())}}} ...")
    return run_task(args, name)


def run_task(args: argparse.Namespace, name: str) -> int:
    """Train (or ``--resume``) the task ``name`` with the parsed flags: 0 on completion, 130 when interrupted."""
    from ..train import TrainConfig, train
    from ..train.config import GROUPS
    from .train import finished

    cls = _task_class(name)
    options = given_options(args)  # --config file (all keys) + engine flags
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
    result = train(None if resume else base, resume=resume, overrides=options, expect_task=name)
    return finished(result)
