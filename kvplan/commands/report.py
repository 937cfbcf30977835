"""``kvplan report whatif.yaml``: expand a what-if sweep into a table and write Markdown/HTML/CSV/JSON."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvplan.cli_options import JsonOpt, OfflineOpt, TokenOpt

EPILOG = ("Examples: kvplan report docs/examples/whatif.yaml --offline  ·  kvplan report whatif.yaml --json > rows.json  ·  "
          "kvplan schema whatif")


def register(app: typer.Typer) -> None:
    from kvplan.cli import handle_errors

    @app.command("report", epilog=EPILOG)
    @handle_errors
    def report(
        path: Annotated[str, typer.Argument(help="What-if file (YAML): title, defaults, sweep, zip, scenarios, outputs, plots.",
                                            show_default=False)],
        offline: OfflineOpt = False,
        token: TokenOpt = None,
        rows: Annotated[int, typer.Option("--rows", min=1, help="Rows shown in the terminal before truncating.")] = 40,
        json_out: JsonOpt = False,
    ) -> None:
        """What-if report: one row per scenario (per-token bytes, weights, KV budget, KV tokens, max concurrency, max context, fits, decode ceiling); writes the outputs the file lists."""
        from kvplan.atomic import write_files
        from kvplan.render.report import progress_bar, render_outputs
        from kvplan.report import build_report
        from kvplan.scenario import display_path, load_whatif

        whatif = load_whatif(path)
        with progress_bar(whatif.num_rows) as progress:
            result = build_report(whatif, offline=offline, token=token, progress=progress)
        files, warnings = render_outputs(result, whatif.outputs, whatif.plots)
        write_files(files)  # all or nothing: every file is complete before the first is replaced
        for warning in warnings:
            sys.stderr.write(f"kvplan: warning: {warning}\n")
        written = [display_path(p) for p in files]
        if json_out:
            from kvplan.render import print_json

            print_json(result.to_dict())
            return
        from kvplan.render import console
        from kvplan.render.report import render_report

        console().print(render_report(result, written, limit=rows))

    _ = report
