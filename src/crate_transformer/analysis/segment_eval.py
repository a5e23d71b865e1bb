"""Score unsupervised masks against ground truth (Yu et al., CPAL 2024, Table 1; JMLR §4.3, Figs. 19-20).

* :func:`predict_masks` — masks of one model on the ground truth's images: MaskCut (:func:`~.segmentation.segment`,
  up to ``n_masks`` per image, scored ``1, 1/2, 1/3, …`` in the order found) or the keep-``mass`` per-head
  attention masks of the Fig. 20 recipe (:func:`~.attention_masks.head_masks`, one per head, scored by how
  concentrated the head is: its kept mass over the area it keeps).  Each image is resized to ``resolution`` for
  the model and the masks are upsampled back to the image (nearest).
* :func:`write_results` — the predictions as a COCO results JSON (``image_id``, ``category_id``, RLE
  ``segmentation`` from ``pycocotools.mask``, ``bbox``, ``score``) that any COCO tool reads.
* :func:`coco_scores` — class-agnostic mask and box AP / AP50 / AP75 / AR@100 by ``pycocotools.cocoeval.COCOeval``
  (as CutLER scores MaskCut: every object one category), never a hand-written AP.
* :func:`single_object_scores` — the single-object protocol of TokenCut / LOST / DINO: **CorLoc**, the fraction of
  annotated images whose top prediction's box has IoU ≥ 0.5 with *any* ground-truth box (TokenCut
  ``main_tokencut.py``, YangtaoWANG95/TokenCut at fed52cd5b60891baefd8ec7110dafa73be816ee1: ``corloc[im_id] = 1 if
  any(bbox_iou(pred, gt_bbxs) >= 0.5)``, the predicted box spanning the mask's pixels ``[min, max + 1)``), and
  **Jaccard**, the mean IoU between the top mask and the union of the image's ground-truth objects (DINO, Caron
  et al. 2021, Table 4's "Jaccard similarity" on VOC12), VOC's void boundary pixels left out of both.
* :func:`evaluate_segmentation` — all of it for one model and one ground truth.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..data.memory import to_chw
from ..data.pixels import picture
from ..data.transforms import resize_tensor
from ..io import make_folder, write_json
from ..models.classifier import ImageClassifier
from ..models.spec import resolve_normalization
from ._common import Normalization, model_device, normalize_images
from .attention_masks import head_masks
from .segment_data import GroundTruth, coco_tools
from .segmentation import segment

__all__ = [
    "METHODS",
    "Prediction",
    "predict_masks",
    "write_results",
    "coco_scores",
    "single_object_scores",
    "evaluate_segmentation",
]

METHODS = ("maskcut", "attention")
STATS = (
    "AP",
    "AP50",
    "AP75",
    "AP_small",
    "AP_medium",
    "AP_large",
    "AR1",
    "AR10",
    "AR100",
    "AR_small",
    "AR_medium",
    "AR_large",
)  # COCOeval.stats, in its order


@dataclass
class Prediction:
    """One predicted object: a boolean mask at the image's resolution and its confidence."""

    image_id: int
    mask: np.ndarray
    score: float

    def box(self) -> np.ndarray:
        """``[x1, y1, x2, y2]`` spanning the mask's pixels (``max + 1``, as TokenCut); zeros for an empty mask."""
        ys, xs = np.nonzero(self.mask)
        if ys.size == 0:
            return np.zeros(4)
        return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float64)


def _load_image(path: Path, channels: int, resolution: int) -> torch.Tensor:
    """The image at ``path`` as the model's ``(1, C, r, r)`` input in [0, 1]: decoded as every image path decodes
    (``data.pixels.picture``: 16-bit and float samples scaled, never clipped), its channels matched as in training,
    the whole image resized to the square (no crop: the masks are scored on the whole image)."""
    from PIL import Image

    with Image.open(path) as im:
        a, _ = picture(im)
    return resize_tensor(to_chw(a, channels, None)[None], resolution).float() / 255.0


def _image_masks(
    model: ImageClassifier, x: torch.Tensor, method: str, layer: int, n_masks: int, tau: float | None, mass: float
) -> tuple[torch.Tensor, list[float]]:
    """``(masks (S, r, r) on the model's input, scores)`` for one normalised image ``x`` ``(1, C, r, r)``."""
    if method == "maskcut":
        grid = torch.from_numpy(segment(model, x, layer, n_masks, tau)[0]).float()  # (S, h, w); S may be 0
        p = model.config.patch_size
        up = grid.repeat_interleave(p, -2).repeat_interleave(p, -1)  # nearest upsampling (works for S = 0)
        return up, [1.0 / (k + 1) for k in range(up.shape[0])]
    maps, masks = head_masks(model, x, layer, mass)
    kept = (maps[0] * masks[0]).flatten(1).sum(1) / maps[0].flatten(1).sum(1).clamp_min(1e-30)
    area = masks[0].flatten(1).float().mean(1).clamp_min(1e-30)
    return masks[0].float(), (kept / area).tolist()


@torch.no_grad()
def predict_masks(
    model: ImageClassifier,
    data: GroundTruth,
    method: str = "maskcut",
    *,
    layer: int = -1,
    n_masks: int = 3,
    tau: float | None = 0.15,
    mass: float = 0.6,
    resolution: int | None = None,
    normalization: Normalization | None = None,
    image_ids: Sequence[int] | None = None,
) -> list[Prediction]:
    """Masks of ``model`` on the images of ``data`` (``method``: ``"maskcut"`` or ``"attention"``, see the module).

    ``resolution``: the square side the images are resized to for the model (default the model's ``image_size``;
    a multiple of the patch size); ``normalization``: ``(mean, std)`` (default the model's own, else none).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    c = model.config
    r = int(resolution or c.image_size)
    if r % c.patch_size:
        raise ValueError(f"resolution {r} is not a multiple of the patch size {c.patch_size}; give one that is")
    norm = normalization if normalization is not None else resolve_normalization(model)
    out: list[Prediction] = []
    for image_id in data.image_ids if image_ids is None else image_ids:
        im = data.image(image_id)
        x = normalize_images(_load_image(data.files[image_id], c.in_chans, r), norm).to(model_device(model))
        masks, scores = _image_masks(model, x, method, layer, n_masks, tau, mass)
        if not len(masks):
            continue
        full = F.interpolate(masks[None], size=(im["height"], im["width"]), mode="nearest")[0].bool().numpy()
        out += [Prediction(image_id, m, s) for m, s in zip(full, scores, strict=True) if m.any()]
    return out


def results_records(predictions: Sequence[Prediction]) -> list[dict]:
    """The predictions as COCO results records (RLE masks through ``pycocotools.mask``, category 1)."""
    mask_api = coco_tools().mask
    records = []
    for p in predictions:
        rle = mask_api.encode(np.asfortranarray(p.mask.astype(np.uint8)))
        bbox = mask_api.toBbox(rle).tolist()
        rle["counts"] = rle["counts"].decode()
        records.append(
            {"image_id": int(p.image_id), "category_id": 1, "segmentation": rle, "bbox": bbox, "score": float(p.score)}
        )
    return records


def write_results(predictions: Sequence[Prediction], path: str | Path) -> Path:
    """Write the predictions as a COCO results JSON (a list of records, :func:`results_records`); returns the path."""
    path = Path(path)
    make_folder(path.parent)
    write_json(path, results_records(predictions), indent=None)
    return path


def coco_scores(data: GroundTruth, results: Sequence[dict] | str | Path) -> dict[str, dict[str, float]]:
    """Class-agnostic COCO scores by ``COCOeval``: ``{"segm": {...}, "bbox": {...}}``, each the twelve
    ``COCOeval.stats`` by name (AP, AP50, AP75, …, AR100, …), on every image of ``data`` (``-1``: undefined, e.g.
    no object of that size).  ``results``: COCO results records or a results JSON file.  With no result at all
    (``loadRes`` refuses an empty list) every score is 0."""
    coco_tools()  # the install hint when pycocotools is absent
    records = json.loads(Path(results).read_text()) if isinstance(results, (str, Path)) else list(results)
    if not records:
        return {iou_type: dict.fromkeys(STATS, 0.0) for iou_type in ("segm", "bbox")}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress and tables
        return {iou_type: _cocoeval(data, records, iou_type) for iou_type in ("segm", "bbox")}


def _cocoeval(data: GroundTruth, records: list[dict], iou_type: str) -> dict[str, float]:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    gt = COCO()
    gt.dataset = json.loads(json.dumps(data.dataset))  # COCO keeps a reference; give it its own copy
    gt.createIndex()
    ev = COCOeval(gt, gt.loadRes([dict(r) for r in records]), iou_type)
    ev.params.imgIds = data.image_ids
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return dict(zip(STATS, (float(v) for v in ev.stats), strict=True))


def box_iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one ``[x1, y1, x2, y2]`` box with each of ``boxes`` ``(n, 4)`` (pixel-edge coordinates)."""
    lt = np.maximum(box[:2], boxes[:, :2])
    rb = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    area = lambda b: np.prod(np.clip(b[..., 2:] - b[..., :2], 0, None), axis=-1)  # noqa: E731
    union = area(box) + area(boxes) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def single_object_scores(data: GroundTruth, predictions: Sequence[Prediction]) -> dict[str, float | int]:
    """CorLoc and Jaccard of the top-scoring prediction of each annotated image (see the module docstring);
    an annotated image without a prediction counts as a miss (CorLoc 0, Jaccard 0).  ``images``: how many were
    scored (the annotated ones)."""
    top: dict[int, Prediction] = {}
    for p in predictions:
        if p.image_id not in top or p.score > top[p.image_id].score:
            top[p.image_id] = p
    hits, jac, n = 0, 0.0, 0
    for image_id in data.image_ids:
        gt_boxes = data.boxes(image_id)
        if not len(gt_boxes):
            continue
        n += 1
        p = top.get(image_id)
        if p is None:
            continue
        hits += bool((box_iou(p.box(), gt_boxes) >= 0.5).any())
        fg = data.masks(image_id).any(0)
        keep = ~data.void(image_id)  # VOC's 255 boundary: neither object nor background, left out
        union = (np.logical_or(fg, p.mask) & keep).sum()
        jac += float((np.logical_and(fg, p.mask) & keep).sum() / union) if union else 0.0
    return {"corloc": hits / n if n else float("nan"), "jaccard": jac / n if n else float("nan"), "images": n}


def evaluate_segmentation(
    model: ImageClassifier | str | Path,
    data: GroundTruth,
    method: str = "maskcut",
    *,
    out: str | Path | None = None,
    layer: int = -1,
    n_masks: int = 3,
    tau: float | None = 0.15,
    mass: float = 0.6,
    resolution: int | None = None,
    normalization: Normalization | None = None,
) -> dict:
    """Score ``model``'s unsupervised masks on ``data`` (:func:`~.segment_data.read_coco` / :func:`read_voc`).

    ``model``: a model with attention maps, or anything ``ct.load_model`` reads (a run, a saved folder, a zoo
    name).  Returns ``{"method", "images", "unannotated", "predictions", "coco": {"segm", "bbox"},
    "single_object": {"corloc", "jaccard", "images"}}``; images without annotations are scored (their
    predictions are false positives) and counted in ``unannotated``.  With ``out``, the predictions are written
    to ``out/results_{method}.json`` (COCO results) and the scores to ``out/segment_eval_{method}.json``.
    """
    if isinstance(model, (str, Path)):
        from ..loading.pipeline import load_model

        model = load_model(model)
    model.eval()
    preds = predict_masks(
        model,
        data,
        method,
        layer=layer,
        n_masks=n_masks,
        tau=tau,
        mass=mass,
        resolution=resolution,
        normalization=normalization,
    )
    records = results_records(preds)
    report = {
        "method": method,
        "annotations": str(data.source),
        "images": len(data.image_ids),
        "unannotated": len(data.unannotated),
        "predictions": len(records),
        "coco": coco_scores(data, records),
        "single_object": single_object_scores(data, preds),
    }
    if out is not None:
        folder = make_folder(out)
        write_json(Path(folder) / f"results_{method}.json", records, indent=None)
        write_json(Path(folder) / f"segment_eval_{method}.json", report, indent=1)
    return report
