"""Markdown tables of the suite's reports (``summary.md``, ``results.md``) and of the results pages."""

from __future__ import annotations

import re
from typing import Iterable, List, Sequence

#: a ``|`` that is not escaped (``\|``): it would end a cell early
_BARE_PIPE = re.compile(r"(?<!\\)\|")


def markdown_cell(text: str) -> str:
    """A free text (an error message, a test's skip reason) as one table cell: each ``|`` escaped, line breaks as
    spaces."""
    return _BARE_PIPE.sub(r"\\|", " ".join(text.splitlines()))


def _line(cells: Sequence[str]) -> str:
    """One line of a markdown table: ``| a | b |`` (an empty cell is ``|  |``).

    Raises:
        ValueError: a cell holding an unescaped ``|`` (several columns in one string: give each its own cell).
    """
    for cell in cells:
        if _BARE_PIPE.search(cell):
            raise ValueError(f"cell {cell!r} holds a '|': give each column its own cell (or escape it: '\\|')")
    return "| " + " | ".join(cells) + " |"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> List[str]:
    """A markdown table as lines: the header, the rule (one ``---`` per header cell: ``|---|---|``), one line per row.

    Args:
        header: the column titles, one string per column.
        rows: the rows' cells, as many strings per row as ``header`` has.

    Raises:
        ValueError: a row of another length than the header, or a cell holding an unescaped ``|``.
    """
    header = list(header)
    lines = [_line(header), "|---" * len(header) + "|"]
    for row in rows:
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells under a header of {len(header)}: {row}")
        lines.append(_line(row))
    return lines
