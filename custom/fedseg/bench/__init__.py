"""``fedseg bench``: compare federated methods with local-only and pooled references over seeds.

Modules:
    simulator  run an exported job in NVFlare's simulator, read its report and round timings;
    runs       one (method, seed) simulator run or one (reference, seed) in-process run, stored as
               ``<out>/runs/<run id>.json`` (resumable); per-image test results read back from the
               site workspaces;
    stats      mean +- std over seeds, paired tests (Wilcoxon signed-rank, paired t-test) against FedAvg;
    report     ``results.json``, ``results.md`` and ``plots/``;
    bench      the command itself (:func:`run_bench`).
"""
