"""``kvplan check capacity.yaml``: capacity requirements that gate CI (exit 0 pass, 1 fail, 2 bad input)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, OfflineOpt, TokenOpt

EPILOG = ("Examples: kvplan check docs/examples/capacity.yaml  ·  "
          "kvplan check capacity.yaml --offline --junit-xml kvplan-junit.xml  ·  kvplan check capacity.yaml --json")


def _in_github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS", "").lower() == "true"


def register(app: typer.Typer) -> None:
    from kvplan.cli.errors import handle_errors

    @app.command("check", epilog=EPILOG)
    @handle_errors
    def check(
        path: Annotated[str, typer.Argument(help="Capacity file (YAML): defaults + checks, each with require.",
                                            show_default=False)],
        junit_xml: Annotated[Optional[str], typer.Option("--junit-xml", help="Also write JUnit XML here (one test case per check).")] = None,
        calibration: Annotated[Optional[str], typer.Option("--calibration", help="Calibration file written by "
                                                          "`kvplan explain --calibrate`: measured terms for the "
                                                          "deployments it matches.")] = None,
        conservative: Annotated[bool, typer.Option("--conservative", help="Judge every check at the low end of "
                                                  "kvplan's range (the KV budget less the spread measured on real "
                                                  "start-ups), so a gate never passes on a number the engine may "
                                                  "not give.")] = False,
        offline: OfflineOpt = False,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Check capacity requirements (concurrency, context, KV tokens, headroom) for CI: exit 0 when all hold, 1 when any fails, 2 for bad input."""
        from kvplan.io.calibration import load_calibration
        from kvplan.checks.capacity import run_checks
        from kvplan.errors import KvplanError
        from kvplan.checks.scenario import load_capacity
        from kvplan.io.yamldoc import display_path

        import time

        started = time.perf_counter()
        if junit_xml:  # before the work: a bad path must not hide the checks' outcome
            from kvplan.io.atomic import check_writable

            check_writable(junit_xml, "--junit-xml", writes="junit")  # never over a file of another kind
        try:
            capacity = load_capacity(path, keep_going=True)  # its mistakes listed with planning's
            report = run_checks(capacity, offline=offline, token=token,
                                calibration=load_calibration(calibration) if calibration else None,
                                conservative=conservative)
        except KvplanError as exc:  # invalid file, unknown model, ...: still a JUnit report, with one error
            if _in_github_actions():
                from kvplan.render.check import github_annotation

                for err in getattr(exc, "errors", (exc,)):
                    w = getattr(err, "where", None)
                    detail = getattr(err, "detail", err.message)
                    print(github_annotation(w.file if w else display_path(Path(path)), w.line if w else 1,
                                            w.col if w else None, "kvplan: invalid capacity file",
                                            f"{detail} ({err.hint})" if err.hint else detail),
                          file=sys.stderr if json_out else sys.stdout)
            if junit_xml:
                from kvplan.io.atomic import write_atomic
                from kvplan.render.check import junit_error_xml

                write_atomic(junit_xml, junit_error_xml(display_path(Path(path)), exc, time.perf_counter() - started))
            raise
        from kvplan.render.check import github_annotations, junit_xml as to_junit, report_to_dict

        if junit_xml:
            from kvplan.io.atomic import write_atomic

            write_atomic(junit_xml, to_junit(report))
        if _in_github_actions():
            for line in github_annotations(report):
                print(line, file=sys.stderr if json_out else sys.stdout)
        if json_out:
            from kvplan.render import print_json

            print_json(report_to_dict(report))
        else:
            from kvplan.render import console
            from kvplan.render.check import render_check

            console().print(render_check(report))
        raise typer.Exit(0 if report.passed else 1)

    _ = check  # registered on the app


