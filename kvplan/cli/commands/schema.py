"""``kvplan schema [capacity|whatif|workload]``: the JSON Schema of a YAML file (for editors and CI linters)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvplan.cli.options import JsonOpt

EPILOG = ("Examples: kvplan schema capacity > kvplan-capacity.schema.json  ·  kvplan schema whatif  ·  "
          "kvplan schema workload  ·  "
          "then put `# yaml-language-server: $schema=kvplan-capacity.schema.json` on a YAML file's first line")


def register(app: typer.Typer) -> None:
    from kvplan.cli.errors import handle_errors

    @app.command("schema", epilog=EPILOG)
    @handle_errors
    def schema(
        kind: Annotated[str, typer.Argument(help="Which file: capacity (kvplan check), whatif (kvplan report) or "
                                                 "workload (kvplan simulate).")] = "capacity",
        json_out: JsonOpt = False,
    ) -> None:
        """Print the JSON Schema of a capacity, what-if or workload file (generated from the validating models); always JSON, --json is accepted like everywhere."""
        from kvplan.render import print_json
        from kvplan.checks.scenario import json_schema

        _ = json_out  # the schema is JSON either way
        model = None
        if kind == "workload":
            from kvplan.sim.workload_schema import WorkloadModel

            model = WorkloadModel
        print_json(json_schema(kind, model))

    _ = schema
