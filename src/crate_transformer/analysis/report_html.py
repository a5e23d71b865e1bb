"""The HTML of ``crate analyze``'s report (:mod:`crate_transformer.analysis.report`): the page and its sections, each
a function of the finished ``report.json`` dict.  A new section is one more entry in :data:`HTML_SECTIONS`."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence

from .explorer import explorer_section
from .measure import METRICS

__all__ = ["HTML_SECTIONS", "HtmlSection", "render_html"]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;"
    "text-align:right}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #eee}"
    "figcaption{font-size:14px;color:#444}h3{margin-bottom:.2em}"
    "td.holds{background:#e3f4e3}td.fails{background:#f9dede}td.na{background:#eee}td.l{text-align:left}"
    "ul.claims{list-style:none;padding:0}ul.claims li{margin:.3em 0;padding:3px 6px}li.holds{background:#e3f4e3}"
    "li.fails{background:#f9dede}li.na{background:#eee}img.lead{max-width:720px}details.rules{margin:.8em 0}"
)
HtmlSection = Callable[[dict], str]


def render_html(report: dict, sections: Sequence[HtmlSection], title: str = "CRATE white-box report") -> str:
    """The page: ``sections`` in order, each a function of the finished ``report`` returning its HTML."""
    head = f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style></head><body>"
    return "\n".join([head, f"<h1>{title}</h1>", *(s(report) for s in sections), "</body></html>\n"])


def verdict_references(verdicts: Sequence[Mapping]) -> list[str]:
    """The distinct references the verdicts compared with, in their order (the untrained network's words first)."""
    return list(dict.fromkeys(v.get("reference") for v in verdicts if v.get("reference") not in (None, "", "none")))


def _layerwise_png(report: dict) -> str | None:
    """Where the page finds the layer-wise figure: ``figures/layerwise.png`` (image models), or beside the page
    where ``report["figure_folder"]`` says so (language models: ""); None when the report has none."""
    if "layerwise.png" not in (report.get("figures") or {}):
        return None
    return f"{report.get('figure_folder', 'figures/')}layerwise.png"


def html_verdicts(report: dict) -> str:
    """The first screen of the page: the layer-wise figure and one line per claim (its figures and its
    reference), then the full table with every rule one click away (``<details>``), then the notes."""
    esc, verdicts = html.escape, report.get("verdicts", [])
    klass = {"holds": "holds", "fails": "fails"}
    lines = "".join(
        f"<li class='{klass.get(v['verdict'], 'na')}'><b>{esc(v['verdict'])}</b> {esc(v['section'])}, "
        f"{esc(v.get('name') or v['claim'])}: {esc(v.get('summary') or v['explanation'])}</li>"
        for v in verdicts
    )
    refs = "".join(f"<li>{esc(r)}</li>" for r in verdict_references(verdicts))
    png = _layerwise_png(report)
    figure = f"<a href='{png}'><img class='lead' src='{png}' alt='layer-wise measurements'></a>" if png else ""
    rows = "".join(
        f"<tr><td class='l'>{esc(v['section'])}</td><td class='l'>{esc(v['claim'])}</td>"
        f"<td class='{klass.get(v['verdict'], 'na')}'><b>{esc(v['verdict'])}</b></td>"
        f"<td class='l'>{esc(v['explanation'])}</td><td class='l'><small>{esc(v['rule'])}</small></td></tr>"
        for v in verdicts
    )
    notes = "".join(f"<p><b>Note.</b> {esc(n)}</p>" for n in report.get("notes", []))
    return (
        f"<h2>Did the paper's claims hold?</h2>{figure}<ul class='claims'>{lines}</ul>"
        + (f"<p>Compared with:</p><ul class='refs'>{refs}</ul>" if refs else "")
        + "<details class='rules'><summary>The rules and every number of each verdict</summary><table><tr>"
        "<th>model</th><th>claim (JMLR, Yu et al. 2024)</th><th>verdict</th><th>measured</th><th>rule</th></tr>"
        f"{rows}</table></details>{notes}"
    )


def _normalization_text(report: dict) -> str:
    """``mean 0.485, 0.456, 0.406; std 0.229, 0.224, 0.225 (model config)``: what the inputs were normalised by."""
    norm, where = report["normalization"], report["source"].get("normalization_source")
    text = (
        "none"
        if norm is None
        else "; ".join(f"{k} {', '.join(f'{v:.4g}' for v in vs)}" for k, vs in zip(("mean", "std"), norm))
    )
    return f"{text} ({where})" if where else text


def html_info(report: dict) -> str:
    c, src, esc = report["model"]["config"], report["source"], html.escape
    info = [
        ("checkpoint", src.get("checkpoint", "-")),
        ("data", src.get("data", "-")),
        (
            "model",
            f"{c['arch']} dim={c['dim']} depth={c['depth']} heads={c['heads']} patch={c['patch_size']} "
            f"image={c['image_size']} ({report['model']['num_params']:,} parameters)",
        ),
        ("normalisation", _normalization_text(report)),
        (
            "eps",
            f"{report['protocol']['eps']} (eps^2 = {report['protocol']['eps_squared']:g}; "
            "the official vis_utils uses eps^2 = 0.01)",
        ),
        ("wall time", f"{report['wall_time_s']} s"),
    ]
    rows = "".join(f"<tr><th>{esc(k)}</th><td style='text-align:left'>{esc(str(v))}</td></tr>" for k, v in info)
    return (
        f"<table>{rows}</table><p>Every number below is also in <a href='report.json'>report.json</a>. Layers are "
        "numbered 1..L and heads 1..K as in the paper (JMLR, Yu et al. 2024). Hover a column name for its "
        "definition.</p>"
    )


def _table_html(records: Sequence[Mapping], metrics: Sequence[str]) -> str:
    head = "".join(f"<th title='{html.escape(METRICS.get(m, m))}'>{m}</th>" for m in metrics)
    rows = []
    for r in records:
        cells = "".join(f"<td>{_fmt(r[m])} <small>± {r[m + '_std']:.2g}</small></td>" for m in metrics)
        rows.append(f"<tr><td>{r['layer']}</td>{cells}</tr>")
    return f"<table><tr><th>layer</th>{head}</tr>{''.join(rows)}</table>"


def html_layer_tables(report: dict) -> str:
    """Mean ± std per layer of every split (from ``report["measure"]``)."""
    order = (
        "rc_in",
        "rc_half",
        "rc_out",
        "rvar_in",
        "rvar_half",
        "rvar_out",
        "nonzero",
        "l1",
        "rate",
        "rate_reduction",
    )
    parts = ["<h2>Layer-wise measurements</h2>"]
    for name, d in report["measure"].items():
        recs = d["layers"]
        unit = d["meta"].get("unit", "images")
        parts.append(f"<h3>{html.escape(name)} ({recs[0]['n_samples']} {unit})</h3>")
        parts.append(_table_html(recs, [m for m in order if m in recs[0]]))
    return "\n".join(parts)


def html_explorer(report: dict) -> str:
    """The interactive explorer (:func:`.explorer.explorer_section`) when the page has its data."""
    payload = report.get("explorer_payload")
    return explorer_section(payload) if payload else ""


def html_figures(report: dict, folder: str = "figures/") -> str:
    esc = html.escape
    parts = ["<h2>Figures</h2>"]
    for f, d in report["figures"].items():
        title, cap = d["title"], d["caption"]
        parts.append(
            f"<figure><h3>{esc(title)}</h3><a href='{folder}{f}'><img src='{folder}{f}' alt='{esc(title)}'></a>"
            f"<figcaption>{esc(cap)}</figcaption></figure>"
        )
    return "\n".join(parts)


def html_subspaces(report: dict) -> str:
    initial = report.get("subspaces_initialisation") or [None] * len(report["subspaces"])
    rows = "".join(
        f"<tr><td>{s['layer']}</td><td>{_fmt(s['mean_cross_coherence'])}</td>"
        f"<td>{'-' if i is None else _fmt(i['mean_cross_coherence'])}</td><td>{_fmt(s['max_principal_cos'])}"
        f"</td><td>{_fmt(s['random_baseline'])}</td></tr>"
        for s, i in zip(report["subspaces"], initial)
    )
    return (
        "<h2>Subspace coherence per layer</h2><table><tr><th>layer</th><th>mean cross-head coherence</th>"
        "<th>the same at initialisation</th><th>max principal cosine</th><th>random baseline sqrt(p/d)</th></tr>"
        f"{rows}</table>"
    )


def html_attention_entropy(report: dict) -> str:
    att = report["attention"]
    return (
        f"<h2>Attention entropy, layer {att['layer']}</h2><p>Per head k = 1..K (nats; uniform = "
        f"{_fmt(att['entropy_uniform'])}): " + ", ".join(_fmt(e) for e in att["entropy_per_head"]) + "</p>"
    )


def html_segmentation_scores(report: dict) -> str:
    """``--annotations``: MaskCut's COCO mask and box AP / AR and the single-object CorLoc / Jaccard."""
    scores = report.get("segmentation_scores")
    if not scores:
        return ""
    esc, coco, single = html.escape, scores["coco"], scores["single_object"]
    stats = list(coco["segm"])
    head = "".join(f"<th>{esc(k)}</th>" for k in stats)
    rows = "".join(
        f"<tr><td class='l'>{kind}</td>" + "".join(f"<td>{coco[kind][k]:.3f}</td>" for k in stats) + "</tr>"
        for kind in ("segm", "bbox")
    )
    return (
        f"<h2>Segmentation against the ground truth (MaskCut, layer {scores['layer']})</h2>"
        f"<p>{esc(scores['annotations'])}: {scores['images']} images ({scores['unannotated']} without annotations), "
        f"{scores['predictions']} predicted masks, class-agnostic; COCO metrics by pycocotools. Single object "
        f"(TokenCut / DINO protocol, {single['images']} images): CorLoc {single['corloc']:.3f}, Jaccard "
        f"{single['jaccard']:.3f}. Predictions in COCO results format: segment_eval/results_maskcut.json.</p>"
        f"<table><tr><th>IoU type</th>{head}</tr>{rows}</table>"
    )


# the page of an image model, in order; a new section is one more function here
HTML_SECTIONS: list[HtmlSection] = [
    html_verdicts,
    html_info,
    html_layer_tables,
    html_segmentation_scores,
    html_explorer,
    html_figures,
    html_subspaces,
    html_attention_entropy,
]
