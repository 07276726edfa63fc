"""``report.json``: the record of one federated run, written by the server into its run directory.

Schema (fields every method writes; methods add their own per-round fields):
    method, config, clients, resumed_at: [round a restarted server continued from] (empty: never restarted),
    rounds: [{round, metrics: {site: {train_loss, val_dice, ...}}, missing: [site], wall_time,
              task_times: {task: seconds from sending it to the last answer},
              task_breakdown: {task: {deliver, site, return, total, answers}} (fedseg.fl.task_clock), ...}],
    final: {global: {site: {dice, hd95, assd}}, personalized: {...} (personalised methods only),
            global_best_val, best_val_round, best_val_score (train_config eval_best_val_round: the best
            validation round's global model; each round's validation metrics in rounds[].global_val),
            local (train_config eval_local_models: each site's last locally trained model on its own test split)}
Only numbers the sites chose to send are here — no images, labels or predictions.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional

from fedseg.markdown import markdown_table

REPORT_NAME = "report.json"
SUMMARY_NAME = "summary.md"


def jsonable(value: Any) -> Any:
    """``value`` made JSON-safe, recursively: tensors / arrays -> lists, dict keys -> str, tuples -> lists,
    NaN / Inf -> None (JSON has no NaN)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunReport:
    def __init__(self, method: str, clients: List[str], config: Dict[str, Any]):
        self.method = method
        self.clients = list(clients)
        self.config = config
        self.rounds: List[Dict[str, Any]] = []
        self.final: Dict[str, Any] = {}
        #: rounds at which a restarted server continued this job (``fedseg.fl.checkpoint``)
        self.resumed_at: List[int] = []

    def add_round(self, round_: int, metrics: Dict[str, Dict[str, float]], **fields: Any) -> None:
        self.rounds.append({"round": round_, "metrics": metrics, **fields})

    def round_summary(self, round_: int) -> str:
        entry = next(r for r in self.rounds if r["round"] == round_)
        val = validation_metric({"rounds": [entry]})
        values = [m.get(val) for m in entry["metrics"].values() if m.get(val) is not None]
        loss = [m.get("train_loss") for m in entry["metrics"].values() if m.get("train_loss") is not None]
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        return f"mean train_loss {mean(loss):.4f}, mean {val} {mean(values):.4f}, {entry.get('wall_time', 0):.1f}s"

    def as_dict(self) -> Dict[str, Any]:
        task = (self.config.get("train_config") or {}).get("task")
        note = CLASSIFICATION_NOTE if task == "classification" else METRIC_NOTE
        final = {**self.final, "note": note} if self.final else self.final
        return jsonable(
            {
                "method": self.method,
                "config": self.config,
                "clients": self.clients,
                "resumed_at": self.resumed_at,
                "rounds": self.rounds,
                "final": final,
            }
        )

    def write(self, run_dir: os.PathLike, plots: bool = True) -> Path:
        """Write report.json (+ summary.md and PNG plots when ``plots``); returns the report path."""
        out = Path(run_dir)
        out.mkdir(parents=True, exist_ok=True)
        data = self.as_dict()
        tmp = out / (REPORT_NAME + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, out / REPORT_NAME)
        if plots:
            from fedseg.plots.report_plots import plot_report

            figures = plot_report(data, out / "plots", validation_metric(data))
            (out / SUMMARY_NAME).write_text(summarise(data, figures, base=out))
        return out / REPORT_NAME


#: final metrics in table order: whole image (Jaccard and mIoU only where a job asks for them in
#: ``eval_metrics``, e.g. FedEFM's downstream job), inside the field of view, distances in mm
METRIC_ORDER = (
    "dice", "iou", "miou", "hd95", "assd", "dice_fov", "hd95_fov", "assd_fov", "hd95_mm", "assd_mm",
    "dice_lcc", "hd95_lcc", "assd_lcc",
    "accuracy", "balanced_accuracy",
)
METRIC_HEADERS = {
    "accuracy": "Accuracy", "balanced_accuracy": "Balanced accuracy",
    "dice": "Dice", "iou": "Jaccard (IoU)", "miou": "mIoU (with background)", "hd95": "HD95 (px)", "assd": "ASSD (px)", "dice_fov": "Dice FOV", "hd95_fov": "HD95 FOV (px)",
    "assd_fov": "ASSD FOV (px)", "hd95_mm": "HD95 (mm)", "assd_mm": "ASSD (mm)",
    "dice_lcc": "Dice LCC", "hd95_lcc": "HD95 LCC (px)", "assd_lcc": "ASSD LCC (px)",
}
#: what the final metrics mean (written into report.json)
CLASSIFICATION_NOTE = (
    "test metrics per site over its test images on the global label space: accuracy, balanced_accuracy (mean "
    "over the classes present at the site) and accuracy_class_<k> (k indexes the datalists' label_space)"
)
STRUCTURE_NOTE = (
    "Each foreground class scored on its own (one class against the rest) and each region as the union of its classes "
    "(e.g. optic disc = rim + cup); Dice, HD95 and ASSD above are the means over the foreground classes. A class absent "
    "from both truth and prediction scores Dice 1 and distance 0 (MONAI's ignore_empty=False), so no mean is NaN"
)
METRIC_NOTE = (
    "test metrics per site are means over its test images, each scored at the image's own size against its mask on "
    "disk (distances in pixels of the original image); *_fov: prediction and truth restricted to the image's "
    "field-of-view mask; *_mm: distances in millimetres from the datalist's pixel spacing (volumes: each scored in "
    "its own geometry, distances in voxels, and *_mm from its header); *_lcc (with train_config eval_largest_component): "
    "the same prediction reduced to each class's largest connected component, reported beside the raw metric"
)


def metric_header(key: str) -> str:
    """Column header of a metric key: ``"dice" -> "Dice"``, ``"dice:cup" -> "Dice cup"``, ``"hd95_mm:disc" ->
    "HD95 disc (mm)"`` (per-class / per-region keys: ``fedseg.data.labels.metric_key``)."""
    from fedseg.data.labels import split_metric_key

    base, name = split_metric_key(key)
    header = METRIC_HEADERS.get(base, base)
    if name is None:
        return header
    head, sep, unit = header.partition(" (")
    return f"{head} {name}" + (f" ({unit}" if sep else "")


def structure_columns(data: Dict[str, Any], which: str = "global") -> List[str]:
    """The per-class / per-region final metrics (``dice:cup``, ...) any site reported for ``which``: by base metric
    in :data:`METRIC_ORDER`, then in the order the sites reported the classes and regions."""
    from fedseg.data.labels import split_metric_key

    from fedseg.data.labels import order_structure_keys

    final = (data.get("final") or {}).get(which) or {}
    keys = order_structure_keys([k for m in final.values() for k in (m or {}) if split_metric_key(k)[1] is not None],
                                (data.get("config") or {}).get("train_config"))
    return [k for base in METRIC_ORDER for k in keys if split_metric_key(k)[0] == base]


def validation_metric(data: Dict[str, Any]) -> str:
    """``val_accuracy`` for a classification run (its sites report no ``val_dice``), else ``val_dice``."""
    for r in data.get("rounds") or []:
        for m in (r.get("metrics") or {}).values():
            if m and "val_dice" in m:
                return "val_dice"
            if m and "val_accuracy" in m:
                return "val_accuracy"
    return "val_dice"


def metric_columns(data: Dict[str, Any], which: str = "global") -> List[str]:
    """The final metrics any site reported for ``which``, in :data:`METRIC_ORDER`."""
    final = (data.get("final") or {}).get(which) or {}
    present = {k for m in final.values() for k in (m or {})}
    return [n for n in METRIC_ORDER if n in present] or ["dice", "hd95", "assd"]


def final_table(data: Dict[str, Any], which: str = "global", names: Optional[List[str]] = None) -> Optional[List[List[str]]]:
    """Rows ``[site, <names>...]`` (default :func:`metric_columns`: dice, hd95, assd, then FOV / mm metrics where
    sites reported them) plus a mean row, or None if the run has no such results."""
    final = (data.get("final") or {}).get(which)
    if not final:
        return None
    names = names or metric_columns(data, which)
    rows = []
    for site in data["clients"]:
        if site in final:
            rows.append([site] + [_fmt(final[site].get(n)) for n in names])
    means = []
    for n in names:
        vals = [final[s][n] for s in final if final[s].get(n) is not None]
        means.append(_fmt(sum(vals) / len(vals)) if vals else "-")
    rows.append(["**mean**"] + means)
    return rows


class FinalTable(NamedTuple):
    """One model's final test table of a report: ``rows`` one per site (``[site, value, ...]`` as strings, under
    ``headers``), and per class and region where the label space has structures (else ``structure_rows`` is empty)."""

    which: str
    title: str
    headers: List[str]
    rows: List[List[str]]
    structure_headers: List[str]
    structure_rows: List[List[str]]


#: the final models a report can hold, in the order they are shown
FINAL_MODELS = ("global", "global_best_val", "local", "personalized")


def final_tables(data: Dict[str, Any]) -> List[FinalTable]:
    """The final test tables of a report, one per model it evaluated (:data:`FINAL_MODELS` order): what the
    summary page and the command line both show."""
    best_round = (data.get("final") or {}).get("best_val_round")
    titles = {"global": "final global model", "personalized": "final personalized model",
              "global_best_val": f"best validation round's global model (round {best_round})",
              "local": "each site's last locally trained model"}
    tables = []
    for which in FINAL_MODELS:
        rows = final_table(data, which)
        if not rows:
            continue
        structures = structure_columns(data, which)
        tables.append(FinalTable(
            which, titles[which], ["site"] + [METRIC_HEADERS[n] for n in metric_columns(data, which)], rows,
            ["site"] + [metric_header(n) for n in structures],
            (final_table(data, which, structures) or []) if structures else []))
    return tables


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{float(x):.4f}"


def summarise(data: Dict[str, Any], figures: Optional[List[Path]] = None, base: Optional[Path] = None) -> str:
    """Markdown summary of a report: configuration, per-round validation Dice, final test metrics."""
    lines = [f"# {data['method']} — {len(data['clients'])} sites, {len(data['rounds'])} rounds", ""]
    cfg = data.get("config", {})
    lines += ["## Configuration", "", "```json", json.dumps(cfg, indent=1), "```", ""]
    if data["rounds"]:
        val = validation_metric(data)
        title = "Validation Dice" if val == "val_dice" else "Validation accuracy"
        rows = [[str(r["round"])] + [_fmt((r["metrics"].get(s) or {}).get(val)) for s in data["clients"]]
                + [_fmt(r.get("wall_time"))] for r in data["rounds"]]
        lines += [f"## {title} per round", "", *markdown_table(["round", *data["clients"], "wall time (s)"], rows), ""]
    for table in final_tables(data):
        note = CLASSIFICATION_NOTE if validation_metric(data) == "val_accuracy" else METRIC_NOTE
        lines += [f"## {table.title[0].upper()}{table.title[1:]} on each site's test split", "", note + ".", ""]
        lines += markdown_table(table.headers, table.rows) + [""]
        if table.structure_rows:
            lines += [f"### Per class and region ({table.which} model)", "", STRUCTURE_NOTE, ""]
            lines += markdown_table(table.structure_headers, table.structure_rows) + [""]
    lines += cross_site_lines(data)
    if figures:
        lines += ["## Figures", ""]
        for fig in figures:
            rel = os.path.relpath(fig, base) if base else str(fig)
            lines.append(f"![{fig.stem}]({rel})")
        lines.append("")
    return "\n".join(lines)


def cross_site_lines(data: Dict[str, Any]) -> List[str]:
    """Markdown table of ``final.cross_site`` (rows: whose model, columns: whose test split), or nothing."""
    cross = (data.get("final") or {}).get("cross_site")
    if not isinstance(cross, dict):
        return []
    rows = ([("global model", cross["global"])] if cross.get("global") else []) + [
        (f"model {m}", r) for m, r in zip(cross["models"], cross["dice"])]
    lines = ["## Cross-site evaluation (mean test Dice)", "",
             "Row = whose model, column = whose test split (each site scores every model on its own test split; only "
             "the means leave it). The diagonal is each site's personalised model at home.", "",
             *markdown_table(["model", *cross["test_sites"]], [[name] + [_fmt(v) for v in values] for name, values in rows])]
    return lines + [""]
