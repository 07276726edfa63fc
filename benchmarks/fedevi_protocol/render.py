"""Renderers of a method's protocol ablation (FedEvi's, GraphFedSeg's: one bench per local-protocol setting, the method
against FedAvg and each against the reference bench's runs) and of FedEvi's weights traced round by round."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from benchmarks.core.registry import run_ids
from benchmarks.core.renderers import remake, stale
from benchmarks.core.runs import load_runs
from fedseg.markdown import markdown_table


def bench_name(run_id: str) -> str:
    """A protocol bench's short name: ``fedevi-protocol-retina-base`` -> ``retina-base``."""
    return run_id[len("fedevi-protocol-"):] if run_id.startswith("fedevi-protocol-") else run_id


def render_protocol_ablation(table_id: str, table: Mapping[str, Any], outputs: Sequence[Optional[Dict[str, Any]]],
                             **_) -> List[str]:
    """One row per ``rows`` entry ``(bench, baseline label, method label, setting, metric, model)``: the baseline's and
    the method's score (mean over sites, mean ± std over seeds), the method − baseline difference per seed (mean ±
    std, seeds ahead) and per test image (pooled over seeds and sites, Wilcoxon), and each one's paired difference
    to the ``reference`` row's runs (the same images and seeds in another bench: what the setting does to each
    method). Benches with no output yet are named in the note (``missing_ok``)."""
    from benchmarks.core.tables import caption, column_header
    from fedseg.bench.report import format_p, format_seed_difference
    from fedseg.bench.stats import compare, seed_differences, summarise_seeds

    benches = {bench_name(r): o for r, o in zip(run_ids(table), outputs)}
    present = {name: o for name, o in benches.items() if o is not None}
    runs = {name: load_runs(Path(o["_output_dir"])) for name, o in present.items()}
    first = next(iter(present.values()))
    sites = list(first["sites"])

    def per_image(records, model):
        return {r["seed"]: r["per_image"].get(model, {}) for r in records}

    def finals(records, model):
        return {r["seed"]: r["final"].get(model, {}) for r in records}

    def score(records, metric, model) -> str:
        s = summarise_seeds(finals(records, model), sites, metrics=(metric,))["mean"][metric]
        return "-" if s.get("mean") is None else f"{s['mean']:.3f} ± {s['std']:.3f}"

    def paired(a, b, metric, model_a, model_b="global") -> str:
        t = compare(per_image(a, model_a), per_image(b, model_b), sites, metrics=(metric,))[metric]["all"]
        return "-" if t.get("mean_diff") is None else f"{t['mean_diff']:+.3f} ({format_p(t.get('wilcoxon_p'))})"

    ref_bench, ref_base, ref_method = table["reference"]
    name = table.get("method_name", "FedEvi")
    head = [f"local protocol (FedAvg / {name} trained alike)", "score", "FedAvg", name,
            f"{name} − FedAvg per seed", f"{name} − FedAvg per image (Wilcoxon p)",
            "FedAvg vs suite default (p)", f"{name} vs suite default (p)"]
    published = table.get("published")  # (column header, {row index: published number})
    if published:
        head.append(published[0])
    rows = []
    labels = {"global": "", "global_best_val": ", best val round", "local": ", local models",
              "personalized": ", personalised"}
    for index, row in enumerate(table["rows"]):
        # a 7th entry: the baseline's model where it differs from the method's (a personalised model against the
        # baseline's global model)
        bench, base, method, setting, metric, model = row[:6]
        base_model = row[6] if len(row) > 6 else model
        if bench not in runs or base not in runs[bench] or method not in runs[bench]:
            continue
        a, b = runs[bench][method], runs[bench][base]
        per_seed = seed_differences(finals(a, model), finals(b, base_model), sites, metric)
        label = column_header(first, metric) + labels[model] + (f" vs {labels[base_model][2:] or 'global'}"
                                                                 if base_model != model else "")
        cells = [setting, label, score(b, metric, base_model), score(a, metric, model), format_seed_difference(per_seed),
                 paired(a, b, metric, model, base_model)]
        same_reading = metric == "dice" and model == "global" and (bench, base, method) != tuple(table["reference"])
        if same_reading and ref_bench in runs:
            cells += [paired(b, runs[ref_bench][ref_base], "dice", "global") if (bench, base) != (ref_bench, ref_base) else "",
                      paired(a, runs[ref_bench][ref_method], "dice", "global") if (bench, method) != (ref_bench, ref_method) else ""]
        else:
            cells += ["", ""]
        if published:
            cells.append(published[1].get(index, ""))
        rows.append(cells)
    lines = markdown_table(head, rows)
    absent = [f"`{bench}`" for bench, o in benches.items() if o is None]
    dates = sorted(str(o.get("date", ""))[:16].replace("T", " ") for o in present.values())
    note = ("One bench per setting (the same federation, seeds, rounds and epochs; the caption's budget is the first "
            "bench's, each bench's command is in the registry: `python benchmarks/reproduce.py --list`); in each, FedAvg "
            f"and {name} train with the same local protocol. Score cells: mean over sites, mean ± std over seeds. Per seed: each seed's mean over "
            f"sites, {name} minus FedAvg (seeds ahead). Per image: mean per-image difference, same seed, pooled over seeds "
            "and sites, two-sided Wilcoxon. 'vs suite default': the same method's per-image difference to its run under the "
            f"suite default (first row). Benches dated {dates[0]} to {dates[-1]}."
            + (f" Not run yet: {', '.join(absent)}." if absent else "")
            + (f" Published: {table['paper']}." if table.get("paper") else "") + f" {remake(table_id)}{stale(first)}")
    return [caption(first, table["title"], note), "", *lines]


#: the rounds the FedEvi weights trace shows
TRACE_ROUNDS = (1, 2, 5, 10, 20, 30)


def render_fedevi_weights_trace(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """One row per round of :data:`TRACE_ROUNDS`: G, A and beta of each site (``first / second``) in the suite's run and
    in the authors' loop with the same seed, then the suite's A and first-site beta over all its seeds (mean ± std);
    ``published``: (column headers, {round: cells}) of real runs beside them."""
    import numpy as np

    data = outputs[0]
    sites = list(data["sites"])
    suite, loop = data["runs"]["suite"], data["runs"]["loop"]
    paired = sorted(set(suite) & set(loop), key=int)
    seed = paired[0] if paired else None

    def pair(trace, key, r):
        return " / ".join(f"{trace[key][r - 1][s]:.3f}" for s in sites)

    def spread(values):
        return f"{np.mean(values):.3f} ± {np.std(values):.3f}"

    head = ["round", f"suite seed {seed}: G", "A", "beta", f"authors' loop seed {seed}: G", "A", "beta",
            f"suite, {len(suite)} seeds: A {sites[0]}", f"A {sites[1]}", f"beta {sites[0]}"]
    published = table.get("published")
    if published:
        head += list(published[0])
    rows = []
    for r in [r for r in TRACE_ROUNDS if r <= data["rounds"]]:
        cells = [str(r)]
        for trace in (suite.get(seed), loop.get(seed)):
            cells += [pair(trace, k, r) for k in ("G", "A", "beta")] if trace else ["-"] * 3
        cells += [spread([suite[x]["A"][r - 1][s] for x in suite]) for s in sites]
        cells.append(spread([suite[x]["beta"][r - 1][sites[0]] for x in suite]))
        if published:
            cells += list(published[1].get(r, [""] * len(published[0])))
        rows.append(cells)
    lines = markdown_table(head, rows)
    gaps = {k: max(abs(suite[seed][k][r][s] - loop[seed][k][r][s]) for r in range(data["rounds"]) for s in sites)
            for k in ("G", "A", "beta")} if seed is not None else {}
    first_gaps = {k: max(abs(suite[seed][k][0][s] - loop[seed][k][0][s]) for s in sites)
                  for k in ("G", "A", "beta")} if seed is not None else {}
    missing = [s for s in map(str, data["seeds"]) if s not in suite]
    n = ", ".join(f"{s} {data['sites'][s]['n_train']}" for s in sites)
    cfg = data["train_config"]
    version = data["code_version"]
    note = (f"Two built-in polyp sites (training images: {n}), FedEvi's `paper` profile at {data['image_size']} px, "
            f"{cfg['local_epochs']} local epoch, batch {cfg['batch_size']}, {data['rounds']} rounds; cells `{sites[0]} / {sites[1]}`. "
            f"Largest difference suite − loop, seed {seed}: round 1 "
            + ", ".join(f"{k} {v:.1e}" for k, v in first_gaps.items()) + "; every round "
            + ", ".join(f"{k} {v:.1e}" for k, v in gaps.items())
            + (f". Seed(s) {', '.join(missing)} of the command did not finish" if missing else "")
            + f". Machine: {data['machine'].get('cpu_count', '?')} CPUs; {str(data.get('date', ''))[:16].replace('T', ' ')}; "
            f"code {version.get('commit')}{'+dirty' if version.get('dirty') else ''}. {remake(table_id)}")
    return [f"**{table['title']}.** {note}", "", *lines]
