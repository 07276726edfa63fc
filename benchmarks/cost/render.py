"""Renderers of the cost page's script tables: the label space (``multiclass_cost.py``), a round against the device's
limit (``round_limit.py``), the bundle path against today's path (``bundle_path.py``) and homomorphic aggregation
against the same job in the clear (``he_cost.py``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

from benchmarks.core.renderers import remake, stale
from fedseg.markdown import markdown_table


def render_multiclass_cost(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/cost/multiclass_cost.py``'s JSON: one row per label space and their ratio; the in-process interleaved
    engine timings in the last two columns."""
    from benchmarks.core.tables import caption

    data = outputs[0]
    costs, ratio, engine = data["costs"], data["ratio_c3_over_c2"], data.get("interleaved_engine") or {}
    rows = []
    for name, c in costs.items():
        e = engine.get(name) or {}
        rows.append([name, f"{c['median_round_wall_s']:.2f}", f"{c['median_site_compute_s']:.2f}",
                     f"{c['peak_site_memory_mb']:.0f}", f"{c['upload_mb_per_site_round']:.3f}", f"{c['mean_test_dice']:.3f}"]
                    + ([f"{e['train']:.2f}", f"{e['evaluate']:.2f}"] if e else ["-", "-"]))
    r, er = ratio, engine.get("ratio") or {}
    rows.append(["ratio C=3 / C=2", f"{r['median_round_wall_s']:.2f}x", f"{r['median_site_compute_s']:.2f}x",
                 f"{r['peak_site_memory_mb']:.2f}x", f"{r['upload_mb_per_site_round']:.4f}x", ""]
                + ([f"{er['train']:.2f}x", f"{er['evaluate']:.2f}x"] if er else ["-", "-"]))
    lines = markdown_table(["label space", "median round wall (s)", "median site compute (s)", "peak site memory (MB)",
                            "upload per site per round (MB)", "mean test Dice", "local epoch, in process (s)",
                            "test evaluation, in process (s)"], rows)
    note = ("One FedAvg bench per label space (first round left out of the medians); mean test Dice = the mean over the "
            "foreground classes (C=3: rim, cup; C=2: disc), so the two are not comparable; in-process columns: median over "
            f"{engine.get('repeats', '?')} interleaved repeats on site {engine.get('site', '?')}, "
            f"{engine.get('threads', '?')} torch thread. {remake(table_id)}{stale(data)}")
    return [caption(data, table["title"], note), "", *lines]


def round_limit_rows(record: Mapping[str, Any]) -> List[str]:
    """``benchmarks/cost/round_limit.py``'s record as a markdown table (header included)."""
    rows = []
    for label, row in record["methods"].items():
        lim = row["limit"]
        shared = lim.get("shared_limit_s")
        compute = row.get("slowest_site_compute_s")
        shared_cells = ["-", "-"] if shared is None else [f"{shared:.2f}", f"{row['ratio_to_shared_limit']:.2f}x"]
        rows.append([label, f"{row['tasks_per_round']:g}", f"{row['round0_s']:.1f}", f"{row['median_round_s']:.2f}",
                     "-" if compute is None else f"{compute:.2f}", f"{lim['limit_s']:.2f}", f"{row['ratio_to_limit']:.2f}x",
                     *shared_cells, f"{row.get('round_ratio_to_fedavg', 1.0):.2f}x"])
    return markdown_table(["method", "tasks per round", "round 0 (s)", "median round (s)",
                           "slowest site's compute in the round (s)", "limit (s)", "round / limit", "shared limit (s)",
                           "round / shared limit", "round vs FedAvg"], rows)


#: what a round-limit table's columns mean
ROUND_LIMIT_NOTE = (
    "Median round = over rounds 1.. of one `fedseg bench` run per method (NVFlare's simulator, one process per site); "
    "round 0 holds the sites' start-up (each site process imports torch and MONAI). Limit = the slowest site alone: its "
    "round's training steps in a plain PyTorch loop over the same batches already resident on the device, plus its "
    "validation forward pass. Shared limit = every site's plain loop at once, one process per site as the simulator "
    "runs them: the floor of a round whose sites share the machine.")


def render_round_limit(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/cost/round_limit.py``'s JSON: per method its round against the device's limit."""
    from benchmarks.core.tables import caption

    data = outputs[0]
    split = "; ".join(
        f"{label}: " + ", ".join(f"{task} {t['deliver']:.2f} / {t['site']:.2f} / {t['return']:.2f}"
                                 for task, t in row["task_breakdown"].items())
        for label, row in data["methods"].items())
    note = (f"`{data['command']}`, {len(data['sites'])} sites. {ROUND_LIMIT_NOTE} Each task's median deliver / site / "
            f"return (s): {split}. {remake(table_id)}{stale(data)}")
    return [caption(data, table["title"], note), "", *round_limit_rows(data)]




#: the paths of ``benchmarks/cost/bundle_path.py`` as its tables name them
BUNDLE_PATH_ARMS = {"bundle": "bundle path (`--bundle`)",
                    "bundle_cached": "bundle path, its datasets set to `CacheDataset`",
                    "today": "today's path", "today_nonresident": "today's path, `resident_data=false`"}


def _curve(values: Sequence[Any]) -> str:
    return " ".join("-" if v is None else f"{v:.3f}" for v in values)


def _diff(value: Any) -> str:
    return "-" if value is None else ("0" if value == 0 else f"{value:.1e}")


def _case_cell(name: str, case: Mapping[str, Any]) -> str:
    return f"{name.upper()}: `{case['bundle']}`, {case['family']}, {len(case['sites'])} sites"


def bundle_path_rows(record: Mapping[str, Any]) -> List[str]:
    """``benchmarks/cost/bundle_path.py``'s record as table rows (header included): per case and path the median round,
    its ratio to today's path, the slowest site's compute, the per-round validation Dice and how far it is from the
    bundle path's."""
    rows = []
    for name, case in record["cases"].items():
        for arm, label in BUNDLE_PATH_ARMS.items():
            row = case["arms"][arm]
            compute = row.get("median_max_site_compute_s")
            rows.append([_case_cell(name, case), label, f"{row['median_round_s']:.2f}", f"{row['ratio_to_today']:.2f}x",
                         "-" if compute is None else f"{compute:.2f}", f"{row['median_round0_s']:.1f}",
                         _curve(row["val_dice"]), "-" if arm == "bundle" else _diff(row["diff_from_bundle"]["val_dice"])])
    return markdown_table(["case", "path", "median round (s)", "vs today's path", "slowest site's compute in the round (s)",
                           "round 0 (s)", "val Dice per round (mean over sites)",
                           "largest difference from the bundle path's val Dice"], rows)


def render_bundle_path(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/cost/bundle_path.py``'s JSON: FedAvg's round on the bundle path against today's path, per case."""
    from benchmarks.core.tables import caption

    data = outputs[0]
    cases = data["cases"].values()
    loads = [r["loadavg_at_start"][0] for c in cases for runs in c["runs"].values() for r in runs if r.get("loadavg_at_start")]
    load = f"; 1-minute load at the runs' starts {min(loads):.1f}-{max(loads):.1f} (a shared machine)" if loads else ""
    repeats = max(v for c in cases for row in c["arms"].values() for v in row["repeats_max_diff"].values())
    losses = "; ".join(f"{name.upper()}: " + ", ".join(f"{BUNDLE_PATH_ARMS[arm]} {_diff(c['arms'][arm]['diff_from_bundle']['train_loss'])}"
                                                        for arm in BUNDLE_PATH_ARMS if arm != "bundle")
                       for name, c in data["cases"].items())
    settings = "; ".join(f"{name.upper()}: `{c['commands']['bundle']}`" for name, c in data["cases"].items())
    note = (f"`{data['command']}`: FedAvg, {data['rounds']} rounds, NVFlare's simulator (one process per site, one torch "
            f"thread each), {data['repeats']} runs per path interleaved, the order reversed every repeat{load}. Median "
            "round = over rounds 1.. of every run (round 0 holds the site processes' start-up); val Dice = the sites' "
            "validation Dice after local training, from the first run (a path's runs differ by at most "
            f"{_diff(repeats)}). Largest difference of the per-round train loss from the bundle path's: {losses}. "
            f"The bundle path: {settings}; `CacheDataset` adds `--set train#dataset#_target_=CacheDataset "
            "validate#dataset#_target_=CacheDataset`; today's path: `--site-datalists` with the same `--set` (the "
            f"commands are in the record). {remake(table_id)}{stale(data)}")
    return [caption(data, table["title"], note), "", *bundle_path_rows(data)]


def bundle_path_site_rows(record: Mapping[str, Any]) -> Tuple[List[str], List[str]]:
    """``benchmarks/cost/bundle_path.py``'s in-process site profile as table rows (header included), and the volume
    cases' validation-Dice checks as sentences."""
    labels = {**BUNDLE_PATH_ARMS, "bundle": "bundle path"}
    rows, checks = [], []
    for name, case in record["cases"].items():
        profile = case.get("site_profile")
        if not profile:
            continue
        medians = profile["medians"]
        for arm, label in labels.items():
            m = medians[arm]
            rows.append([f"{_case_cell(name, case)}, {profile['site']}", label, f"{m['train_s']:.3f}",
                         f"{m['validation_s']:.3f}", f"{m['site_round_s']:.3f}",
                         f"{m['site_round_s'] / medians['today']['site_round_s']:.2f}x"])
        first = profile.get("initial_val_dice")
        if first:
            checks.append(f"{name.upper()}, the initial model's validation Dice on {profile['site']}: the bundle path "
                          f"with its postprocessing as written {first['bundle_postprocessing_as_written']:.6f}, "
                          f"with `Invertd` first {first['bundle_invertd_before_softmax']:.6f}, today's path "
                          f"{first['today_nonresident']:.6f}")
    lines = markdown_table(["case", "path's engine", "local epoch (s)", "validation (s)", "site's round (s)",
                            "vs today's path"], rows)
    return lines, checks


def render_bundle_path_site(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/cost/bundle_path.py``'s in-process site profile: one local epoch and one validation per engine."""
    from benchmarks.core.tables import caption

    data = outputs[0]
    lines, checks = bundle_path_site_rows(data)
    repeats = next((c["site_profile"]["repeats"] for c in data["cases"].values() if c.get("site_profile")), None)
    note = (f"`{data['command']}`, in one process after the simulator runs: each case's first site, one torch thread, "
            f"the four paths' engines in turn, {repeats} local epochs and validations each, medians over all but the "
            "first. " + ("; ".join(checks) + ". " if checks else "") + f"{remake(table_id)}{stale(data)}")
    return [caption(data, table["title"], note), "", *lines]


#: the modes of ``benchmarks/cost/he_cost.py`` as its table names them
HE_COST_MODES = {"plain": "in the clear", "he": "HE (CKKS)"}


def _he_arm_cell(arm: Mapping[str, Any]) -> str:
    return f"{arm['method']}, {arm['family']} ({arm['data_profile']} data), {len(arm['sites'])} sites"


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _he_model_diff(acc: Mapping[str, Any], rounds: int) -> str:
    """The HE row's model cell: after one round against CKKS's bound, after every round against two plaintext runs."""
    first = acc.get("one_round")
    head = (f"after 1 round {_diff(first['max_abs_diff_global_model'])} (CKKS bound "
            f"{_diff(first['ckks_bound_one_aggregation'])}); " if first else "")
    return (f"{head}after {rounds} rounds {_diff(acc['max_abs_diff_global_model'])} (two plain runs "
            f"{_diff(acc.get('plain_repeats_max_abs_diff'))})")


def he_cost_rows(record: Mapping[str, Any]) -> List[str]:
    """``benchmarks/cost/he_cost.py``'s record as table rows (header included): per arm a row per mode (median round,
    server CPU per round, bytes up / down per round, final test Dice per site) and their ratio HE / plain, with the
    largest difference of the final global models and of the Dice."""
    rows = []
    for arm in record["arms"].values():
        cell, acc = _he_arm_cell(arm), arm["accuracy"]
        for mode, label in HE_COST_MODES.items():
            m = arm["modes"][mode]
            cpu = m.get("median_server_cpu_s")
            dice = " / ".join(f"{d:.3f}" for _, d in sorted(m["final_test_dice"].items()))
            diff = "" if mode == "plain" else _he_model_diff(acc, record["rounds"])
            rows.append([cell, label, f"{arm['parameters']:,}", f"{m['median_round_s']:.2f}",
                         "-" if cpu is None else f"{cpu:.2f}", f"{m['bytes_up_per_round'] / 1e6:.2f}",
                         f"{m['bytes_down_per_round'] / 1e6:.2f}", dice, diff])
        r = arm["ratio_he_over_plain"]
        rows.append([cell, "HE / plain", "", _ratio(r["median_round_s"]), _ratio(r["median_server_cpu_s"]),
                     _ratio(r["bytes_up_per_round"]), _ratio(r["bytes_down_per_round"]),
                     f"largest difference {_diff(acc['max_abs_diff_final_test_dice'])}", ""])
    return markdown_table(["arm", "aggregation", "model's float values", "median round (s)", "server CPU per round (s)",
                           "up per round, all sites (MB)", "down per round, all sites (MB)",
                           "final global model's test Dice per site", "largest difference plain - HE in the global model"],
                          rows)


def render_he_cost(table_id: str, table: Mapping[str, Any], outputs: Sequence[Dict[str, Any]], **_) -> List[str]:
    """``benchmarks/cost/he_cost.py``'s JSON: per arm the round, server CPU and payload with homomorphic aggregation
    against the same job in the clear, and how far apart their models end."""
    from benchmarks.core.tables import caption

    data = outputs[0]
    arms = data["arms"].values()
    loads = [r["loadavg_at_start"][0] for a in arms for runs in a["runs"].values() for r in runs if r.get("loadavg_at_start")]
    load = f"; 1-minute load at the runs' starts {min(loads):.1f}-{max(loads):.1f} (a shared machine)" if loads else ""
    he_repeats = max((a["accuracy"].get("he_repeats_max_abs_diff") or 0.0 for a in arms), default=0.0)
    settings = "; ".join(f"`{a['commands']['he']}`" for a in arms)
    note = (f"`{data['command']}`: {data['rounds']} rounds, NVFlare's simulator (one process per site, one torch "
            f"thread each), {data['repeats']} runs per mode interleaved, the order reversed every repeat{load}. "
            "Median round and server CPU (the server process's CPU seconds in the round) = over rounds 1.. of every "
            "run (round 0 holds the site processes' start-up); up / down = the bytes the sites sent the server / the "
            "server sent the sites in a round, all sites together; model's float values = the floating-point entries "
            "of the model's state (what a site encrypts: parameters and batch-norm statistics). Test Dice per site: "
            "the final global model's, first run of each mode. Largest difference plain - HE: over every float value "
            "of the final global model, the plaintext server's against each HE site's decrypted copy, all runs with "
            "the same seed. After 1 round: a plain and an HE run of one round, whose sites train identically, so "
            "that one CKKS aggregation alone separates them (its bound `CKKS_ABS_TOL` x max(1, max |x|)); after "
            f"{data['rounds']} rounds: the first runs of each mode, whose later rounds train from global models "
            "already that far apart, beside the difference between two plaintext runs of the same job (two HE runs: "
            f"at most {_diff(he_repeats)}). The HE runs: {settings} (the plaintext ones without `--he`). "
            f"{remake(table_id)}{stale(data)}")
    return [caption(data, table["title"], note), "", *he_cost_rows(data)]
