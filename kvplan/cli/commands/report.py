"""``kvplan report whatif.yaml``: expand a what-if sweep into a table and write Markdown/HTML/CSV/JSON."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, OfflineOpt, TokenOpt

EPILOG = ("Examples: kvplan report docs/examples/whatif.yaml --offline  ·  kvplan report whatif.yaml --json > rows.json  ·  "
          "kvplan schema whatif")
ANNOUNCE_ROWS = 10_000  # say the row count on stderr before starting when there are at least this many


def register(app: typer.Typer) -> None:
    from kvplan.cli.errors import handle_errors

    @app.command("report", epilog=EPILOG)
    @handle_errors
    def report(
        path: Annotated[str, typer.Argument(help="What-if file (YAML): title, defaults, sweep, zip, scenarios, outputs, plots.",
                                            show_default=False)],
        offline: OfflineOpt = False,
        token: TokenOpt = None,
        rows: Annotated[int, typer.Option("--rows", min=1, max=100_000, help="Rows shown in the terminal before truncating.")] = 40,
        force: Annotated[bool, typer.Option("--force", help="Run even past the bounds (1,000,000 rows, 10,000 configurations).")] = False,
        calibration: Annotated[Optional[str], typer.Option("--calibration", help="Calibration file written by "
                                                          "`kvplan explain --calibrate`: measured terms for the "
                                                          "deployments it matches.")] = None,
        json_out: JsonOpt = False,
    ) -> None:
        """What-if report: one row per scenario (per-token bytes, weights, KV budget, KV tokens, max concurrency, max context, fits, decode ceiling); writes the outputs the file lists."""
        from kvplan.io.atomic import AtomicFiles, check_writable
        from kvplan.io.kinds import SUFFIX_FORMATS
        from kvplan.io.calibration import load_calibration
        from kvplan.render.progress import delayed_progress
        from kvplan.render.report import DOCUMENT_ROWS, JsonRows, open_row_writers, render_documents
        from kvplan.checks.report import RowDigest, Sweep
        from kvplan.checks.scenario import load_whatif
        from kvplan.io.yamldoc import display_path

        whatif = load_whatif(path)
        sweep = Sweep(whatif, offline=offline, token=token,
                      calibration=load_calibration(calibration) if calibration else None)
        sweep.check_bounds(force)
        for out_path in whatif.outputs:  # before the work: a bad path must not cost the whole sweep
            check_writable(out_path, writes=SUFFIX_FORMATS[out_path.suffix.lower()])  # nor replace another kind
        if sweep.num_rows >= ANNOUNCE_ROWS:
            names = ", ".join(display_path(p) for p in whatif.outputs) or "no files"
            sys.stderr.write(f"kvplan: {sweep.describe_size()} -> {names}\n")
        digest = RowDigest(keep=max(DOCUMENT_ROWS, rows))
        with AtomicFiles() as files, delayed_progress("sweeping") as progress:  # all or nothing
            sweep.plan(progress)
            head = sweep.report(RowDigest(keep=0)).header()
            writers = open_row_writers(files, whatif.outputs, head)
            if json_out:
                writers.append(JsonRows(sys.stdout, head, indent=2))
            for row in sweep.rows(progress):
                digest.add(row)
                if writers:
                    d = row.to_dict()
                    for writer in writers:
                        writer.add(d)
            for writer in writers:
                writer.close()
            result = sweep.report(digest)
            documents, warnings = render_documents(result, whatif.outputs, whatif.plots)
            for doc_path, data in documents.items():
                if doc_path not in whatif.outputs:  # a Markdown output's plots: not over another kind of file
                    check_writable(doc_path, "plot", writes=SUFFIX_FORMATS[doc_path.suffix.lower()])
                files.write(doc_path, data)
        for warning in warnings:
            sys.stderr.write(f"kvplan: warning: {warning}\n")
        if json_out:
            return
        from kvplan.render import console
        from kvplan.render.report import render_report

        written = [display_path(p) for p in [*whatif.outputs, *(p for p in documents if p not in whatif.outputs)]]
        console().print(render_report(result, written, limit=rows))

    _ = report
