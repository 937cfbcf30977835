"""``kvplan estimate``'s body, shared by the typer command (:func:`kvplan.cli.app.estimate`) and the plain
path that runs without typer (:func:`kvplan.cli.entry.main`): both call it with the same arguments.
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import InputError
from kvplan.options import CLI_OPTIONS


def estimate_command(model: str, json_out: bool = False, brief: bool = False, *, values: dict[str, Any],
                     token: str | None) -> None:
    """``kvplan estimate``'s body: plan ``model`` under the estimate option ``values`` and print the answer
    (the table, ``--brief``'s lines or ``--json``); a list of values prints one row per combination."""
    from kvplan.planning.plan import estimate as run_estimate, options_from_values

    if brief and json_out:
        raise InputError("--brief and --json: give one of them", "--json holds every figure --brief prints")
    if any("," in str(values.get(o.name) or "") for o in CLI_OPTIONS if o.compare):  # one row per combination
        from kvplan.checks.compare import compare

        comparison = compare({"model": model, **values}, token=token)
        from kvplan.render import console, print_json

        if json_out:
            print_json(comparison.to_dict())
            return
        from kvplan.render.compare import render_comparison

        console().print(render_comparison(comparison))
        return
    plan = run_estimate(options_from_values({"model": model, **values}), token=token)
    if json_out:
        from kvplan.render import print_json

        print_json(plan.to_dict())
        return
    from kvplan.render.estimate import render_brief, render_plan, source_line
    from kvplan.render.styled import show

    if brief:
        show(render_brief(plan))
        return
    show(source_line(plan.source), render_plan(plan))
