"""Ground truth for scoring unsupervised segmentation, read from the real layouts (class-agnostic).

* :func:`read_coco` — a COCO instances JSON (``images``, ``annotations`` with polygon or RLE ``segmentation``,
  ``bbox``) and its images folder (COCO val2017: ``instances_val2017.json`` + ``val2017/``).
* :func:`read_voc` — a PASCAL VOC root: ``Annotations/*.xml`` (boxes), ``SegmentationObject/*.png`` (instance
  masks, index ``i`` = the XML's ``i``-th object, 255 = void), ``JPEGImages/*.jpg``.

Both return a :class:`GroundTruth`: a COCO-format dataset with one category (every object is "object", as
CutLER scores MaskCut class-agnostically), the image files, and the images without any annotation (counted and
reported, still scored: a prediction there is a false positive).  Bad records raise one line naming the file and
the record; sizes read from a file are bounded by :data:`MAX_PIXELS` before anything is allocated.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["MAX_PIXELS", "GroundTruth", "read_coco", "read_voc", "coco_tools"]

MAX_PIXELS = 1 << 26  # 67M pixels (8192 x 8192): COCO's largest image is 640 x 640, VOC's 500 x 500
POLYGON_SLACK = 1.0  # pixels a polygon vertex may lie outside the image (annotation tools round to the border)
CATEGORY = {"id": 1, "name": "object", "supercategory": "object"}


def coco_tools() -> Any:
    """``pycocotools`` (imported lazily: it is the ``seg`` extra), or a one-line error saying how to install it."""
    try:
        import pycocotools.mask  # noqa: F401
        from pycocotools import coco, cocoeval  # noqa: F401
    except ImportError as e:
        raise ImportError("scoring segmentation needs pycocotools: pip install crate-transformer[seg]") from e
    import pycocotools

    return pycocotools


@dataclass
class GroundTruth:
    """Class-agnostic ground truth: ``dataset`` is COCO format (``images``, ``annotations`` with RLE
    ``segmentation``, ``bbox`` as ``[x, y, w, h]``, ``categories`` = one "object"); ``files`` maps image id to
    its file; ``unannotated`` lists the ids of images with no annotation; ``source`` is the file read."""

    dataset: dict
    files: dict[int, Path]
    source: Path
    unannotated: list[int] = field(default_factory=list)
    voids: dict[int, dict] = field(default_factory=dict)  # image id → RLE of pixels neither object nor background

    def void(self, image_id: int) -> np.ndarray:
        """The image's void pixels ``(h, w)`` bool (VOC's 255 boundary band; none for COCO)."""
        im = self.image(image_id)
        if image_id not in self.voids:
            return np.zeros((im["height"], im["width"]), dtype=bool)
        return coco_tools().mask.decode(self.voids[image_id]).astype(bool)

    @property
    def image_ids(self) -> list[int]:
        return [im["id"] for im in self.dataset["images"]]

    def image(self, image_id: int) -> dict:
        return self._images()[image_id]

    def annotations(self, image_id: int) -> list[dict]:
        """The annotations of one image (crowd regions included, flagged ``iscrowd``)."""
        return [a for a in self.dataset["annotations"] if a["image_id"] == image_id]

    def masks(self, image_id: int) -> np.ndarray:
        """The non-crowd instance masks of one image, ``(n, h, w)`` bool."""
        mask_api = coco_tools().mask
        im = self.image(image_id)
        rles = [a["segmentation"] for a in self.annotations(image_id) if not a.get("iscrowd")]
        if not rles:
            return np.zeros((0, im["height"], im["width"]), dtype=bool)
        return np.moveaxis(mask_api.decode(rles), -1, 0).astype(bool)

    def boxes(self, image_id: int) -> np.ndarray:
        """The non-crowd boxes of one image, ``(n, 4)`` as ``[x1, y1, x2, y2]`` in pixel-edge coordinates."""
        b = [a["bbox"] for a in self.annotations(image_id) if not a.get("iscrowd")]
        b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
        return np.concatenate([b[:, :2], b[:, :2] + b[:, 2:]], axis=1)

    def _images(self) -> dict[int, dict]:
        return {im["id"]: im for im in self.dataset["images"]}


def _size(where: str, width: Any, height: Any) -> tuple[int, int]:
    """Checked ``(height, width)`` from a record: positive integers whose product is at most MAX_PIXELS."""
    if not all(isinstance(v, (int, float)) and float(v).is_integer() and v > 0 for v in (width, height)):
        raise ValueError(f"{where}: width/height must be positive integers, got {width!r} x {height!r}")
    h, w = int(height), int(width)
    if h * w > MAX_PIXELS:
        raise ValueError(f"{where}: {w} x {h} pixels exceeds the limit of {MAX_PIXELS} (MAX_PIXELS); fix the record")
    return h, w


def _image_records(path: Path, images: Any, folder: Path) -> tuple[list[dict], dict[int, Path]]:
    if not isinstance(images, list):
        raise ValueError(f"{path}: 'images' must be a list of image records")
    out, files = [], {}
    for n, rec in enumerate(images):
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: image record {n} is {type(rec).__name__}, not a record (a JSON object)")
        where = f"{path}: image id={rec.get('id')!r} ({rec.get('file_name')!r})"
        if not isinstance(rec.get("id"), int) or not isinstance(rec.get("file_name"), str):
            raise ValueError(f"{where}: an image record needs an integer 'id' and a 'file_name'")
        if rec["id"] in files:
            raise ValueError(f"{where}: the image id appears twice")
        h, w = _size(where, rec.get("width"), rec.get("height"))
        f = folder / rec["file_name"]
        if not f.is_file():
            raise FileNotFoundError(f"{where}: {f} is missing from the images folder {folder}")
        out.append({"id": rec["id"], "file_name": rec["file_name"], "height": h, "width": w})
        files[rec["id"]] = f
    return out, files


def _segmentation_rle(where: str, seg: Any, h: int, w: int) -> dict:
    """A COCO ``segmentation`` (polygons, uncompressed or compressed RLE) as compressed RLE, checked against
    the image."""
    mask_api = coco_tools().mask
    if isinstance(seg, list):
        if not seg or not all(isinstance(p, list) and len(p) >= 6 and len(p) % 2 == 0 for p in seg):
            raise ValueError(f"{where}: a polygon needs an even number (>= 6) of coordinates")
        xy = np.concatenate([np.asarray(p, dtype=np.float64) for p in seg]).reshape(-1, 2)
        if (xy < -POLYGON_SLACK).any() or (xy[:, 0] > w + POLYGON_SLACK).any() or (xy[:, 1] > h + POLYGON_SLACK).any():
            raise ValueError(f"{where}: a polygon vertex lies outside the {w} x {h} image")
        return mask_api.merge(mask_api.frPyObjects(seg, h, w))
    if isinstance(seg, dict) and "size" in seg and "counts" in seg:
        if list(seg["size"]) != [h, w]:
            raise ValueError(
                f"{where}: RLE size {list(seg['size'])} differs from the image's [height, width] [{h}, {w}]"
            )
        if isinstance(seg["counts"], list):  # uncompressed RLE (crowd regions): its run lengths must cover the image
            if sum(seg["counts"]) != h * w:
                raise ValueError(f"{where}: RLE counts sum to {sum(seg['counts'])}, not height*width = {h * w}")
            return mask_api.frPyObjects(seg, h, w)
        return {"size": [h, w], "counts": seg["counts"]}
    raise ValueError(f"{where}: 'segmentation' must be polygons or an RLE dict with 'size' and 'counts'")


def _annotation(path: Path, a: Any, images: dict[int, dict], n: int) -> dict:
    if not isinstance(a, dict):
        raise ValueError(f"{path}: annotation {n} is {type(a).__name__}, not a record (a JSON object)")
    where = f"{path}: annotation id={a.get('id', n)!r}"
    im = images.get(a.get("image_id"))
    if im is None:
        raise ValueError(f"{where} names image_id={a.get('image_id')!r}, which no image record has")
    h, w = im["height"], im["width"]
    rle = _segmentation_rle(where, a.get("segmentation"), h, w)
    mask_api = coco_tools().mask
    if isinstance(rle["counts"], str):
        rle["counts"] = rle["counts"].encode()
    try:
        area, bbox = float(mask_api.area(rle)), mask_api.toBbox(rle).tolist()
    except Exception as e:  # a corrupt compressed RLE string
        raise ValueError(f"{where}: the RLE does not decode ({e})") from None
    bbox = a.get("bbox", bbox)
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
        raise ValueError(f"{where}: 'bbox' must be [x, y, width, height], got {str(bbox)[:60]}")
    x, y, bw, bh = bbox
    if (
        bw < 0
        or bh < 0
        or x < -POLYGON_SLACK
        or y < -POLYGON_SLACK
        or x + bw > w + POLYGON_SLACK
        or y + bh > h + POLYGON_SLACK
    ):
        raise ValueError(f"{where}: bbox {bbox} lies outside the {w} x {h} image")
    rle["counts"] = rle["counts"].decode()
    return {
        "id": a.get("id", n + 1),
        "image_id": im["id"],
        "category_id": CATEGORY["id"],
        "segmentation": rle,
        "area": float(a.get("area", area)),
        "bbox": [float(v) for v in bbox],
        "iscrowd": int(a.get("iscrowd", 0)),
    }


def read_coco(annotations: str | Path, images: str | Path) -> GroundTruth:
    """Read a COCO instances JSON and its images folder as class-agnostic ground truth (every category → "object")."""
    path = Path(annotations)
    folder = Path(images)
    if not folder.is_dir():
        raise FileNotFoundError(f"{path}: the images folder {folder} does not exist")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable COCO JSON file ({e})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("annotations"), list):
        raise ValueError(f"{path}: a COCO instances file needs 'images' and 'annotations' lists")
    recs, files = _image_records(path, raw.get("images"), folder)
    by_id = {r["id"]: r for r in recs}
    anns = [_annotation(path, a, by_id, n) for n, a in enumerate(raw["annotations"])]
    return _ground_truth(recs, anns, files, path)


def _ground_truth(recs: list[dict], anns: list[dict], files: dict[int, Path], path: Path) -> GroundTruth:
    annotated = {a["image_id"] for a in anns}
    dataset = {"images": recs, "annotations": anns, "categories": [dict(CATEGORY)]}
    return GroundTruth(dataset, files, path, [r["id"] for r in recs if r["id"] not in annotated])


def _voc_boxes(xml: Path) -> tuple[int, int, list[list[float]]]:
    """``(height, width, boxes)`` of one VOC XML; boxes ``[x, y, w, h]`` from VOC's 1-based inclusive corners
    (``xmin − 1``, as TokenCut's ``extract_gt_VOC``: a box ``1..W`` covers ``[0, W]``)."""
    try:
        root = ET.parse(xml).getroot()
        size = root.find("size")
        h, w = _size(f"{xml}: <size>", int(size.findtext("width")), int(size.findtext("height")))
    except (ET.ParseError, AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{xml}: not a VOC annotation with a <size> of integer width and height ({e})") from None
    boxes = []
    for k, obj in enumerate(root.iter("object")):
        try:
            x1, y1, x2, y2 = (float(obj.find("bndbox").findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax"))
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"{xml}: object {k} needs a <bndbox> with numeric xmin, ymin, xmax, ymax") from None
        if not (1 <= x1 <= x2 <= w and 1 <= y1 <= y2 <= h):
            raise ValueError(f"{xml}: object {k}'s box ({x1}, {y1}, {x2}, {y2}) lies outside the {w} x {h} image")
        boxes.append([x1 - 1, y1 - 1, x2 - x1 + 1, y2 - y1 + 1])
    return h, w, boxes


def _voc_masks(png: Path, h: int, w: int, n: int) -> tuple[list[np.ndarray | None], np.ndarray]:
    """The ``n`` objects' masks from a SegmentationObject PNG (palette index ``k + 1`` = object ``k``), and its
    void pixels (index 255)."""
    from PIL import Image

    with Image.open(png) as im:
        if im.size != (w, h):
            raise ValueError(f"{png}: the mask is {im.size[0]} x {im.size[1]}, the XML says {w} x {h}")
        idx = np.asarray(im)
    if idx.ndim != 2:
        raise ValueError(f"{png}: a SegmentationObject mask must be a single-channel (palette) PNG of object indices")
    return [(idx == k + 1) if (idx == k + 1).any() else None for k in range(n)], idx == 255


def read_voc(root: str | Path, ids: list[str] | None = None, split: str | None = None) -> GroundTruth:
    """Read a PASCAL VOC root (``Annotations/``, ``JPEGImages/``, optional ``SegmentationObject/``).

    ``ids``: the image names to read; else ``ImageSets/Segmentation/{split}.txt`` when ``split`` is given, else
    every XML.  Objects with an instance mask get it; the others (no PNG, or absent from it) get their box as mask.
    """
    root = Path(root)
    if not (root / "Annotations").is_dir():
        raise FileNotFoundError(f"{root}: not a VOC root (no Annotations/ folder)")
    if ids is None and split is not None:
        ids = (root / "ImageSets" / "Segmentation" / f"{split}.txt").read_text().split()
    if ids is None:
        ids = sorted(p.stem for p in (root / "Annotations").glob("*.xml"))
    recs, anns, files, voids = [], [], {}, {}
    for i, name in enumerate(ids, start=1):
        xml = root / "Annotations" / f"{name}.xml"
        h, w, boxes = _voc_boxes(xml)
        img = root / "JPEGImages" / f"{name}.jpg"
        if not img.is_file():
            raise FileNotFoundError(f"{xml}: its image {img} is missing from JPEGImages/")
        png = root / "SegmentationObject" / f"{name}.png"
        masks, void = _voc_masks(png, h, w, len(boxes)) if png.is_file() else ([None] * len(boxes), None)
        recs.append({"id": i, "file_name": f"{name}.jpg", "height": h, "width": w})
        files[i] = img
        if void is not None and void.any():
            voids[i] = coco_tools().mask.encode(np.asfortranarray(void.astype(np.uint8)))
        for box, mask in zip(boxes, masks, strict=True):
            anns.append(_voc_annotation(len(anns) + 1, i, box, mask, h, w))
    gt = _ground_truth(recs, anns, files, root / "Annotations")
    gt.voids = voids
    return gt


def _voc_annotation(ann_id: int, image_id: int, box: list[float], mask: np.ndarray | None, h: int, w: int) -> dict:
    mask_api = coco_tools().mask
    if mask is None:
        x, y, bw, bh = (int(round(v)) for v in box)
        mask = np.zeros((h, w), dtype=bool)
        mask[y : y + bh, x : x + bw] = True
    rle = mask_api.encode(np.asfortranarray(mask.astype(np.uint8)))
    area = float(mask_api.area(rle))
    rle["counts"] = rle["counts"].decode()
    seg = {"size": [h, w], "counts": rle["counts"]}
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": 1,
        "segmentation": seg,
        "area": area,
        "bbox": box,
        "iscrowd": 0,
    }


def truth_labels(data: GroundTruth, files: Sequence[str | Path], image_size: int, crop_pct: float = 1.0) -> Tensor:
    """The ground truth of ``files`` (matched to ``data``'s images by path) as instance label maps ``(N, image_size,
    image_size)`` uint8 (0 = background, s = instance s; an image without a record or an annotation is all 0),
    under the very geometry of ``crate analyze --images`` (:func:`~crate_transformer.data.memory.to_chw`: shorter
    side to ``image_size / crop_pct``, centre crop): each instance mask is resized like the image (antialiased
    bilinear of 0/255) and kept where it covers at least half a pixel, so outline and prediction share pixels."""
    import torch

    from ..data.memory import to_chw

    by_path = {Path(f).resolve(): i for i, f in data.files.items()}
    out = torch.zeros(len(files), image_size, image_size, dtype=torch.uint8)
    for n, f in enumerate(files):
        image_id = by_path.get(Path(f).resolve())
        if image_id is None:
            continue
        for s, m in enumerate(data.masks(image_id)):
            scaled = to_chw((m * 255).astype(np.uint8), 1, image_size, crop_pct)[0]
            out[n][(scaled >= 128) & (out[n] == 0)] = min(s + 1, 255)
    return out
