"""The house: one place for each rule, tests that mirror the packages, rooms of a livable size.

- engine rules live behind the Engine interface, in kvplan/engines/ only;
- tests/ mirrors kvplan/'s packages (tests/engines/test_sglang.py speaks for kvplan/engines/sglang.py): every
  package has its folder, every test file sits in the folder of what it checks and is named for it;
- no module is over 600 lines and no function over 60 (its body; a command's option declarations aside), but
  those listed with the reason and their size when listed: the list only shrinks.
"""

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


# --- the house: tests/ mirrors kvplan/'s packages; no module or function grown past its room -------------------

TESTS = Path(__file__).resolve().parent
# Test folders that speak for no one package: whole commands, across packages (cli/ is kvplan.cli's own folder too).
WHOLE_COMMAND_FOLDERS = {
    "e2e": "whole commands through the entry point, across commands (bad input, the fuzz)",
    "docs": "README.md and docs/*.md stay true: their examples run, their numbers and generated sections are current",
    "project": "what ships beside the package: the wheel, the GitHub Action and pre-commit hook, the benchmarks",
}
# Modules in tests/ that are not tests: helpers the tests import (or run), at tests/'s top only.
HELPERS = {"conftest.py", "entry_point.py", "hub_emulator.py", "kvplan_names.py", "metrics_pages.py", "fuzz_worker.py",
           "source_trees.py"}
# Repository-wide checks at tests/'s top, beside the tests of kvplan's flat modules (tests/test_units.py ...).
REPO_WIDE = {"test_structure.py": "the package's layout, its rules' one place and the size of its rooms",
             "test_import_graph.py": "the import graph: no cycles, data flows one way"}
# Test files named for a behaviour that several modules of their package share, not for one module: each says
# what it checks. A new file is named for its module (tests/engines/test_sglang.py speaks for
# kvplan/engines/sglang.py) or is listed here with what it checks.
BEHAVIOURS = {
    "checks/test_shared_prefix.py": "a prefix every request shares counts once in the verdict, the row and the check",
    "cli/test_startup.py": "what `kvplan estimate` imports and asks the Hub for at start-up",
    "docs/test_doc_examples.py": "every kvplan command the docs show runs",
    "docs/test_docs.py": "the docs' numbers are kvplan's and the CLI reference is current",
    "docs/test_readme.py": "the README's test command is the one CI runs",
    "e2e/test_bad_input.py": "bad input across commands: one line, exit 2, never a traceback",
    "e2e/test_fuzz.py": "fuzzed files and option values through the entry point in a fresh interpreter",
    "engines/test_auto_dtype.py": "`--dtype auto` as each engine resolves it",
    "engines/test_budgets.py": "every budget term of each engine with hand-derived numbers, releases, defaults",
    "engines/test_model_max_len.py": "the longest max_model_len each engine accepts under rope scaling",
    "engines/test_vllm_choices.py": "what vLLM chooses by itself for a model, a GPU and an installation",
    "engines/test_vllm_cpu.py": "vLLM's CPU backend as a target: an explicit KV budget, float32 SSM state",
    "engines/test_vllm_cpu_models.py": "what vLLM's CPU backend does with particular models",
    "engines/test_vllm_flags.py": "`--dtype` as the engine runs the model, and a pasted `vllm serve` line",
    "explain/test_corpus.py": "the corpus of real start-up logs (benchmarks/corpus/) stays well-formed",
    "explain/test_corpus_logs.py": "explain reads every corpus log with no flags and recomputes its logged tokens",
    "memory/test_cross_attention.py": "cross-attention layers cache the request's image tokens",
    "model/test_hub_configs.py": "every real Hub config in shared/hub-configs gives its hand-computed KV bytes",
    "model/test_model_specs.py": "the bundled model specs (model_specs/) parse and say where their numbers came from",
    "model/test_transformers_oracle.py": "transformers as the config oracle, sampled",
    "observe/test_diagnosis.py": "observe's diagnosis from what the page says, and a server that stops answering",
    "observe/test_real_server.py": "replays of a real vLLM server's pages and logs",
    "planning/test_deployment_limits.py": "deployments the engine refuses or caps, and the launch command they serve",
    "planning/test_sections_agree.py": "one plan, one answer: every section of a plan counts the same blocks",
    "project/test_benchmarks.py": "the speed benchmarks still run to their summary",
    "project/test_ci_action.py": "the GitHub Action and the pre-commit hook run as declared",
    "project/test_packaging.py": "the wheel ships model_specs; every module imports in a fresh interpreter",
    "sim/test_figures_agree.py": "every figure simulate derives agrees with what it derives from",
}
# Test files in a package's folder that reach their package only through the CLI, the API or the plan.
THROUGH_THE_CLI = {
    "checks/test_compare.py": "a list of values per option, planned and printed as rows by `kvplan estimate`",
    "engines/test_vllm_cpu_models.py": "the CPU backend's rules as the plan applies them",
    "explain/test_corpus.py": "the corpus entries' curated kvplan blocks, planned with the engines' rules",
    "cli/test_startup.py": "the command line's start-up, run in a fresh interpreter",
}


def _packages() -> list[Path]:
    """kvplan's packages (folders with an ``__init__.py``), relative to kvplan/."""
    return sorted(p.parent.relative_to(PACKAGE) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def _test_files() -> list[Path]:
    return sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts)


# kvplan/cli/commands/ holds one thin function per command: their tests are whole-command tests (tests/cli/).
PACKAGES_WITHOUT_A_FOLDER = {Path("cli/commands"): "the commands are checked whole, in tests/cli/ and tests/e2e/"}


def test_every_kvplan_package_has_its_test_folder() -> None:
    missing = [str(p) for p in _packages() if p not in PACKAGES_WITHOUT_A_FOLDER and not (TESTS / p).is_dir()]
    assert missing == [], f"kvplan packages without a tests/ folder: {missing}"
    assert all(p in _packages() for p in PACKAGES_WITHOUT_A_FOLDER), "a listed package no longer exists"


def test_every_test_file_sits_under_the_package_it_speaks_for() -> None:
    """tests/engines/test_sglang.py speaks for kvplan/engines/sglang.py; a file named for a behaviour is listed in
    BEHAVIOURS with what it checks; tests/'s top holds the tests of kvplan's flat modules and the repo-wide checks."""
    packages = set(_packages())
    misplaced, unnamed, silent = [], [], []
    for rel in _test_files():
        folder, stem = rel.parent, rel.stem.removeprefix("test_")
        key = rel.as_posix()
        if folder == Path("."):
            if not (PACKAGE / f"{stem}.py").is_file() and rel.name not in REPO_WIDE:
                misplaced.append(key)
            continue
        if folder not in packages and folder.as_posix() not in WHOLE_COMMAND_FOLDERS:
            misplaced.append(key)
            continue
        named = folder in packages and ((PACKAGE / folder / f"{stem}.py").is_file() or stem == folder.name)
        if not named and key not in BEHAVIOURS:
            unnamed.append(key)
        if folder in packages and key not in THROUGH_THE_CLI:
            dotted = "kvplan." + ".".join(folder.parts)
            text = (TESTS / rel).read_text(encoding="utf-8")
            imported = {m[0] + ("." + m[1] if m[1] else "") for m in
                        re.findall(r"^\s*from (kvplan(?:\.\w+)*) import \(?\s*(\w+)|^\s*import (kvplan(?:\.\w+)*)()", text,
                                   flags=re.M) for m in [(m[0] or m[2], m[1])]}
            if not any(name == dotted or name.startswith(dotted + ".") for name in imported):
                silent.append(key)
    assert misplaced == [], f"test files outside a folder of kvplan's packages (or e2e/, docs/, project/): {misplaced}"
    assert unnamed == [], f"test files named for no module of their package; name them for it, or say in BEHAVIOURS what they check: {unnamed}"
    assert silent == [], f"test files that import nothing of the package whose folder they sit in: {silent}"
    listed = set(BEHAVIOURS) | set(THROUGH_THE_CLI)
    assert listed <= {p.as_posix() for p in _test_files()}, f"listed files that no longer exist: {listed - {p.as_posix() for p in _test_files()}}"


def test_the_files_run_first_exist() -> None:
    """conftest's LONG_FIRST names test files by path: a file moved or renamed would silently run in its place."""
    from conftest import LONG_FIRST

    root = TESTS.parent
    assert [path for path in LONG_FIRST if not (root / path).is_file()] == []
    assert len(set(LONG_FIRST)) == len(LONG_FIRST)


def test_test_modules_have_unique_names_and_helpers_sit_at_the_top() -> None:
    """pytest imports test modules by their basename (rootdir-relative 'prepend' import mode, no __init__.py):
    two test_x.py in two folders would clash. Helpers sit at tests/'s top, where every test file finds them."""
    names = [p.name for p in _test_files()]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
    others = sorted(p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*.py")
                    if not p.name.startswith("test_") and "fixtures" not in p.relative_to(TESTS).parts)
    assert others == sorted(HELPERS), "helpers belong at tests/'s top (and in HELPERS); tests are named test_*.py"
    assert not list(TESTS.rglob("__init__.py")), "tests/ is no package: its modules are imported by basename"
    # ``from tests.x import`` finds tests/x.py of any checkout on sys.path (an editable install's): only helpers
    wrong = sorted(f"{p.relative_to(TESTS)}: tests.{name}" for p in TESTS.rglob("*.py") if "fixtures" not in p.parts
                   for name in re.findall(r"^\s*from tests\.(\w+) import", p.read_text(encoding="utf-8"), flags=re.M)
                   if f"{name}.py" not in HELPERS)
    assert wrong == [], f"test files import helpers by their bare name (tests/ is on sys.path), never other tests: {wrong}"


# --- the size of the rooms --------------------------------------------------------------------------------------

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
# Each exception with its size when it was listed (lines): the list only shrinks, and a listed room does not grow.
MODULE_EXCEPTIONS: dict[str, tuple[int, str]] = {}
FUNCTION_EXCEPTIONS: dict[str, tuple[int, str]] = {}


def _function_lengths(text: str, rel: str) -> dict[str, int]:
    """Each function's length in lines: its body (the signature, where a command declares its options, aside),
    without the functions and classes defined inside it (each measured on its own). Keyed ``rel:outer.name``."""
    import ast

    out: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = set(range(child.body[0].lineno, child.end_lineno + 1))
                for inner in ast.walk(child):
                    if inner is not child and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        start = min([inner.lineno] + [d.lineno for d in inner.decorator_list])
                        lines -= set(range(start, inner.end_lineno + 1))
                out[f"{rel}:{prefix}{child.name}"] = len(lines)
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(text), "")
    return out


def _check_sizes(sizes: dict[str, int], limit: int, exceptions: dict[str, tuple[int, str]], what: str) -> None:
    over = {name: n for name, n in sizes.items() if n > limit}
    new = sorted(f"{name} ({n} lines)" for name, n in over.items() if name not in exceptions)
    assert new == [], f"{what} over {limit} lines: split by what each part owns: {new}"
    grown = sorted(f"{name}: {over[name]} lines, listed at {exceptions[name][0]}" for name in over
                   if over[name] > exceptions[name][0])
    assert grown == [], f"a listed {what} grew; split it (or, while its split is pending, say why here): {grown}"
    done = sorted(name for name in exceptions if name not in over)
    assert done == [], f"no longer over {limit} lines (or gone): take them off the list: {done}"


def test_no_module_is_over_600_lines() -> None:
    sizes = {p.relative_to(PACKAGE.parent).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in PACKAGE.rglob("*.py")}
    _check_sizes(sizes, MAX_MODULE_LINES, MODULE_EXCEPTIONS, "module")


def test_no_function_is_over_60_lines() -> None:
    sizes = {name: n for p in PACKAGE.rglob("*.py")
             for name, n in _function_lengths(p.read_text(encoding="utf-8"), p.relative_to(PACKAGE.parent).as_posix()).items()}
    _check_sizes(sizes, MAX_FUNCTION_LINES, FUNCTION_EXCEPTIONS, "function")


def test_a_function_is_measured_by_its_body_without_what_it_defines() -> None:
    # register: 1 body line of its own (return) once its command is taken out; the command: 3 body lines (the
    # docstring, x, return), its 3 option lines aside; the class's method: 1 line
    text = ("def register(app):\n    @app.command()\n    def observe(\n        url: str,\n        every: float = 1,\n"
            "    ):\n        \"\"\"Doc.\"\"\"\n        x = 1\n        return x\n    return observe\n\n"
            "class C:\n    def m(self):\n        return 1\n")
    assert _function_lengths(text, "m.py") == {"m.py:register": 1, "m.py:register.observe": 3, "m.py:C.m": 1}
