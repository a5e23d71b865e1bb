"""TokenCut's CorLoc: its VOC box reading, box IoU and the per-image hit test, transcribed for the tests.

Source: https://github.com/YangtaoWANG95/TokenCut, commit fed52cd5b60891baefd8ec7110dafa73be816ee1:
``extract_gt_VOC`` and ``bbox_iou`` (the plain-IoU path) from ``datasets.py``; ``corloc`` from the evaluation
loop of ``main_tokencut.py`` (``if torch.any(ious >= 0.5): corloc[im_id] = 1`` and ``100 * np.sum(corloc) / cnt``),
wrapped in a function over (prediction, ground-truth boxes) pairs.  The predicted box is ``object_discovery.py``'s
``[xmin, ymin, xmax + 1, ymax + 1]`` of the mask's pixels (the scale factors there are 1 at pixel resolution).
"""

import numpy as np
import torch


def extract_gt_VOC(objects):
    gt_bbxs = []
    for o in range(len(objects)):
        obj = objects[o]["bndbox"]
        x1y1x2y2 = [int(obj["xmin"]), int(obj["ymin"]), int(obj["xmax"]), int(obj["ymax"])]
        # Original annotations are integers in the range [1, W or H]
        # Assuming they mean 1-based pixel indices (inclusive),
        # a box with annotation (xmin=1, xmax=W) covers the whole image.
        # In coordinate space this is represented by (xmin=0, xmax=W)
        x1y1x2y2[0] -= 1
        x1y1x2y2[1] -= 1
        gt_bbxs.append(x1y1x2y2)
    return np.asarray(gt_bbxs)


def bbox_iou(box1, box2, eps=1e-7):
    box2 = box2.T
    b1_x1, b1_y1, b1_x2, b1_y2 = box1[0], box1[1], box1[2], box1[3]
    b2_x1, b2_y1, b2_x2, b2_y2 = box2[0], box2[1], box2[2], box2[3]
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(0) * (
        torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)
    ).clamp(0)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    union = w1 * h1 + w2 * h2 - inter + eps
    return inter / union


def pred_box(mask):
    mask = np.nonzero(mask)
    ymin, ymax = min(mask[0]), max(mask[0]) + 1
    xmin, xmax = min(mask[1]), max(mask[1]) + 1
    return np.asarray([xmin, ymin, xmax, ymax])


def corloc(pairs):
    """``pairs``: (predicted box, ground-truth boxes) per image; returns CorLoc in percent."""
    hits = np.zeros(len(pairs))
    for im_id, (pred, gt_bbxs) in enumerate(pairs):
        ious = bbox_iou(torch.from_numpy(pred), torch.from_numpy(gt_bbxs))
        if torch.any(ious >= 0.5):
            hits[im_id] = 1
    return 100 * np.sum(hits) / len(pairs)
