"""``crate analyze CHECKPOINT [--images DIR | --data NAME] --out DIR``: the white-box report."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.segmentation import TAU
from ..config import Config
from ..config_utils import POSITIVE, Range, option
from ..train.config import DataOptions, SystemOptions
from .evaluate import OUT_HELP, OVERWRITE_HELP, EvalOptions
from .options import MEASURED, REPORT, SYSTEM, add_command_options, apply_threads, like, parse_model_args, refuse_given
from .reports import held_out_corpus, layer_number, report_dir, report_home

# options of one kind of model only: given for the other kind they are refused, not ignored
IMAGE_ONLY = (
    "images",
    "annotations",
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
ANALYZE_FILES = ("report.json", "report.html", "figures", "masks", "segment_eval", "*.png")


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
    annotations: str | None = option(
        None,
        "`images`: a COCO instances JSON of those images (matched by file name): the report adds the MaskCut masks' "
        "COCO mask / box AP and CorLoc / Jaccard (analysis.segment_eval) and the explorer draws the ground truth",
        metavar="FILE",
        path=True,
        group=MEASURED,
    )
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
        if self.annotations is not None and self.images is None:
            raise ValueError("--annotations scores the images of --images DIR; pass the folder its file names are in")


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
    default = report_home(args.checkpoint) / "analysis"
    replace_partial(args.out, default)
    args.out = report_dir(args.out, default, args.overwrite, "analyze", ANALYZE_FILES)
    ref = run_reference(args.checkpoint)
    start, missing = starting_model(ref, model)
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
        seed=ref.seed,
        seed_words=ref.seed_words,
        start=(start, ref.start_checkpoint, missing),
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


def _run_config(checkpoint: str) -> tuple[Path | None, dict]:
    """The run directory of ``checkpoint`` (the folder itself, or RUN for RUN/checkpoints/last.pt or RUN/model) and
    its config.yaml as a dict; (None, {}) for a checkpoint outside a run (a zoo name, an official .pth)."""
    from ..io import read_side_file
    from ..train.rundir import CONFIG_FIX

    path = Path(checkpoint)
    for folder in (path, path.parent, path.parent.parent):
        if (folder / "config.yaml").is_file():
            return folder, read_side_file(folder / "config.yaml", CONFIG_FIX, form="yaml") or {}
    return None, {}


def _run_task(checkpoint: str) -> str | None:
    """The training task recorded in a run directory's config.yaml (e.g. "dino"), or None."""
    return _run_config(checkpoint)[1].get("task")


@dataclass(frozen=True)
class RunReference:
    """What the verdicts compare with: the seed of the untrained network (and whose seed it is, in words), and a
    fine-tuned run's starting checkpoint: config.yaml's ``init_from`` (``start_checkpoint``), the model and
    task-arguments that load it as fine-tuning did (``start_load``), and its step-0 measurement records (``start``,
    the fallback when its file is gone); None for any other checkpoint."""

    seed: int
    seed_words: str
    start: list[dict] | None
    start_checkpoint: str | None = None
    start_load: dict = field(default_factory=dict)
    start_by: str = "fine-tuning"


def run_reference(checkpoint: str) -> RunReference:
    """The reference of ``crate analyze``'s verdicts for ``checkpoint``: an untrained network of the same
    architecture with the run's seed (config.yaml's ``system.seed``; seed 0, stated so, for a checkpoint outside a
    run), and, when the run was initialised from a checkpoint (``init_from``: fine-tuning, continued pre-training),
    that starting checkpoint and its step-0 records from ``metrics.jsonl``."""
    from ..analysis import load_measure_records

    run, cfg = _run_config(checkpoint)
    if run is None:
        return RunReference(0, "seed 0; the checkpoint records no training seed", None)
    seed = (cfg.get("system") or {}).get("seed")
    words = f"seed {seed}, the run's seed" if isinstance(seed, int) else "seed 0; the run records no seed"
    start, init_from = None, cfg.get("init_from")
    log = run / "metrics.jsonl"
    if init_from and log.is_file():
        start = [r for r in load_measure_records(log) if r.get("step") == 0] or None
    load = {"name": cfg.get("model"), "model_args": dict(cfg.get("model_args") or {})}
    by = "continued pre-training" if cfg.get("task") == "mae" else "fine-tuning"
    return RunReference(seed if isinstance(seed, int) else 0, words, start, init_from or None, load, by)


def starting_model(ref: RunReference, model: object) -> tuple[object | None, str | None]:
    """A fine-tuned run's starting checkpoint (config.yaml's ``init_from``) loaded as the run's training loaded it
    (a classifier: as one, its position grid re-gridded to the model's image size; a CRATE-MAE: as itself), on the
    model's device, to be measured exactly as the model; (None, why) when it is gone, unreadable or of another
    architecture (the report then falls back to the run's step-0 records, and says so)."""
    from ..loading.pipeline import load_model
    from ..models.contract import LANGUAGE_MODEL, MASKED_AUTOENCODER

    if not ref.start_checkpoint:
        return None, None
    name, args = ref.start_load.get("name"), ref.start_load.get("model_args", {})
    try:
        if model.kind in (MASKED_AUTOENCODER, LANGUAGE_MODEL):  # continued as itself; a text head is not measured
            start = load_model(ref.start_checkpoint)
        else:
            start = load_model(ref.start_checkpoint, name=name, as_classifier=True, **args)
            if start.config.image_size != model.config.image_size:
                start.resize_pos_embed(model.config.image_size)  # as fine-tuning did
    except (ValueError, OSError, KeyError, TypeError, RuntimeError) as e:
        return None, str(e)
    shape = (len(start.layers), start.config.dim, getattr(start.config, "patch_size", None))
    want = (len(model.layers), model.config.dim, getattr(model.config, "patch_size", None))
    if shape != want:
        words = "{} layers of width {} on {} px patches" if want[2] else "{} layers of width {}"
        return None, f"it has {words.format(*shape)}, the analysed model {words.format(*want)}"
    return start.eval().to(next(model.parameters()).device), None


def print_layerwise(first: list[dict], where: str = "") -> None:
    """The first split's R^c (and ToST's R^c_var) and non-zero fraction from the first layer to the last."""
    span = f"(layer 1 -> {len(first)}){where}"

    def change(key: str) -> str:
        return f"{first[0][key]:.4g} -> {first[-1][key]:.4g}"

    print(f"layer-wise R^c (attention input) {change('rc_in')}, non-zero fraction {change('nonzero')} {span}")
    if "rvar_in" in first[0]:
        print(f"layer-wise R^c_var (TSSA input) {change('rvar_in')} {span}")


def print_verdicts(report: dict) -> None:
    """The verdicts, one line each with their figures, the references they compared with, and where the rules are
    (report.html, one click away), then the notes."""
    from ..analysis.report_html import verdict_references
    from ..analysis.verdicts import Verdict, format_verdicts

    verdicts = [Verdict(**v) for v in report.get("verdicts", [])]
    print(format_verdicts(verdicts))
    refs = verdict_references(report.get("verdicts", []))
    if refs:
        print("compared with: " + "; ".join(refs))
    print("the rules and every number: report.html, 'The rules and every number of each verdict'")
    for note in report.get("notes", ()):
        print(f"note: {note}")


def replace_partial(out: str | None, default: Path) -> None:
    """A report that ``crate analyze`` was killed while writing (its folder holds the partial marker) is removed,
    so that a plain rerun writes there again and ``--overwrite`` always works: the named ``--out``, else the
    default folder and its numbered siblings.  Only what crate analyze writes is removed (and the marker)."""
    import shutil

    from ..analysis._common import PARTIAL_MARKER, is_partial

    if out is not None:
        candidates = [Path(out)]
    else:
        candidates = [default, *sorted(default.parent.glob(f"{default.name}-[0-9]*"))]
    for folder in candidates:
        if not is_partial(folder):
            continue
        for pattern in (*ANALYZE_FILES, PARTIAL_MARKER):
            for p in folder.glob(pattern):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        print(f"{folder} held a report that crate analyze did not finish; it is replaced")


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
    source = {"data": data, "normalization_source": norm_src, "crop_pct": crop}
    root = Path(args.images).expanduser()
    return {"images": imgs}, norm, {**source, "files": [str(Path(f).relative_to(root)) for f in files]}


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


def print_segmentation_scores(report: dict, annotations: str) -> None:
    """The headline numbers of ``--annotations``: COCO mask AP / AP50 and the single-object CorLoc / Jaccard."""
    scores = report["segmentation_scores"]
    segm, single = scores["coco"]["segm"], scores["single_object"]
    print(
        f"segmentation against {annotations} ({scores['images']} images, {scores['unannotated']} without "
        f"annotations): mask AP {segm['AP']:.3f}, AP50 {segm['AP50']:.3f}, CorLoc {single['corloc']:.3f}, "
        f"Jaccard {single['jaccard']:.3f} (MaskCut, layer {scores['layer']})"
    )


def _annotations(args: argparse.Namespace, source: dict, size: int) -> tuple[object | None, object | None]:
    """``--annotations``: the COCO ground truth of the ``--images`` folder and its instance labels under the
    geometry of the analysed images (for the explorer's outline); (None, None) without the option."""
    if not args.annotations:
        return None, None
    from ..analysis.segment_data import read_coco, truth_labels

    ground_truth = read_coco(args.annotations, args.images)
    files = [Path(args.images).expanduser() / f for f in source["files"]]
    return ground_truth, truth_labels(ground_truth, files, size, source["crop_pct"])


def run_analyze(args: argparse.Namespace) -> int:
    from ..analysis import analyze
    from ..analysis.report import Reference
    from ..loading.pipeline import load_model
    from ..models.contract import LANGUAGE_MODEL
    from ..train.runtime import resolve_device

    apply_threads(args)
    device = resolve_device(args.device)
    model = load_model(args.checkpoint, args.model, **parse_model_args(args.model_args, args.model)).to(device).eval()
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
    ground_truth, truth = _annotations(args, source, size)  # read and checked before any work
    source["checkpoint"] = str(args.checkpoint)
    default = report_home(args.checkpoint) / "analysis"
    replace_partial(args.out, default)
    args.out = report_dir(args.out, default, args.overwrite, "analyze", ANALYZE_FILES)  # after every check
    ref = run_reference(args.checkpoint)
    start_model, missing = starting_model(ref, model)
    reference = Reference(ref.seed, ref.seed_words, ref.start, start_model, ref.start_checkpoint, missing, ref.start_by)
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
        reference=reference,
        ground_truth=ground_truth,
        truth=truth,
    )
    out = Path(args.out)
    print_layerwise(next(iter(report["measure"].values()))["layers"])
    print_verdicts(report)
    if ground_truth is not None:
        print_segmentation_scores(report, args.annotations)
    print(f"wrote {out / 'report.html'} and {out / 'report.json'} ({report['wall_time_s']} s)")
    return 0
