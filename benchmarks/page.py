"""The results page is a render of the committed run records: this module checks that it is.

A table on a page is written as ``<a id="TABLE"></a>`` followed by ``reproduce.py TABLE``'s output without its first
(comment) line: the caption, a blank line, the markdown table. A figure is a markdown image whose file name is a
figure id of ``figures.FIGURES`` (``![...](figures/ID.svg)``), its SVG next to the page. :func:`check_pages` re-renders
each from the records (a figure: the digest of the numbers it plots) and reports every difference, and every markdown table that is not such a block (a number on
the page without its record).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, List, Mapping, Tuple

#: the page whose every table must be a render of a record (other pages: their anchored blocks only)
RESULTS_PAGE = "benchmarks.md"
ANCHOR = re.compile(r'^<a id="([\w.-]+)"></a>\s*$')
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.svg)\)")


def table_blocks(lines: List[str]) -> Iterator[Tuple[str, int, List[str]]]:
    """``(table id, line number of its anchor (1-based), the block's lines)`` for each anchored block of ``lines``:
    the lines after the anchor up to the end of the first markdown table that follows; an empty block where the
    anchor is not followed by a caption (a bold line)."""
    for i, line in enumerate(lines):
        match = ANCHOR.match(line)
        if not match:
            continue
        block, j, in_table = [], i + 1, False
        while j < len(lines) and lines[i + 1].startswith("**"):
            is_row = lines[j].startswith("|")
            if in_table and not is_row:
                break
            in_table = in_table or is_row
            block.append(lines[j])
            j += 1
        yield match.group(1), i + 1, block


def check_page(page: Path, root: Path, runs: Mapping[str, Any], tables: Mapping[str, Any],
               results_page: bool = True) -> List[str]:
    """Every difference between ``page`` and its render from the records under ``root``, one line each; on a
    ``results_page`` every markdown table must be a rendered block (elsewhere, e.g. the README's method lists,
    only the anchored blocks are checked)."""
    import reproduce
    from figures import FIGURES, read_digest, write_figure

    lines = page.read_text().splitlines()
    problems, covered = [], set()
    for table_id, at, block in table_blocks(lines):
        if table_id not in tables:
            continue  # an anchor of a section, not of a table
        covered.update(range(at, at + len(block) + 1))
        try:
            expected = reproduce.render(table_id, root, runs=runs, tables=tables).splitlines()[1:]
        except reproduce.ReproduceError as e:
            problems.append(f"{page}:{at}: table {table_id!r} cannot be rendered from the records: {e}")
            continue
        if block != expected:
            first = next((k for k, (a, b) in enumerate(zip(block, expected)) if a != b), min(len(block), len(expected)))
            problems.append(f"{page}:{at + 1 + first}: table {table_id!r} differs from its render "
                            f"(`python benchmarks/reproduce.py {table_id}`): page has "
                            f"{(block[first] if first < len(block) else '<end>')[:120]!r}, the render "
                            f"{(expected[first] if first < len(expected) else '<end>')[:120]!r}")
    for number, line in enumerate(lines, 1):
        if results_page and line.startswith("|---") and number not in covered:
            problems.append(f"{page}:{number}: a table without its record (every table is a `reproduce.py` render "
                            "after its <a id=\"TABLE\"></a> anchor)")
    with tempfile.TemporaryDirectory() as tmp:
        for number, line in enumerate(lines, 1):
            for target in IMAGE.findall(line):
                figure_id = Path(target).stem
                if figure_id not in FIGURES:
                    problems.append(f"{page}:{number}: figure {target} is not in the figure registry")
                    continue
                committed = page.parent / target
                try:
                    fresh = write_figure(figure_id, Path(tmp), root, runs)
                except reproduce.ReproduceError as e:
                    problems.append(f"{page}:{number}: figure {figure_id!r} cannot be rendered from the records: {e}")
                    continue
                if not committed.is_file():
                    problems.append(f"{page}:{number}: figure file {committed} is missing")
                elif read_digest(committed) != read_digest(fresh):
                    problems.append(f"{page}:{number}: figure {committed} differs from its render "
                                    f"(`python benchmarks/reproduce.py --all --figures {committed.parent}`)")
    return problems


def update_page(page: Path, root: Path, runs: Mapping[str, Any], tables: Mapping[str, Any]) -> List[str]:
    """Rewrite every anchored table block of ``page`` with its render from the records (text around the blocks is
    kept); returns the ids of the tables written."""
    import reproduce

    lines = page.read_text().splitlines()
    written = []
    for table_id, at, block in reversed(list(table_blocks(lines))):  # from the end: earlier line numbers stay valid
        if table_id in tables:
            try:
                lines[at:at + len(block)] = reproduce.render(table_id, root, runs=runs, tables=tables).splitlines()[1:]
            except reproduce.ReproduceError as e:  # left as it is; check_page reports it
                print(f"{page}: {table_id} not rendered: {str(e).splitlines()[0]}", file=sys.stderr)
                continue
            written.append(table_id)
    page.write_text("\n".join(lines) + "\n")
    return written[::-1]


def check_pages(pages: List[Path], root: Path, runs: Mapping[str, Any], tables: Mapping[str, Any]) -> List[str]:
    """:func:`check_page` over ``pages``; a page that does not exist is a problem too."""
    problems = []
    for page in pages:
        if not page.is_file():
            problems.append(f"{page}: no such page")
            continue
        # the overview and every page of docs/results/ hold rendered tables only
        problems += check_page(page, root, runs, tables, results_page=page.name == RESULTS_PAGE or page.parent.name == "results")
    return problems
