"""``crate analyze CHECKPOINT [--images DIR | --data NAME] --out DIR``: the white-box report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..analysis.segmentation import TAU
from ..config import Config
from ..config_utils import POSITIVE, Range, option
from ..train.config import DataOptions, SystemOptions
from .common import apply_threads, parse_model_args, refuse_given
from .options import MEASURED, REPORT, SYSTEM, add_command_options, like
from .reports import held_out_corpus, layer_number, report_dir, report_home
from .train import OUT_HELP, OVERWRITE_HELP, EvalOptions

# options of one kind of model only: given for the other kind they are refused, not ignored
IMAGE_ONLY = (
    "images",
    "num_images",
    "num_vis",
    "image_size",
    "on_bad_image",
    "seg_layer",
    "masks",
    "tau",
    "seed",
    "normalize",
    "crop_pct",
)
TEXT_ONLY = ("num_blocks", "attn_tokens")
# what crate analyze writes (image models: figures/, masks/; language models: PNGs beside report.json)
ANALYZE_FILES = ("report.json", "report.html", "figures", "masks", "*.png")


NORMALIZE_CHOICES = ("auto", "imagenet", "folder", "none")
LAYERS = "1..L, or -1 the last, -2 the one before"
TEXT = "language models"


@dataclass
class AnalyzeOptions(Config):
    """The options of ``crate analyze`` (the checkpoint is its positional argument)."""

    model: str | None = like(EvalOptions, "model")
    model_args: list[str] = like(EvalOptions, "model_args")
    images: str | None = option(
        None, "a folder of images (any format PIL reads), shorter side resized and centre-cropped (`crop_pct`)",
        metavar="DIR", basic=True, group=MEASURED
    )  # fmt: skip
    data: str | None = option(
        None,
        "a dataset: mnist, digits, a CIFAR folder, a class-per-subfolder image folder, WebDataset shards or a saved "
        "Hugging Face dataset (measures its train and test splits); default: the model config's dataset. Language "
        "models: a text corpus (python-docs, a file or folder) whose held-out tail is measured",
        metavar="NAME|DIR",
        basic=True,
        group=MEASURED,
    )
    out: str | None = option(
        None, OUT_HELP, shown="analysis inside the checkpoint's folder, or analysis-2, -3, ... when that one is in use",
        basic=True, group=REPORT
    )  # fmt: skip
    overwrite: bool = option(False, OVERWRITE_HELP, group=REPORT)
    num_images: int = option(
        256, "images measured per split (seeded subset)", range=POSITIVE, basic=True, group=MEASURED
    )
    num_vis: int = option(4, "images shown in the attention/PCA/MaskCut figures", range=POSITIVE, group=MEASURED)
    normalize: str = option(
        "auto",
        "`images`: the mean/std applied to the photos: auto = the model config's, else ImageNet's; folder = the "
        "photos' own statistics",
        choices=NORMALIZE_CHOICES,
        group=MEASURED,
    )
    crop_pct: float | None = option(
        None,
        "`images`: resize the shorter side to image-size / crop-pct, then crop the centre (0.875: 256 -> 224)",
        shown="the model's pretrained_cfg, 1.0 unless its release states one",
        range=Range(0, 1, lo_open=True),
        group=MEASURED,
    )
    image_size: int | None = like(DataOptions, "image_size", help="resize images to this square size", group=MEASURED)
    on_bad_image: str = like(DataOptions, "on_bad_image", group=MEASURED)
    image_column: str = like(DataOptions, "image_column", group=MEASURED)
    label_column: str = like(DataOptions, "label_column", group=MEASURED)
    eps: float = option(0.1, "coding precision eps (the official eps^2 = 0.01)", range=Range(0, lo_open=True))
    attn_layer: int = option(-1, f"layer of the attention maps: {LAYERS}", basic=True)
    seg_layer: int = option(-1, f"layer of the PCA / MaskCut features: {LAYERS}")
    masks: int = option(3, "MaskCut: number of masks per image (S)", range=POSITIVE)
    tau: float = option(0.15, "MaskCut: affinity threshold on cosine similarity", range=TAU)
    batch_size: int = option(64, "batch size of the measurement", range=POSITIVE)
    seed: int = option(0, "seed of the measured image subset", group=SYSTEM)
    device: str = like(SystemOptions, "device", basic=True, group=SYSTEM)
    threads: int = like(SystemOptions, "threads", basic=True, group=SYSTEM)
    progress: bool = option(True, "show the progress bars", group=SYSTEM)
    num_blocks: int = option(64, "held-out token blocks measured", range=POSITIVE, group=TEXT, basic=True)
    attn_tokens: int = option(48, "tokens shown in the attention maps", range=POSITIVE, group=TEXT)

    def validate(self) -> None:
        if self.images is not None and self.data is not None:
            raise ValueError("--images and --data both name what to measure; pass one")


def configure_analyze(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint",
        help="a crate train run directory, a save_pretrained directory or hf-hub:ORG/NAME, a training-state file "
        "or an official .pth",
    )
    add_command_options(parser, AnalyzeOptions)


def _analyze_language_model(model: object, args: argparse.Namespace) -> int:
    """Per-layer compression and sparsity of held-out token representations, and attention maps over tokens."""
    import torch

    from ..analysis.language import analyze_text
    from ..data.text import TokenBlocks, load_tokens, split_tokens

    if model.tokenizer is None:
        raise ValueError(
            f"{args.checkpoint} has no tokenizer.json beside its weights; save the model with its tokenizer"
        )
    data, val_fraction, columns = held_out_corpus(Path(args.checkpoint), args.data)
    block = model.config.block_size
    tokens = load_tokens(data, model.tokenizer, columns)
    cut = split_tokens(len(tokens), val_fraction, block)
    held_out = TokenBlocks(tokens, block, cut, len(tokens), str(data), "held-out")
    n = min(args.num_blocks, len(held_out))
    blocks = held_out.get(torch.arange(n))[:, :-1]
    args.out = report_dir(args.out, report_home(args.checkpoint) / "analysis", args.overwrite, "analyze", ANALYZE_FILES)
    source = {
        "data": f"{data}: the held-out last {val_fraction:.0%} of the tokens, {n} blocks of {block}",
        "checkpoint": str(args.checkpoint),
    }
    report = analyze_text(
        model,
        args.out,
        blocks,
        eps=args.eps,
        batch_size=args.batch_size,
        attn_layers=(0, layer_number(model, args.attn_layer, "--attn-layer")),
        attn_tokens=min(args.attn_tokens, block),
        source=source,
    )
    print_layerwise(report["measure"]["held-out text"]["layers"], f" on {n} held-out blocks")
    print_verdicts(report)
    out, secs = Path(args.out), report["wall_time_s"]
    print(f"wrote {out / 'report.html'}, report.json, layerwise.png and attention maps ({secs} s)")
    return 0


def _subset(n: int, k: int, seed: int) -> list[int]:
    import torch

    if k >= n:
        return list(range(n))
    g = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(n, generator=g)[:k].tolist())


def _split_images(ds: object, k: int, seed: int, size: int) -> object:
    """uint8 → [0, 1] images of a seeded subset of ``k`` samples of a split, resized to ``size``."""
    import torch

    from ..data import ImageDataset
    from ..data.transforms import resize_tensor

    if isinstance(ds, ImageDataset):  # random access: the seeded subset of the whole split
        x = ds.images[torch.as_tensor(_subset(len(ds), k, seed), dtype=torch.long)]
    else:  # streamed: the first k samples of a seeded epoch (shards have no random access)
        x = ds.first(k, shuffle=True, seed=seed)[0]
    return resize_tensor(x, size).float() / 255.0


def _dataset_splits(model: object, data: str, image_size: int, args: argparse.Namespace) -> tuple:
    from ..data import match_channels, open_source, resolve_normalization
    from .reports import dataset_columns

    k, seed = args.num_images, args.seed
    kw = dict(image_size=image_size, on_bad_image=args.on_bad_image, stats=resolve_normalization(model))
    kw.update(dataset_columns(args, model, data))
    train = open_source(data, "train", **kw)
    c = model.config.in_chans
    try:
        test = open_source(data, "test", **kw)
    except ValueError:
        test = None
    splits = {}
    for name, ds in (("train", train), ("test", test)):
        if ds is not None:
            imgs = _split_images(ds, k, seed, image_size)
            try:
                splits[name] = match_channels(imgs, c)
            except ValueError as e:
                raise ValueError(f"dataset {data!r}: {e} (the model expects {c}-channel images)") from None
    source = {"data": f"{data} ({', '.join(f'{k}: {v.shape[0]}' for k, v in splits.items())} images)"}
    if train.channels != c:
        source["channels"] = f"{train.channels}-channel images converted to {c} channels, as in training"
    return splits, resolve_normalization(model, train), source


def _run_task(checkpoint: str) -> str | None:
    """The training task recorded in a run directory's config.yaml (e.g. "dino"), or None."""
    from ..io import read_side_file
    from ..train.rundir import CONFIG_FIX

    path = Path(checkpoint)
    cfg = (path if path.is_dir() else path.parent.parent) / "config.yaml"  # RUN or RUN/checkpoints/last.pt
    if not cfg.is_file():
        return None
    return read_side_file(cfg, CONFIG_FIX, form="yaml").get("task")


def _initial_records(checkpoint: str) -> list[dict] | str:
    """The run's own per-layer measurement at step 0 (``metrics.jsonl``, written by training's measure hook) when
    ``checkpoint`` is a run directory or a file inside one, else "fresh" (a freshly initialised model)."""
    from ..analysis import load_measure_records

    path = Path(checkpoint)
    for folder in (path, path.parent, path.parent.parent):
        log = folder / "metrics.jsonl"
        if (folder / "config.yaml").is_file() and log.is_file():
            records = [r for r in load_measure_records(log) if r.get("step") == 0]
            return records or "fresh"
    return "fresh"


def print_layerwise(first: list[dict], where: str = "") -> None:
    """The first split's R^c (and ToST's R^c_var) and non-zero fraction from the first layer to the last."""
    span = f"(layer 1 -> {len(first)}){where}"

    def change(key: str) -> str:
        return f"{first[0][key]:.4g} -> {first[-1][key]:.4g}"

    print(f"layer-wise R^c (attention input) {change('rc_in')}, non-zero fraction {change('nonzero')} {span}")
    if "rvar_in" in first[0]:
        print(f"layer-wise R^c_var (TSSA input) {change('rvar_in')} {span}")


def print_verdicts(report: dict) -> None:
    """The verdicts (and notes) of a report, one line each, like the theory lab's checks."""
    from ..analysis.verdicts import Verdict, format_verdicts

    verdicts = [Verdict(**v) for v in report.get("verdicts", [])]
    print(format_verdicts(verdicts, report.get("notes", ())))


def _folder_normalization(choice: str, model: object, imgs: object) -> tuple:
    """The (mean, std) that turn ``--images`` photos into model inputs, and where it came from: by default the
    model's own data config (``model.pretrained_cfg``: its training data's, else its released weights', else
    ImageNet's); the photos' own statistics only when asked for (they would erase the very contrast and colour
    the model learned from)."""
    from ..data import fit_normalization
    from ..models.spec import IMAGENET_MEAN, IMAGENET_STD

    channels = model.config.in_chans
    if choice == "auto":
        cfg = model.pretrained_cfg
        return (list(cfg["mean"]), list(cfg["std"])), normalization_words(model) or FALLBACK_WORDS
    if choice == "imagenet":
        return fit_normalization(IMAGENET_MEAN, IMAGENET_STD, channels), "ImageNet's"
    if choice == "folder":
        stats = (imgs.mean((0, 2, 3)).tolist(), imgs.std((0, 2, 3)).clamp_min(1e-3).tolist())
        return stats, "statistics of the image folder (--normalize folder)"
    if choice == "none":
        return None, "none (--normalize none)"
    raise ValueError(f"--normalize must be one of {', '.join(NORMALIZE_CHOICES)}, got {choice!r}")


FALLBACK_WORDS = "ImageNet's (the model config records none)"


def normalization_words(model: object) -> str | None:
    """Where the model's own mean/std come from, as the report says it (its ``pretrained_cfg["normalization"]``):
    its config (the training data), its released weights (their zoo entry), or None (neither states one)."""
    words = {"training data": "model config", "released weights": "the released weights' (their zoo entry)"}
    return words.get(model.pretrained_cfg.get("normalization"))


def _folder_splits(model: object, args: argparse.Namespace, size: int) -> tuple:
    """``--images DIR``: one split of the folder's images (shorter side resized with the model's interpolation,
    centre crop of ``--crop-pct``, by default the model's) and the normalisation (``--normalize``)."""
    from ..data import load_image_folder

    cfg = model.pretrained_cfg
    crop = args.crop_pct if args.crop_pct is not None else cfg["crop_pct"]
    imgs, files = load_image_folder(
        args.images,
        size,
        model.config.in_chans,
        limit=args.num_images,
        on_bad_image=args.on_bad_image,
        crop_pct=crop,
        interpolation=cfg["interpolation"],
    )  # grey/RGB converted as in training
    norm, norm_src = _folder_normalization(args.normalize, model, imgs)
    resize = f"shorter side to {round(size / crop)} px ({cfg['interpolation']}), centre crop {size}"
    data = f"{args.images} ({len(files)} images; {resize})"
    return {"images": imgs}, norm, {"data": data, "normalization_source": norm_src}


def _data_splits(model: object, args: argparse.Namespace, size: int) -> tuple:
    """``--data NAME`` (default: the model config's dataset): its train and test splits."""
    c = model.config
    data = args.data or (c.data.source if c.data else None)  # crate train records the resolved path
    if not data:
        raise ValueError("no images to analyse: pass --images DIR or --data NAME (e.g. --data mnist)")
    try:
        splits, norm, source = _dataset_splits(model, str(data), size, args)
    except ValueError as e:
        if args.data:
            raise
        raise ValueError(f"{e} (dataset {data!r} is recorded in the model config; pass --data or --images)") from None
    source["normalization_source"] = normalization_words(model) or "dataset statistics"
    return splits, norm, source


def run_analyze(args: argparse.Namespace) -> int:
    from ..analysis import analyze
    from ..config import LANGUAGE_MODEL
    from ..loading.pipeline import load_model
    from ..train.runtime import resolve_device

    apply_threads(args)
    device = resolve_device(args.device)
    model = load_model(args.checkpoint, args.model, **parse_model_args(args.model_args)).to(device).eval()
    if model.kind == LANGUAGE_MODEL:
        refuse_given(args, IMAGE_ONLY, f"to a language model ({args.checkpoint}); pass a text corpus as --data")
        return _analyze_language_model(model, args)
    refuse_given(args, TEXT_ONLY, f"to an image model ({args.checkpoint}); it is for language models")
    c = model.config
    size = args.image_size or c.image_size
    if size % c.patch_size:
        raise ValueError(f"--image-size {size} is not a multiple of the model's patch size {c.patch_size}")
    attn_layer, seg_layer = (
        layer_number(model, args.attn_layer, "--attn-layer"),
        layer_number(model, args.seg_layer, "--seg-layer"),
    )
    splits, norm, source = (_folder_splits if args.images else _data_splits)(model, args, size)
    source["checkpoint"] = str(args.checkpoint)
    home = report_home(args.checkpoint)
    args.out = report_dir(args.out, home / "analysis", args.overwrite, "analyze", ANALYZE_FILES)  # after every check
    report = analyze(
        model,
        args.out,
        splits,
        normalization=norm,
        eps=args.eps,
        batch_size=args.batch_size,
        attn_layer=attn_layer,
        seg_layer=seg_layer,
        n_masks=args.masks,
        tau=args.tau,
        num_vis=args.num_vis,
        progress=args.progress,
        source=source,
        section="DINO backbone" if _run_task(args.checkpoint) == "dino" else None,
        initial=_initial_records(args.checkpoint),
    )
    out = Path(args.out)
    print_layerwise(next(iter(report["measure"].values()))["layers"])
    print_verdicts(report)
    print(f"wrote {out / 'report.html'} and {out / 'report.json'} ({report['wall_time_s']} s)")
    return 0
