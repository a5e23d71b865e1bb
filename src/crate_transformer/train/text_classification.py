"""Fine-tuning a language model on labelled texts (GLUE-style, JMLR Table 5): the ``text-classification`` task.

A CSV / TSV with a text (or a text pair) and a label (classification: cross-entropy) or a score (regression,
STS-B: mean squared error on one output).  The pretrained model keeps its weights and gets a fresh head on the
pooled representation (:meth:`~crate_transformer.models.lm.LanguageModel.classify`).  Metrics as in Table 5:
accuracy, F1 of the positive class (two classes, MRPC / QQP) and Spearman's rank correlation (scores).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import Config
from ..data import to_device
from ..data.text import LabelledTexts, eval_split_of, read_labelled
from ..errors import OptionError
from ..layers.inference import evaluating
from ..loading.pipeline import config_from_dict, load_model
from ..models.contract import LANGUAGE_MODEL
from ..models.registry import build
from ..models.tokenizer import Tokenizer
from .evaluation import require_evaluated
from .task import RunSummary, Task, TaskError, TaskResult, task_option

__all__ = ["TextClassificationTask", "TextOptions", "text_metrics"]


@dataclass
class TextOptions(Config):
    APPLIES = "always"  # every field is read by every text-classification run
    eval_data: str = task_option(
        "", "a second table evaluated instead of a `val_fraction` split (GLUE dev.tsv)", basic=True
    )
    regression: str = task_option(
        "auto",
        "auto (scores when every label is a number and one is not written as an integer, e.g. 3.8; classes when "
        "every label is an integer or a name) | yes | no",
        choices=("auto", "yes", "no"),
        basic=True,
    )


def text_metrics(pred: Tensor, target: Tensor, regression: bool) -> dict[str, float]:
    """Table 5's metrics: accuracy (+ F1 of class 1 for two classes), or Spearman (and Pearson) for scores."""
    if regression:
        from scipy.stats import pearsonr, spearmanr

        p, t = pred.double().numpy(), target.double().numpy()
        ok = len(p) > 1 and p.std() > 0 and t.std() > 0
        return {
            "spearman": float(spearmanr(p, t).statistic) if ok else 0.0,
            "pearson": float(pearsonr(p, t).statistic) if ok else 0.0,
        }
    out = {"acc": float((pred == target).double().mean())}
    if int(max(pred.max(), target.max())) <= 1:
        tp = int(((pred == 1) & (target == 1)).sum())
        fp, fn = int(((pred == 1) & (target == 0)).sum()), int(((pred == 0) & (target == 1)).sum())
        out["f1"] = 2 * tp / max(2 * tp + fp + fn, 1)
    return out


class TextClassificationTask(Task):
    """Sequence classification / regression on a CSV or TSV (GLUE-style), fine-tuning a language model."""

    name = "text-classification"
    metric = "acc"
    entry = "classify"
    Options = TextOptions
    defaults = {
        "model": None,
        "data": "",
        "val_fraction": 0.1,
        "epochs": 3,
        "batch_size": 32,
        "lr": 5e-4,
        "min_lr": 1e-6,
        "weight_decay": 0.01,
        "warmup_epochs": 0.1,
        "eval_batch_size": 128,
    }

    def setup(self, state: dict | None) -> None:
        cfg, rt = self.cfg, self.rt
        self.options = o = self.parse_options(cfg)
        if not cfg.data.source:
            raise TaskError(
                "task='text-classification' needs data='TABLE' (a CSV or TSV with a text and a label column)"
            )
        texts, raw, cols, label = read_labelled(cfg.data.source, "train", cfg.data.text_columns, cfg.data.label_column)
        self.columns = (cols, label)
        if state is not None:
            model = build(config_from_dict(dict(state["model_config"])))
            tok = Tokenizer.from_str(state["task"]["tokenizer"])
            self.regression, self.classes = state["task"]["regression"], state["task"]["classes"]
        else:
            if not cfg.init_from:
                raise TaskError(
                    "task='text-classification' needs init_from='CHECKPOINT' (a task='lm' run or model dir)"
                )
            model = load_model(cfg.init_from)
            if model.kind != LANGUAGE_MODEL or model.tokenizer is None:
                raise TaskError(f"{cfg.init_from} is not a language model with a tokenizer; pretrain with task='lm'")
            tok = model.tokenizer
            self.regression = self._scores(o.regression, raw, Path(cfg.data.source).name)
            self.classes = [] if self.regression else sorted(set(raw), key=lambda v: (not _is_int(v), _key(v)))
            model.reset_classifier(1 if self.regression else len(self.classes))
        if not self.regression and len(self.classes) < 2:
            raise ValueError(f"{cfg.data.source} has a single label {self.classes}; classification needs at least two")
        self.tokenizer = model.tokenizer = tok
        self.model = model.to(rt.device)
        data = self._encode(texts, raw, Path(cfg.data.source).name, "train")
        held_out = None if o.eval_data else eval_split_of(cfg.data.source)  # a dataset's own split beats --val-fraction
        if o.eval_data or held_out:
            t2, r2, _, _ = read_labelled(o.eval_data or cfg.data.source, held_out or "validation", cols, label)
            name = Path(o.eval_data).name if o.eval_data else held_out
            self.train_data, self.eval_data = data, self._encode(t2, r2, name, "eval")
        else:
            if not 0 < cfg.data.val_fraction < 1:
                raise OptionError(
                    "pass eval_data='TABLE' or a val_fraction in (0, 1) for the evaluation split", option="val_fraction"
                )
            g = torch.Generator().manual_seed(cfg.system.seed)
            order = torch.randperm(len(data), generator=g).tolist()
            n_val = max(1, round(cfg.data.val_fraction * len(data)))
            self.train_data, self.eval_data = data.subset(order[n_val:], "train"), data.subset(order[:n_val], "val")

    def _scores(self, mode: str, raw: list[str], name: str) -> bool:
        """Whether the labels are scores (regression), by the rule ``regression`` states: ``auto`` — scores when
        every label is a number and one is not written as an integer (``3.8``, ``1e-3``), classes when every label
        is an integer or a name.  The numbers were bounded when the table was read (``data.text.LABEL_LIMIT``), and
        an ``auto`` choice of scores is said with the row that made it, so a stray number is never a silent switch
        to regression."""
        if mode != "auto":
            return mode == "yes"
        first = next((i for i, v in enumerate(raw) if not _is_int(v)), None)
        if first is None or not all(_is_number(v) for v in raw):  # integers, or names among them: classes
            return False
        self.rt.log(
            f"notice: the labels of {name} are read as scores (regression, mean squared error): row {first + 1} "
            f"holds {raw[first]!r}, not an integer (regression=no reads them as classes)"
        )
        return True

    def _encode(self, texts: list[tuple[str, ...]], raw: list[str], name: str, split: str) -> LabelledTexts:
        """``[CLS] a [SEP] (b [SEP])`` truncated to the context; labels → class indices or float scores."""
        tok, n = self.tokenizer, self.model.config.block_size
        ids, cut = [], 0
        for parts in texts:
            seq = [tok.cls_id]
            for enc in tok.encode_batch(list(parts)):
                seq += enc + [tok.sep_id]
            cut += len(seq) > n
            ids.append(seq[:n])
        self.truncated = {**getattr(self, "truncated", {}), split: cut}
        if cut:  # the end of a long row (a pair's second text, for one) is not seen: say how often
            self.rt.log(
                f"notice: {cut:,} of the {len(ids):,} rows of {name} are longer than the model's {n}-token context "
                f"and are cut to their first {n} tokens"
            )
        if self.regression:
            bad = next((i for i, v in enumerate(raw) if not _is_number(v)), None)
            if bad is not None:
                raise ValueError(
                    f"{name}: row {bad + 1}'s label {raw[bad]!r} is not a number, and regression needs scores; "
                    "fix the row, or read the labels as classes (regression=auto or no)"
                )
            targets = torch.tensor([float(v) for v in raw], dtype=torch.float32)
        else:
            unknown = sorted(set(raw) - set(self.classes))
            if unknown:
                raise ValueError(f"{name}: labels {unknown[:5]} were not in the training labels {self.classes[:10]}")
            index = {c: i for i, c in enumerate(self.classes)}
            targets = torch.tensor([index[v] for v in raw])
        return LabelledTexts(ids, targets, tok.pad_id, name, split)

    def prepare(self, batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        return tuple(to_device(t, self.rt.device) for t in batch)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """``model(ids, lengths)`` runs ``classify`` (:attr:`entry`: through DDP, FSDP and torch.compile)."""
        ids, lengths, y = batch
        return self._objective(model(ids, lengths).float(), y)

    def _objective(self, out: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        loss = F.mse_loss(out[:, 0], y) if self.regression else F.cross_entropy(out, y)
        with torch.no_grad():
            n = y.new_full((), len(y), dtype=torch.float32)
            stats = {"loss": loss.detach() * n, "n": n}
            if not self.regression:
                stats["acc"] = (out.argmax(-1) == y).sum().float()
        return loss, stats

    @torch.no_grad()
    def evaluate(self, split: str) -> dict[str, float]:
        model, rt = self.model, self.rt
        preds, targets, loss_sum = [], [], 0.0
        with evaluating(model):
            for batch in self.eval_data.batches(self.cfg.logging.eval_batch_size, shuffle=False, at=rt.position()):
                ids, lengths, y = self.prepare(batch)
                out = model.classify(ids, lengths).float()
                _, s = self._objective(out, y)
                preds.append((out[:, 0] if self.regression else out.argmax(-1)).cpu())
                targets.append(y.cpu())
                loss_sum += float(s["loss"])
        mine = (torch.cat(preds), torch.cat(targets)) if preds else (torch.empty(0), torch.empty(0))
        parts = rt.gather((*mine, loss_sum))  # F1 and Spearman need every prediction
        pred, target = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        require_evaluated(len(target), "rows", self.eval_data)
        return {"loss": sum(p[2] for p in parts) / len(target), **text_metrics(pred, target, self.regression)}

    def describe(self) -> RunSummary:
        kind = "regression" if self.regression else f"{len(self.classes)} classes"
        facts = {
            "labels": kind,
            "text_columns": list(self.columns[0]),
            "label_column": self.columns[1],
            "train_rows": len(self.train_data),
            "eval_rows": len(self.eval_data),
            "truncated_rows": self.truncated,
        }
        return RunSummary(
            model=f"{self.model.num_params():,} params, {self.model.config.arch}",
            data=f"on {self.train_data.name}: {len(self.train_data)} train / {len(self.eval_data)} eval rows, {kind}",
            facts=facts,
        )

    def state_dict(self) -> dict:
        return {"tokenizer": self.tokenizer.to_str(), "regression": self.regression, "classes": self.classes}

    def finish(self, run_dir: Path) -> TaskResult:
        m = self.evaluate("test")
        if self.rt.main:
            self.model.save_pretrained(run_dir / "model")
        shown = ", ".join(f"{k} {v:.4f}" for k, v in m.items() if k != "loss")
        return TaskResult(record=m, message=f"{self.eval_data.split} {shown} ({len(self.eval_data)} rows)", numbers=m)


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def _is_int(v: str) -> bool:
    try:
        int(v)
        return True
    except ValueError:
        return False


def _key(v: str) -> Any:
    return int(v) if _is_int(v) else v
