"""Rendering of capacity-check results: rich table, JSON, JUnit XML, GitHub Actions annotations."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvplan.checks.capacity import CheckReport, CheckResult, Outcome

from kvplan.checks.capacity import format_value
from kvplan.units import plural

SCHEMA_VERSION = 1


def _fmt_margin(o: "Outcome", short: bool = False) -> str:
    if o.margin is None:
        return ""
    if o.unit == "%":
        return f"{o.margin:+.1f} pts"
    return f"{o.margin:+,}" if short else f"{o.margin:+,} {o.unit}".strip()


def _setup(result: "CheckResult") -> str:
    p = result.plan
    o = p.options
    par = f" tp{o.tp}" + (f" pp{o.pp}" if o.pp > 1 else "") if o.gpu_count > 1 else ""
    return f"{p.spec.model_id} on {o.gpu_count}x {p.gpu.name}{par}, KV {p.kv_dtype}"


def render_check(report: "CheckReport", width: int | None = None):  # noqa: ANN201 - rich renderable
    """The table (check, requirement, actual, margin, verdict) and, per failure, what would make it pass.

    Check names and numbers are never cut or split mid-word: the requirement text wraps, and at a narrow
    ``width`` (default: the terminal's) the margin column is dropped first."""
    from rich.console import Group
    from rich.text import Text

    from kvplan.checks.capacity import requirement_text
    from kvplan.render.fit import Col, fitted_table, terminal_width

    cols = [Col("check"), Col("requirement", wrap=True), Col("actual", justify="right"),
            Col("margin", justify="right", drop=1), Col("verdict")]
    sections: set[int] = set()
    for r in report.results:
        for i, o in enumerate(r.outcomes):
            verdict = Text("pass", style="bold green") if o.passed else Text("FAIL", style="bold red")
            row = [r.name if i == 0 else "", requirement_text(o.requirement, o.required, r.plan),
                   format_value(o.actual, o.unit if o.unit == "%" else ""), _fmt_margin(o, short=True), verdict]
            for col, cell in zip(cols, row):
                col.cells.append(cell)
        sections.add(len(cols[0].cells) - 1)
    table, dropped = fitted_table(cols, width or terminal_width(), sections=sections,
                                  title=f"capacity checks: {report.file}", title_justify="left")
    parts: list[Any] = [table]
    if dropped:
        parts.append(Text(f"({', '.join(dropped)} not shown at this width: see --json)", style="grey62"))
    for r in report.results:
        if r.passed:
            continue
        text = Text()
        text.append(f"✗ {r.name}", style="bold red")
        text.append(f"  ({r.where}; {_setup(r)})\n", style="grey62")
        for o in r.outcomes:
            if o.passed:
                continue
            text.append(f"  {o.message}\n")
            if o.suggestions:
                text.append("  to pass, any one of:\n", style="bold")
                for s in o.suggestions:
                    text.append(f"    - {s}\n")
            else:
                text.append("  no single change found (tried fewer requests, shorter context, fp8 KV, tp x2/x4/x8, "
                            "every larger catalogue GPU)\n", style="yellow")
        parts.append(text)
    parts += _warnings(report)
    n, failed = len(report.results), report.num_failed
    summary = Text(f"{n - failed} of {plural(n, 'check')} passed", style="bold green" if not failed else "bold red")
    parts.append(summary)
    return Group(*parts)


def _warnings(report: "CheckReport") -> list[Any]:
    """The lines under the table: a requirement that passes at the estimate but not at the low end, and a check
    judged on a KV dtype the engine cannot run (its verdict is a what-if's)."""
    from rich.text import Text

    lines = [(r.name, at_risk_text(o)) for r in report.results for o in r.outcomes if o.at_risk]
    lines += [(r.name, f"{note}: the verdict is a what-if's") for r in report.results for note in (what_if_note(r),)
              if note]
    if not lines:
        return []
    text = Text()
    for name, line in lines:
        text.append(f"! {name}: ", style="bold yellow")
        text.append(line + "\n")
    return [text]


def report_to_dict(report: "CheckReport") -> dict[str, Any]:
    """The ``--json`` document: every check, its requirements and its full plan (with assumptions)."""
    checks = []
    for r in report.results:
        checks.append({
            "name": r.name,
            "description": r.description,
            "file": r.where.file,
            "line": r.where.line,
            "passed": r.passed,
            "judged": r.judged,
            "what_if": what_if_note(r),  # the engine cannot run the planned KV dtype (None: it can)
            "requirements": [{
                "requirement": o.requirement,
                "required": o.required,
                "actual": round(o.actual, 3) if isinstance(o.actual, float) else o.actual,
                "margin": o.margin,
                "unit": o.unit,
                "passed": o.passed,
                "message": o.message,
                "suggestions": list(o.suggestions),
                "low_end": None if o.low_end_passed is None else {
                    "actual": round(o.low_end_actual, 3) if isinstance(o.low_end_actual, float) else o.low_end_actual,
                    "passed": o.low_end_passed},
            } for o in r.outcomes],
            "plan": r.plan.to_dict(),
        })
    return {
        "schema_version": SCHEMA_VERSION,
        "file": report.file,
        "passed": report.passed,
        "summary": {"checks": len(report.results), "passed": len(report.results) - report.num_failed,
                    "failed": report.num_failed},
        "checks": checks,
    }


def _failure_text(r: "CheckResult") -> tuple[str, str]:
    failed = [o for o in r.outcomes if not o.passed]
    message = "; ".join(o.message for o in failed)
    lines = [f"{r.where}: {_setup(r)}"]
    for o in failed:
        lines.append(o.message)
        lines.extend(f"  to pass: {s}" for s in o.suggestions)
    return message, "\n".join(lines)


def junit_xml(report: "CheckReport") -> str:
    """JUnit XML: one ``testsuite``, one ``testcase`` per check, a ``failure`` with message and details."""
    import xml.etree.ElementTree as ET

    n, failed = len(report.results), report.num_failed
    suites = ET.Element("testsuites", name="kvplan check", tests=str(n), failures=str(failed), errors="0")
    suites.set("time", _seconds(report.elapsed_s))
    suite = ET.SubElement(suites, "testsuite", name=f"kvplan check {report.file}", tests=str(n), failures=str(failed),
                          errors="0", skipped="0", time=_seconds(report.elapsed_s))
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname=f"kvplan.checks.capacity.{Path(report.file).stem}", name=r.name,
                             file=r.where.file, line=str(r.where.line), time=_seconds(r.elapsed_s))
        if not r.passed:
            message, details = _failure_text(r)
            failure = ET.SubElement(case, "failure", message=message, type="CapacityCheckFailed")
            failure.text = details
        out = ET.SubElement(case, "system-out")
        out.text = "\n".join([_setup(r)] + [f"{'pass' if o.passed else 'FAIL'}: {o.message}" for o in r.outcomes]
                              + [f"at risk: {at_risk_text(o)}" for o in r.outcomes if o.at_risk])
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _seconds(elapsed_s: float) -> str:
    """JUnit's ``time``: the real elapsed seconds, to the millisecond."""
    return f"{elapsed_s:.3f}"


def junit_error_xml(file: str, error: Any, elapsed_s: float = 0.0) -> str:
    """JUnit XML for a capacity file that could not be checked (invalid, or a model that cannot be
    resolved): one ``testcase`` with an ``error`` carrying every mistake, so CI publishes a red test
    instead of finding no report. ``error`` is a :class:`kvplan.errors.KvplanError`; ``elapsed_s`` the seconds
    it took to find it."""
    import xml.etree.ElementTree as ET

    where = getattr(error, "where", None)
    suites = ET.Element("testsuites", name="kvplan check", tests="1", failures="0", errors="1",
                        time=_seconds(elapsed_s))
    suite = ET.SubElement(suites, "testsuite", name=f"kvplan check {file}", tests="1", failures="0", errors="1",
                          skipped="0", time=_seconds(elapsed_s))
    attrs = {"file": where.file, "line": str(where.line)} if where is not None else {"file": file}
    case = ET.SubElement(suite, "testcase", classname=f"kvplan.checks.capacity.{Path(file).stem}",
                         name="capacity file is valid", time=_seconds(elapsed_s), **attrs)
    lines = error.lines()
    err = ET.SubElement(case, "error", message=lines[0], type=type(error).__name__)
    err.text = "\n".join(lines)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation_path(file: str) -> str:
    """The file as GitHub expects it: relative to ``GITHUB_WORKSPACE`` when inside it."""
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if workspace:
        try:
            return str(Path(file).resolve().relative_to(Path(workspace).resolve()))
        except ValueError:
            pass
    return file


def github_annotation(file: str, line: int, col: int | None, title: str, message: str, level: str = "error") -> str:
    """One ``::error file=...,line=...,title=...::message`` workflow command (escaped; ``level`` ``warning``
    for a ``::warning``)."""
    props = f"file={_escape_property(annotation_path(file))},line={line}"
    if col:
        props += f",col={col}"
    return f"::{level} {props},title={_escape_property(title)}::{_escape_data(message)}"


def what_if_note(r: "CheckResult") -> str | None:
    """The plan's note when the engine has no ``--kv-cache-dtype`` for the planned KV dtype (a what-if it cannot
    run: no launch line), else None."""
    if r.plan.launch.kv_cache_dtype is not None:
        return None
    return next((n for n in r.plan.notes if " is a what-if " in n), f"--kv-dtype {r.plan.kv_dtype} is a what-if")


def at_risk_text(o: "Outcome") -> str:
    """A requirement that passes at kvplan's estimate but not at the low end of its range, in words."""
    return (f"{o.requirement} passes at kvplan's estimate ({format_value(o.actual, o.unit)}) but not at the low end "
            f"of its range ({format_value(o.low_end_actual, o.unit)}): the engine may give less (--conservative "
            "gates there)")


def github_annotations(report: "CheckReport") -> list[str]:
    """One annotation per failed check, pointing at the check's entry in the file; a warning per check that
    passes only at kvplan's estimate (not at the low end of its range)."""
    out = []
    for r in report.results:
        if r.passed:
            risky = [at_risk_text(o) for o in r.outcomes if o.at_risk]
            risky += [f"{note}: the verdict is a what-if's" for note in (what_if_note(r),) if note]
            if risky:
                out.append(github_annotation(r.where.file, r.where.line, r.where.col,
                                             f"kvplan check at risk: {r.name}", "\n".join(risky), "warning"))
            continue
        message, details = _failure_text(r)
        fixes = [s for o in r.outcomes if not o.passed for s in o.suggestions]  # every one, as JUnit and the table carry them
        body = message + (("\nto pass: " + " | ".join(fixes)) if fixes else "")
        out.append(github_annotation(r.where.file, r.where.line, r.where.col, f"kvplan check failed: {r.name}", body))
    return out
