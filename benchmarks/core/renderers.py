"""The renderers every page may use: a table's markdown (a one-line caption above one markdown table) from its run's
stored output. A table entry (``TABLES[id]``) names its renderer and options:

* ``accuracy`` (a bench against its baseline): ``"data"``, its row label in the glance table (for runs whose baseline
  is FedAvg); ``"metrics"``, extra accuracy columns such as ``hd95_mm`` or ``dice_fov@DRIVE`` (one site's value of a
  metric only that site reports); ``"seeds"``, render only these seeds of a bench, re-aggregated from its run records
  (which also accepts a bench whose command differs only in ``--seeds``, as long as it ran them); ``"baseline"``,
  another of the bench's labels as the baseline of the paired tests (the bench re-aggregated from its run records);
  ``"paper"``, a column of published numbers; ``"glance_labels"``, ``{approach: name}``, the glance rows of a
  published method whose arms are ablation rows (FedEFM's downstream UNETR from a foundation checkpoint);
* ``cost``, ``ranking`` (which approach to use, by the rule), ``overview`` (several benches, one row each),
  ``pairs`` (two approaches of one bench; ``[A, B, published]`` and ``"paper_note"``: a paper column; ``"parts"``:
  what each pair tests; ``"rule": true``: the per-seed difference and the rule's verdict),
  ``budget`` (one column per bench of more rounds), ``versus`` (the approaches of ``"labels"`` against each of
  ``"against"``, per seed and per image; ``"round_time": false`` drops its round-time column, for a bench whose
  runs were timed on different days and loads);
* ``glance`` and ``verdicts``: rows of other accuracy tables (``"from"``; ``"baselines_from"``: more benches whose
  baselines compete for the "best baseline" row).

``"missing_ok"``: a multi-run table drawn from the runs that exist, naming the others.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from benchmarks.core.outputs import load_output, merge_benches, select_seeds
from benchmarks.core.registry import MissingOutput, ReproduceError, run_ids
from benchmarks.core.runs import load_runs, median_round_wall, per_image
from fedseg.markdown import markdown_table


def remake(table_id: str) -> str:
    return f"Re-make: `python benchmarks/reproduce.py {table_id} --run`."


def stale(results: Mapping[str, Any]) -> str:
    """What the caption must add: an output made by another command, or a table of some of a bench's seeds."""
    text = (f" NOTE: made by `{results['_command_differs']}`, not by the registry's command."
            if results.get("_command_differs") else "")
    if results.get("_seeds_of") is not None and list(results["_seeds_of"]) != list(results.get("seeds") or []):
        text += (f" Seed(s) {', '.join(map(str, results['seeds']))} of a bench that ran seed(s) "
                 f"{', '.join(map(str, results['_seeds_of']))} (re-aggregated from its run records).")
    return text


def render_accuracy(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    from benchmarks.core.tables import accuracy_note, accuracy_rows, caption

    results = outputs[0]
    header, rows = accuracy_rows(results, table.get("metrics", ()))
    note = f"{accuracy_note(results)} {remake(table_id)}{stale(results)}"
    if table.get("paper"):
        header, rows = with_paper_column(header, rows, results, table["paper"])
        note += f" Paper column: {table['paper']['note']}"
    return [caption(results, table["title"], note), "", *markdown_table(header, rows)]


def with_paper_column(header: Sequence[str], rows: Sequence[Sequence[str]], results: Mapping[str, Any],
                      paper: Mapping[str, Any]) -> Tuple[List[str], List[List[str]]]:
    """The header and rows of :func:`benchmarks.core.tables.accuracy_rows` (one row per ``results["approaches"]``
    entry, in order) with a last column: ``paper["values"][label]`` (a published number, typed into the registry with
    its source) on the first row of each label, blank elsewhere."""
    entries = list(results.get("approaches", {}).values())
    if len(rows) != len(entries):
        raise ReproduceError(f"{len(rows)} table rows for {len(entries)} approaches: cannot add the paper column")
    out, seen = [], set()
    for row, entry in zip(rows, entries):
        label = entry["label"]
        out.append([*row, "" if label in seen else paper["values"].get(label, "")])
        seen.add(label)
    return [*header, paper["title"]], out


def render_cost(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    from benchmarks.core.tables import caption, cost_note, cost_table

    results = outputs[0]
    return [caption(results, table["title"], f"{cost_note(results)} {remake(table_id)}{stale(results)}"), "",
            *cost_table(results)]


def other_runs(table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]]) -> str:
    """`` Other runs: `id`: date, code ...`` for the runs after the first of a multi-run table (their budget where it
    differs from the first's), or ``""``."""
    from benchmarks.core.tables import budget_text, code_text

    first = budget_text(outputs[0]) if outputs[0].get("budget") else ""
    parts = []
    for run_id, o in zip(run_ids(table)[1:], outputs[1:]):
        budget = budget_text(o) if o.get("budget") else ""
        parts.append(f"`{run_id}`: " + (f"budget: {budget}; " if budget != first else "")
                     + f"{str(o.get('date', ''))[:16].replace('T', ' ')}; {code_text(o)}")
    return f" Other runs: {'; '.join(parts)}." if parts else ""


def render_overview(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """Rows = runs (one per data set), columns = every approach any run has: the mean test score over sites (Dice or
    accuracy; mean ± std over seeds). The caption is the first run's; the others' budget, date and code follow."""
    from benchmarks.core.tables import approach_title, caption, data_text, seed_cell
    from fedseg.bench.runs import task_metrics
    from fedseg.fl.report import metric_header

    names: Dict[str, str] = {}
    for results in outputs:
        for key, entry in results["approaches"].items():
            names.setdefault(approach_title(entry), key)
    rows = []
    for results, run_id in zip(outputs, run_ids(table)):
        metric = task_metrics(results.get("task", "segmentation"))[0]
        by_title = {approach_title(e): e for e in results["approaches"].values()}
        cells = [seed_cell(by_title[n]["summary"]["mean"][metric], 3) if n in by_title else "-" for n in names]
        rows.append([f"`{run_id}` (mean {metric_header(metric)})", data_text(results), *cells])
    lines = markdown_table(["data", "sites", *names], rows)
    note = ("Cells: unweighted mean over sites of each site's test mean (mean ± std over seeds where there are several)."
            + other_runs(table, outputs) + f" {remake(table_id)}" + "".join(stale(o) for o in outputs))
    return [caption(outputs[0], table["title"], note), "", *lines]


def page_link(table: Mapping[str, Any], source: Mapping[str, Any], link: Optional[str] = None) -> Optional[str]:
    """Where a row drawn from table ``source`` links, from the page ``table`` is on: ``link`` (one page for every
    source: ``--link``) where given, else the source's page relative to this table's (both ``"page"``: the
    repository-relative path the registry gives every table), else None (no link)."""
    if link:
        return link
    if not table.get("page") or not source.get("page"):
        return None
    return posixpath.relpath(source["page"], posixpath.dirname(table["page"]) or ".")


def _glance_sources(table_id: str, table: Mapping[str, Any], root: Path, tables: Mapping[str, Mapping[str, Any]],
                    runs: Mapping[str, Mapping[str, Any]], ignore_command: bool):
    """Per source table of ``table["from"]`` whose output exists: ``(source id, its entry, its results, its ranking
    or None)``, the results and ranking over the source's bench and its ``baselines_from`` benches together
    (:func:`benchmarks.core.outputs.merge_benches`); and the tables with no output yet.

    Raises:
        ReproduceError: a ``baselines_from`` bench that does not share the source's baseline runs.
    """
    found, missing = [], []
    for source in table["from"]:
        src = tables[source]
        try:
            results = load_output(run_ids(src)[0], root, runs, ignore_command)
        except MissingOutput:
            missing.append(source)
            continue
        try:  # ranked by this code's rule from the bench's run records (a stored ranking may be an older rule's)
            ranked = load_output(run_ids(src)[0], root, runs, ignore_command, baseline=results.get("baseline"))
        except (ReproduceError, ValueError):  # no run records: the bench's own ranking, if it has one
            ranked = results if results.get("ranking") else None
        others = []
        for extra in src.get("baselines_from", []):
            try:
                others.append(load_output(run_ids(tables[extra])[0], root, runs, ignore_command))
            except MissingOutput:
                missing.append(extra)
        if others:  # one bench of the source's runs and the others' approaches, ranked together
            try:
                results = ranked = merge_benches(results, others)
            except ReproduceError as e:
                raise ReproduceError(f"table {table_id!r}: {', '.join(src['baselines_from'])} cannot be paired with "
                                     f"{source!r}: {e}") from None
        found.append((source, src, results, ranked))
    if not found:
        raise MissingOutput(f"table {table_id!r}: none of its source tables has an output yet: {', '.join(table['from'])}")
    return found, missing


def render_glance(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], root: Path,
                  tables: Mapping[str, Mapping[str, Any]], runs: Mapping[str, Mapping[str, Any]],
                  link: Optional[str] = None, ignore_command: bool = False, **_) -> List[str]:
    """"Results at a glance": the rows of every listed accuracy table whose output exists (:func:`glance_rows`), each
    linking to its table's page, and above them which approach to use on each federation."""
    from benchmarks.core.tables import glance_rows, glance_table, recommendation_text

    found, missing = _glance_sources(table_id, table, root, tables, runs, ignore_command)
    rows, used, uses = [], [], []
    for source, src, results, ranked in found:
        timing_from = None
        if src.get("round_time_from"):  # the source's round times are not a cost measurement: another table's are
            timing_table = src["round_time_from"]
            timing_from = (load_output(run_ids(tables[timing_table])[0], root, runs, ignore_command), timing_table)
        try:
            rows += glance_rows(results, src.get("data") or src["title"], source, page_link(table, src, link), timing_from,
                                labels=src.get("glance_labels"))
        except ValueError as e:  # a source whose baseline is not FedAvg
            raise ReproduceError(str(e)) from None
        if ranked is not None:
            uses.append("- " + recommendation_text(ranked, src.get("data") or src["title"]))
        used.append(f"`{source}` ({str(results.get('date', ''))[:10]})")
    extra = sorted({e for _, src, _, _ in found for e in src.get("baselines_from", [])})
    note = ("Each row from its source table's own `fedseg bench` run (sources: " + ", ".join(used) + "): the method's "
            "test Dice (mean over sites, mean ± std over seeds) with FedAvg's of the same run in brackets; Δ = mean "
            "per-image difference to FedAvg (Wilcoxon p); round time = median round wall over FedAvg's in the same run, "
            "or in the cost run the cell names."
            + (f" Best baseline also from {', '.join(f'`{e}`' for e in extra)} (the same FedAvg runs)." if extra else "")
            + (f" Not yet run: {', '.join(missing)}." if missing else "")
            + f" Re-make: `python benchmarks/reproduce.py {table_id}`.")
    # before the table: a page block is its caption lines up to the end of the first markdown table (core/page.py)
    use_lines = ["Which to use, on each federation at its table's budget: the highest mean Dice, and whether it beats "
                 "every other approach by the rule (ahead in every seed, beyond the spread, paired p < 0.05) or which "
                 "approaches the rule cannot separate from it:", "", *uses, ""]
    return [f"**{table['title']}.** {note}", "", *(use_lines if uses else []), *glance_table(rows)]


def render_verdicts(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], root: Path,
                    tables: Mapping[str, Mapping[str, Any]], runs: Mapping[str, Mapping[str, Any]],
                    link: Optional[str] = None, ignore_command: bool = False, **_) -> List[str]:
    """The glance's verdict lines as a table: per source table (federation), which approach to use by the rule, why,
    and a link to the source table; ``"glance"``: the glance table's id, which the caption links to."""
    from benchmarks.core.tables import recommendation

    found, missing = _glance_sources(table_id, table, root, tables, runs, ignore_command)
    rows = []
    for source, src, _, ranked in found:
        if ranked is None:
            continue
        verdict = recommendation(ranked)
        target = page_link(table, src, link)
        cell = f"[{source}]({target}#{source})" if target else f"`{source}`"
        rows.append([src.get("data") or src["title"], f"**{verdict['use']}**", f"{verdict['how']} ({verdict['evidence']})",
                     cell])
    lines = markdown_table(["federation", "use", "by the rule", "table"], rows)
    glance = table.get("glance")
    glance_cell = ""
    if glance in tables:
        target = page_link(table, tables[glance], link)
        glance_cell = f" Every method's numbers: [{tables[glance]['title'].lower()}]({target}#{glance})." if target else ""
    note = ("Per federation at its table's budget: the approach with the highest mean test Dice, and whether it beats "
            "every other approach by the rule (ahead in every seed, beyond the spread, paired per-image p < 0.05) or "
            "which approaches the rule cannot separate from it." + glance_cell
            + (f" Not yet run: {', '.join(missing)}." if missing else "")
            + f" Re-make: `python benchmarks/reproduce.py {table_id}`.")
    return [f"**{table['title']}.** {note}", "", *lines]


def render_ranking(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """Which approach to use on a bench's federation by the page's rule (``fedseg.bench.ranking``): the approaches by
    mean Dice, the leader against each, the verdict; the caption says which to use. The table's entry sets
    ``baseline`` so that the bench is re-aggregated from its run records (the ranking needs the per-image scores)."""
    from benchmarks.core.tables import caption, ranking_table, recommendation_text

    results = outputs[0]
    if not results.get("ranking"):
        raise ReproduceError(f"table {table_id!r}: no ranking (set the table's 'baseline'; a segmentation bench of two "
                             "or more federated approaches)")
    note = (recommendation_text(results, "On this federation, at this budget") + ". The rule: ahead in every seed, the "
            "mean per-seed difference beyond its std, paired per-image Wilcoxon p < 0.05; an approach the leader does "
            "not beat by it is level with it (a difference the rule cannot confirm: the cost table says what each "
            f"round costs). References (local, pooled) are not ranked. {remake(table_id)}{stale(results)}")
    return [caption(results, table["title"], note), "", *ranking_table(results)]


def render_pairs(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """One row per ``pairs`` entry ``[A, B]`` of a bench run (two approaches, e.g. two settings of one method): each
    one's Dice (mean over sites, mean ± std over seeds), the paired difference A − B per test image (same seed; pooled
    over seeds and sites; Wilcoxon) for every metric in ``metrics``, and A's median round wall over B's, both from the
    same bench. An entry ``[A, B, published]`` adds a last column, the paper's number for the same comparison (typed
    into the registry with its source, named in ``paper_note``). ``"parts"`` (one text per pair) adds a first column,
    what the pair tests (an ablation: the one part in which A and B differ); ``"rule": true`` adds the first metric's
    per-seed difference (seeds ahead) and the verdict by the page's rule (:func:`fedseg.bench.ranking.rule_verdict`:
    "A beats B", "B beats A" or "level")."""
    from benchmarks.core.tables import approach_title, caption, column_header
    from fedseg.bench.ranking import rule_verdict
    from fedseg.bench.report import format_seed_difference
    from fedseg.bench.stats import compare, summarise_seeds

    results = outputs[0]
    runs = load_runs(Path(results["_output_dir"]))
    sites = list(results["sites"])
    metrics = list(table.get("metrics", ["dice"]))

    def seeds_cell(label: str, metric: str) -> str:
        final = {r["seed"]: r["final"]["global"] for r in runs[label]}
        having = [x for x in sites if all(f.get(x, {}).get(metric) is not None for f in final.values())]  # DRIVE's FOV
        if not having:
            return "-"
        s = summarise_seeds(final, having, metrics=(metric,))["mean"][metric]
        return f"{s['mean']:.3f} ± {s['std']:.3f}" + ("" if having == sites else f" ({', '.join(having)})")

    def p_text(v: Optional[float]) -> str:
        return "-" if v is None else (f"{v:.3f}" if v >= 1e-3 else f"{v:.1e}")

    def verdict(a: str, b: str) -> List[str]:
        entry = {x: {"final_by_seed": {r["seed"]: r["final"]["global"] for r in runs[x]},
                     "per_image_by_seed": per_image(runs[x])} for x in (a, b)}
        ab = rule_verdict(entry[a], entry[b], sites, metrics[0])
        word = "A beats B" if ab["beats"] else (
            "B beats A" if rule_verdict(entry[b], entry[a], sites, metrics[0])["beats"] else "level")
        return [format_seed_difference(ab["per_seed"]), word]

    parts, rule = table.get("parts"), bool(table.get("rule"))
    if parts is not None and len(parts) != len(table["pairs"]):
        raise ReproduceError(f"table {table_id!r}: {len(parts)} parts for {len(table['pairs'])} pairs")
    names = [column_header(results, m) for m in metrics]  # "Dice FOV", as the accuracy tables name it
    published = any(len(pair) > 2 for pair in table["pairs"])
    head = (["part tested"] if parts else []) + ["method (A vs B)"] + [
        column for h in names for column in (f"{h}: A", f"{h}: B", f"Δ {h} A − B (Wilcoxon p, pairs)")] + (
        [f"Δ {names[0]} per seed (seeds ahead)", "by the rule"] if rule else []) + [
        "round wall A / B"] + (["paper"] if published else [])
    rows = []
    for i, (a, b, *paper) in enumerate(table["pairs"]):
        cells = ([parts[i]] if parts else []) + [
            f"{approach_title(results['approaches'][a])} vs {approach_title(results['approaches'][b])}"]
        for metric in metrics:
            t = compare(per_image(runs[a]), per_image(runs[b]), sites, metrics=(metric,))[metric]["all"]
            diff = "-" if t["mean_diff"] is None else f"{t['mean_diff']:+.4f}"
            cells += [seeds_cell(a, metric), seeds_cell(b, metric), f"{diff} ({p_text(t['wilcoxon_p'])}, {t['n']})"]
        cells += verdict(a, b) if rule else []
        cells.append(f"{median_round_wall(runs[a]) / median_round_wall(runs[b]):.2f}x")
        cells += [paper[0] if paper else ""] if published else []
        rows.append(cells)
    lines = markdown_table(head, rows)
    seeds = sorted({r["seed"] for records in runs.values() for r in records})
    note = (f"A and B: two approaches of the same bench (seeds {', '.join(map(str, seeds))}); cells: mean "
            f"over sites, mean ± std over seeds; Δ: mean per-image difference, same seed, pooled over seeds and sites, "
            f"two-sided Wilcoxon signed-rank." + (
                " Δ per seed: each seed's mean over sites of A minus B's, mean ± std over seeds; by the rule: A beats B "
                "when A is ahead in every seed, the mean difference is beyond its std and the per-image p < 0.05 "
                "(docs/benchmarks.md)." if rule else "") + (f" Paper column: {table['paper_note']}" if table.get("paper_note") else "")
            + f" {remake(table_id)}{stale(results)}")
    return [caption(results, table["title"], note), "", *lines]


def render_versus(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """One row per approach of ``labels`` (each model: global, personalised) of one bench, one pair of columns per
    label of ``against``: the Dice difference to that approach's global model per seed (mean ± std over seeds, seeds
    ahead) and per test image (same seed, pooled over seeds and sites, Wilcoxon p), the bench re-aggregated from its
    run records with that label as the baseline (:func:`benchmarks.core.outputs.select_seeds`); then Dice and the
    round time over FedAvg's, unless ``"round_time"`` is false (a bench whose runs were timed on different days and
    loads: its ratios would not be a cost measurement)."""
    from benchmarks.core.tables import (
        approach_title, caption, column_spread, diff_cell, label_entry, paired_test, seed_cell, seed_difference,
    )
    from fedseg.bench.report import format_seed_difference

    results = outputs[0]
    against, labels = list(table["against"]), list(table["labels"])
    present = {e["label"] for e in results["approaches"].values()}
    missing = [x for x in labels + against if x not in present]
    if missing:
        raise ReproduceError(f"table {table_id!r}: {missing} are not approaches of the bench ({sorted(present)})")
    versus = {c: select_seeds(results, results.get("seeds") or [], baseline=c) for c in against}
    titles = {c: approach_title(label_entry(results, c)) for c in against}
    timed = table.get("round_time", True)
    head = ["approach", "Dice"] + [f"Δ Dice vs {titles[c]}: {what}" for c in against
                                   for what in ("per seed (seeds ahead)", "per image (Wilcoxon p)")] + (
        ["round time vs FedAvg"] if timed else [])
    rows = []
    names = sorted((n for n, e in results["approaches"].items() if e.get("label") in labels),
                   key=lambda n: labels.index(results["approaches"][n]["label"]))  # the registry's order, stable per label
    for name in names:
        entry = results["approaches"][name]
        cells = [approach_title(entry), seed_cell(column_spread(entry, "dice"), 3)]
        for c in against:
            if name == c:  # the comparator's own global model
                cells += ["", ""]
                continue
            comparison = (versus[c].get("comparisons") or {}).get(name)
            cells += [format_seed_difference(seed_difference(versus[c], comparison)),
                      diff_cell(paired_test(comparison, "dice"), "wilcoxon_p")]
        if timed:
            ratio = ((results.get("timing") or {}).get(entry["label"]) or {}).get("round_wall_ratio_to_fedavg")
            cells.append("-" if ratio is None else f"{ratio:.2f}x")
        rows.append(cells)
    lines = markdown_table(head, rows)
    note = ("Dice: unweighted mean over sites of each site's test mean, mean ± std over seeds. Δ per seed: each seed's "
            "mean over sites minus the other approach's of the same seed, mean ± std over seeds (seeds ahead); per "
            "image: mean per-image difference to its global model, same seed, pooled over seeds and sites, two-sided "
            "Wilcoxon signed-rank p. "
            + ("Round time: median round wall over FedAvg's in the same bench. " if timed else "")
            + f"{remake(table_id)}{stale(results)}")
    return [caption(results, table["title"], note), "", *lines]


def render_budget(table_id: str, table: Mapping[str, Any], outputs: Sequence[Optional[Dict[str, Any]]], **_) -> List[str]:
    """The budget curve: one column per bench (same federation and settings, more rounds), one row per approach of
    ``labels`` (each model: global, personalised): Dice (mean over sites; mean ± std over seeds where several) and
    the paired per-image difference to the baseline's global model of the same bench (Wilcoxon p). A bench with no
    output yet (``missing_ok``) is named in the note, not drawn."""
    from benchmarks.core.tables import approach_title, baseline_title, caption, code_text, column_spread, paired_test, seed_cell
    from fedseg.bench.report import format_p

    present = [(r, o) for r, o in zip(run_ids(table), outputs) if o is not None]
    absent = [r for r, o in zip(run_ids(table), outputs) if o is None]
    labels = table.get("labels")
    names: List[str] = []
    for _, o in present:
        names += [n for n, e in o["approaches"].items() if n not in names and (labels is None or e["label"] in labels)]
    if labels is not None:  # the registry's order, global model before personalised
        names.sort(key=lambda n: next(list(labels).index(o["approaches"][n]["label"]) for _, o in present
                                      if n in o["approaches"]))

    def rounds(o: Mapping[str, Any]) -> str:
        return str((o.get("budget") or {}).get("rounds") or "profile default")

    head = ["approach"] + [f"{rounds(o)} rounds: Dice (Δ vs {baseline_title(o)}, Wilcoxon p)" for _, o in present]
    rows = []
    for name in names:
        title, cells = None, []
        for _, o in present:
            entry = o["approaches"].get(name)
            if entry is None:
                cells.append("-")
                continue
            title = title or approach_title(entry)
            dice = seed_cell(column_spread(entry, "dice"), 3)
            test = paired_test((o.get("comparisons") or {}).get(name), "dice")
            if name == o.get("baseline") or not test or test.get("mean_diff") is None:
                cells.append(dice)
            else:
                cells.append(f"{dice} ({test['mean_diff']:+.3f}, {format_p(test.get('wilcoxon_p'))})")
        rows.append([str(title), *cells])
    lines = markdown_table(head, rows)
    columns = "; ".join(f"{rounds(o)} rounds: `{r}` ({str(o.get('date', ''))[:16].replace('T', ' ')}, {code_text(o)})"
                        for r, o in present)
    note = (f"One bench per column, each with the first's settings but its rounds: {columns}."
            + (f" Not run yet: {', '.join(f'`{r}`' for r in absent)}." if absent else "")
            + f" {remake(table_id)}{stale(present[0][1])}")
    first = dict(present[0][1])  # the caption's budget names every column's rounds
    every = " / ".join(rounds(o) for _, o in present)
    first["approaches"] = {k: {**e, "num_rounds": every} for k, e in first["approaches"].items()}
    return [caption(first, table["title"], note), "", *lines]


#: the renderers every page may use, by the name a table entry gives (``"render"``)
GENERIC = {
    "accuracy": render_accuracy, "cost": render_cost, "overview": render_overview, "ranking": render_ranking,
    "pairs": render_pairs, "budget": render_budget, "glance": render_glance, "verdicts": render_verdicts,
    "versus": render_versus,
}
