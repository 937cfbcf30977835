"""The code has one place for each rule (issue 11): engine rules behind the Engine interface."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from kvplan_names import resolve

from kvplan.engines import Engine
from kvplan.engines.registry import NAMES, engine

PACKAGE = Path(__file__).resolve().parents[1] / "kvplan"


def _sources(exclude: str | None = None) -> dict[str, str]:
    return {str(p.relative_to(PACKAGE.parent)): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")
            if exclude is None or exclude not in p.parts}


def test_every_engine_module_is_an_engine() -> None:
    members = set(Engine.__annotations__) | {name for name, value in vars(Engine).items()
                                             if inspect.isfunction(value) and not name.startswith("_")}
    assert {"ENGINE", "defaults", "budget", "inflight_tokens", "starts", "kv_tokens", "serve_command"} <= members
    for name in NAMES:
        module = engine(name)
        assert module.ENGINE == name
        missing = sorted(m for m in members if not hasattr(module, m))
        assert missing == [], f"kvplan.engines.{name} lacks {missing}"
        for m in members:
            if inspect.isfunction(getattr(Engine, m, None)):
                protocol = list(inspect.signature(getattr(Engine, m)).parameters)[1:]  # without self
                assert list(inspect.signature(getattr(module, m)).parameters) == protocol, (name, m)


def test_no_engine_branches_outside_the_engines_package() -> None:
    """``if engine == "sglang"`` lives in kvplan/engines/ only: everything else asks the engine's rules."""
    branch = re.compile(r"""[=!]=\s*["'](vllm|sglang)["']|["'](vllm|sglang)["']\s*[=!]=""")
    offenders = [f"{path}:{n}" for path, text in _sources(exclude="engines").items()
                 for n, line in enumerate(text.splitlines(), 1) if branch.search(line)]
    assert offenders == []


def test_no_engine_version_literals_in_plan() -> None:
    """Which release does what is the engines' business (their profiles), not plan.py's."""
    text = (PACKAGE / "planning" / "plan.py").read_text(encoding="utf-8")
    assert re.findall(r"""["']\d+\.\d+["']""", text) == []


def test_every_option_is_declared_once_in_the_table() -> None:
    """The CLI options, the YAML scenario fields and Options' fields all come from kvplan.options.OPTIONS."""
    from dataclasses import fields

    import typer.main

    from kvplan.cli.app import app
    from kvplan.options import CLI_OPTIONS, KINDS, OPTIONS, YAML_OPTIONS, Options
    from kvplan.checks.scenario import OptionsModel
    from kvplan.checks.fields import KIND_TYPES, OPTION_FIELDS

    assert all(o.kind in KINDS and o.kind in KIND_TYPES for o in OPTIONS)
    command = typer.main.get_command(app)
    for name in ("estimate", "validate"):
        params = {p.name for p in command.commands[name].params}  # type: ignore[attr-defined]
        assert {o.name for o in CLI_OPTIONS} <= params, name
    assert list(OPTION_FIELDS) == [o.name for o in YAML_OPTIONS] == list(OptionsModel.model_fields)
    assert {f.name for f in fields(Options)} == ({o.field_name for o in OPTIONS if o.in_options}
                                                 | {"auto_max_model_len", "tp_from_gpus", "split_given", "context_from_default"})
    # every option a user can type is in the CLI and (except the Hub token) in the YAML files
    assert {o.name for o in OPTIONS if o.panel} | {"model"} == {o.name for o in YAML_OPTIONS} | {"token"}


def test_docs_name_functions_that_exist_and_every_json_key() -> None:
    """docs/architecture.md's "Where each rule lives" names real functions; docs/cli.md's JSON table lists every key."""
    import kvplan

    repo = PACKAGE.parent
    math_md = (repo / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = math_md[math_md.index("## Where each rule lives"):]
    names = set(re.findall(r"`((?:memory|engines|planning|paged|model)(?:\.\w+)+)`", table))
    assert len(names) > 25
    for dotted in names:
        resolve(dotted)
    cli_md = (repo / "docs" / "cli.md").read_text(encoding="utf-8")
    doc = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", prefix_tokens=100).to_dict()
    for section in ("model", "assumptions", "per_token", "budget", "pool", "answer", "engine_report"):
        row = next(line for line in cli_md.splitlines() if line.startswith(f"| `{section}` |"))
        missing = [key for key in doc[section] if f"`{key}`" not in row]
        assert missing == [], f"docs/cli.md, {section}: {missing}"
