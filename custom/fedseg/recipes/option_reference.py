"""The method options page (``docs/guide/options.md``), written from the option dataclasses themselves: every recipe's
own keywords with their defaults and one-line meanings (``fedseg.method_options.option``), one table per method.

    python -m fedseg.recipes.option_reference > docs/guide/options.md

``tests/test_method_options.py`` checks that the committed page is what this writes.
"""

from __future__ import annotations

from typing import List, Tuple

from fedseg.markdown import markdown_cell, markdown_table
from fedseg.methods import available_methods

HEADER = """# Method options

[README](../../README.md) · [user guide](README.md) · [jobs and options](jobs.md)

Every method's own options: keywords of its recipe (`FedEviRecipe(delta=0.5)`), options of `jobs/job.py METHOD`
(`--delta 0.5`), of `fedseg export` / `fedseg run` (`--set delta=0.5`) and of a `fedseg bench` variant
(`fedevi:delta=0.5`). The options every method shares (rounds, sites, the training settings, the server step,
homomorphic aggregation) are in [jobs and options](jobs.md); what each method's options mean for the method is in
[methods](../methods.md). Written from the option definitions by `python -m fedseg.recipes.option_reference`.
"""


def method_option_rows(method: str) -> List[Tuple[str, str, str]]:
    """``(option, default, meaning)`` of every keyword ``method``'s recipe takes for its strategy and objective, in the
    recipe's order (an option both take, once)."""
    from fedseg.recipes import get_recipe_class

    recipe = get_recipe_class(method)
    docs = {}
    for job in (recipe.strategy_options, recipe.objective_options):
        if job is not None:
            for name, doc in job.options.docs().items():
                docs.setdefault(name, doc)
    return [(name, repr(parameter.default), docs.get(name, "")) for name, parameter in recipe.method_options().items()]


def render_option_reference() -> str:
    """The whole page: :data:`HEADER`, then a section per method (those without options of their own say so)."""
    parts = [HEADER]
    for method in available_methods():
        rows = method_option_rows(method)
        parts.append(f"## {method}\n")
        if not rows:
            parts.append("No options of its own.\n")
            continue
        lines = markdown_table(["option", "default", "meaning"],
                               [[f"`{name}`", markdown_cell(f"`{default}`"), markdown_cell(doc)] for name, default, doc in rows])
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render_option_reference(), end="")
