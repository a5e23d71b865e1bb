"""Language modelling (JMLR §4.1.4): the ``lm`` task.

``--objective clm`` trains a causal model on next-token prediction (eq. (89), CRATE-GPT); ``mlm`` a
bidirectional one on masked tokens (eq. (85), CRATE-BERT: 15 % of tokens, 80/10/10).  Evaluation is the
mean cross-entropy per predicted token on the held-out tail of the corpus, and its perplexity ``exp(loss)``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import Config
from ..config_utils import Range, coerce_fields
from ..data import to_device
from ..data.text import TokenBlocks, corpus_files, iter_documents, load_tokens, split_tokens
from ..errors import OptionError, OptionWarning, Step, short_repr
from ..layers.inference import evaluating
from ..loading.pipeline import config_from_dict
from ..models.contract import LANGUAGE_MODEL
from ..models.lm import LanguageModel, LMConfig, mask_tokens
from ..models.registry import build, model_config
from ..models.tokenizer import TOKENIZER_KINDS, Tokenizer
from .config import TrainConfig
from .evaluation import require_evaluated
from .task import Hook, RunSummary, StepContext, Task, TaskResult, task_option

__all__ = ["LMTask", "LMOptions", "build_tokenizer", "plateau_warning"]

OBJECTIVES = ("clm", "mlm")
DEFAULT_MODELS = {"clm": "crate_gpt_mini", "mlm": "crate_bert_mini"}
PRIOR_TOKENS = 2048  # training tokens the head's features are measured on for the token prior
# the plateau check: after this share of the steps, a held-out loss not below (1 - margin) x the training tokens'
# unigram entropy means the model still predicts little beyond token frequencies
PLATEAU_SHARE, PLATEAU_MARGIN = 0.2, 0.05
PLATEAU_BLOCKS = 128  # held-out windows the check evaluates (at most)


@dataclass
class LMOptions(Config):
    objective: str = task_option(
        "clm",
        "clm: next token (CRATE-GPT, eq. (89)) | mlm: masked tokens (CRATE-BERT, eq. (85))",
        choices=OBJECTIVES,
        basic=True,
        applies="always",
    )
    tokenizer: str = task_option(
        "byte",
        "byte (no training) | bpe | wordpiece (trained on `data`) | a tokenizer.json file",
        fixed=True,
        basic=True,
        applies="always",
    )
    vocab_size: int = task_option(
        4096,
        "vocabulary size of a bpe / wordpiece tokenizer",
        range=Range(1, integer=True),
        fixed=True,
        basic=True,
        applies={"tokenizer": ("bpe", "wordpiece")},
    )
    mask_prob: float = task_option(
        0.15,
        "mlm: fraction of tokens predicted (of them 0.8 become [MASK], 0.1 random, 0.1 stay)",
        range=Range(0, 1, lo_open=True, hi_open=True),
        applies={"objective": ("mlm",)},
    )
    eval_blocks: int = task_option(
        0,
        "evaluate on at most this many held-out blocks (0 = all)",
        range=Range(0, integer=True, note="0 = every held-out block"),
        applies="always",
    )
    sample_tokens: int = task_option(
        200,
        "clm: tokens of the sample written to sample.txt at the end (0 = none)",
        range=Range(0, integer=True, note="0 = no sample"),
        applies={"objective": ("clm",)},
    )
    token_prior: bool = task_option(
        True,
        "a new model starts by predicting the training tokens' frequencies (its head set to their log "
        "frequencies), so training does not first sit on the unigram plateau; off: the plain initialisation",
        applies="always",
    )


def _embedding_size(given: object, tokenizer: Tokenizer) -> int:
    """The model's ``vocab_size``: the tokenizer's size, or a larger table the user asked for (nanoGPT rounds GPT-2's
    50,257 up to 50,304); a smaller one could not embed the tokenizer's ids and is refused, not replaced."""
    if given is None:
        return tokenizer.vocab_size
    size = coerce_fields(LMConfig, {"vocab_size": given})["vocab_size"]  # "300" from --model-args is 300
    if size < tokenizer.vocab_size:
        raise ValueError(
            f"vocab_size={size} is smaller than the {tokenizer.kind} tokenizer's {tokenizer.vocab_size} tokens, so "
            f"the model could not embed its ids; drop vocab_size (the tokenizer sets it) or give at least "
            f"{tokenizer.vocab_size}"
        )
    return size


def build_tokenizer(spec: str, source: str, vocab_size: int, columns: Sequence[str] = ()) -> Tokenizer:
    """``byte``, a ``bpe`` / ``wordpiece`` vocabulary trained on ``source`` (streamed; a dataset's text ``columns``),
    or a tokenizer.json file."""
    if spec in TOKENIZER_KINDS:
        pieces = (piece for doc in iter_documents(source, columns) for piece in doc)
        return Tokenizer.train(spec, pieces, vocab_size)
    return Tokenizer.from_file(spec)


def plateau_warning(loss: float, entropy: float, step: int, total: int, token_prior: bool) -> OptionWarning:
    """The one line saying the held-out ``loss`` after ``step`` of ``total`` steps is still near the unigram
    ``entropy`` of the training tokens, and what to try."""
    first = "token_prior (it is off), " if not token_prior else ""
    return OptionWarning(
        f"held-out loss {loss:.3f} per token after {step} of {total} steps ({step / total:.0%}) is not yet "
        f"{PLATEAU_MARGIN:.0%} below the unigram entropy of the training tokens ({entropy:.3f}): the model predicts "
        f"little beyond token frequencies; try {first}a longer warm-up (warmup_fraction), a lower lr or more epochs",
        option=("token_prior", "warmup_fraction", "lr", "epochs"),
    )


def _check_objective(config: LMConfig, name: str, objective: str) -> None:
    """The objective must fit the model: next tokens need a causal model, masked tokens a bidirectional one."""
    if config.causal != (objective == "clm"):
        kind = "causal (GPT)" if config.causal else "bidirectional (BERT)"
        other = "clm" if config.causal else "mlm"
        raise OptionError(
            f"{name} is a {kind} model; use objective={other!r} or a {objective} model (e.g. "
            f"model={DEFAULT_MODELS[objective]!r})"
        )


class LMTask(Task):
    """Language modelling (CRATE-GPT / CRATE-BERT): next-token or masked-token cross-entropy on a text corpus."""

    name = "lm"
    metric = "acc"  # token accuracy (of the predicted tokens)
    Options = LMOptions
    model_kind = LANGUAGE_MODEL
    defaults = {
        "model": None,
        "data": "python-docs",
        "val_fraction": 0.1,
        "epochs": 4,
        "batch_size": 32,
        # JMLR C.4 (CRATE-GPT): AdamW (0.9, 0.95), weight decay 0.1, linear warm-up then cosine decay; its lr 6e-4
        # and 2,000 warm-up steps are for batches of 384 x 1,024 tokens over 600,000 steps, and the warm-up is a
        # share of the run here so that it scales with the run (docs/language-models.md)
        "lr": 3e-3,
        "min_lr": 1e-4,
        "weight_decay": 0.1,
        "betas": [0.9, 0.95],
        "warmup_epochs": 0.0,
        "warmup_fraction": 0.05,
        "eval_batch_size": 64,
    }

    def check_model(self, cfg: TrainConfig) -> None:
        """Besides the model's kind: ``--vocab-size`` sizes a trained vocabulary only (bpe / wordpiece), and the
        model's ``tokenizer`` (the kind it records) is the task's tokenizer option, never a model argument: the run
        records the tokenizer it trains, so another value there would be replaced silently."""
        super().check_model(cfg)
        tokenizer = cfg.task_args.get("tokenizer", "byte")
        given = cfg.model_args.get("tokenizer")
        if given is not None and str(given) != str(tokenizer):
            raise OptionError(
                f"the model's tokenizer is the one the training uses (tokenizer={tokenizer!r}), not "
                f"model_args={short_repr({'tokenizer': given})}; pass tokenizer={short_repr(given)} instead"
            )
        if "vocab_size" in cfg.task_args and tokenizer not in ("bpe", "wordpiece"):
            raise OptionError(
                f"vocab_size applies to a tokenizer trained on the data (bpe, wordpiece), not {tokenizer}; drop it, "
                "or add tokenizer='bpe'",
                option="vocab_size",
            )

    def resolve(self, cfg: TrainConfig) -> dict[str, Any]:
        """The default model of the objective (recorded in config.yaml) when ``--model`` is not given."""
        return {} if cfg.model else {"model": DEFAULT_MODELS[self.parse_options(cfg).objective]}

    def setup(self, state: dict | None) -> None:
        cfg, rt = self.cfg, self.rt
        self.options = o = self.parse_options(cfg)
        source = cfg.data.source
        if cfg.data.image_column or cfg.data.label_column:
            raise OptionError(
                "image_column / label_column name an image dataset's columns; a corpus has text only",
                option=("image_column", "label_column"),
            )
        corpus_files(source, cfg.data.text_columns)  # a missing corpus or column fails before tokenizer training
        if source != "python-docs":
            local = Path(source).expanduser()
            source = str(local.resolve()) if local.exists() else source  # a dataset id stays as given
        config = self._config(state, source)
        _check_objective(config, cfg.model or config.arch, o.objective)  # a resumed run as a new one
        model = build(config)
        model.tokenizer = self.tokenizer
        block = model.config.block_size
        tokens = load_tokens(source, self.tokenizer, cfg.data.text_columns)
        cut = split_tokens(len(tokens), cfg.data.val_fraction, block)
        name = Path(source).name if source != "python-docs" else "python-docs"
        self.train_data = TokenBlocks(tokens, block, 0, cut, name, "train")
        end = min(len(tokens), cut + o.eval_blocks * block + 1) if o.eval_blocks else len(tokens)
        self.eval_data = TokenBlocks(tokens, block, cut, end, name, "held-out")
        self._unigram(model, start=state is None and o.token_prior)  # on the CPU, before the model moves
        self.model = model.to(rt.device)
        self.special = torch.tensor(self.tokenizer.special_ids, device=rt.device)

    def _unigram(self, model: LanguageModel, start: bool) -> None:
        """The training tokens' unigram entropy (``self.unigram_entropy``, the plateau level), from their counts;
        with ``start`` the new ``model`` is set to predict their frequencies (:meth:`LanguageModel.init_token_prior`,
        measured on the first :data:`PRIOR_TOKENS` training tokens)."""
        counts = torch.from_numpy(self.train_data.token_counts(model.config.vocab_size)).double()
        p = counts[counts > 0] / counts.sum()
        self.unigram_entropy = float(-(p * p.log()).sum())
        self.token_prior = False
        if start:
            log_prior = torch.log((counts + 0.5) / (counts.sum() + 0.5 * len(counts)))  # add-half: no -inf
            windows = max(1, min(PRIOR_TOKENS // model.config.block_size, len(self.train_data)))
            self.token_prior = model.init_token_prior(log_prior, self.train_data.get(torch.arange(windows))[:, :-1])

    def _config(self, state: dict | None, source: str) -> LMConfig:
        """The tokenizer (``self.tokenizer``: the checkpoint's or one built for ``source``) and the model's config."""
        cfg, o = self.cfg, self.options
        if state is not None:
            self.tokenizer = Tokenizer.from_str(state["task"]["tokenizer"])
            if o.tokenizer in TOKENIZER_KINDS and o.tokenizer != self.tokenizer.kind:
                raise OptionError(
                    f"this run was trained with the {self.tokenizer.kind} tokenizer, not {o.tokenizer}; drop "
                    f"tokenizer={o.tokenizer!r} to continue it, or start a new run"
                )
            return config_from_dict(dict(state["model_config"]))  # by its arch: CRATE-GPT, GPT, ToST, ...
        else:
            if model_config(cfg.model).kind != LANGUAGE_MODEL:
                raise OptionError(f"{cfg.model} is not a language model; pick one (ct.list_models() lists them)")
            self.tokenizer = build_tokenizer(o.tokenizer, source, o.vocab_size, cfg.data.text_columns)
            size = _embedding_size(cfg.model_args.get("vocab_size"), self.tokenizer)
            overrides = {**cfg.model_args, "vocab_size": size, "tokenizer": self.tokenizer.kind}
            config = model_config(cfg.model, written=cfg.model_args, **overrides)
            if config.positions_skip_padding and "pad_token_id" not in cfg.model_args:
                # the released CRATE-BERT's positions skip padding, which they recognise by its id
                overrides["pad_token_id"] = self.tokenizer.pad_id
                config = model_config(cfg.model, written=cfg.model_args, **overrides)
            return config

    # ---------------------------------------------------------------- batches and loss
    def _split(self, blocks: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``(inputs, targets)`` of windows of ``block_size + 1`` tokens: shifted for clm (eq. (89)), masked for mlm."""
        blocks = to_device(blocks, self.rt.device)
        if self.options.objective == "clm":
            return blocks[:, :-1], blocks[:, 1:]
        t = self.tokenizer
        return mask_tokens(
            blocks[:, :-1],
            mask_id=t.mask_id,
            vocab_size=t.vocab_size,
            special_ids=self.special,
            prob=self.options.mask_prob,
            generator=generator,
        )

    def prepare(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        return self._split(batch)

    def weight(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        """The predicted tokens of a chunk (on the device: counting them on the host would wait for it)."""
        return (batch[1] != -100).sum()

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        x, y = batch
        logits = model(x).float()
        loss_sum = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
        with torch.no_grad():
            keep = y != -100
            n = keep.sum().float()
            stats = {"loss": loss_sum.detach(), "acc": ((logits.argmax(-1) == y) & keep).sum().float(), "n": n}
        return loss_sum / n.clamp_min(1), stats

    def evaluate(self, split: str) -> dict[str, float]:
        """Held-out loss per predicted token, perplexity and token accuracy (every process its slice, summed)."""
        return self._evaluate(self.eval_data)

    @torch.no_grad()
    def _evaluate(self, data: TokenBlocks) -> dict[str, float]:
        model, rt = self.model, self.rt
        g = torch.Generator(device=rt.device).manual_seed(1234)  # the same masks at every evaluation (mlm)
        total = torch.zeros(3, dtype=torch.float64, device=rt.device)
        with evaluating(model):
            for blocks in data.batches(self.cfg.logging.eval_batch_size, shuffle=False, at=rt.position()):
                with rt.autocast():
                    _, s = self.loss(model, self._split(blocks, g))
                total += torch.stack([s["loss"], s["acc"], s["n"]]).double()
        loss_sum, correct, n = rt.all_reduce(total).tolist()
        require_evaluated(n, "tokens to predict", data)
        loss = loss_sum / n
        return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "acc": correct / n, "tokens": n}

    # ---------------------------------------------------------------- the plateau check
    def hooks(self) -> list[Hook]:
        return [self._plateau_check]

    def _plateau_check(self, ctx: StepContext) -> list[dict] | None:
        """After :data:`PLATEAU_SHARE` of the steps, the held-out loss (of at most :data:`PLATEAU_BLOCKS` windows)
        against the unigram entropy; an :class:`~crate_transformer.errors.OptionWarning` when it is not yet
        :data:`PLATEAU_MARGIN` below it."""
        total = self.train_data.steps_per_epoch(self.cfg.optim.batch_size) * self.cfg.optim.epochs
        if ctx.step != max(1, round(PLATEAU_SHARE * total)):
            return None
        d = self.eval_data
        first = TokenBlocks(
            d.tokens, d.block_size, d.lo, min(d.hi, d.lo + PLATEAU_BLOCKS * d.block_size + 1), d.name, d.split
        )
        loss = self._evaluate(first)["loss"]
        h = self.unigram_entropy
        on_plateau = loss > (1 - PLATEAU_MARGIN) * h
        if on_plateau and ctx.is_main:
            warnings.warn(plateau_warning(loss, h, ctx.step, total, self.options.token_prior), stacklevel=2)
        return [
            {"split": "plateau_check", "step": ctx.step, "loss": loss, "unigram_entropy": h, "on_plateau": on_plateau}
        ]

    # ---------------------------------------------------------------- bookkeeping
    def describe(self) -> RunSummary:
        c, o = self.model.config, self.options
        n = self.model.num_params()
        facts = {
            "objective": o.objective,
            "tokenizer": self.tokenizer.kind,
            "vocab_size": self.tokenizer.vocab_size,
            "train_tokens": self.train_data.num_tokens,
            "heldout_tokens": self.eval_data.num_tokens,
            "context": c.block_size,
            "parameters": n,
            "unigram_entropy": round(self.unigram_entropy, 4),
            "token_prior": self.token_prior,
        }
        return RunSummary(
            model=f"{n:,} params, {c.arch} {o.objective}",
            data=f"on {self.train_data.name}: {self.train_data.num_tokens:,} train / {self.eval_data.num_tokens:,} "
            f"held-out tokens, {self.tokenizer.kind} tokenizer (V={c.vocab_size}), context {c.block_size}",
            facts=facts,
        )

    def state_dict(self) -> dict:
        return {"tokenizer": self.tokenizer.to_str()}

    def finish(self, run_dir: Path) -> TaskResult:
        m = self.evaluate("test")
        model: LanguageModel = self.model
        if self.rt.main:
            model.save_pretrained(run_dir / "model")
            if self.options.objective == "clm" and self.options.sample_tokens:
                (run_dir / "sample.txt").write_text(self.sample() + "\n", encoding="utf-8")
        generate = (Step("generate", str(run_dir), (("prompt", "def "),)),) if self.options.objective == "clm" else ()
        return TaskResult(
            record=m,
            message=f"held-out loss {m['loss']:.4f} per token, perplexity {m['ppl']:.3f}, token accuracy "
            f"{100 * m['acc']:.1f}% ({m['tokens']:,.0f} tokens), {model.num_params():,} params",
            numbers={
                "heldout_loss": m["loss"],
                "heldout_ppl": m["ppl"],
                "heldout_acc": m["acc"],
                "params": model.num_params(),
            },
            next=(*generate, Step("analyze", str(run_dir))),
        )

    def sample(self) -> str:
        """``sample_tokens`` tokens generated from an end-of-text token (temperature 0.8, top-k 50, seeded)."""
        rt = self.rt
        g = torch.Generator(device=rt.device).manual_seed(self.cfg.system.seed)
        start = torch.tensor([[self.tokenizer.eos_id]], device=rt.device)
        out = self.model.generate(start, self.options.sample_tokens, temperature=0.8, top_k=50, generator=g)
        return self.tokenizer.decode(out[0, 1:].tolist(), skip_special_tokens=True)
