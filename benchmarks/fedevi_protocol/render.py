"""Renderer of FedEvi's protocol ablation: one bench per local-protocol setting, each method against the
reference bench's runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from benchmarks.core.registry import run_ids
from benchmarks.core.renderers import remake, stale
from benchmarks.core.runs import load_runs


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
    from fedseg.bench.report import format_p, format_seed_difference
    from fedseg.bench.stats import compare, seed_differences, summarise_seeds
    from fedseg.bench.tables import caption, column_header

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
    head = ["local protocol (FedAvg / FedEvi trained alike)", "score", "FedAvg", "FedEvi",
            "FedEvi − FedAvg per seed", "FedEvi − FedAvg per image (Wilcoxon p)",
            "FedAvg vs suite default (p)", "FedEvi vs suite default (p)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for bench, base, method, setting, metric, model in table["rows"]:
        if bench not in runs or base not in runs[bench] or method not in runs[bench]:
            continue
        a, b = runs[bench][method], runs[bench][base]
        per_seed = seed_differences(finals(a, model), finals(b, model), sites, metric)
        label = column_header(first, metric) + ("" if model == "global" else ", best val round")
        cells = [setting, label, score(b, metric, model), score(a, metric, model), format_seed_difference(per_seed),
                 paired(a, b, metric, model, model)]
        same_reading = metric == "dice" and model == "global" and (bench, base, method) != tuple(table["reference"])
        if same_reading and ref_bench in runs:
            cells += [paired(b, runs[ref_bench][ref_base], "dice", "global") if (bench, base) != (ref_bench, ref_base) else "",
                      paired(a, runs[ref_bench][ref_method], "dice", "global") if (bench, method) != (ref_bench, ref_method) else ""]
        else:
            cells += ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    absent = [f"`{name}`" for name, o in benches.items() if o is None]
    dates = sorted(str(o.get("date", ""))[:16].replace("T", " ") for o in present.values())
    note = ("One bench per setting (the same federation, seeds, rounds and epochs; the caption's budget is the first "
            "bench's, each bench's command is in the registry: `python benchmarks/reproduce.py --list`); in each, FedAvg "
            "and FedEvi train with the same local protocol. Score cells: mean over sites, mean ± std over seeds. Per seed: each seed's mean over "
            "sites, FedEvi minus FedAvg (seeds ahead). Per image: mean per-image difference, same seed, pooled over seeds "
            "and sites, two-sided Wilcoxon. 'vs suite default': the same method's per-image difference to its run under the "
            f"suite default (first row). Benches dated {dates[0]} to {dates[-1]}."
            + (f" Not run yet: {', '.join(absent)}." if absent else "")
            + (f" Published: {table['paper']}." if table.get("paper") else "") + f" {remake(table_id)}{stale(first)}")
    return [caption(first, table["title"], note), "", *lines]
