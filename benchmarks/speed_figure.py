"""The figure at the top of docs/speed.md, drawn from the dated tables further down that page (nothing is
re-measured): on a CPU, this implementation's speed-up over the official formulation (inference by batch, and the
training step); on one H200, training images/s of CRATE against the official formulation and a ViT of the same
size (the official and ViT numbers are CRATE's images/s divided by the page's measured ratios).

    python benchmarks/speed_figure.py                 # writes docs/images/speed.png
    python benchmarks/speed_figure.py --check         # parses the tables and prints the numbers, draws nothing
    python benchmarks/speed_figure.py --tiny          # draws it into a temp dir, not docs/ (a test runs it)
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from _common import Arguments

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "speed.md"
OUT = ROOT / "docs" / "images" / "speed.png"


def table(text: str, header: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header row starts with ``header`` (cells by column name)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(names, (c.strip() for c in line.strip("|").split("|")))))
    return rows


def number(cell: str) -> float:
    """``"**1.75x**"``, ``"4,091.4"``, ``"46.7%"`` → the number."""
    return float(re.sub(r"[^\d.]", "", cell.split(" ")[0]))


def measurements(text: str) -> dict:
    """CPU inference speed-ups by model and batch, CPU training-step speed-ups, and H200 images/s."""
    inference: dict[str, list[tuple[int, float]]] = {}
    for r in table(text, "| model | batch | official ms | ours ms"):
        inference.setdefault(r["model"], []).append((int(r["batch"]), number(r["official ms"]) / number(r["ours ms"])))
    training = [
        (f"{r['model']} {r['image / patch'].replace(' ', '')}", int(r["batch"]), number(r["speedup"]))
        for r in table(text, "| model | image / patch | batch | official ms")
    ]
    gpu = []
    for r in table(text, "| model | img/s | MFU | vs official"):
        if r["vs official"] and r["vs ViT (ours)"]:
            ours = number(r["img/s"])
            gpu.append((r["model"], ours, ours / number(r["vs official"]), ours / number(r["vs ViT (ours)"])))
    return {"inference": inference, "training": training, "gpu": gpu}


def draw(m: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.3]})
    for model, points in m["inference"].items():
        a.plot(*zip(*points), marker="o", label=f"{model} inference")
    for i, (label, batch, x) in enumerate(m["training"]):
        a.scatter([batch], [x], marker="s", color="k", zorder=3, label="training step" if i == 0 else None)
        a.annotate(label, (batch, x), textcoords="offset points", xytext=(6, -4 - 9 * (i % 2)), fontsize=7)
    a.axhline(1.0, color="grey", lw=0.8, ls="--")
    a.set(xscale="log", xlabel="batch", ylabel="speed-up over the official code", ylim=(0, None))
    a.set_xticks([1, 2, 8, 32, 128], ["1", "2", "8", "32", "128"])
    a.set_title("CPU (2 shared cores, fp32): this package / official", fontsize=9)
    a.legend(fontsize=7, loc="lower right")
    names = [g[0].replace(" eager", "").replace(" compiled", "\ncompiled") for g in m["gpu"]]
    x = range(len(names))
    for k, (label, colour) in enumerate(
        [("CRATE (this package)", "C0"), ("official code", "C7"), ("ViT, same size", "C1")]
    ):
        b.bar([i + (k - 1) * 0.27 for i in x], [g[1 + k] for g in m["gpu"]], width=0.27, label=label, color=colour)
    b.set_xticks(list(x), names, fontsize=8)
    b.set(ylabel="training images / s")
    b.set_title("one H200, bf16, 224 px / patch 16: a training step", fontsize=9)
    b.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    parser = Arguments(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="parse and print the numbers, draw nothing")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--tiny", action="store_true", help="draw into a new temp dir (docs/images is left alone)")
    args = parser.parse_args()
    if args.tiny:
        args.out = Path(tempfile.mkdtemp(prefix="speed_figure_")) / "speed.png"
    m = measurements(PAGE.read_text())
    for model, points in m["inference"].items():
        print(model, "inference", " ".join(f"b{b}:{s:.2f}x" for b, s in points))
    for label, batch, s in m["training"]:
        print("training step", label, f"batch {batch}", f"{s:.2f}x")
    for name, ours, official, vit in m["gpu"]:
        print(f"{name}: {ours:,.0f} img/s, official {official:,.0f}, ViT {vit:,.0f}")
    if not args.check:
        print(draw(m, args.out))


if __name__ == "__main__":
    main()
