"""``python benchmarks/reproduce.py``'s command line: list, render, run, record and check the registry's tables."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from benchmarks.core import registry
from benchmarks.core.figures import FIGURES, write_figure
from benchmarks.core.outputs import DEFAULT_ROOT, OUT_ROOT
from benchmarks.core.page import check_pages, update_page
from benchmarks.core.registry import MissingOutput, ReproduceError, check_registry
from benchmarks.core.render import RENDERERS, listing, render
from fedseg.processes import StopOnSignal


@StopOnSignal("reproduce.py")  # SIGTERM / Ctrl-C during --run end the commands it runs and their processes
def main(argv: Optional[Sequence[str]], runs: Mapping[str, Mapping[str, Any]], tables: Mapping[str, Mapping[str, Any]],
         description: str = __doc__) -> int:
    """``reproduce.py``'s command line over the registry ``runs`` / ``tables``; the exit status."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", metavar="TABLE", help="table ids (see --list); 'glance' for the overview")
    parser.add_argument("--run", action="store_true", help="run the tables' commands first (fedseg bench resumes)")
    parser.add_argument("--list", action="store_true", help="list the tables with their outputs and commands")
    parser.add_argument("--all", action="store_true", help="render every table whose output exists")
    parser.add_argument("--records", default=str(DEFAULT_ROOT),
                        help="where the run records are read from (default: the repository's benchmarks/results)")
    parser.add_argument("--out-root", default=None,
                        help="where --run writes outputs and --record reads them (default $FEDSEG_BENCH_OUT, else ./bench_out)")
    parser.add_argument("--data-root", default=None,
                        help="the folder holding the real data sets, for the import commands (default $FEDSEG_DATASETS)")
    parser.add_argument("--record", action="store_true",
                        help="record the tables' outputs from --out-root into --records, then render")
    parser.add_argument("--check-page", nargs="+", metavar="PAGE", default=None,
                        help="check that every table and figure on these pages equals its render from the records")
    parser.add_argument("--update-page", nargs="+", metavar="PAGE", default=None,
                        help="rewrite every table block of these pages with its render from the records")
    parser.add_argument("--figures", default=None, metavar="DIR",
                        help="with --all: also write every figure into DIR (the page's figures: docs/figures)")
    parser.add_argument("--link", default=None,
                        help="one page the glance links every source table to (default: each table's own page)")
    parser.add_argument("--ignore-command", action="store_true",
                        help="render outputs made by another command than the registry's (the caption says so)")
    args = parser.parse_args(argv)
    root = Path(args.records)
    out_root = Path(args.out_root) if args.out_root else OUT_ROOT
    registry.DATA_ROOT = args.data_root or registry.DATA_ROOT
    try:
        check_registry(runs, tables, RENDERERS)
    except ReproduceError as e:
        print(f"reproduce.py: bad registry: {e}", file=sys.stderr)
        return 2
    if args.list:
        sys.stdout.write(listing(root, runs, tables, out_root))
        return 0
    if args.check_page:
        problems = check_pages([Path(p) for p in args.check_page], root, runs, tables)
        for problem in problems:
            print(f"reproduce.py: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if args.update_page:
        for page in args.update_page:
            print(f"{page}: {', '.join(update_page(Path(page), root, runs, tables)) or 'no table blocks'}", file=sys.stderr)
        return 0
    if not args.tables and not args.all:
        parser.error("name a TABLE, or use --all, --list, --check-page or --update-page")
    if args.all and (args.run or args.record):
        parser.error("--all renders the records only; name the tables to --run or --record")
    failed = 0
    if args.figures:
        for figure_id in FIGURES:
            try:
                print(write_figure(figure_id, Path(args.figures), root, runs), file=sys.stderr)
            except ReproduceError as e:
                print(f"reproduce.py: figure {figure_id}: {e}", file=sys.stderr)
                failed += 1
    ids = list(tables) if args.all else args.tables
    blocks = []
    for table_id in ids:
        try:
            blocks.append(render(table_id, root, run=args.run, link=args.link, ignore_command=args.ignore_command,
                                 runs=runs, tables=tables, out_root=out_root, record=args.record))
        except MissingOutput as e:
            print(f"reproduce.py: {table_id}: {e}", file=sys.stderr)
            failed += 0 if args.all else 1  # --all renders what exists
        except ReproduceError as e:
            print(f"reproduce.py: {table_id}: {e}", file=sys.stderr)
            failed += 1
    sys.stdout.write("\n".join(blocks))
    return 1 if failed else 0
