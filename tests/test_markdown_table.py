"""``fedseg.markdown``: the one way the suite draws a markdown table (``summary.md``, ``results.md``, the results
pages), and free text made safe for a cell."""

from __future__ import annotations

import pytest

from fedseg.markdown import markdown_cell, markdown_table


def test_the_rule_has_one_column_per_header_cell():
    lines = markdown_table(["approach", "Dice", "Δ Dice vs FedAvg (Wilcoxon p)"],
                           [["FedAvg", "0.712 ± 0.004", ""], ["FVAC", "0.731 ± 0.010", "+0.019 (0.002)"]])
    assert lines == ["| approach | Dice | Δ Dice vs FedAvg (Wilcoxon p) |",
                     "|---|---|---|",
                     "| FedAvg | 0.712 ± 0.004 |  |",
                     "| FVAC | 0.731 ± 0.010 | +0.019 (0.002) |"]


def test_a_table_without_rows_is_its_header_and_rule():
    assert markdown_table(["a"], []) == ["| a |", "|---|"]
    assert markdown_table(("a", "b"), iter([("1", "2")]))[2] == "| 1 | 2 |"  # any sequences, rows from a generator


def test_a_row_of_another_length_is_refused():
    with pytest.raises(ValueError, match="a row of 3 cells under a header of 2"):
        markdown_table(["a", "b"], [["1", "2", "3"]])
    with pytest.raises(ValueError, match="a row of 1 cells under a header of 2"):
        markdown_table(["a", "b"], [["1"]])


def test_several_columns_in_one_string_are_refused():
    """``"Dice: A | Dice: B"`` as one header cell would draw two columns the rule does not count."""
    with pytest.raises(ValueError, match="give each column its own cell"):
        markdown_table(["method", "Dice: A | Dice: B"], [])
    with pytest.raises(ValueError, match="give each column its own cell"):
        markdown_table(["method", "shared limit (s)", "round / shared limit"], [["fedavg", "- | -", "1.00x"]])
    assert markdown_table(["a"], [[r"x \| y"]])[2] == r"| x \| y |"  # an escaped bar is text


def test_free_text_becomes_one_cell():
    reason = "needs CUDA | a GPU\nskipped"
    cell = markdown_cell(reason)
    assert cell == r"needs CUDA \| a GPU skipped"
    assert markdown_table(["test", "detail"], [["t", cell]])[2] == r"| t | needs CUDA \| a GPU skipped |"
    assert markdown_cell(r"already \| escaped") == r"already \| escaped"
