"""The training engine: one loop for every task (nanoGPT / DINO ``main_dino.py`` style, top to bottom).

``train(cfg)`` claims a run directory, lets the task build its model and data, then repeats: take the
next global batch, split this process's share into ``accum_steps`` chunks, backward each, clip,
step the optimizer and the per-iteration schedule, log, run the hooks, checkpoint.  A checkpoint holds
everything needed to continue bit-for-bit (weights, optimizer, schedule, scaler, every process's RNG
states, the data position and the task's own state) and its SHA-256; ``train(resume=run_dir)`` reads it
once and continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import applied
from ..data.prefetch import prefetch
from ..errors import OptionError
from . import sharding
from .config import TrainConfig, nest_options
from .optim import Optimization, warmup_steps
from .rundir import CHECKPOINT, CONFIG_FILE, RunDir, load_training_state
from .runtime import Interrupt, ProcessSettings, Runtime, StopVote, rng_state, seed_everything, set_rng_state
from .task import Hook, StepContext, Task, TaskError, make_task
from .threads import SlowdownWatch

__all__ = ["train", "TrainState"]


@dataclass
class TrainState:
    """Where the run is: optimizer steps taken, the epoch, and global batches done within it."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


def train(
    cfg: TrainConfig | None = None,
    *,
    resume: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | None = None,
    task: Task | None = None,
    hooks: Sequence[Hook] = (),
    expect_task: str | None = None,
) -> dict:
    """Run (or, with ``resume=RUN_DIR``, continue) a training job; returns a summary of the final metrics
    (with ``next``: the commands worth running next, which ``crate`` prints).

    ``overrides`` update ``cfg`` (or, when resuming, the saved configuration — e.g. ``{"epochs": 60}``).
    The task is ``task`` or the one ``cfg.task`` names (a resumed run rebuilds its own); ``expect_task``
    refuses a run of another task with a :class:`~crate_transformer.errors.TaskError` naming the run's task.
    An interrupted run returns ``interrupted=True`` with its ``task`` and ``init_from`` (what resumes it).
    A resumed run passes the checks of a new one: its options are validated again, the task checks them
    against the checkpoint's model, and a ``model`` / ``model_args`` that differs from the checkpoint's
    architecture is refused.
    Writes ``<run_dir>/{config.yaml, metrics.jsonl, curves.png, checkpoints/last.pt, model/}``.
    """
    cfg, task, state = _configure(cfg, resume, overrides, task, expect_task)
    rt = Runtime.start(cfg.system.device, cfg.system.amp)
    run, finished = None, False
    try:
        sharding.check_strategy(cfg.system.strategy, rt.world, task.name, task.shardable)
        with ProcessSettings(cfg.system.threads, cfg.system.deterministic, cfg.system.tf32, rt.device):
            path = Path(resume) if resume is not None else Path(rt.broadcast(str(cfg.logging.out or _default_dir(cfg))))
            run = rt.on_main(lambda: RunDir.reopen(path) if resume is not None else RunDir.create(path))
            result = _run(cfg, task, rt, run or RunDir(path, writer=False), state, hooks)
        rt.barrier()  # leave together: a rank tearing down gloo early can abort its peers
        finished = True
        return result
    except FloatingPointError as e:  # a diverged run: one line with the fixes, the last good checkpoint kept
        kept = run is not None and (run.path / CHECKPOINT).is_file()
        saved = f"the last good checkpoint is kept in {run.path / CHECKPOINT}" if kept else "no checkpoint was saved"
        raise OptionError(
            f"{e}; {saved}; lower lr, keep grad_clip on (e.g. 1.0) or use amp='none'", option=("lr", "grad_clip")
        ) from None
    finally:
        if run is not None:
            # a new run that failed before its first checkpoint leaves nothing behind that would refuse the
            # corrected command on the same --out
            if not finished and resume is None:
                announced = (run.path / CONFIG_FILE).is_file()  # its "run directory:" line was printed
                if run.discard_unfinished() and announced:
                    rt.log(f"removed {run.path}: the run stopped before its first checkpoint, so it holds nothing")
            run.close()
        rt.close()


def _configure(
    cfg: TrainConfig | None,
    resume: str | os.PathLike | None,
    overrides: Mapping[str, Any] | None,
    task: Task | None,
    expect_task: str | None,
) -> tuple[TrainConfig, Task, dict | None]:
    """The run's configuration, its task (options checked) and the training state resumed, before anything is
    written (see :func:`train`)."""
    state = saved = None
    overrides = nest_options(overrides or {})  # every value typed before it is merged
    given_task_args = set(overrides.get("task_args") or {})
    if resume is not None:
        state = load_training_state(resume)
        cfg = saved = TrainConfig.from_dict(state["train_config"], saved=True)  # any layout: from_dict reads it
        _check_architecture(state, overrides, resume)
    for key in ("task_args", "model_args"):  # a resumed run keeps the options not given again
        if cfg is not None and key in overrides:
            overrides[key] = {**getattr(cfg, key), **overrides[key]}
    cfg = TrainConfig.from_dict(overrides, cfg or TrainConfig())
    if task is not None:
        cfg = TrainConfig.from_dict({"task": task.name}, cfg)
    if expect_task is not None and cfg.task != expect_task:  # first: the other checks are the other task's
        use = f"task={cfg.task!r}" + (" with init_from" if cfg.init_from else "")
        if resume is not None:
            raise TaskError(f"{resume} is a {cfg.task} run, not {expect_task}; use: {use} resume={str(resume)!r}")
        raise TaskError(
            f"the options set task {cfg.task!r}, and this trains {expect_task}; train {cfg.task} with {use}, or "
            f"drop task: {cfg.task} from the options"
        )
    task = task or make_task(cfg.task)
    if saved is not None and task.Options is not None:  # a saved option the ones given now leave unread: its default
        cfg.task_args = applied(task.Options, cfg.task_args, given_task_args)
    task.parse_options(cfg)  # the task's options are checked before anything is written
    if saved is not None:
        _check_fixed_options(task, saved, cfg, state, given_task_args, resume)
    else:
        task.check_model(cfg)  # the right kind of model for the command, before a run folder is made
        if cfg.init_from and Path(cfg.init_from).exists():  # config.yaml names the start from any folder (analyze)
            cfg.init_from = str(Path(cfg.init_from).resolve())
    return cfg, task, state


def _run(cfg: TrainConfig, task: Task, rt: Runtime, run: RunDir, state: dict | None, hooks: Sequence[Hook]) -> dict:
    """Set the task up, train it to the last step (or an interrupt) and finish: the body of :func:`train`."""
    loop = _Loop(cfg, task, rt, run, state, hooks)
    interrupted = loop.train()
    return loop.interrupted() if interrupted else loop.finish()


class _Loop:
    """One run of the loop: the task, the optimizer, the position (:class:`TrainState`) and the logging window.

    :meth:`train` repeats :meth:`epoch` (each :meth:`step`, then :meth:`log`, the hooks and periodic
    checkpoints) and :meth:`end_epoch` (evaluation and the epoch checkpoint) until the last step.
    """

    def __init__(
        self, cfg: TrainConfig, task: Task, rt: Runtime, run: RunDir, state: dict | None, hooks: Sequence[Hook]
    ) -> None:
        self.t_start = time.time()
        cfg = TrainConfig.from_dict(task.resolve(cfg), cfg)  # e.g. the LM's model for its objective
        self.cfg, self.task, self.rt, self.run = cfg, task, rt, run
        seed_everything(cfg.system.seed)  # identical initialisation on every process
        task.start(cfg, rt, state)
        if settled := task.settled():  # what the task chose from its data: config.yaml records it
            cfg = task.cfg = self.cfg = TrainConfig.from_dict(settled, cfg)
        self.raw, self.n_train = task.model, len(task.train_data)
        self.steps_per_epoch = _steps_per_epoch(cfg, task, rt)
        self.total = self.steps_per_epoch * cfg.optim.epochs
        self.last = min(self.total, cfg.optim.max_steps) if cfg.optim.max_steps else self.total
        self.sharded = cfg.system.strategy == "fsdp"
        if self.sharded:  # full weights into the unsharded model, shard, then the optimizer of the shards
            if state is not None:
                self.raw.load_state_dict(state["model"])
            self.replica = sharding.Replica(self.raw)
            methods = () if task.entry == "forward" else (task.entry,)
            sharding.shard(self.raw, methods=methods, amp_dtype=rt.amp_dtype)
        self.opt = Optimization(self.raw, cfg.optim, self.steps_per_epoch, self.total, rt)
        self.ts = _restore(state, task, self.opt, cfg, self.n_train) if state is not None else TrainState()
        seed_everything(cfg.system.seed + rt.rank)  # per-process augmentation / dropout streams
        if state is not None and len(state["rng"]) == rt.world:
            set_rng_state(state["rng"][rt.rank])
        self.model = _wrap(self.raw if task.entry == "forward" else Entry(self.raw, task.entry), cfg, rt)
        self.sync_owner = self.raw if self.sharded else self.model  # what no_sync acts on
        self.hooks = [*hooks, *task.hooks()]
        self.fixed = task.fixed_batch() if self.hooks else None
        self.model_cfg = self.raw.config.to_dict() if hasattr(self.raw, "config") else {}
        _start_run(cfg, task, rt, run, self.model_cfg, self.steps_per_epoch, self.total, self.last, self.ts,
                   state is not None)  # fmt: skip
        self.window: dict[str, torch.Tensor] = {}
        self.t_window = time.time()
        self.watch = SlowdownWatch()  # step time without evaluation, hooks and checkpoints
        self.vote = StopVote(rt)

    def epoch_of(self, step: int) -> float:
        return round(step / self.steps_per_epoch, 4)

    def train(self) -> bool:
        """Train to the last step; True when interrupted (every process stops at the same step)."""
        self.bar = self.rt.progress(self.cfg.logging.progress, total=self.last, initial=self.ts.step)
        if self.hooks and self.ts.step == 0:
            self.run_hooks()  # the untrained model: the "random init" curve of Fig. 15
        self.model.train()
        interrupted = False
        with Interrupt() as self.stop:
            while self.ts.step < self.last and not interrupted:
                interrupted = self.epoch()
                if interrupted or self.ts.batch < self.steps_per_epoch:
                    break
                self.end_epoch()
        self.vote.close()
        self.bar.close()
        return interrupted

    def epoch(self) -> bool:
        """The rest of the current epoch, up to the last step; True when interrupted."""
        cfg, ts, rt = self.cfg, self.ts, self.rt
        where = rt.position(seed=cfg.system.seed, epoch=ts.epoch, start=ts.batch)
        self.watch.step_started()
        batches = self.task.train_data.batches(cfg.optim.batch_size, shuffle=True, at=where)
        for batch in prefetch(batches, rt.device):  # the next batch's copy runs behind this step (data/prefetch.py)
            interrupted = self.iteration(batch)
            if interrupted or ts.step >= self.last:
                return interrupted
        return False

    def iteration(self, batch: Any) -> bool:
        """One optimizer step and what follows it: the log record when due, the hooks, a periodic checkpoint; True
        when interrupted.  Only a logging step reads a value from the device (tests/test_device_hygiene.py)."""
        cfg, ts = self.cfg, self.ts
        self.step(batch)
        self.watch.step_done()
        ts.step, ts.batch = ts.step + 1, ts.batch + 1
        self.bar.update(1)
        if ts.step % cfg.logging.log_every == 0 or ts.step == self.last:
            self.log()
        if self.hooks:
            self.run_hooks()
        if cfg.logging.checkpoint_every and ts.step % cfg.logging.checkpoint_every == 0:
            self.checkpoint("periodic")
        interrupted = self.vote(self.stop.flag)  # every process stops at the same step
        self.watch.step_started()
        return interrupted

    def step(self, batch: Any) -> None:
        """One optimizer step on a global batch: this process's share, in ``accum_steps`` chunks weighted to one
        batch mean, each backward; the task's per-step settings; clipping and the step."""
        task, rt, opt = self.task, self.rt, self.opt
        chunks = task.chunks(task.prepare(batch), self.cfg.optim.accum_steps)
        weights = [task.weight(c) for c in chunks]
        opt.zero_grad()
        for i, chunk in enumerate(chunks):
            sync = i == len(chunks) - 1 or not rt.distributed  # DDP all-reduces on the last chunk only
            with nullcontext() if sync else sharding.no_sync(self.sync_owner), rt.autocast():
                loss, stats = task.loss(self.model, chunk)
            opt.backward(loss * (weights[i] / sum(weights)))
            self.window = {k: self.window[k] + v if k in self.window else v.double() for k, v in stats.items()}
        task.before_optimizer_step(opt.optimizer, self.ts.step)
        opt.step()

    def log(self) -> None:
        """Record the logging window's averages (one host sync) and show them in the progress bar."""
        step, lr = self.ts.step, self.opt.lr
        rec = _window_record(self.window, self.rt, time.time() - self.t_window, step, lr)
        self.run.record("train", step, epoch=self.epoch_of(step), **rec, lr=lr, time=time.time() - self.t_start)
        self.bar.set_postfix_str(_postfix(rec, self.task.metric, self.ts.epoch, self.cfg.optim.epochs))
        self.window, self.t_window = {}, time.time()
        if (slow := self.watch.end_window()) and self.rt.main:
            self.bar.write(str(slow))  # worded now: flags under the CLI

    def run_hooks(self) -> None:
        where = dict(step=self.ts.step, epoch=self.epoch_of(self.ts.step), fixed_batch=self.fixed,
                     run_dir=self.run.path, is_main=self.rt.main)  # fmt: skip
        if self.sharded:  # hooks measure a full replica, gathered only when one reads ctx.model
            ctx = gathering_context(self.replica, self.raw, **where)
        else:
            ctx = StepContext(self.raw, **where)
        for rec in (r for hook in self.hooks for r in (hook(ctx) or [])):
            self.run.record(**rec)

    def end_epoch(self) -> None:
        """Count the epoch, evaluate when due (not after the last step: the final evaluation follows) and checkpoint."""
        cfg, ts = self.cfg, self.ts
        ts.epoch, ts.batch = ts.epoch + 1, 0
        due = cfg.logging.eval_every and ts.epoch % cfg.logging.eval_every == 0 and ts.step < self.last
        with self.unsharded():
            m = self.task.evaluate(cfg.data.eval_split) if due else {}
        if m:  # {}: nothing to measure (DINO on a single class)
            self.run.record(
                cfg.data.eval_split, ts.step, epoch=self.epoch_of(ts.step), **m, time=time.time() - self.t_start
            )
            if self.rt.main:  # tqdm.write prints even from the disabled bars of the other ranks
                self.bar.write(
                    f"epoch {ts.epoch}: {cfg.data.eval_split} " + ", ".join(f"{k} {v:.4g}" for k, v in m.items())
                )
        self.checkpoint("epoch")

    def unsharded(self) -> Any:
        """A context in which ``task.model`` is a full, plain replica (FSDP; see :class:`.sharding.Replica`)."""
        return self.replica.swapped_in(self.task, self.raw) if self.sharded else nullcontext()

    def checkpoint(self, reason: str) -> None:
        """Save everything a resume needs; refuse to overwrite a good checkpoint with non-finite weights.

        With FSDP the full weights and the full, name-keyed optimizer state are gathered (every process takes
        part; rank 0 writes), so the checkpoint is the same whatever the number of processes."""
        cfg, ts, raw = self.cfg, self.ts, self.raw
        if not sharding.all_finite(raw.parameters(), self.rt):  # never replace a good checkpoint
            raise FloatingPointError(f"the weights became non-finite by step {ts.step} (lr {self.opt.lr:.3g})")
        if self.sharded:
            weights = sharding.full_state_dict(raw)
            optimization = {
                **self.opt.state_dict(),
                "optimizer": sharding.full_optimizer_state(raw, self.opt.optimizer),
            }
        else:
            weights, optimization = {k: v.detach().cpu() for k, v in raw.state_dict().items()}, self.opt.state_dict()
        rngs = self.rt.gather(rng_state())
        self.run.save_state({
            "model_config": self.model_cfg, "model": weights,
            **optimization, "rng": rngs, "step": ts.step, "epoch": ts.epoch, "reason": reason,
            "data": {**asdict(ts), "seed": cfg.system.seed, "num_samples": self.n_train,
                     "global_batch": cfg.optim.batch_size},
            "train_config": cfg.to_dict(), "task": self.task.state_dict(),
        })  # fmt: skip

    def interrupted(self) -> dict:
        """Checkpoint an interrupted run; the result names its task (and ``init_from``), which resuming continues."""
        self.checkpoint("interrupted")
        run, ts = self.run, self.ts
        if self.rt.main:
            self.task.figures(run.path, run.metrics_path)
        self.rt.log(f"interrupted at step {ts.step}/{self.total}: checkpoint saved to {run.path / CHECKPOINT}")
        return {
            "run_dir": str(run.path), "step": ts.step, "interrupted": True,
            "task": self.cfg.task, "init_from": self.cfg.init_from,
        }  # fmt: skip

    def finish(self) -> dict:
        """The task's final evaluation and artefacts, the last checkpoint, the figures and the report."""
        run, ts = self.run, self.ts
        t0 = time.time()
        with self.unsharded():
            result = self.task.finish(run.path)
        eval_seconds = time.time() - t0
        run.record("test", ts.step, epoch=self.epoch_of(ts.step), **result.record, time=time.time() - self.t_start,
                   final=True)  # fmt: skip
        self.checkpoint("end")
        elapsed = time.time() - self.t_start
        if self.rt.main:
            self.task.figures(run.path, run.metrics_path)
            run.log_figures(ts.step)
            print(
                f"{result.message}, {elapsed:.0f} s, step {ts.step}\n"
                f"run directory: {run.path}  (config.yaml, metrics.jsonl, curves.png, {CHECKPOINT}, model/)",
                flush=True,
            )
        return {
            "run_dir": str(run.path), "step": ts.step, "interrupted": False, **result.numbers,
            "eval_seconds": eval_seconds, "next": result.next, "seconds": elapsed,
        }  # fmt: skip


# --------------------------------------------------------------------------- pieces of the loop
def _check_architecture(state: Mapping[str, Any], overrides: Mapping[str, Any], resume: str | os.PathLike) -> None:
    """A resumed run's model is its checkpoint's: a ``model`` or ``model_args`` that differs is an error, not
    silently ignored (equal values, e.g. from the same config file, pass)."""
    from ..config_utils import coerce_fields
    from ..models.registry import config_class

    saved, stored = state["train_config"], dict(state["model_config"])
    diffs = []
    if overrides.get("model") is not None and overrides["model"] != saved.get("model"):
        diffs.append(f"model={overrides['model']!r} (run: {saved.get('model')!r})")
    given = coerce_fields(config_class(stored.get("arch")), dict(overrides.get("model_args") or {}))
    diffs += [f"model_args={ {k: v}!r} (run: {stored.get(k)!r})" for k, v in given.items() if stored.get(k) != v]
    if diffs:
        raise OptionError(
            f"{resume} keeps the architecture of its checkpoint, which differs from {', '.join(diffs)}; drop "
            "these options to continue it, or start a new run with them (another out)",
            option="out",
        )


def _check_fixed_options(
    task: Task, saved: TrainConfig, cfg: TrainConfig, state: Mapping[str, Any], given: set, resume: str | os.PathLike
) -> None:
    """Task options marked ``fixed`` (the model or its tokenizer depends on them: MAE's ``mask_ratio``, DINO's
    head, the LM's tokenizer) cannot change on resume: a different value is refused, not ignored and recorded.
    ``fixed="key"`` compares with the checkpoint's model config entry ``key``, ``fixed=True`` with the run's."""
    if task.Options is None or not given:
        return
    old, new = task.parse_options(saved), task.parse_options(cfg)
    for f in dataclasses.fields(task.Options):
        fixed = f.metadata.get("fixed")
        if not fixed or f.name not in given:
            continue
        was = state["model_config"].get(fixed) if isinstance(fixed, str) else getattr(old, f.name)
        now = getattr(new, f.name)
        if now != was:
            raise OptionError(
                f"{resume} keeps the {f.name} of its checkpoint ({was!r}), not {now!r}; drop {f.name}={now!r} to "
                "continue it, or start a new run with it (another out)",
                option="out",
            )


def _default_dir(cfg: TrainConfig) -> Path:
    data = Path(cfg.data.source).name or "data"
    what = cfg.model or ("finetune" if cfg.init_from else "model" if cfg.task == "classification" else cfg.task)
    return Path("runs") / f"{what}-{data}-{time.strftime('%Y%m%d-%H%M%S')}"


def _steps_per_epoch(cfg: TrainConfig, task: Task, rt: Runtime) -> int:
    if cfg.optim.batch_size % (rt.world * cfg.optim.accum_steps):
        raise ValueError(
            f"batch_size {cfg.optim.batch_size} is not divisible by {rt.world} process(es) x {cfg.optim.accum_steps} "
            f"accumulation steps; use a multiple of {rt.world * cfg.optim.accum_steps}"
        )
    steps = task.train_data.steps_per_epoch(cfg.optim.batch_size)
    if steps == 0:
        raise OptionError(
            f"batch_size {cfg.optim.batch_size} is larger than the {len(task.train_data)} training samples; lower "
            "batch_size",
            option="batch_size",
        )
    return steps


def _restore(state: dict, task: Task, opt: Optimization, cfg: TrainConfig, n: int) -> TrainState:
    """Load weights, optimizer, schedule, scaler and task state; check the data still matches."""
    data = state["data"]
    if data["num_samples"] != n or data["global_batch"] != cfg.optim.batch_size:
        raise OptionError(
            f"the training data or batch size changed since the checkpoint ({data['num_samples']} samples, batch "
            f"{data['global_batch']}; now {n}, {cfg.optim.batch_size}); resume with the same data and batch_size",
            option="batch_size",
        )
    if sharding.is_sharded(task.model):  # its weights were loaded before sharding (see _Loop)
        state = {**state, "optimizer": sharding.load_optimizer_state(task.model, opt.optimizer, state["optimizer"])}
    else:
        task.model.load_state_dict(state["model"])
    opt.load_state_dict(state)
    task.load_state_dict(state.get("task") or {})
    return TrainState(state["step"], data["epoch"], data["batch"])


class Entry(nn.Module):
    """A module whose call runs ``model.<method>``: what DDP and torch.compile wrap for a task whose loss calls
    another method than ``forward`` (:attr:`Task.entry`, e.g. ``classify``).  Calling the method on the
    wrapped model's ``.module`` instead would skip DDP's forward, and with it the averaging of the gradients."""

    def __init__(self, model: nn.Module, method: str) -> None:
        super().__init__()
        self.model, self.method = model, method

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.model, self.method)(*args, **kwargs)


def _wrap(module: nn.Module, cfg: TrainConfig, rt: Runtime) -> nn.Module:
    """``module`` (the model, or an :class:`Entry` of it) in DDP under torchrun unless sharded, then compiled."""
    model = module
    if rt.distributed and not any(sharding.is_sharded(m) for m in module.modules()):
        model = nn.parallel.DistributedDataParallel(
            module, device_ids=[rt.device.index] if rt.device.type == "cuda" else None
        )
    return torch.compile(model) if cfg.system.compile else model


def _start_run(
    cfg: TrainConfig,
    task: Task,
    rt: Runtime,
    run: RunDir,
    model_cfg: dict,
    steps: int,
    total: int,
    last: int,
    ts: TrainState,
    resumed: bool,
) -> None:
    """Write config.yaml (with the derived sizes), start metrics.jsonl, and print what is about to run (and the
    task's warnings about a run that ends at step ``last``)."""
    about = task.describe()
    what = cfg.model or Path(str(cfg.init_from or "model")).name
    line = f"{about.verb or task.name} {what} ({about.model}) {about.data}"
    derived = {
        "world_size": rt.world,
        "local_batch": cfg.optim.batch_size // rt.world,
        "accum_steps": cfg.optim.accum_steps,
    }
    derived.update(steps_per_epoch=steps, total_steps=total, warmup_steps=warmup_steps(cfg.optim, steps, total))
    derived.update(**about.facts, summary=line, **({"chosen": about.notes} if about.notes else {}))
    run.write_yaml(CONFIG_FILE, {**cfg.to_dict(), "model_config": model_cfg, "derived": derived})
    run.start_log(ts.step if resumed else None, cfg.logging.tensorboard, cfg.logging.logger, cfg.flat())
    procs = f" ({rt.world} processes)" if rt.distributed else ""
    accum = f", {cfg.optim.accum_steps} accumulation steps" if cfg.optim.accum_steps > 1 else ""
    threads = torch.get_num_threads()
    rt.log(
        f"{line}, {cfg.optim.epochs} epochs x {steps} steps, batch {cfg.optim.batch_size}{procs}{accum}, "
        f"device {rt.device}, {threads} CPU thread" + ("s" if threads > 1 else "")
        + (f", resuming at step {ts.step}" if resumed else "")
        + "".join(f"\n  {note}" for note in about.notes) + f"\nrun directory: {run.path}"
    )  # fmt: skip
    for warning in task.warnings(last):
        rt.log(f"warning: {warning}")


def _window_record(
    window: dict[str, torch.Tensor], rt: Runtime, seconds: float, step: int, lr: float
) -> dict[str, float]:
    """Average the summed statistics of the logging window over samples and processes (one host sync)."""
    keys = sorted(window)
    total = rt.all_reduce(torch.stack([window[k] for k in keys])).tolist()
    sums = dict(zip(keys, total))
    n = max(sums.pop("n"), 1.0)
    rec = {k: v / n for k, v in sums.items()}
    if not math.isfinite(rec.get("loss", 0.0)):
        raise FloatingPointError(f"training diverged: the loss became {rec['loss']} by step {step} (lr {lr:.3g})")
    rec["samples_per_s"] = n / max(seconds, 1e-9)
    return rec


def _postfix(rec: Mapping[str, float], metric: str, epoch: int, epochs: int) -> str:
    shown = f" {metric} {100 * rec[metric]:.1f}%" if metric == "acc" and metric in rec else ""
    return f"ep {epoch + 1}/{epochs} loss {rec['loss']:.3f}{shown} {rec['samples_per_s']:,.0f}/s"


def gathering_context(replica: sharding.Replica, sharded: nn.Module, **fields: Any) -> Any:
    """A :class:`~.task.StepContext` whose ``model`` is a :class:`Replica` of ``sharded``, gathered on first
    access only: a hook that skips a step (``--measure-every N``) costs no all-gather.  Every process runs the
    same hooks on the same step, so all of them reach the gather together."""

    class _Gathering(StepContext):
        @property
        def model(self) -> nn.Module:
            if self._model is None:
                self._model = replica.of(sharded)
            return self._model

        @model.setter
        def model(self, value: nn.Module | None) -> None:
            self._model = value

    return _Gathering(model=None, **fields)
