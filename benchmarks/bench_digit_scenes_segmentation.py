"""Does a supervised CRATE's attention segment better than a ViT's?  Item 4 of issue 51, on digit scenes.

The emergence claim (JMLR §4.3, Figs. 19-20; Yu et al., CPAL 2024, Table 1: MaskCut on COCO val2017, CRATE-B/8
against ViT-B/8) at a scale a shared CPU runs: a CRATE and a ViT of about the same size, each trained by the same
``crate train`` recipe on the ``digit-scenes`` source (64 px scenes of 1-3 digits over clutter, labelled by the
largest digit, seen at their own 64 px on an 8 × 8 grid of 8 px patches) for every seed, then scored by
``evaluate_segmentation`` (what ``crate segment-eval --data digit-scenes`` runs) on the 1,000 test scenes,
whose masks are exact: MaskCut's masks and each head's attention mask (Fig. 20), class-agnostic COCO mask AP50 /
box AP50 (pycocotools), CorLoc and Jaccard.  Beside each trained model: the untrained network of the same
architecture and seed (the reference of ``crate analyze``'s verdicts), normalised with the same statistics.

The recipe (the defaults; why, in docs/results.md): AdamW lr 4e-3, batch 64, 30 epochs, 1 warm-up epoch,
``--augment translate``.  CRATE embeds patches with a plain linear map (``patch_norm=False``, CRATE-MAE's patch
embedding, the ViT's too) and keeps its MSSA + ISTA layers: the official classifier's LayerNorm over each patch's
pixels (Alg. 6) scales every patch to unit variance, so the clutter, dimmer than the digits but textured, is
amplified to the digits' strength (a patch's brightest value tells digit from clutter with AUC 1.00 before that
LayerNorm, 0.44 after), and that CRATE learned far more slowly (one seed, 24 epochs: 22.5% test accuracy
against 47.3%; chance is 12%).

Verdict rule, on MaskCut mask AP50 (the metric of the paper's table) and as well on box AP50, CorLoc and Jaccard:
CRATE segments better when its mean over seeds exceeds the ViT's by more than the noise, twice the standard error
of the difference of the seed means (``2·√(s_c²/n_c + s_v²/n_v)``, at least :data:`MIN_EFFECT`: scores that all round
to zero decide nothing), and training raised its score above its untrained network's by more than the same noise;
otherwise the claim fails here (or the ViT wins, when the difference is as large the other way).  The seeds may run
as separate processes into one ``--out`` (``--seeds 1``, and one seed's two models too: ``--models ViT``): each
writes ``rows-seed{N}.json`` (``rows-seed{N}-ViT.json``), and every process ends by reporting over all the rows
found there (``--report`` only reports).  ``--diagnose`` trains nothing and prints the numbers behind the patch
embedding's choice (:func:`patch_diagnostic`).

    python benchmarks/bench_digit_scenes_segmentation.py --out runs/digit-scenes-seg   # 3 seeds, 30 epochs, 1000 scenes
    python benchmarks/bench_digit_scenes_segmentation.py --tiny                        # seconds: a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import NON_NEGATIVE, POSITIVE, Arguments

import crate_transformer as ct
from crate_transformer.analysis import GroundTruth, evaluate_segmentation, read_coco
from crate_transformer.data.digit_scenes import load_digit_scenes, scenes_folder
from crate_transformer.train import TrainConfig, train

# About the same size (the run prints both counts: 55,178 and 57,826): CRATE d 64 with 4 heads of 16 and 3 layers;
# the ViT at about half the width, 2 heads of 18 and a 4x MLP, as crate_mnist / vit_mnist are paired (a CRATE layer
# holds about 3d² weights, a ViT layer 12d²; d 36 rather than 32 makes up for CRATE's wider patch projection).  Both
# embed patches with one linear map (CRATE: patch_norm=False, see the module docstring).  Small enough that 3 seeds
# of both train in about 12 CPU-minutes.
GEOMETRY = dict(image_size=64, patch_size=8, in_chans=3, depth=3)
MODELS = {
    "CRATE": ("crate_mnist_p4", dict(GEOMETRY, dim=64, heads=4, patch_norm=False)),
    "ViT": ("vit_mnist", dict(GEOMETRY, dim=36, heads=2)),
}
# The recipe, the same for both models (what was tried before it: docs/results.md).
RECIPE = dict(augment="translate", lr=4e-3, batch_size=64, warmup_epochs=1.0)
MIN_EFFECT = 0.01  # one point of AP / CorLoc / Jaccard: the smallest difference the rule calls a difference
METRICS = ("maskcut_AP50", "maskcut_boxAP50", "maskcut_corloc", "maskcut_jaccard", "attention_AP50")


def _subset(gt: GroundTruth, n: int) -> GroundTruth:
    """The first ``n`` test scenes (the smoke run)."""
    keep = set(gt.image_ids[:n])
    d = dict(gt.dataset, images=[im for im in gt.dataset["images"] if im["id"] in keep])
    d["annotations"] = [a for a in gt.dataset["annotations"] if a["image_id"] in keep]
    return GroundTruth(d, {i: gt.files[i] for i in keep}, gt.source)


def _patch_stats(x: np.ndarray, cover: np.ndarray, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """One scene's ``patch × patch`` tiles ``(n, 3·p²)`` and the share of each that is digit pixels."""
    side = x.shape[0] // patch
    tiles = x[: side * patch, : side * patch].reshape(side, patch, side, patch, 3).swapaxes(1, 2)
    share = cover[: side * patch, : side * patch].reshape(side, patch, side, patch).mean((1, 3))
    return tiles.reshape(side * side, -1), share.ravel()


def patch_diagnostic(gt: GroundTruth, n: int = 300, patch: int = 8) -> dict[str, float]:
    """Why the official patch LayerNorm hides the digits (``--diagnose``), on the first ``n`` scenes of ``gt``.

    Patches with at least 5% digit pixels against those with none (slivers between are left out): the AUC with
    which a patch's brightest value tells them apart (scikit-learn's ``roc_auc_score``), on the raw pixels and
    after the LayerNorm over each patch's ``3·p²`` values (Alg. 6, without its affine part); the mean pixel std
    of each kind, which that LayerNorm scales to 1; and how much of its box a digit's mask fills (a mask made
    of whole patches cannot reach IoU 0.5 with a stroke that fills less than half of its box), over every
    digit of ``gt``."""
    from PIL import Image
    from sklearn.metrics import roc_auc_score

    tiles, shares = [], []
    for i in gt.image_ids[:n]:
        x = np.asarray(Image.open(gt.files[i]).convert("RGB"), dtype=np.float64) / 255
        t, share = _patch_stats(x, gt.masks(i).any(0), patch)
        keep = (share == 0) | (share >= 0.05)
        tiles.append(t[keep]), shares.append(share[keep])
    t, digit = np.concatenate(tiles), np.concatenate(shares) >= 0.05
    z = (t - t.mean(1, keepdims=True)) / np.sqrt(t.var(1, keepdims=True) + 1e-5)  # nn.LayerNorm's eps
    fill = np.array([a["area"] / (a["bbox"][2] * a["bbox"][3]) for a in gt.dataset["annotations"]])  # every digit
    auc_raw, auc_ln = roc_auc_score(digit, t.max(1)), roc_auc_score(digit, z.max(1))
    return {"patches": len(digit), "digit_share": float(digit.mean()), "auc_raw": float(auc_raw),
            "auc_layernorm": float(auc_ln), "std_digit": float(t[digit].std(1).mean()),
            "std_clutter": float(t[~digit].std(1).mean()), "digits": len(fill), "fill_median": float(np.median(fill)),
            "fill_half": float(np.mean(fill >= 0.5))}  # fmt: skip


def _scores(model: torch.nn.Module, gt: GroundTruth, norm: tuple) -> dict[str, float]:
    out = {}
    for method in ("maskcut", "attention"):
        r = evaluate_segmentation(model, gt, method, normalization=norm)
        out[f"{method}_AP50"] = r["coco"]["segm"]["AP50"]
        if method == "maskcut":
            out["maskcut_boxAP50"] = r["coco"]["bbox"]["AP50"]
            out["maskcut_corloc"] = r["single_object"]["corloc"]
            out["maskcut_jaccard"] = r["single_object"]["jaccard"]
    return out


def _scored(model: torch.nn.Module, gt: GroundTruth, norm: tuple) -> dict:
    """The scores and the CPU-seconds they took."""
    t0 = time.process_time()
    scores = _scores(model, gt, norm)
    return {**scores, "score_cpu_s": time.process_time() - t0}


def _run(kind: str, seed: int, args: argparse.Namespace, gt: GroundTruth, norm: tuple, out: Path) -> list[dict]:
    """Train one model, score it and its untrained twin; two rows."""
    name, model_args = MODELS[kind]
    torch.manual_seed(seed)
    untrained = ct.create_model(name, **model_args).eval()
    rows = [{"model": kind, "trained": False, "seed": seed, **_scored(untrained, gt, norm)}]
    run = out / f"{kind}-seed{seed}"
    cfg = TrainConfig(model=name, model_args=model_args, data="digit-scenes", **RECIPE, epochs=args.epochs,
                      max_steps=args.max_steps, seed=seed, threads=args.threads, progress=False, eval_every=0,
                      out=str(run))  # fmt: skip
    t0 = time.process_time()
    summary = train(cfg)
    cpu = time.process_time() - t0
    model = ct.load_model(run).eval()
    acc = summary.get("test_acc", float("nan"))
    rows.append({"model": kind, "trained": True, "seed": seed, "test_acc": acc, "train_cpu_s": cpu,
                 "params": model.num_params(), **_scored(model, gt, norm)})  # fmt: skip
    return rows


def _mean_sd(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def verdict(rows: list[dict], metric: str = "maskcut_AP50") -> str:
    """The rule of the module docstring, in one line with its numbers."""

    def pick(kind: str, trained: bool) -> list[float]:
        return [r[metric] for r in rows if r["model"] == kind and r["trained"] == trained]

    crate, vit, crate0 = pick("CRATE", True), pick("ViT", True), pick("CRATE", False)
    (c, sc), (v, sv), (c0, sc0) = _mean_sd(crate), _mean_sd(vit), _mean_sd(crate0)
    # each mean's own count: a report read while another process still trains one model has fewer of its seeds
    noise = max(2 * math.sqrt(sc**2 / len(crate) + sv**2 / len(vit)), MIN_EFFECT)
    gain_noise = max(2 * math.sqrt(sc**2 / len(crate) + sc0**2 / len(crate0)), MIN_EFFECT)
    n = f"{len(crate)} seeds" if len(crate) == len(vit) else f"seeds: CRATE {len(crate)}, ViT {len(vit)}"
    if c - v > noise and c - c0 > gain_noise:
        word = "holds: CRATE's attention segments better than the ViT's"
    elif v - c > noise:
        word = "fails: the ViT's attention segments better than CRATE's"
    else:
        word = "fails: no difference beyond the noise (or CRATE no better than untrained)"
    return (f"{word} ({metric}: CRATE {c:.3f} ± {sc:.3f}, ViT {v:.3f} ± {sv:.3f}, noise {noise:.3f}; "
            f"untrained CRATE {c0:.3f}, gain noise {gain_noise:.3f}; {n})")  # fmt: skip


def table(rows: list[dict]) -> str:
    """Mean ± sd over seeds of each metric, per model and state (markdown)."""
    lines = ["| model | state | test acc | " + " | ".join(METRICS) + " |", "|---" * (3 + len(METRICS)) + "|"]
    for kind in MODELS:
        for trained in (False, True):
            sel = [r for r in rows if r["model"] == kind and r["trained"] == trained]
            acc = "-" if not trained else "{:.3f} ± {:.3f}".format(*_mean_sd([r["test_acc"] for r in sel]))
            cells = ["{:.3f} ± {:.3f}".format(*_mean_sd([r[m] for r in sel])) for m in METRICS]
            lines.append(f"| {kind} | {'trained' if trained else 'untrained'} | {acc} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def collect(out: Path) -> list[dict]:
    """The rows of every seed written into ``out`` (by this process or others), in seed order, CRATE first."""
    rows = [row for f in out.glob("rows-seed*.json") for row in json.loads(f.read_text())]
    return sorted(rows, key=lambda r: (r["seed"], list(MODELS).index(r["model"]), r["trained"]))


def report(rows: list[dict], out: Path) -> None:
    """Print the table and the verdicts over the rows; write them to ``out/results.json``."""
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    for metric in ("maskcut_AP50", "maskcut_boxAP50", "maskcut_corloc", "maskcut_jaccard"):
        print(f"verdict ({metric}):", verdict(rows, metric))
    cpu = sum(r.get("train_cpu_s", 0.0) + r["score_cpu_s"] for r in rows)
    seeds = sorted({r["seed"] for r in rows})
    print(f"seeds {seeds}; CPU-seconds {cpu:.0f} (training and scoring) -> {out / 'results.json'}")


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], range=NON_NEGATIVE)
    p.add_argument("--epochs", type=int, default=30, range=POSITIVE, help="the same budget for both models")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="train only these")
    p.add_argument("--max-steps", type=int, default=0, range=NON_NEGATIVE, help="stop after N steps (0 = all)")
    p.add_argument("--threads", type=int, default=1, range=POSITIVE)
    p.add_argument("--images", type=int, default=0, range=NON_NEGATIVE, help="score N test scenes (0 = 1,000)")
    p.add_argument("--out", default=None, help="run directories and results (default: a temp dir)")
    p.add_argument("--report", action="store_true", help="train nothing: report the seeds already in --out")
    p.add_argument("--tiny", action="store_true", help="smoke run: 1 seed, 2 steps, 8 test scenes")
    p.add_argument("--diagnose", action="store_true", help="train nothing: what the patch LayerNorm does to the scenes")
    p.rule(lambda a: a.out or not a.report, "--report reads the rows of an earlier run: pass its --out DIR")
    args = p.parse_args()
    if args.tiny:
        args.seeds, args.max_steps, args.images, args.epochs = [0], 2, 8, 1
    if args.diagnose:
        folder = scenes_folder("test")
        print(json.dumps(patch_diagnostic(read_coco(folder / "instances.json", folder / "images"))))
        return
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_dss_"))
    if not args.report:
        _train_and_score(args, out)
    rows = collect(out)
    if not rows:
        raise SystemExit(f"no rows-seed*.json in {out}: run the seeds first (without --report)")
    report(rows, out)


def _train_and_score(args: argparse.Namespace, out: Path) -> None:
    """Each seed of ``args``: the models, trained and untrained, into ``out/rows-seed{N}.json`` (both models) or
    ``rows-seed{N}-{model}.json`` (one)."""
    torch.set_num_threads(args.threads)
    folder = scenes_folder("test")
    gt = read_coco(folder / "instances.json", folder / "images")
    gt = _subset(gt, args.images) if args.images else gt
    train_set = load_digit_scenes("train")
    norm = (train_set.mean, train_set.std)
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        rows: list[dict] = []
        for kind in (k for k in MODELS if k in args.models):
            rows += _run(kind, seed, args, gt, norm, out)
            print(json.dumps(rows[-2]), json.dumps(rows[-1]), sep="\n", flush=True)
        tag = "" if set(args.models) == set(MODELS) else "-" + "-".join(args.models)
        (out / f"rows-seed{seed}{tag}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
