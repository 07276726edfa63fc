"""Results-page tables from a ``fedseg bench`` run's ``results.json``: accuracy, cost, a one-line caption and the
rows of a "Results at a glance" table (each page's registry, ``benchmarks/<page>/registry.py``, names which run makes
which table).

Every number is read from ``results.json`` as :mod:`fedseg.bench.report` wrote it (seed summaries, paired tests,
timings); nothing is recomputed here. A ``*_table`` function returns markdown lines (``List[str]``, drawn by
:func:`fedseg.markdown.markdown_table`); the others return one string, or a table's header and rows.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from fedseg.bench.bench import version_label
from fedseg.bench.report import BASELINE, MODEL_SUFFIXES, format_p, format_seed_difference, format_spread
from fedseg.bench.runs import task_metrics
from fedseg.data.labels import split_metric_key
from fedseg.fl.report import metric_header
from fedseg.markdown import markdown_table
from fedseg.methods import PUBLISHED_METHODS, method_titles

#: how a method (its row's title, ``fedseg.methods``) or a reference is named on the results page
METHOD_NAMES = {**method_titles(), "local": "local only", "pooled": "pooled"}
#: a method's ``server_optimizer`` option as a name suffix (``fedseg.strategies.server_step``)
SERVER_STEP_NAMES = {"sgd-momentum": " + server momentum", "adam": " + server Adam"}
#: train_config keys of the label space (shown as classes and regions, not as ``--set`` values)
_LABEL_KEYS = ("num_classes", "labels", "regions", "label_values")


# ----------------------------------------------------------------------------------------- names
def approach_title(entry: Mapping[str, Any]) -> str:
    """The page name of a ``results["approaches"]`` entry: ``FedAvg``, ``FVAC (fvda_foreground=per_class)`` for an
    ablation row, ``GraphFedSeg (personalised)`` for a personalised model; unknown methods keep their label."""
    method, label = entry.get("method"), entry.get("label")
    name = METHOD_NAMES.get(method, method or label)
    args = dict(entry.get("variant_args") or {})
    step = args.pop("server_optimizer", None)
    if step in SERVER_STEP_NAMES:
        name += SERVER_STEP_NAMES[step]
    elif step is not None:
        args["server_optimizer"] = step
    if args:
        name += " (" + ", ".join(_arg_text(k, v) for k, v in args.items()) + ")"
    elif label and label != method and step is None:
        name += f" `{label}`"
    name += MODEL_SUFFIXES.get(entry.get("model", "global"), "")
    return name


#: a value naming a file of another bench's run: its simulator workspace ``.../workspaces/<kind>-<label>-seed<N>/...``
_RUN_FILE = re.compile(r"/workspaces/(?:method|reference)-(.+?)-seed\d+/")


def _arg_text(key: str, value: Any) -> str:
    """``key=value``, or ``foundation_ckpt from `fedefm``` where the value is a file of a bench run (a checkpoint of
    the run of the same seed, :func:`fedseg.bench.runs.seeded_args`): the run's label, not a folder of a machine."""
    match = _RUN_FILE.search(value) if isinstance(value, str) else None
    return f"{key} from `{match.group(1)}`" if match else f"{key}={value}"


def label_entry(results: Mapping[str, Any], label: str) -> Mapping[str, Any]:
    """The global-model approach entry of a run label (timing rows are per label)."""
    for entry in results.get("approaches", {}).values():
        if entry.get("label") == label and entry.get("model", "global") == "global":
            return entry
    return {"label": label, "method": label}


def baseline_title(results: Mapping[str, Any]) -> str:
    base = results.get("baseline")
    return approach_title(label_entry(results, base)) if base else "-"


# --------------------------------------------------------------------------------------- caption
def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _by_approach(results: Mapping[str, Any], value) -> str:
    """``"10"`` or ``"1 (FVAC: 5)"``: the most common value over the approaches' global models, then the others."""
    values = {}
    for entry in results.get("approaches", {}).values():
        if entry.get("model", "global") == "global":
            v = value(entry)
            if v is not None:
                values[approach_title(entry)] = v
    if not values:
        return ""
    common = Counter(values.values()).most_common(1)[0][0]
    others = [f"{name}: {v}" for name, v in values.items() if v != common]
    return f"{common}" + (f" ({', '.join(others)})" if others else "")


def _size(size: Any) -> str:
    if isinstance(size, (list, tuple)):
        return "×".join(str(s) for s in size)
    return f"{size}"


def input_text(results: Mapping[str, Any]) -> str:
    """How images reached the network, from ``results["spatial"]`` (``fedseg bench`` records it): ``images resized
    to 64 px``, ``native resolution, 96 px patches``, ``3-D patches 64×64×16``, ``slices, 64 px patches``."""
    spatial = {site: s for site, s in (results.get("spatial") or {}).items() if "spatial_mode" in s}
    if not spatial:
        cfg = next((e.get("train_config") for e in results.get("approaches", {}).values() if e.get("train_config")), None) or {}
        if not cfg:
            return ""
        return f"image size {cfg.get('image_size')} px / patch {_size(cfg.get('patch_size'))} (spatial mode not recorded)"
    texts: dict = {}  # text -> the sites it describes
    for site, s in spatial.items():
        mode, size = s["spatial_mode"], _size(s.get("input_size"))
        if mode == "resize":
            text = f"images resized to {size} px"
        elif mode == "slices":
            text = f"slices, {size} px patches"
        elif s.get("spatial_dims") == 3:
            text = f"3-D patches {size}"
        else:
            text = f"native resolution, {size} px patches" + (f", rescale {s['rescale']:g}" if s.get("rescale", 1.0) != 1.0 else "")
        texts.setdefault(text, []).append(site)
    if len(texts) == 1:
        return next(iter(texts))
    return "; ".join(f"{text} ({', '.join(sites)})" for text, sites in texts.items())  # sites differ: say which


def label_space(results: Mapping[str, Any]):
    """The run's :class:`fedseg.data.labels.LabelSpace` (from its approaches' ``train_config``, else the budget's
    ``--set`` values), or None where it cannot be read."""
    from fedseg.data.labels import LabelSpace

    cfg = next((e.get("train_config") for e in results.get("approaches", {}).values() if e.get("train_config")), None)
    try:
        return LabelSpace.from_config(cfg or (results.get("budget") or {}).get("sets") or {})
    except ValueError:
        return None


def labels_text(results: Mapping[str, Any]) -> str:
    """``classes rim, cup (regions disc = rim + cup)`` for a label space with several classes or regions, else ``""``."""
    space = label_space(results)
    if space is None or not space.multi_class:
        return ""
    text = "classes " + ", ".join(space.foreground)
    regions = [f"{r} = {' + '.join(m)}" for r, m in space.regions.items() if list(m) != [r]]
    return text + (f" (regions {', '.join(regions)})" if regions else "")


def budget_text(results: Mapping[str, Any]) -> str:
    """Profile, rounds, local epochs, input, other ``--set`` values and non-default job settings of a run."""
    budget = results.get("budget") or {}
    parts = [f"profile `{budget.get('profile', 'default')}`"]
    rounds = _by_approach(results, lambda e: e.get("num_rounds") if e.get("kind") == "method" else None)
    parts.append(f"rounds {rounds or budget.get('rounds') or 'profile default'}"
                 + (" (profile default)" if rounds and budget.get("rounds") is None else ""))
    epochs = _by_approach(results, lambda e: (e.get("train_config") or {}).get("local_epochs"))
    parts.append(f"local epochs {epochs or budget.get('local_epochs') or 'profile default'}")
    for text in (input_text(results), labels_text(results)):
        if text:
            parts.append(text)
    sets = {k: v for k, v in (budget.get("sets") or {}).items() if k not in _LABEL_KEYS}
    if sets:
        parts.append("set " + ", ".join(f"{k}={v}" for k, v in sets.items()))
    if budget.get("task_request_interval") is not None:
        parts.append(f"task request interval {budget['task_request_interval']} s")
    return ", ".join(parts)


def machine_text(machine: Optional[Mapping[str, Any]]) -> str:
    """``2 CPUs, no GPU, torch 2.13.0+cpu, load 2.5`` (1-minute load average) from a ``machine`` record
    (:func:`fedseg.bench.simulator.machine_info`, with a benchmark script's ``device`` / ``torch_threads`` where it
    records them): the device the numbers were measured on where the record names one, else the machine's GPUs."""
    if not machine:
        return "not recorded"
    parts = []
    if machine.get("cpu_count"):
        parts.append(_count(int(machine["cpu_count"]), "CPU"))
    if machine.get("device"):
        parts.append(f"device {machine['device']}")
    elif "gpus" in machine:
        parts.append(", ".join(machine["gpus"]) if machine["gpus"] else "no GPU")
    if machine.get("torch"):
        parts.append(f"torch {machine['torch']}")
    if machine.get("torch_threads"):
        parts.append(_count(int(machine["torch_threads"]), "torch thread"))
    load = machine.get("loadavg_at_start")
    if load:
        parts.append(f"load {load[0]:.1f}")
    return ", ".join(parts)


def code_text(results: Mapping[str, Any]) -> str:
    """``code 3454ff5`` (the commit that wrote ``results.json``), with the runs' own commits where they differ
    (a resumed bench), ``+dirty`` for uncommitted changes; ``code version not recorded`` for older outputs."""
    if "code_version" not in results:
        return "code version not recorded"
    text = f"code {version_label(results['code_version'])}"
    runs = results.get("run_code_versions") or {}
    if runs and set(runs) != {version_label(results["code_version"])}:
        text += " (runs: " + ", ".join(f"{v} ×{len(ids)}" for v, ids in runs.items()) + ")"
    return text


def data_text(results: Mapping[str, Any]) -> str:
    """``3 sites, 21 test images`` (``results["data"]``: images per split of every site)."""
    data = results.get("data") or {}
    sites = results.get("sites") or list(data)
    if not sites:
        return ""
    tests = [n.get("test") for n in data.values() if isinstance(n, Mapping) and n.get("test") is not None]
    return _count(len(sites), "site") + (f", {_count(sum(tests), 'test image')}" if tests else "")


def caption(results: Mapping[str, Any], title: str, note: str = "") -> str:
    """One line: **title.** data, seeds; budget; machine; date; code version; then ``note``."""
    seeds = results.get("seeds")
    seeds_text = ("seed " if len(seeds or []) == 1 else "seeds ") + ", ".join(map(str, seeds or []))
    head = ", ".join(p for p in (data_text(results), seeds_text if seeds else "") if p)
    date = str(results.get("date") or "date not recorded").replace("T", " ")[:16]
    parts = [p for p in (head, f"budget: {budget_text(results)}" if results.get("budget") else "",
                         f"machine: {machine_text(results.get('machine'))}", date, code_text(results)) if p]
    return f"**{title}.** " + "; ".join(parts) + "." + (f" {note}" if note else "")


# -------------------------------------------------------------------------------------- accuracy
def _digits(metric: str) -> int:
    base = split_metric_key(metric)[0]
    return 3 if base.startswith("dice") or "iou" in base or "accuracy" in base else 2


def at_site(column: str) -> Tuple[str, Optional[str]]:
    """``"dice_fov@DRIVE"`` -> ``("dice_fov", "DRIVE")``: a column of one site's value (a metric only some sites
    report, such as DRIVE's field-of-view Dice, has no mean over sites); ``"dice"`` -> ``("dice", None)``."""
    metric, sep, site = column.partition("@")
    return metric, (site if sep else None)


def column_spread(entry: Mapping[str, Any], column: str) -> Mapping[str, Any]:
    """The seed spread of a column: the mean over sites, or the named site's value."""
    metric, site = at_site(column)
    return (((entry.get("summary") or {}).get(site or "mean") or {}).get(metric)) or {}


def _has_values(results: Mapping[str, Any], metric: str) -> bool:
    return any(column_spread(e, metric).get("mean") is not None for e in results.get("approaches", {}).values())


def accuracy_metrics(results: Mapping[str, Any], extra: Sequence[str] = ()) -> List[str]:
    """The columns of an accuracy table: the task's headline metric (Dice, or accuracy), its per-class / per-region
    variants (``dice:<name>``, in ``results["metrics"]`` order), then HD95 (segmentation) or balanced accuracy
    (classification), then ``extra``; only metrics the run has values for."""
    task = results.get("task", "segmentation")
    head, *rest = task_metrics(task)
    metrics = list(results.get("metrics") or task_metrics(task))
    cols = [head] + [m for m in metrics if split_metric_key(m)[0] == head and split_metric_key(m)[1] is not None]
    cols += ["hd95"] if task == "segmentation" else rest
    cols += [m for m in extra if m not in cols]
    return [m for m in cols if _has_values(results, m)]


def seed_cell(spread: Mapping[str, Any], digits: int) -> str:
    """A table cell of a :func:`fedseg.bench.stats.seed_spread`: mean ± std over seeds, the mean alone for a single
    seed (no spread to show), ``-`` without a value."""
    if spread.get("mean") is not None and spread.get("n", 0) == 1:
        return f"{spread['mean']:.{digits}f}"
    return format_spread(dict(spread), digits)


def column_header(results: Mapping[str, Any], metric: str) -> str:
    """``Dice (mean of rim, cup)`` where a run has several foreground classes; distances in voxels for volumes
    (``results["spatial"]``); ``Dice in FOV (DRIVE)`` for a one-site column (:func:`at_site`); else the metric's
    header (:func:`fedseg.fl.report.metric_header`)."""
    metric, site = at_site(metric)
    if site is not None:
        return f"{column_header(results, metric)} ({site})"
    space = label_space(results)
    if metric == "dice" and space is not None and space.multi_class:
        return f"Dice (mean of {', '.join(space.foreground)})"
    header = metric_header(metric)
    if any(s.get("spatial_dims") == 3 for s in (results.get("spatial") or {}).values()):
        header = header.replace("(px)", "(voxels)")
    return header


def paired_test(comparison: Optional[Mapping[str, Any]], metric: str) -> Optional[Mapping[str, Any]]:
    """The paired test of a column: pooled over sites, or the named site's (:func:`at_site`)."""
    metric, site = at_site(metric)
    tests = ((comparison or {}).get("metrics") or {}).get(metric) or {}
    return (tests.get("per_site") or {}).get(site) if site is not None else tests.get("all")


def diff_cell(test: Optional[Mapping[str, Any]], p_key: str) -> str:
    """A paired test's table cell: ``"+0.012 (0.031)"`` (mean difference, then ``test[p_key]``), ``"-"`` without one."""
    if not test or test.get("mean_diff") is None:
        return "-"
    return f"{test['mean_diff']:+.3f} ({format_p(test.get(p_key))})"


def test_columns(results: Mapping[str, Any], metrics: Sequence[str]) -> List[str]:
    """The metrics of ``metrics`` that have a paired test in ``results["comparisons"]`` (segmentation: Dice and its
    per-class / per-region variants; classification: per-image correctness, shown as the accuracy difference)."""
    if results.get("task") == "classification":
        return ["correct"] if any(paired_test(c, "correct") for c in results.get("comparisons", {}).values()) else []
    return [m for m in metrics if (split_metric_key(m)[0] == "dice" if "@" not in m else at_site(m)[0].startswith("dice"))
            and any(paired_test(c, m) for c in results.get("comparisons", {}).values())]


def seed_difference(results: Mapping[str, Any], comparison: Optional[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """The headline metric's per-seed difference to the baseline (:func:`fedseg.bench.stats.seed_differences`), where
    the comparison has one over two or more seeds (``results.json`` written before it existed has none)."""
    head = task_metrics(results.get("task", "segmentation"))[0]
    diff = ((comparison or {}).get("seed_differences") or {}).get(head)
    return diff if diff and diff.get("n", 0) > 1 else None


def has_seed_differences(results: Mapping[str, Any]) -> bool:
    """Whether any approach has a per-seed difference to show (two or more seeds, a ``results.json`` that has them)."""
    return any(seed_difference(results, c) for c in (results.get("comparisons") or {}).values())


def accuracy_table(results: Mapping[str, Any], extra_metrics: Sequence[str] = ()) -> List[str]:
    """The markdown lines of :func:`accuracy_rows`."""
    return markdown_table(*accuracy_rows(results, extra_metrics))


def accuracy_rows(results: Mapping[str, Any], extra_metrics: Sequence[str] = ()) -> Tuple[List[str], List[List[str]]]:
    """The accuracy table's header and rows. Rows = approaches (``results["approaches"]``, in order); columns = the
    mean over sites (mean ± std over seeds) of :func:`accuracy_metrics`, then the paired test of each Dice column
    against the baseline's global model: mean per-image difference (Wilcoxon p) — for classification the accuracy
    difference (McNemar p) — and, over two or more seeds, the headline metric's per-seed difference of site means:
    mean ± std over seeds (in how many seeds the approach is ahead)."""
    metrics = accuracy_metrics(results, extra_metrics)
    tests = test_columns(results, metrics)
    base = baseline_title(results)
    classification = results.get("task") == "classification"
    p_key = "mcnemar_p" if classification else "wilcoxon_p"
    comparisons = results.get("comparisons", {})
    per_seed = has_seed_differences(results)
    headers = ["approach"] + [column_header(results, m) for m in metrics]
    for m in tests:
        what = ("accuracy" if m == "correct" else "Dice" if m == "dice" else
                column_header(results, m) if "@" in m else split_metric_key(m)[1])
        headers.append(f"Δ {what} vs {base} ({'McNemar' if classification else 'Wilcoxon'} p)")
    if per_seed:
        headers.append(f"Δ {'accuracy' if classification else 'Dice'} per seed (mean ± std, seeds ahead)")
    rows = []
    base_label = results.get("baseline")
    for name, entry in results.get("approaches", {}).items():
        cells = [approach_title(entry)] + [seed_cell(column_spread(entry, m), _digits(at_site(m)[0])) for m in metrics]
        is_base = name == base_label
        cells += ["" if is_base else diff_cell(paired_test(comparisons.get(name), m), p_key) for m in tests]
        if per_seed:
            cells.append("" if is_base else format_seed_difference(seed_difference(results, comparisons.get(name))))
        rows.append(cells)
    return headers, rows


def pairs_text(results: Mapping[str, Any]) -> str:
    """``63 pairs`` (test images × seeds) when every comparison has as many, else ``pairs per approach differ``."""
    counts = {(paired_test(c, "correct" if results.get("task") == "classification" else "dice") or {}).get("n")
              for c in results.get("comparisons", {}).values()}
    counts.discard(None)
    if not counts:
        return ""
    return _count(counts.pop(), "pair") if len(counts) == 1 else "pairs per approach differ"


def accuracy_note(results: Mapping[str, Any]) -> str:
    """What an accuracy table's cells and Δ columns are."""
    seeds = results.get("seeds") or []
    cells = ("Cells: unweighted mean over sites of each site's test mean" +
             (", mean ± std over seeds" if len(seeds) > 1 else " (one seed: no spread)"))
    if not results.get("comparisons"):
        return cells + "; no baseline, no paired tests."
    base = baseline_title(results)
    if results.get("task") == "classification":
        test = "accuracy difference, McNemar's exact test on per-image correctness"
    else:
        test = "mean per-image difference, two-sided Wilcoxon signed-rank p"
    note = (f"{cells}; Δ: paired against {base}'s global model of the same seed over the test images "
            f"({pairs_text(results)}; {test}).")
    if has_seed_differences(results):
        note += (f" Δ per seed: each seed's mean over sites minus {base}'s of the same seed, mean ± std over seeds, "
                 "and in how many seeds the approach is ahead.")
    return note


# ------------------------------------------------------------------------------------------- cost
def cost_table(results: Mapping[str, Any]) -> List[str]:
    """Rows = run labels; columns: median round wall (s), its ratio to the baseline's, upload / download per site per
    round (MB), peak site memory (MB, where recorded) and wall time per run (mean ± std over seeds)."""
    base = baseline_title(results)
    rows = []
    for label, t in (results.get("timing") or {}).items():
        med = "-" if t.get("median_round_wall") is None else f"{t['median_round_wall']:.2f}"
        ratio = "-" if t.get("round_wall_ratio_to_fedavg") is None else f"{t['round_wall_ratio_to_fedavg']:.2f}x"
        up, down = t.get("upload_mb_per_site_round"), t.get("download_mb_per_site_round")
        traffic = "-" if up is None else f"{up:.2f} / {down or 0:.2f}"
        mem = "-" if t.get("peak_site_memory_mb") is None else f"{t['peak_site_memory_mb']:.0f}"
        wall = seed_cell(t.get("wall_s_per_run") or {}, 1) + ("" if t.get("kind") == "method" else " (in process)")
        rows.append([approach_title(label_entry(results, label)), med, ratio, traffic, mem, wall])
    return markdown_table(["approach", "median round wall (s)", f"vs {base}", "upload / download per site per round (MB)",
                           "peak site memory (MB)", "wall time per run (s)"], rows)


def cost_note(results: Mapping[str, Any]) -> str:
    timed = {t.get("rounds_timed") for t in (results.get("timing") or {}).values() if t.get("median_round_wall") is not None}
    rounds = f" ({_count(timed.pop(), 'round')} per approach)" if len(timed) == 1 and None not in timed else ""
    return (f"Round wall: median over every round but the first, pooled over seeds{rounds}, in one simulator run per "
            f"seed with every site on this machine; ratio to {baseline_title(results)}'s in the same bench. Traffic: "
            "model payload bytes per site per round. References train in process (no rounds, no traffic).")


# ------------------------------------------------------------------------------------------ glance
def glance_rows(results: Mapping[str, Any], data: str, table_id: str, link: Optional[str] = None,
                timing_from: Optional[Tuple[Mapping[str, Any], str]] = None,
                labels: Optional[Mapping[str, str]] = None) -> List[List[str]]:
    """Rows of the "Results at a glance" table from one accuracy run: per published method as shipped or with the
    server step (global and personalised models; not references, not other ablation rows ``LABEL=METHOD:key=value``),
    then the run's best-scoring other baseline (FedAvgM, FedDyn, FedAvg with more local epochs, ...): method, data,
    score (baseline's), Δ vs baseline (p), round time vs baseline, source table. ``timing_from``: (another run's
    results, its table id) whose round times to show instead (a cost measurement on a quieter machine); the cell
    names that table. ``labels``: ``{approach: its glance name}``, the published method's rows where its arms are
    ablation rows (FedEFM: the downstream network from a foundation checkpoint), in place of the rule above.

    Raises:
        ValueError: the run's baseline is not FedAvg (the glance table compares every method with FedAvg).
    """
    base_label = results.get("baseline")
    base = label_entry(results, base_label) if base_label else {}
    if base.get("method") != BASELINE:
        raise ValueError(f"table {table_id}: its baseline is {base_label!r}, not FedAvg; the glance table compares "
                         "with FedAvg (leave this table out of it)")
    classification = results.get("task") == "classification"
    metric = task_metrics(results.get("task", "segmentation"))[0]
    test_key, p_key = ("correct", "mcnemar_p") if classification else ("dice", "wilcoxon_p")
    base_score = seed_cell(base["summary"]["mean"][metric], _digits(metric))
    source = f"[{table_id}]({link}#{table_id})" if link else f"`{table_id}`"
    comparisons = results.get("comparisons", {})

    def row(name: str, entry: Mapping[str, Any], title: str) -> List[str]:
        timing_results, timing_table = timing_from or (results, None)
        t = (timing_results.get("timing") or {}).get(entry.get("label"), {})
        ratio = "-" if t.get("round_wall_ratio_to_fedavg") is None else f"{t['round_wall_ratio_to_fedavg']:.2f}x"
        if timing_table and ratio != "-":
            ratio += f" (`{timing_table}`)"
        score = seed_cell(entry["summary"]["mean"][metric], _digits(metric))
        prefix = "accuracy " if classification else ""
        return [title, data, f"{prefix}{score} ({base_score})", diff_cell(paired_test(comparisons.get(name), test_key), p_key),
                ratio, source]

    approaches = results.get("approaches", {})
    unknown = sorted(set(labels or {}) - set(approaches))
    if unknown:
        raise ValueError(f"table {table_id}: glance labels {unknown} are not approaches of its run ({sorted(approaches)})")
    rows, baselines = [], []
    for name, entry in approaches.items():
        if entry.get("kind") != "method" or name == base_label:
            continue  # references stay in the source table
        if entry.get("method") not in PUBLISHED_METHODS:
            baselines.append((name, entry))
        elif labels is not None:
            if name in labels:
                rows.append(row(name, entry, labels[name]))
        elif set(entry.get("variant_args") or {}) <= {"server_optimizer"}:
            rows.append(row(name, entry, approach_title(entry)))  # as shipped, or with the server step
    if baselines:  # the strongest other baseline of the same run beside the methods (FedAvg is in every row)
        name, entry = max(baselines, key=lambda b: b[1]["summary"]["mean"][metric]["mean"])
        rows.append(row(name, entry, f"best baseline: {approach_title(entry)}"))
    return rows


GLANCE_HEADER = ["method", "data", "Dice (FedAvg)", "Δ vs FedAvg (p)", "round time vs FedAvg", "table"]


def glance_table(rows: Sequence[Sequence[str]]) -> List[str]:
    """The "Results at a glance" table of :func:`glance_rows` (of one or several runs)."""
    return markdown_table(GLANCE_HEADER, rows)


# ----------------------------------------------------------------------------------------- ranking
def _entry_title(results: Mapping[str, Any], name: str) -> str:
    entry = (results.get("approaches") or {}).get(name)
    return approach_title(entry) if entry else name


def recommendation(results: Mapping[str, Any]) -> Dict[str, str]:
    """Which approach to use by ``results["ranking"]`` (``fedseg.bench.ranking``), in parts: ``use`` (its title),
    ``how`` (whether it beats every other approach by the rule, or which the rule cannot separate from it) and
    ``evidence`` (the leader against the closest approach the rule cannot separate from it, else the runner-up).

    Raises:
        ValueError: ``results`` has no ranking (fewer than two federated approaches).
    """
    ranking = results.get("ranking")
    if not ranking:
        raise ValueError("no ranking (fewer than two federated approaches)")
    use, leader, level = ranking["use"], ranking["leader"], ranking["level"]
    runner_up = level[0] if level else ranking["order"][1][0]
    v = ranking["verdicts"][runner_up]
    ps, pt = v["per_seed"], v["paired"]
    p = "-" if pt.get("wilcoxon_p") is None else format_p(pt["wilcoxon_p"])
    evidence = (f"{_entry_title(results, leader)} vs {_entry_title(results, runner_up)}: {ps['mean']:+.3f} ± {ps['std']:.3f} "
                f"per seed, {ps['ahead']}/{ps['n']} seeds ahead, p {p}")
    if ranking["seeds"] < 3:
        how = "the highest mean; fewer than three seeds decide nothing"
    elif not level:
        how = "beats every other approach by the rule"
    else:
        how = "the highest mean; the rule does not separate it from " + ", ".join(_entry_title(results, n) for n in level)
    return {"use": _entry_title(results, use), "how": how, "evidence": evidence}


def recommendation_text(results: Mapping[str, Any], data: str) -> str:
    """``built-in polyp: use FedAvg (local_epochs=5) — level by the rule with FVAC, the cheaper round (leader vs
    FVAC: +0.023 ± 0.029 per seed, 2/3 seeds ahead, p 0.1)`` from ``results["ranking"]`` (:func:`recommendation`)."""
    if not results.get("ranking"):
        return f"{data}: no ranking (fewer than two federated approaches)"
    r = recommendation(results)
    return f"{data}: **use {r['use']}** — {r['how']} ({r['evidence']})"


def ranking_table(results: Mapping[str, Any]) -> List[str]:
    """Every federated approach by mean Dice, the leader against it (per seed, per image) and the rule's verdict."""
    ranking = results["ranking"]
    rows = []
    for i, (name, score) in enumerate(ranking["order"], 1):
        title = _entry_title(results, name) + (" **(use)**" if name == ranking["use"] else "")
        if name == ranking["leader"]:
            rows.append([str(i), title, f"{score:.3f}", "leader", "leader", "-"])
            continue
        v = ranking["verdicts"][name]
        ps, pt = v["per_seed"], v["paired"]
        per_image = "-" if pt.get("mean_diff") is None else f"{pt['mean_diff']:+.3f} ({format_p(pt.get('wilcoxon_p'))})"
        verdict = "beaten by the leader" if v["beats"] else "level with the leader"
        rows.append([str(i), title, f"{score:.3f}", f"{ps['mean']:+.3f} ± {ps['std']:.3f} ({ps['ahead']}/{ps['n']})",
                     per_image, verdict])
    return markdown_table(["rank", "approach", "Dice", "leader minus it, per seed (seeds ahead)", "per image (Wilcoxon p)",
                           "by the rule"], rows)
