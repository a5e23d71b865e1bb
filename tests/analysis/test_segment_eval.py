"""Scoring unsupervised masks: COCO / VOC readers on tiny fixtures in the real layouts, COCO AP by pycocotools
(against COCOeval run directly on the same files), CorLoc / Jaccard against TokenCut's code and numpy, bad input."""

import json
import sys

import numpy as np
import pytest
import torch
from official import tokencut_corloc as tokencut
from PIL import Image

import crate_transformer as ct
from crate_transformer.analysis import segment_data, segment_eval
from crate_transformer.analysis.segment_data import read_coco, read_voc
from crate_transformer.analysis.segment_eval import Prediction, coco_scores, single_object_scores

pytest.importorskip("pycocotools")
from pycocotools import mask as mask_api  # noqa: E402
from pycocotools.coco import COCO  # noqa: E402
from pycocotools.cocoeval import COCOeval  # noqa: E402

H, W = 32, 40


def planted_masks():
    """Image 1: a square (given as a polygon) and a rectangle (given as RLE); image 2: a triangle-free box polygon."""
    sq = np.zeros((H, W), bool)
    sq[4:14, 6:16] = True
    rect = np.zeros((H, W), bool)
    rect[18:30, 20:38] = True
    box2 = np.zeros((H, W), bool)
    box2[8:24, 10:30] = True
    return {1: [sq, rect], 2: [box2]}


def rle_of(m):
    r = mask_api.encode(np.asfortranarray(m.astype(np.uint8)))
    r["counts"] = r["counts"].decode()
    return r


def write_images(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(0)
    for n in names:
        Image.fromarray(g.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(folder / n)


def coco_fixture(tmp_path, mutate=None):
    """A COCO instances JSON (polygon and RLE segmentations, one unannotated image) and its images folder."""
    write_images(tmp_path / "val", ["a.png", "b.png", "c.png"])
    images = [{"id": i, "file_name": f, "height": H, "width": W} for i, f in ((1, "a.png"), (2, "b.png"), (3, "c.png"))]
    anns = [
        {"id": 10, "image_id": 1, "category_id": 1, "segmentation": [[6, 4, 16, 4, 16, 14, 6, 14]],
         "bbox": [6, 4, 10, 10], "area": 100, "iscrowd": 0},
        {"id": 11, "image_id": 1, "category_id": 1, "segmentation": rle_of(planted_masks()[1][1]),
         "bbox": [20, 18, 18, 12], "area": 216, "iscrowd": 0},
        {"id": 12, "image_id": 2, "category_id": 1, "segmentation": [[10, 8, 30, 8, 30, 24, 10, 24]],
         "bbox": [10, 8, 20, 16], "area": 320, "iscrowd": 0},
    ]  # fmt: skip
    raw = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "thing"}]}
    if mutate:
        mutate(raw)
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(raw))
    return path, tmp_path / "val"


def direct_cocoeval(gt_file, dt_file, iou_type):
    """COCOeval exactly as a COCO user runs it on the two files."""
    gt = COCO(str(gt_file))
    ev = COCOeval(gt, gt.loadRes(str(dt_file)), iou_type)
    ev.evaluate(), ev.accumulate(), ev.summarize()
    return ev.stats


def test_read_coco_decodes_polygons_and_rle_and_counts_unannotated(tmp_path):
    gt = read_coco(*coco_fixture(tmp_path))
    assert gt.image_ids == [1, 2, 3] and gt.unannotated == [3]
    for image_id, masks in planted_masks().items():
        got = gt.masks(image_id)
        assert got.shape == (len(masks), H, W)
        for g, m in zip(got, masks):
            assert (g == m).mean() > 0.97  # polygon rasterisation differs from the pixel square only on its edges
    assert (gt.masks(1)[1] == planted_masks()[1][1]).all()  # RLE exact
    assert gt.boxes(1).tolist() == [[6, 4, 16, 14], [20, 18, 38, 30]]
    assert gt.masks(3).shape == (0, H, W)


@pytest.mark.parametrize("shift", [0, 3, 7])
def test_coco_ap_equals_cocoeval_on_the_same_files(tmp_path, shift):
    gt_file, folder = coco_fixture(tmp_path)
    gt = read_coco(gt_file, folder)
    preds = [Prediction(i, np.roll(m, shift, axis=1), 1.0 - 0.1 * k) for i in (1, 2) for k, m in enumerate(gt.masks(i))]
    dt_file = segment_eval.write_results(preds, tmp_path / "out" / "results.json")
    ours = coco_scores(gt, dt_file)
    for iou_type in ("segm", "bbox"):
        stats = direct_cocoeval(gt_file, dt_file, iou_type)
        assert [ours[iou_type][k] for k in segment_eval.STATS] == pytest.approx(list(stats), abs=1e-12)
    if shift == 0:
        assert ours["segm"]["AP"] == pytest.approx(1.0) and ours["bbox"]["AP"] == pytest.approx(1.0)
    else:
        assert ours["segm"]["AP"] < 1.0


def test_partial_predictions_lower_recall_as_cocoeval_says(tmp_path):
    gt_file, folder = coco_fixture(tmp_path)
    gt = read_coco(gt_file, folder)
    preds = [Prediction(1, gt.masks(1)[0], 0.9), Prediction(3, gt.masks(1)[1], 0.95)]  # one hit, one false positive
    dt_file = segment_eval.write_results(preds, tmp_path / "r.json")
    ours = coco_scores(gt, json.loads(dt_file.read_text()))
    assert [ours["segm"][k] for k in segment_eval.STATS] == pytest.approx(
        list(direct_cocoeval(gt_file, dt_file, "segm"))
    )
    assert ours["segm"]["AR100"] == pytest.approx(1 / 3) and 0 < ours["segm"]["AP"] < 1 / 3 + 1e-9


def test_no_prediction_scores_zero(tmp_path):
    gt = read_coco(*coco_fixture(tmp_path))
    assert coco_scores(gt, [])["segm"]["AP"] == 0.0


def numpy_single_object(gt_masks, gt_boxes, top_masks):
    """CorLoc / Jaccard written out independently: the top mask's pixel box against every gt box, IoU of masks."""
    hits, jac = [], []
    for masks, boxes, m in zip(gt_masks, gt_boxes, top_masks):
        ys, xs = np.nonzero(m)
        b = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], float)
        ious = []
        for g in boxes:
            iw = max(0.0, min(b[2], g[2]) - max(b[0], g[0]))
            ih = max(0.0, min(b[3], g[3]) - max(b[1], g[1]))
            union = (b[2] - b[0]) * (b[3] - b[1]) + (g[2] - g[0]) * (g[3] - g[1]) - iw * ih
            ious.append(iw * ih / union)
        hits.append(max(ious) >= 0.5)
        fg = np.any(masks, axis=0)
        jac.append((fg & m).sum() / (fg | m).sum())
    return np.mean(hits), np.mean(jac)


def test_corloc_and_jaccard_match_tokencut_and_numpy(tmp_path):
    gt = read_coco(*coco_fixture(tmp_path))
    m1 = np.roll(gt.masks(1)[1], 2, axis=0)  # near the rectangle: a hit
    m2 = np.zeros((H, W), bool)
    m2[0:6, 0:8] = True  # far from the box: a miss
    preds = [Prediction(1, m1, 0.9), Prediction(1, m2, 0.1), Prediction(2, m2, 0.5)]
    got = single_object_scores(gt, preds)
    corloc, jac = numpy_single_object([gt.masks(1), gt.masks(2)], [gt.boxes(1), gt.boxes(2)], [m1, m2])
    official = tokencut.corloc([(tokencut.pred_box(m1), gt.boxes(1)), (tokencut.pred_box(m2), gt.boxes(2))])
    assert got["images"] == 2 and got["corloc"] == corloc == 0.5 and official == 50.0
    assert got["jaccard"] == pytest.approx(jac) and 0 < jac < 0.5


def voc_fixture(tmp_path, boxes=((3, 5, 12, 16), (20, 10, 36, 28)), png=True, size=(W, H)):
    root = tmp_path / "VOC2012"
    for d in ("Annotations", "JPEGImages", "SegmentationObject"):
        (root / d).mkdir(parents=True, exist_ok=True)
    objs = "".join(
        f"<object><name>dog</name><difficult>0</difficult><bndbox><xmin>{a}</xmin><ymin>{b}</ymin><xmax>{c}</xmax>"
        f"<ymax>{d}</ymax></bndbox></object>"
        for a, b, c, d in boxes
    )
    head = f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>"
    xml = f"<annotation>{head}{objs}</annotation>"
    (root / "Annotations" / "2007_000001.xml").write_text(xml)
    Image.fromarray(np.zeros((H, W, 3), np.uint8)).save(root / "JPEGImages" / "2007_000001.jpg")
    idx = np.zeros((H, W), np.uint8)
    for k, (a, b, c, d) in enumerate(boxes):
        idx[b - 1 : d, a - 1 : c] = k + 1  # VOC corners are 1-based inclusive
    idx[0, :] = 255  # a void boundary row
    if png:
        im = Image.fromarray(idx, mode="P")
        im.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0] + [0] * 759)
        im.save(root / "SegmentationObject" / "2007_000001.png")
    return root, idx


def test_read_voc_boxes_follow_tokencut_and_masks_the_png(tmp_path):
    root, idx = voc_fixture(tmp_path)
    gt = read_voc(root)
    objects = [
        {"bndbox": {"xmin": a, "ymin": b, "xmax": c, "ymax": d}} for a, b, c, d in ((3, 5, 12, 16), (20, 10, 36, 28))
    ]
    x1y1 = tokencut.extract_gt_VOC(objects)[:, :2]
    assert gt.boxes(1)[:, :2].tolist() == x1y1.tolist()  # xmin - 1, ymin - 1 as TokenCut
    assert gt.boxes(1)[:, 2:].tolist() == [[12, 16], [36, 28]]  # the inclusive last pixel's far edge
    masks = gt.masks(1)
    assert (masks[0] == (idx == 1)).all() and (masks[1] == (idx == 2)).all() and not masks[:, 0].any()


def test_read_voc_without_masks_uses_the_boxes(tmp_path):
    root, idx = voc_fixture(tmp_path, png=False)
    masks = read_voc(root).masks(1)
    assert masks[0].sum() == 10 * 12 and masks[0][4:16, 2:12].all()


def _bad(raw, key, **change):
    raw[key][0 if key == "images" else -1].update(change)


@pytest.mark.parametrize(
    "mutate,words",
    [
        (lambda r: _bad(r, "annotations", image_id=99), "annotation id=12 names image_id=99, which no image record"),
        (lambda r: _bad(r, "annotations", segmentation=[[10, 8, 90, 8, 30, 24]]), "annotation id=12: a polygon vertex"),
        (
            lambda r: _bad(r, "annotations", segmentation={"size": [16, 16], "counts": "abc"}),
            "RLE size [16, 16] differs",
        ),
        (lambda r: _bad(r, "annotations", segmentation={"size": [H, W], "counts": [5, 3]}), "RLE counts sum to 8"),
        (lambda r: _bad(r, "annotations", bbox=[10, 8, 35, 16]), "annotation id=12: bbox [10, 8, 35, 16] lies outside"),
        (lambda r: _bad(r, "annotations", bbox=[10, 8]), "annotation id=12: 'bbox' must be [x, y, width, height]"),
        (lambda r: _bad(r, "images", file_name="gone.png"), "image id=1 ('gone.png'): "),
        (lambda r: _bad(r, "images", width=10**6, height=10**6), "exceeds the limit of 67108864"),
        (lambda r: _bad(r, "images", width=-3), "width/height must be positive integers"),
        (lambda r: r.pop("annotations"), "needs 'images' and 'annotations' lists"),
    ],
)
def test_bad_coco_records_are_one_line_naming_file_and_record(tmp_path, mutate, words):
    path, folder = coco_fixture(tmp_path, mutate)
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        read_coco(path, folder)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and words in msg


def test_oversized_records_are_refused_before_allocation(tmp_path, monkeypatch):
    path, folder = coco_fixture(tmp_path, lambda r: _bad(r, "images", width=9000, height=9000))
    monkeypatch.setattr(np, "zeros", lambda *a, **k: pytest.fail("allocated before the size check"))
    with pytest.raises(ValueError, match="MAX_PIXELS"):
        read_coco(path, folder)


def test_bad_voc_files_name_the_file(tmp_path):
    root, _ = voc_fixture(tmp_path, boxes=((3, 5, 60, 16),))
    with pytest.raises(ValueError, match=r"2007_000001.xml: object 0's box .* outside the 40 x 32 image"):
        read_voc(root)
    root, _ = voc_fixture(tmp_path / "b", size=(W + 1, H))
    with pytest.raises(ValueError, match=r"2007_000001.png: the mask is 40 x 32, the XML says 41 x 32"):
        read_voc(root)
    (root / "JPEGImages" / "2007_000001.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="2007_000001.jpg is missing from JPEGImages"):
        read_voc(root)
    (root / "Annotations" / "2007_000001.xml").write_text("<annotation><size>")
    with pytest.raises(ValueError, match="2007_000001.xml: not a VOC annotation"):
        read_voc(root)


def test_missing_pycocotools_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycocotools", None)
    with pytest.raises(ImportError, match=r"pip install crate-transformer\[seg\]"):
        segment_data.coco_tools()


@pytest.mark.parametrize("method", ["maskcut", "attention"])
def test_evaluate_segmentation_end_to_end_writes_coco_results(tmp_path, method):
    gt_file, folder = coco_fixture(tmp_path)
    gt = read_coco(gt_file, folder)
    torch.manual_seed(0)
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)
    rep = segment_eval.evaluate_segmentation(model, gt, method, out=tmp_path / "ev", resolution=32)
    assert rep["images"] == 3 and rep["unannotated"] == 1 and rep["predictions"] > 0
    res = tmp_path / "ev" / f"results_{method}.json"
    records = json.loads(res.read_text())
    assert len(records) == rep["predictions"] and all(r["segmentation"]["size"] == [H, W] for r in records)
    for iou_type in ("segm", "bbox"):
        assert [rep["coco"][iou_type][k] for k in segment_eval.STATS] == pytest.approx(
            list(direct_cocoeval(gt_file, res, iou_type))
        )
    if method == "attention":
        assert rep["predictions"] == 3 * 4  # one mask per head per image
    saved = json.loads((tmp_path / "ev" / f"segment_eval_{method}.json").read_text())
    assert saved["single_object"] == pytest.approx(rep["single_object"])


def test_predict_masks_refuses_a_resolution_off_the_patch_grid(tmp_path):
    gt = read_coco(*coco_fixture(tmp_path))
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)
    with pytest.raises(ValueError, match="resolution 30 is not a multiple of the patch size 8"):
        segment_eval.predict_masks(model, gt, resolution=30)
    with pytest.raises(ValueError, match="method must be one of maskcut, attention"):
        segment_eval.predict_masks(model, gt, "tokencut")


def test_voc_jaccard_leaves_the_void_band_out(tmp_path):
    root, idx = voc_fixture(tmp_path)
    gt = read_voc(root)
    assert (gt.void(1) == (idx == 255)).all() and gt.void(1).sum() == W
    pred = np.zeros((H, W), bool)
    pred[0:16, 2:12] = True  # object 0 plus part of the void row and some background
    got = single_object_scores(gt, [Prediction(1, pred, 1.0)])
    fg, keep = (idx == 1) | (idx == 2), idx != 255
    assert got["jaccard"] == pytest.approx((fg & pred & keep).sum() / ((fg | pred) & keep).sum())
    assert got["jaccard"] != pytest.approx((fg & pred).sum() / (fg | pred).sum())  # the void band matters here
    assert got["corloc"] == 1.0  # its box [2, 0, 12, 16] against object 0's [2, 4, 12, 16]: IoU 0.75


def test_evaluate_segmentation_takes_a_saved_model_folder(tmp_path):
    gt = read_coco(*coco_fixture(tmp_path))
    torch.manual_seed(0)
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)
    model.save_pretrained(tmp_path / "saved")
    from_path = segment_eval.evaluate_segmentation(str(tmp_path / "saved"), gt, "attention", resolution=32)
    from_object = segment_eval.evaluate_segmentation(model, gt, "attention", resolution=32)
    assert from_path["coco"] == from_object["coco"] and from_path["predictions"] == from_object["predictions"] == 12


def test_an_image_where_maskcut_finds_nothing_gives_no_prediction(tmp_path, monkeypatch):
    gt = read_coco(*coco_fixture(tmp_path))
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)
    monkeypatch.setattr(segment_eval, "segment", lambda *a, **k: [np.zeros((0, 4, 4), bool)])
    assert segment_eval.predict_masks(model, gt, "maskcut", resolution=32) == []
    rep = segment_eval.evaluate_segmentation(model, gt, "maskcut", resolution=32)
    assert rep["predictions"] == 0 and rep["coco"]["segm"]["AP"] == 0.0 and rep["single_object"]["corloc"] == 0.0


def test_unreadable_or_malformed_annotation_files_are_one_line(tmp_path):
    path, folder = coco_fixture(tmp_path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"instances.json: not a readable COCO JSON file") as e:
        read_coco(path, folder)
    assert "\n" not in str(e.value)
    path.write_text(json.dumps({"images": [], "annotations": [[1, 2]]}))
    with pytest.raises(ValueError, match=r"instances.json: annotation 0 is list, not a record"):
        read_coco(path, folder)
    path.write_text(json.dumps({"images": ["a.png"], "annotations": []}))
    with pytest.raises(ValueError, match=r"instances.json: image record 0 is str, not a record"):
        read_coco(path, folder)
    with pytest.raises(FileNotFoundError, match="the images folder .*nowhere does not exist"):
        read_coco(path, tmp_path / "nowhere")


@pytest.mark.parametrize("name", ["vit_tiny", "tost_mnist", "crate_alpha_mnist", "crate_mae_tiny"])
@pytest.mark.parametrize("method", ["maskcut", "attention"])
def test_every_family_with_attention_maps_is_scored(tmp_path, name, method):
    gt = read_coco(*coco_fixture(tmp_path))
    model = ct.create_model(name, image_size=32, patch_size=8, in_chans=3, dim=32, depth=2, heads=4)
    rep = segment_eval.evaluate_segmentation(model, gt, method, resolution=32)
    assert rep["images"] == 3 and 0 <= rep["coco"]["segm"]["AP"] <= 1 and rep["single_object"]["images"] == 2
    if method == "attention":
        assert rep["predictions"] <= 3 * 4


def test_crate_segment_eval_command_writes_the_scores_the_function_computes(tmp_path, capsys):
    from clitools import crate, one_line_error

    gt_file, folder = coco_fixture(tmp_path)
    torch.manual_seed(0)
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)
    model.save_pretrained(tmp_path / "saved")
    out = tmp_path / "ev"
    argv = ["segment-eval", tmp_path / "saved", "--data", gt_file, "--images", folder, "--method", "attention"]
    assert crate(*argv, "--out", out, "--threads", 1, "--layer", 2) == 0
    said = capsys.readouterr().out
    assert "3 images (1 without annotations), 12 masks" in said and "CorLoc" in said
    saved = json.loads((out / "segment_eval_attention.json").read_text())
    direct = segment_eval.evaluate_segmentation(model, read_coco(gt_file, folder), "attention", layer=1)
    assert saved["coco"] == direct["coco"] and f"AP50 {direct['coco']['segm']['AP50']:.3f}" in said
    assert saved["single_object"] == pytest.approx(direct["single_object"]) and direct["single_object"]["jaccard"] > 0
    assert f"Jaccard {direct['single_object']['jaccard']:.3f}" in said
    one_line_error(capsys, "segment-eval", tmp_path / "saved", match="pass --data: a COCO instances JSON")
    one_line_error(capsys, "segment-eval", tmp_path / "saved", "--data", gt_file, match="pass its images folder")
    one_line_error(capsys, *argv, "--layer", 5, match="--layer 5 does not exist: the model has 2 layers")
    one_line_error(capsys, *argv, "--mass", 0, match="mass")
    one_line_error(capsys, "segment-eval", tmp_path / "saved", "--data", tmp_path / "nope.json", match="does not exist")


def test_images_are_decoded_as_every_image_path_decodes_them(tmp_path):
    """A 16-bit greyscale PNG is scored as the picture it shows (data.pixels.picture scales it to 8 bits), not
    clipped at 255 as PIL's own convert("L") does: the same input as its 8-bit copy."""
    from crate_transformer.analysis.segment_eval import _load_image

    eight = (np.arange(32 * 32).reshape(32, 32) % 256).astype(np.uint8)
    Image.fromarray(eight).save(tmp_path / "a8.png")
    Image.fromarray(eight.astype(np.uint16) * 257).save(tmp_path / "a16.png")  # 0..65535, the same picture
    assert Image.open(tmp_path / "a16.png").mode.startswith("I")
    x8, x16 = _load_image(tmp_path / "a8.png", 1, 16), _load_image(tmp_path / "a16.png", 1, 16)
    assert x8.shape == (1, 1, 16, 16) and torch.equal(x8, x16)
    assert 0.2 < float(x8.mean()) < 0.8  # neither black nor clipped white


def test_crate_analyze_with_annotations_adds_the_scores_of_evaluate_segmentation(tmp_path, capsys):
    """Issue 51 §5: ``crate analyze --images DIR --annotations FILE`` puts evaluate_segmentation's scores of the
    report's own MaskCut settings into report.json and report.html, and prints the headline numbers."""
    from crate_transformer.cli import main as cli_main

    gt_file, folder = coco_fixture(tmp_path)
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)
    model.eval().save_pretrained(tmp_path / "m")
    out = tmp_path / "an"
    argv = ["analyze", str(tmp_path / "m"), "--images", str(folder), "--annotations", str(gt_file), "--masks", "2"]
    assert cli_main([*argv, "--num-vis", "1", "--no-progress", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    scores = report["segmentation_scores"]
    direct = segment_eval.evaluate_segmentation(
        model, read_coco(gt_file, folder), "maskcut", n_masks=2, tau=0.15, normalization=report["normalization"]
    )
    assert scores["coco"] == direct["coco"] and scores["single_object"] == direct["single_object"]
    assert scores["images"] == 3 and scores["unannotated"] == 1 and scores["layer"] == 2
    segm = scores["coco"]["segm"]
    assert f"mask AP {segm['AP']:.3f}, AP50 {segm['AP50']:.3f}" in capsys.readouterr().out
    page = (out / "report.html").read_text()
    assert "Segmentation against the ground truth (MaskCut, layer 2)" in page and f"{segm['AP']:.3f}" in page
    dt = json.loads((out / "segment_eval" / "results_maskcut.json").read_text())
    assert len(dt) == scores["predictions"]
    assert report["explorer"]["ground_truth"] is True and report["source"]["files"] == ["a.png", "b.png", "c.png"]
    # without --images there are no file names to match: a one-line error before any work
    assert cli_main(["analyze", str(tmp_path / "m"), "--data", "digits", "--annotations", str(gt_file)]) == 2
    assert "--annotations scores the images of --images DIR" in capsys.readouterr().err


def test_truth_labels_follow_the_geometry_of_the_analysed_images(tmp_path):
    """The explorer's ground truth is cropped and scaled as ``--images`` crops the photos (shorter side to
    size / crop_pct, centre crop): here 32 x 40 images, so a centre crop of columns 4..35 at crop_pct 1, and
    the centre 16 x 16 of the original upsampled twice at crop_pct 0.5."""
    gt_file, folder = coco_fixture(tmp_path)
    gt = read_coco(gt_file, folder)
    files = [folder / "a.png", folder / "c.png", tmp_path / "elsewhere.png"]
    labels = segment_data.truth_labels(gt, files, 32, 1.0).numpy()
    sq, rect = gt.masks(1)
    want = np.zeros((32, 32), np.uint8)
    want[sq[:, 4:36]] = 1
    want[rect[:, 4:36] & (want == 0)] = 2
    assert (labels[0] == want).all()
    assert not labels[1].any() and not labels[2].any()  # unannotated, and a file the annotations do not name
    half = segment_data.truth_labels(gt, files[:1], 32, 0.5).numpy()[0]
    sq_up = np.kron(sq[8:24, 12:28], np.ones((2, 2), bool))
    assert ((half == 1) == sq_up).mean() > 0.98 and (half == 1).sum() > 0
