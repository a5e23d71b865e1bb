"""The image classifiers' zoo: the named models of :mod:`~crate_transformer.models.classifier` (CRATE and ViT
sizes, JMLR Table 8; the emergence paper's; DINO's and SimDINO's ViT backbones; the digits models) and the weights
their authors released (:class:`~crate_transformer.models._registry.PretrainedSource`).

The family's architectures register in :mod:`~crate_transformer.models.classifier` itself (``register_arch``:
the classes and the checkpoint formats); the names and the files live here, so that the model code is not read
past some 200 lines of sizes and addresses.  :mod:`~crate_transformer.models.registry` imports this module, which
fills the tables when the package is imported.
"""

from __future__ import annotations

from ._registry import PretrainedSource, model_config, register_model, register_pretrained
from .classifier import CLASSIFIER_FORMAT, DINO_VIT_FORMAT
from .spec import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["EMERGENCE_COLAB", "DINO_FILES", "SIMDINO_README", "DINOV2_FILES"]

# JMLR Table 8: image 224, patch 16, p = d/K.  Parameter counts: 6.09M / 13.12M / 22.80M / 77.64M.
register_model("crate_tiny", arch="crate", dim=384, depth=12, heads=6)
register_model("crate_small", arch="crate", dim=576, depth=12, heads=12)
register_model("crate_base", arch="crate", dim=768, depth=12, heads=12)
register_model("crate_large", arch="crate", dim=1024, depth=24, heads=16)
# The emergence paper's models (Yu et al., CPAL 2024; CRATE_base_demo, CRATE_small_21k, CRATE_base_21k in crate.py of
# LeslieTrue/crate-emergence-notebooks, commit d62ec79): 8x8 patches, ImageNet-21K.  crate_base_demo is the demo's
# crate-demo.pth: 6 heads of 128, and its forward returns mlp_head's 768 values (LN + Linear(768, 768)).
register_model("crate_base_demo", arch="crate", patch_size=8, dim=768, depth=12, heads=6, num_classes=768)
register_model("crate_small_21k", arch="crate", patch_size=8, dim=384, depth=12, heads=6, num_classes=21842)
register_model("crate_base_21k", arch="crate", patch_size=8, dim=768, depth=12, heads=12, num_classes=21842)
# ViT baselines (paper Table 1/8: 5.72M, 22.05M, 86.5M, 304M with a 1000-class head).
register_model("vit_tiny", arch="vit", dim=192, depth=12, heads=3)
register_model("vit_small", arch="vit", dim=384, depth=12, heads=6)
register_model("vit_base", arch="vit", dim=768, depth=12, heads=12)
register_model("vit_large", arch="vit", dim=1024, depth=24, heads=16)
# DINO's ViT backbones (facebookresearch/dino hubconf.py: vit_small / vit_base with patch 16 or 8, num_classes=0) and
# SimDINO's (RobinWu218/SimDINO README: ViT-B/16, ViT-L/16, and its DINO ViT-B/16 baseline), in DINO's layout: the
# class token after the last LayerNorm (eps 1e-6) is the output, the position grid resized as DINO resizes it.
_DINO = dict(arch="vit", num_classes=0, final_norm="tokens", norm_eps=1e-6, interpolate_offset=0.1)
for _name, _dim, _depth, _heads, _patch in (
    ("dino_vits16", 384, 12, 6, 16),
    ("dino_vits8", 384, 12, 6, 8),
    ("dino_vitb16", 768, 12, 12, 16),
    ("dino_vitb8", 768, 12, 12, 8),
    ("simdino_vitb16", 768, 12, 12, 16),
    ("simdino_vitl16", 1024, 24, 16, 16),
    ("simdino_dino_vitb16", 768, 12, 12, 16),
):
    register_model(_name, **_DINO, dim=_dim, depth=_depth, heads=_heads, patch_size=_patch)
# DINOv2's layout (SimDINO's simdinov2/models/vision_transformer.py): SimDINOv2's checkpoints and the SimDINO authors'
# DINOv2 baselines (README, ViT-B/16 and ViT-L/16 at 224), trained by simdino_config.yaml over ssl_default_config.yaml:
# 4 register tokens, LayerScale (SimDINOv2's 0.1, the default's 1e-5), the antialiased resize to the size.
_DINOV2 = dict(_DINO, registers=4, interpolate_antialias=True, interpolate_offset=0.0)
for _name, _dim, _depth, _heads, _scale in (
    ("simdinov2_vitb16", 768, 12, 12, 0.1),
    ("simdinov2_vitl16", 1024, 24, 16, 0.1),
    ("simdino_dinov2_vitb16", 768, 12, 12, 1e-5),
    ("simdino_dinov2_vitl16", 1024, 24, 16, 1e-5),
):
    register_model(_name, **_DINOV2, dim=_dim, depth=_depth, heads=_heads, patch_size=16, layer_scale_init=_scale)
# DINOv2's released backbones, which SimDINO's hubconf.py re-exports (simdinov2/hub/backbones.py: img_size 518,
# patch 14, init_values 1.0; the *_reg ones with 4 registers and the antialiased resize, the others DINO's resize).
# ViT-g/14 is not registered: its SwiGLU MLP (ffn_layer="swiglufused") is not the ViT's.
for _name, _dim, _depth, _heads in (
    ("dinov2_vits14", 384, 12, 6),
    ("dinov2_vitb14", 768, 12, 12),
    ("dinov2_vitl14", 1024, 24, 16),
):
    _meta = dict(_DINO, dim=_dim, depth=_depth, heads=_heads, image_size=518, patch_size=14, layer_scale_init=1.0)
    register_model(_name, **_meta)
    register_model(f"{_name}_reg", **{**_meta, **_DINOV2, "layer_scale_init": 1.0})
# Small models for the built-in 28x28 digits (the classification task's default) and its ViT counterpart, paired as
# CRATE-T/ViT-T are (Table 8): ViT at half the width and half the heads (same head size 32), 4x MLP, and about
# the same parameter count (309k vs 305k).
register_model(
    "crate_mnist", arch="crate", image_size=28, patch_size=7, in_chans=1, num_classes=10, dim=128, depth=6, heads=4
)
# The classification task's default model: the digits resized to 24 px on a 6x6 grid of 4x4 patches (d = 128,
# 3 layers, 4 heads of 32; 158,250 parameters).  Patches of 4 px make the attention maps and MaskCut masks of the
# analysis follow the strokes, where crate_mnist's 4x4 grid of 7 px patches gives 16 blocks; the 24 px resize drops
# MNIST's empty border, so 36 patches cost what crate_mnist's 16 patches and 6 layers do (docs/results.md).
register_model(
    "crate_mnist_p4", arch="crate", image_size=24, patch_size=4, in_chans=1, num_classes=10, dim=128, depth=3, heads=4
)
register_model(
    "vit_mnist",
    arch="vit",
    image_size=28,
    patch_size=7,
    in_chans=1,
    num_classes=10,
    dim=64,
    depth=6,
    heads=2,
    mlp_ratio=4.0,
)
# The CRATE variants of the ablations at the same size as crate_mnist: JMLR Table 17's hybrids and
# CRATE-α's sparse-coding block (Yang et al. 2024).  The ablation "17" trains them side by side.
_MNIST = dict(arch="crate", image_size=28, patch_size=7, in_chans=1, num_classes=10, dim=128, depth=6, heads=4)
register_model("crate_mlp_mnist", **_MNIST, mlp="mlp")  # MSSA + GELU MLP
register_model("crate_mhsa_mnist", **_MNIST, attention="mhsa")  # standard attention + ISTA
register_model("crate_alpha_mnist", **_MNIST, mlp="odl")  # MSSA + overcomplete ISTA (4d atoms) + residual

register_pretrained(
    PretrainedSource(
        name="crate_small",
        title="CRATE-S/16, ImageNet-1K supervised",
        loader=CLASSIFIER_FORMAT.name,
        filename="",  # a Drive share page: the user saves the file under any name
        url="https://drive.google.com/file/d/1hYgDJl4EKHYfKprwhEjmWmWHuxnK6_h8/view?usp=share_link",
        input="image 224 (resize 256, centre crop 224)",
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        crop_pct=224 / 256,
        interpolation="bilinear",  # torchvision's Resize default, which main.py's validation transform uses
        classes="ImageNet-1K (1000)",
        licence="MIT (the repository's)",
        reference="github.com/Ma-Lab-Berkeley/CRATE README.md, main.py (commit 674408f)",
        status="reported dead since 2025-04 (github.com/Ma-Lab-Berkeley/CRATE/issues/30, open)",
    )
)

# The emergence paper's checkpoints: the official README's Colab demo (crate-emergence.ipynb) fetches them; its
# code is LeslieTrue/crate-emergence-notebooks (no weights in the repository).  Sizes are what the tensors imply.
EMERGENCE_COLAB = "https://colab.research.google.com/drive/1rYn_NlepyW7Fu5LDliyBDmFZylHco7ss?usp=sharing"
_EMERGENCE_SOURCES = (
    "github.com/Ma-Lab-Berkeley/CRATE README, 'Demo: Emergent segmentation in CRATE' (the Colab above)",
    "github.com/Ma-Lab-Berkeley/CRATE/issues/30 (a user re-hosts the Colab's files; the address is in the thread)",
)
for _name, _title, _file, _size, _classes in (
    (
        "crate_base_demo",
        "CRATE-B/8 (6 heads), ImageNet-21K supervised: the emergence demo's",
        "crate-demo.pth",
        "about 158 MB: 39.4M float32 values (22.6M model + the unused 768 x 21842 head)",
        "768 features (mlp_head)",
    ),
    (
        "crate_small_21k",
        "CRATE-S/8 (d 384, 6 heads), ImageNet-21K supervised",
        "",
        "about 56 MB: 14.1M float32 values",
        "ImageNet-21K (21842)",
    ),
    (
        "crate_base_21k",
        "CRATE-B/8 (12 heads), ImageNet-21K supervised",
        "",
        "about 155 MB: 38.8M float32 values",
        "ImageNet-21K (21842)",
    ),
):
    register_pretrained(
        PretrainedSource(
            name=_name,
            title=_title,
            loader=CLASSIFIER_FORMAT.name,
            filename=_file,
            url=EMERGENCE_COLAB,
            input="image 224 (any multiple of 8: the position embedding is interpolated)",
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            classes=_classes,
            licence="not stated (the demo code's repository has no licence file)",
            reference="crate.py of LeslieTrue/crate-emergence-notebooks (commit d62ec79); Ma-Lab-Berkeley/CRATE README",
            size=_size,
            sources=_EMERGENCE_SOURCES,
            status="fetched by the Colab notebook; not on the Hugging Face Hub",
        )
    )

# DINO's released ViT backbones: the direct links of facebookresearch/dino hubconf.py (commit 7c446df), which torch.hub
# also fetches; the README names each beside its full checkpoint (student and teacher with their heads, which loads
# too: the teacher is read).  No size or checksum is published; sizes are what the tensors imply (float32), and the
# parameter counts are the README's (21M, 85M).  Evaluation transform: eval_knn.py's (resize 256 bicubic, crop 224).
DINO_FILES = "https://dl.fbaipublicfiles.com/dino"
for _name, _title, _stem, _size in (
    ("dino_vits16", "DINO ViT-S/16", "dino_deitsmall16", "about 87 MB in float32 (21.67M values"),
    ("dino_vits8", "DINO ViT-S/8", "dino_deitsmall8", "about 87 MB in float32 (21.67M values"),
    ("dino_vitb16", "DINO ViT-B/16", "dino_vitbase16", "about 343 MB in float32 (85.80M values"),
    ("dino_vitb8", "DINO ViT-B/8", "dino_vitbase8", "about 343 MB in float32 (85.81M values"),
):
    register_pretrained(
        PretrainedSource(
            name=_name,
            title=f"{_title}, ImageNet-1K self-supervised (the backbone: the class token's features)",
            loader=DINO_VIT_FORMAT.name,
            filename=f"{_stem}_pretrain.pth",
            url=f"{DINO_FILES}/{_stem}_pretrain/{_stem}_pretrain.pth",
            direct=True,
            input=f"image 224 (resize 256 bicubic, centre crop 224; any multiple of {model_config(_name).patch_size})",
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            crop_pct=224 / 256,
            interpolation="bicubic",  # eval_knn.py / eval_linear.py: Resize(256, interpolation=3), PIL's bicubic
            classes="none: the class token's features (num_classes=0)",
            licence="Apache 2.0 (the repository's)",
            reference="github.com/facebookresearch/dino hubconf.py, README.md, eval_knn.py (commit 7c446df)",
            size=f"{_size}: what the tensors imply; no size is published)",
            sources=(
                f"{DINO_FILES}/{_stem}_pretrain/{_stem}_pretrain_full_checkpoint.pth (the full checkpoint: student and "
                "teacher with their heads; loads too, its teacher read)",
                f"torch.hub.load('facebookresearch/dino:main', '{_name}') fetches the same link",
            ),
            status="a direct link of the authors' hubconf.py; no checksum is published",
        )
    )

# SimDINO's checkpoints (RobinWu218/SimDINO README, commit 8149fc4): Google Drive "view" links, nothing else.
SIMDINO_README = "github.com/RobinWu218/SimDINO README.md 'Pretrained models' (commit 8149fc4)"
_SIMDINO_UNSTATED = (
    "a Google Drive view link only: no direct URL, file name, size or checksum is published, nor what the file holds "
    "(main_dino.py's checkpoint.pth, {'student', 'teacher', ...}, and a bare backbone both load)"
)


def _simdino_drive_source(
    name: str, title: str, drive: str, *, licence: str, reference: str, status: str
) -> PretrainedSource:
    """A checkpoint of SimDINO's README: a Google Drive view link (``drive``, its file id) and nothing else, read in
    the DINO ViT format at 224 px with ImageNet's normalisation (both repositories' evaluation transforms: resize 256
    bicubic, crop 224; simdinov2/data/transforms.py make_classification_eval_transform)."""
    return PretrainedSource(
        name=name,
        title=title,
        loader=DINO_VIT_FORMAT.name,
        filename="",  # a Drive share page: the user saves the file under any name
        url=f"https://drive.google.com/file/d/{drive}/view?usp=drive_link",
        input="image 224 (resize 256 bicubic, centre crop 224; any multiple of 16)",
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        crop_pct=224 / 256,
        interpolation="bicubic",
        classes="none: the class token's features (num_classes=0)",
        licence=licence,
        reference=reference,
        size="not stated",
        sources=(f"{SIMDINO_README}: the 'ckpt' link",),
        status=status,
    )


for _name, _title, _drive, _status in (
    (
        "simdino_vitb16",
        "SimDINO ViT-B/16, ImageNet-1K 100 epochs (k-NN 74.9%, linear 77.3% per the README)",
        "1nqcX0IgKQ8H3ZFJKaEx_O5wTVqdorLyQ",
        _SIMDINO_UNSTATED,
    ),
    (
        "simdino_vitl16",
        "SimDINO ViT-L/16, ImageNet-1K 100 epochs (k-NN 75.6%, linear 77.4% per the README)",
        "1jy27VYHHSxllMqWr5DiKk80y9ZBrKkPV",
        _SIMDINO_UNSTATED + "; simdino/vision_transformer.py has no vit_large (main_dino.py's arch choices stop at "
        "vit_base), so the code that saved it is not in the repository; it loads in DINO's layout and in DINOv2's "
        "(simdinov2/configs/eval/vitl16_v1.yaml's: no registers nor LayerScale; with LayerScale, pass "
        "layer_scale_init=)",
    ),
    (
        "simdino_dino_vitb16",
        "DINO ViT-B/16 trained by the SimDINO authors (their baseline; k-NN 72.9%, linear 76.3% per the README)",
        "1o-FtJ0TDNPAZiREa_qjGENksYL_3Ohc8",
        _SIMDINO_UNSTATED,
    ),
):
    register_pretrained(
        _simdino_drive_source(
            _name,
            _title,
            _drive,
            licence="MIT (the repository's; its simdino/ code is DINO's, Apache 2.0)",
            reference=f"{SIMDINO_README}; simdino/main_dino.py, simdino/eval_knn.py",
            status=_status,
        )
    )

# SimDINOv2's checkpoints and the SimDINO authors' DINOv2 baselines (the same README): Drive view links, nothing else.
# What the file holds is not stated either; simdinov2/train/train.py's do_test writes eval/N/teacher_checkpoint.pth,
# {'teacher': ...} of the teacher's backbone and heads, which the README's evaluation commands read.
_SIMDINOV2_UNSTATED = (
    "a Google Drive view link only: no direct URL, file name, size or checksum is published, nor what the file holds "
    "(simdinov2's teacher_checkpoint.pth, {'teacher': {'backbone.*', 'dino_head.*'}}, and a bare backbone both load)"
)
for _name, _title, _drive in (
    (
        "simdinov2_vitb16",
        "SimDINOv2 ViT-B/16, ImageNet-1K 100 epochs (k-NN 78.1%, linear 79.7% per the README)",
        "1g_f3aEFdfiKCn8IH11Y4FwtEDu1pPbQv",
    ),
    (
        "simdinov2_vitl16",
        "SimDINOv2 ViT-L/16, ImageNet-1K 100 epochs (k-NN 81.1%, linear 82.4% per the README)",
        "1IotEWszh1chGtzwl8X_ul6j3ACT7Tn6i",
    ),
    (
        "simdino_dinov2_vitb16",
        "DINOv2 ViT-B/16 trained by the SimDINO authors (their baseline; k-NN 76.0%, linear 77.2% per the README)",
        "1QZpUkC_yX2V9rWqHW3qLTFfvD6BUqyN_",
    ),
    (
        "simdino_dinov2_vitl16",
        "DINOv2 ViT-L/16 trained by the SimDINO authors (their baseline; k-NN 80.8%, linear 82.0% per the README)",
        "1p-cUWNShnZEFBJ_mnw77HnvCFIV0FthN",
    ),
):
    register_pretrained(
        _simdino_drive_source(
            _name,
            _title,
            _drive,
            licence="MIT (the repository's; its simdinov2/ code is DINOv2's, Apache 2.0)",
            reference=f"{SIMDINO_README}; simdinov2/configs/simdino_config.yaml, ssl_default_config.yaml, "
            "simdinov2/train/train.py, simdinov2/data/transforms.py",
            status=_SIMDINOV2_UNSTATED,
        )
    )

# DINOv2's released backbones: the direct links simdinov2/hub/backbones.py builds (_DINOV2_BASE_URL of
# simdinov2/hub/utils.py), which torch.hub.load fetches.  No size or checksum is published; the sizes are what the
# tensors imply in float32 (mask_token included, which the loader drops).  Evaluation transform: DINOv2's
# make_classification_eval_transform (resize 256 bicubic, crop 224); the position table is 37 x 37 (518 px).
DINOV2_FILES = "https://dl.fbaipublicfiles.com/dinov2"
for _name, _title, _size in (
    ("dinov2_vits14", "DINOv2 ViT-S/14", "about 88 MB in float32 (22.06M values"),
    ("dinov2_vitb14", "DINOv2 ViT-B/14", "about 346 MB in float32 (86.58M values"),
    ("dinov2_vitl14", "DINOv2 ViT-L/14", "about 1.22 GB in float32 (304.37M values"),
    ("dinov2_vits14_reg", "DINOv2 ViT-S/14 with 4 registers", "about 88 MB in float32 (22.06M values"),
    ("dinov2_vitb14_reg", "DINOv2 ViT-B/14 with 4 registers", "about 346 MB in float32 (86.58M values"),
    ("dinov2_vitl14_reg", "DINOv2 ViT-L/14 with 4 registers", "about 1.22 GB in float32 (304.37M values"),
):
    _stem, _file = _name.removesuffix("_reg"), _name.replace("_reg", "_reg4")
    register_pretrained(
        PretrainedSource(
            name=_name,
            title=f"{_title}, LVD-142M self-supervised (the backbone: the class token's features)",
            loader=DINO_VIT_FORMAT.name,
            filename=f"{_file}_pretrain.pth",
            url=f"{DINOV2_FILES}/{_stem}/{_file}_pretrain.pth",
            direct=True,
            input="image 224 (resize 256 bicubic, centre crop 224; any multiple of 14; the table is for 518)",
            mean=IMAGENET_MEAN,
            std=IMAGENET_STD,
            crop_pct=224 / 256,
            interpolation="bicubic",
            classes="none: the class token's features (num_classes=0)",
            licence="Apache 2.0 (DINOv2's code and weights; simdinov2/LICENSE)",
            reference="github.com/RobinWu218/SimDINO hubconf.py, simdinov2/hub/backbones.py, simdinov2/hub/utils.py "
            "(commit 8149fc4)",
            size=f"{_size}: what the tensors imply; no size is published)",
            sources=(f"torch.hub.load('facebookresearch/dinov2', '{_name}') fetches the same link",),
            status="a direct link of DINOv2's hub code; no checksum is published",
        )
    )
