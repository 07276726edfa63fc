"""The suite's benchmarks and the results pages drawn from their records.

* ``reproduce.py`` — the command: ``python benchmarks/reproduce.py TABLE [--run]``, ``--check-page``, ``--list``;
* ``core/`` — what every page shares: run records (``records``), registry entries and outputs (``registry``,
  ``outputs``), rendering (``render``, ``renderers``; a bench's tables and captions: ``tables``), the page check
  (``page``) and figures (``figures``);
* ``registry.py`` — every page's registry gathered;
* one folder per results page, holding its registry (``registry.py``) and the scripts that make its records:
  ``overview/`` (``docs/benchmarks.md``), ``accuracy/``, ``fedevi_protocol/``, ``server_step/``, ``cost/``,
  ``fullsize/``, ``gpu/``, ``fedefm/`` (``docs/results/<question>.md``);
* ``results/`` — the committed run records (JSON only).

Imports go one way: scripts and page registries import ``core``; ``core`` imports no page. The package is imported
as ``benchmarks`` with the repository root first on ``sys.path`` (the scripts put it there), because another
distribution (opacus) installs a top-level ``benchmarks`` of its own.
"""
