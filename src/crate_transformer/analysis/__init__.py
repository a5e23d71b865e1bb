"""White-box analysis toolkit: look inside a CRATE (or ViT) model (JMLR §4.2-4.3, pp.47-54).

::

    from crate_transformer import analysis
    table = analysis.measure(model, images)            # per-layer R^c, sparsity, l1, R, ΔR (Figs. 14-15)
    table.to_records(); table.to_json("measure.json")
    analysis.plot_layerwise({"train": t1, "val": t2}, "layerwise.png")
    maps = analysis.cls_attention(model, x, layer=-1)  # (b, K, h, w) class-token attention (Fig. 18)
    masks = analysis.segment(model, x)                 # MaskCut (Alg. 1, Fig. 19)
    maps, masks = analysis.head_masks(model, x)        # per-head keep-60%-mass masks (Fig. 20's recipe)
    gt = analysis.read_coco("instances_val2017.json", "val2017/")   # or analysis.read_voc("VOC2012/")
    analysis.evaluate_segmentation(model, gt, "maskcut")           # COCO AP/AR (pycocotools), CorLoc, Jaccard
    analysis.incoherence(model)                        # subspace coherence (Fig. 17)
    analysis.analyze(model, "out/", {"test": images01}, normalization=(mean, std))  # report.html + report.json
    analysis.decoder_inversion(mae, x)                 # CRATE-MAE: decoder layer L-1-l vs encoder layer l (§3.5)
    analysis.compression_verdict(table, "classifier")  # did R^c fall with depth beyond its noise?  (verdicts.py)
    from crate_transformer.analysis import features    # ISTA codes as features: statistics, top inputs, purity

The explorer (``report.html``'s interactive section, or a page of its own)::

    analysis.write_explorer(analysis.image_payload(model, images01), "explorer.html")

Command line: ``crate analyze CHECKPOINT [--images DIR | --data NAME] --out DIR``; ``crate features RUN``.
"""

from .attention import attention_entropy, cls_attention
from .attention_masks import head_masks, plot_head_masks, threshold_attention
from .decoder import decoder_inversion, is_autoencoder, reconstruction_recognition
from .explorer import explorer_section, image_payload, text_payload, write_explorer
from .measure import METRICS, LayerTable, load_measure_records, measure, measure_batch, measure_hook, official_rc
from .plots import (
    plot_attention,
    plot_decoder_inversion,
    plot_layerwise,
    plot_masks,
    plot_measure_history,
    plot_pca,
    plot_reconstructions,
    plot_subspace_grams,
    plot_token_heatmaps,
    save_mask_png,
)
from .report import analyze
from .segment_data import GroundTruth, read_coco, read_voc
from .segment_eval import coco_scores, evaluate_segmentation, predict_masks, single_object_scores, write_results
from .segmentation import cosine_affinity, iou, maskcut, normalized_cut, patch_features, pca_rgb, segment
from .subspaces import incoherence, subspace_gram
from .verdicts import Verdict, compression_verdict, decoder_verdict, rate_reduction_note, sparsity_verdict

__all__ = [
    "METRICS",
    "LayerTable",
    "measure",
    "measure_batch",
    "official_rc",
    "measure_hook",
    "load_measure_records",
    "cls_attention",
    "attention_entropy",
    "patch_features",
    "pca_rgb",
    "cosine_affinity",
    "normalized_cut",
    "maskcut",
    "segment",
    "iou",
    "threshold_attention",
    "head_masks",
    "plot_head_masks",
    "GroundTruth",
    "read_coco",
    "read_voc",
    "predict_masks",
    "write_results",
    "coco_scores",
    "single_object_scores",
    "evaluate_segmentation",
    "subspace_gram",
    "incoherence",
    "plot_layerwise",
    "plot_measure_history",
    "plot_attention",
    "plot_pca",
    "plot_masks",
    "save_mask_png",
    "plot_subspace_grams",
    "plot_token_heatmaps",
    "analyze",
    "decoder_inversion",
    "is_autoencoder",
    "reconstruction_recognition",
    "plot_decoder_inversion",
    "plot_reconstructions",
    "image_payload",
    "text_payload",
    "explorer_section",
    "write_explorer",
    "Verdict",
    "compression_verdict",
    "sparsity_verdict",
    "decoder_verdict",
    "rate_reduction_note",
]
