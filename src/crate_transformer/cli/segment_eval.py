"""``crate segment-eval MODEL --data ANNOTATIONS [--images DIR]``: score a model's unsupervised masks.

MaskCut masks or the per-head attention masks of Fig. 20 against ground truth, class-agnostic: COCO mask and box
AP / AP50 / AP75 / AR by pycocotools, CorLoc and Jaccard (:func:`crate_transformer.analysis.evaluate_segmentation`).
``--data`` is a COCO instances JSON (with ``--images`` its images folder), a VOC root folder, or ``digit-scenes``:
the 1,000 test scenes of :mod:`crate_transformer.data.digit_scenes` (written once into the cache, every digit's
exact mask as ground truth).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Config
from ..config_utils import POSITIVE, Range, option
from ..io import make_folder
from ..train.config import SystemOptions
from .evaluate import EvalOptions
from .options import SYSTEM, add_command_options, apply_threads, like, parse_model_args
from .reports import layer_number

if TYPE_CHECKING:
    from ..analysis import GroundTruth

LAYERS = "1..L, or -1 the last, -2 the one before"


@dataclass
class SegmentEvalOptions(Config):
    """The options of ``crate segment-eval`` (the model is its positional argument)."""

    data: str | None = option(
        None,
        "ground truth: a COCO instances JSON, a PASCAL VOC root (Annotations/, JPEGImages/, SegmentationObject/), "
        "or digit-scenes (the built-in benchmark's test scenes)",
        metavar="FILE|DIR",
        basic=True,
    )
    images: str | None = option(None, "the images folder of a COCO JSON (e.g. val2017/)", metavar="DIR", basic=True)
    method: str = option(
        "maskcut",
        "masks scored: MaskCut's, or each head's attention mask (Fig. 20)",
        choices=("maskcut", "attention"),
        basic=True,
    )
    layer: int = option(-1, f"layer of the MaskCut features / attention maps: {LAYERS}", basic=True)
    masks: int = option(3, "MaskCut: masks per image at most", range=POSITIVE)
    tau: float = option(
        0.15, "MaskCut: the affinity's cosine threshold", range=Range(-1, 1, lo_open=True, hi_open=True)
    )
    mass: float = option(
        0.6, "attention: the share of each head's attention mass a mask keeps", range=Range(0, 1, lo_open=True)
    )
    resolution: int | None = option(
        None, "side the images are resized to for the model", shown="its image_size", range=POSITIVE
    )
    out: str = option(
        "segment-eval",
        "folder of results_METHOD.json (COCO results) and segment_eval_METHOD.json",
        metavar="DIR",
        basic=True,
    )
    model: str | None = like(EvalOptions, "model")
    model_args: list[str] = like(EvalOptions, "model_args")
    device: str = like(SystemOptions, "device", basic=True, group=SYSTEM)
    threads: int = like(SystemOptions, "threads", basic=True, group=SYSTEM)


def configure_segment_eval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", help="a run directory, a save_pretrained folder, hf-hub:ORG/NAME or an authors' file"
    )
    add_command_options(parser, SegmentEvalOptions)


def _ground_truth(args: argparse.Namespace) -> GroundTruth:
    from ..analysis import read_coco, read_voc
    from ..data.digit_scenes import NAME, scenes_folder

    if not args.data:
        raise ValueError("pass --data: a COCO instances JSON (with --images DIR), a VOC root folder or digit-scenes")
    if args.data.lower() == NAME:
        if args.images:
            raise ValueError(f"--data {NAME} brings its own images; drop --images")
        folder = scenes_folder("test")
        return read_coco(folder / "instances.json", folder / "images")
    data = Path(args.data)
    if not data.exists():
        raise FileNotFoundError(f"--data {data} does not exist; pass a COCO instances JSON or a VOC root folder")
    if data.is_dir():
        return read_voc(data)
    if not args.images:
        raise ValueError(f"--data {data} is a COCO JSON: pass its images folder as --images DIR")
    return read_coco(data, args.images)


def run_segment_eval(args: argparse.Namespace) -> int:
    """Score the masks, write the COCO results and the scores into ``--out``, print the table."""
    from ..analysis import evaluate_segmentation
    from ..loading.pipeline import load_model
    from ..train.runtime import resolve_device

    make_folder(args.out, "segment-eval results")  # the target first: nothing is computed for an unwritable one
    gt = _ground_truth(args)  # the annotations are checked before the model is loaded
    apply_threads(args)
    model = load_model(args.checkpoint, args.model, **parse_model_args(args.model_args, args.model))
    model = model.to(resolve_device(args.device)).eval()
    layer = layer_number(model, args.layer, "--layer")
    report = evaluate_segmentation(
        model,
        gt,
        args.method,
        out=args.out,
        layer=layer,
        n_masks=args.masks,
        tau=args.tau,
        mass=args.mass,
        resolution=args.resolution,
    )
    print(f"{report['images']} images ({report['unannotated']} without annotations), {report['predictions']} masks")
    for kind in ("segm", "bbox"):
        s = report["coco"][kind]
        print(f"{kind:5s} AP {s['AP']:.3f}  AP50 {s['AP50']:.3f}  AP75 {s['AP75']:.3f}  AR100 {s['AR100']:.3f}")
    so = report["single_object"]
    print(f"single object ({so['images']} images): CorLoc {so['corloc']:.3f}  Jaccard {so['jaccard']:.3f}")
    print(f"-> {Path(args.out) / f'segment_eval_{args.method}.json'}")
    return 0
