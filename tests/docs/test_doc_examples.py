"""Every kvplan command the docs show runs: README.md, docs/*.md code blocks and the commands' help epilogs.

Each command is run through the real entry point (``kvplan.cli.app.main``) in a scratch folder holding the
example files, and must exit 0, or 1 where it is a check that may fail; never 2 (a documented command
that is rejected) and never a traceback. Placeholders become real inputs: ``capacity.yaml``,
``whatif.yaml`` and ``workload.yaml`` the tested examples, ``./my-model/`` a local config folder.

What cannot run here is planned instead, with the same options: ``validate`` on a GPU (this machine has
none) runs ``estimate``; simulations are shortened to 120 simulated seconds. ``observe`` (a live server
for minutes) and ``explain`` (a server log) have their own tests (test_observe.py, test_explain.py), and
``torchrun`` needs several processes (test_distributed.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_HERE = ("observe", "explain")  # own tests; they need a server or a log


def _code_block_commands(text: str) -> list[str]:
    """The kvplan commands of the code blocks, but for output blocks (```text then ``$ kvplan ARGS``): those
    are run by docs/gen_cli_reference.py, whose output the docs must quote exactly (test_docs.py)."""
    out, in_block, pending, output_block = [], False, "", False
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            in_block, pending = not in_block, ""
            output_block = in_block and line.strip() == "```text" and i + 1 < len(lines) \
                and lines[i + 1].startswith("$ kvplan ")
            continue
        if not in_block or output_block:
            continue
        line = line.strip().removeprefix("$ ")
        if pending:
            line, pending = pending + " " + line, ""
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        line = line.split("run: ", 1)[-1] if line.startswith("run: kvplan ") else line  # a CI step
        if line.startswith(("kvplan ", "python -m kvplan ", "python3 -m pip install . && kvplan ")):
            out.append(line.split("&& ")[-1])
    return out


def _epilog_commands() -> list[str]:
    """The "Examples:" of every command's --help (typer's epilogs)."""
    import typer.main

    from kvplan.cli.app import app

    group = typer.main.get_command(app)
    commands = list(group.commands.values())  # type: ignore[attr-defined]
    commands += [sub for c in commands for sub in getattr(c, "commands", {}).values()]
    out = []
    for command in commands:
        epilog = (command.epilog or "").removeprefix("Examples:")
        out += [c.strip() for c in epilog.split("·") if c.strip().startswith("kvplan ")]
    return out


def documented_commands() -> list[str]:
    commands = []
    for path in SOURCES:
        if path.name == "cli-reference.md":  # generated from --help: its examples are the epilogs below
            continue
        commands += _code_block_commands(path.read_text())
    commands += _epilog_commands()
    keep = []
    for c in dict.fromkeys(commands):
        c = c.split(" #")[0].strip()
        if "[OPTIONS]" in c or c.startswith("torchrun") or c.split()[1] in NOT_HERE or "calib.yaml" in c:
            continue
        keep.append(c)
    return keep


COMMANDS = documented_commands()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("docs")
    shutil.copytree(ROOT / "docs" / "examples", d / "docs" / "examples")
    for name in ("capacity.yaml", "whatif.yaml"):
        shutil.copy(ROOT / "docs" / "examples" / name, d / name)
    shutil.copy(ROOT / "docs" / "examples" / "shared_prompt.yaml", d / "workload.yaml")
    (d / "my-model").mkdir()
    shutil.copy(ROOT / "tests" / "fixtures" / "configs" / "mistral_v01.json", d / "my-model" / "config.json")
    return d


def _args(command: str) -> list[str]:
    command = command.split(" > ")[0].split(" | ")[0]  # output redirections: stdout is captured here
    args = shlex.split(command.removeprefix("python -m ").removeprefix("kvplan "))
    if args[0] == "validate" and "cpu" not in args:  # no GPU here: plan what validate would check
        args[0] = "estimate"
        args = [a for a in args if a != "--probe"]
    if args[0] == "simulate":
        args = [a for i, a in enumerate(args) if not (a == "--duration" or (i and args[i - 1] == "--duration"))]
        args += ["--duration", "120"]
    if args[0] in ("estimate", "check", "report", "simulate", "validate") and "--offline" not in args:
        args.append("--offline")
    return args


def test_the_docs_show_commands_of_every_command():
    shown = {c.split()[1] for c in COMMANDS}
    assert {"estimate", "check", "report", "schema", "simulate", "validate"} <= shown, shown


@pytest.mark.parametrize("command", COMMANDS)
def test_documented_command_runs(command, scratch):
    from kvplan.cli.app import main

    args = _args(command)
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(scratch)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        pytest.fail(f"{command}: {traceback.format_exc()}")
    finally:
        os.chdir(old)
    may_fail = args[0] in ("check", "validate")  # a capacity check or a validation may report a failure (exit 1)
    assert code == 0 or (code == 1 and may_fail), f"{command} -> {args} exited {code}:\n{err.getvalue()[-1500:]}"
    assert "Traceback" not in err.getvalue()
