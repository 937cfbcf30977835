"""The CLI's estimate options, built from the option table (:data:`kvplan.options.OPTIONS`).

Values stay strings where the user may type units (``8k``, ``24GiB``); :func:`kvplan.options.options_from_values`
parses them, so the CLI and the YAML files accept exactly the same spellings. To add an option, add it to
the table: :func:`with_estimate_options` gives it to every command that takes estimate options.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from typing import Annotated, Any, Callable, Optional, TypeVar

import typer

from kvplan.cli.flags import ALIASES, cli_type, resolve_aliases, split_flags, split_values  # noqa: F401 - re-exported
from kvplan.options import BY_NAME, CLI_OPTIONS, KINDS, Opt

# ---------------------------------------------------------------------------------------------
# shell completion (typer's autocompletion callbacks): cheap, from the bundled files (no torch, no Hub)

KV_DTYPE_NAMES = ("auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "int4")  # what --kv-dtype's help lists


def _matching(names: Any, incomplete: str) -> list[str]:
    """``names`` that complete ``incomplete``, case-insensitively; a list option (``H100,H2``) completes its last
    item, keeping the ones before it."""
    head, _, last = incomplete.rpartition(",")
    head = head + "," if head else ""
    seen: dict[str, None] = {}
    for name in names:
        if name.lower().startswith(last.lower()):
            seen.setdefault(head + name)
    return list(seen)


def complete_gpu(incomplete: str) -> list[str]:
    """GPU names and aliases of the catalogue (``kvplan gpus``), those a shell word can hold (no spaces)."""
    from kvplan.gpus import load_gpus

    return _matching((label for g in load_gpus() for label in (g.name, *g.aliases) if " " not in label), incomplete)


def complete_model(incomplete: str) -> list[str]:
    """Bundled model ids (``kvplan models``); a Hub id or a path is typed as it is."""
    from kvplan.model.sources import bundled_ids

    return _matching(bundled_ids(), incomplete)


def complete_kv_dtype(incomplete: str) -> list[str]:
    return _matching(KV_DTYPE_NAMES, incomplete)


def complete_dtype(incomplete: str) -> list[str]:
    from kvplan.options import MODEL_DTYPES

    return _matching(("auto", *MODEL_DTYPES), incomplete)


def complete_choice(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    return lambda incomplete: _matching(choices, incomplete)


COMPLETIONS: dict[str, Callable[[str], list[str]]] = {
    "gpu": complete_gpu, "kv_dtype": complete_kv_dtype, "dtype": complete_dtype,
    **{kind: complete_choice(k.choices) for kind, k in KINDS.items() if k.choices},
}
"""The completion of each kind of option value that has names to offer (:data:`kvplan.options.KINDS`)."""

ModelArg = Annotated[str, typer.Argument(help="Hub id (meta-llama/Llama-3.1-8B), bundled id, or local path to a "
                                         "config.json / model folder.", show_default=False,
                                         autocompletion=complete_model)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
BriefOpt = Annotated[bool, typer.Option("--brief", help="Print only the lines the engine logs about its KV cache "
                                        "and the verdict.")]


def cli_annotation(opt: Opt) -> Any:
    """``Annotated[type, typer.Option(...)]`` for one table entry (its kind decides the type)."""
    typ: Any = cli_type(opt)
    if opt.cli_value is None:
        typ = Optional[typ]
    extra: dict[str, Any] = {} if opt.show_default else {"show_default": False}
    if opt.kind in COMPLETIONS:
        extra["autocompletion"] = COMPLETIONS[opt.kind]
    return Annotated[typ, typer.Option(*split_flags(opt)[0], help=opt.help, rich_help_panel=opt.panel, **extra)]


def alias_parameters(name: str) -> list[inspect.Parameter]:
    """The parameters of option ``name``'s other spellings, each listed on its own row of ``--help``."""
    out = []
    for key, (opt, flag, negates) in ALIASES.items():
        if opt.name == name:
            help_ = f"Turns {opt.flag} off." if negates else f"Same as {opt.flag}."
            done = {"autocompletion": COMPLETIONS[opt.kind]} if opt.kind in COMPLETIONS and not negates else {}
            option = typer.Option(flag, help=help_, rich_help_panel=opt.panel, show_default=False, **done)
            typ = Optional[bool if negates else cli_type(opt)]
            out.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None,
                                         annotation=Annotated[typ, option]))
    return out


def with_alias_rows(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """``params``, each followed by its option's other spellings (keyword-only, like the rest after it)."""
    out: list[inspect.Parameter] = []
    for p in params:
        out.append(p)
        out += [a.replace(kind=p.kind) for a in alias_parameters(p.name)]
    return out


def cli_parameter(opt: Opt) -> inspect.Parameter:
    """The keyword parameter typer reads for one table entry."""
    return inspect.Parameter(opt.name, inspect.Parameter.KEYWORD_ONLY, default=opt.cli_value,
                             annotation=cli_annotation(opt))


# the table's options that commands also declare on their own (``kvplan models show``, ``kvplan check``)
RevisionOpt, TokenOpt, HubOpt, OfflineOpt, RefreshOpt, KvDtypeOpt = (
    cli_annotation(BY_NAME[name]) for name in ("revision", "token", "hub", "offline", "refresh", "kv_dtype"))
# --kv-dtype of a command that plans one dtype (``kvplan size``, ``kvplan models show``): estimate's help
# without its list ("a list prints one row per dtype" is estimate's and check's sweep, not theirs)
OneKvDtypeOpt = cli_annotation(dataclasses.replace(
    BY_NAME["kv_dtype"], help=BY_NAME["kv_dtype"].help.split("; a list")[0] + " (one dtype)."))

ESTIMATE_PARAMS = tuple(cli_parameter(opt) for opt in CLI_OPTIONS)
F = TypeVar("F", bound=Callable[..., Any])


def with_estimate_options(fn: F) -> F:
    """Give a command every estimate option of the table without repeating them.

    ``fn`` declares ``model`` first, its own options, and two keyword-only parameters the decorator
    fills: ``values`` (a dict for :func:`kvplan.options.options_from_values`) and ``token`` (the Hub
    token). typer sees ``model``, the estimate options, then ``fn``'s own options.
    """
    hints = typing.get_type_hints(fn, include_extras=True)  # fn's annotations are strings (PEP 563)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(fn).parameters.values()
           if p.name not in ("values", "token")]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values, token = split_values(kwargs)
        return fn(*args, values=values, token=token, **kwargs)

    params = own[:1] + [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in ESTIMATE_PARAMS] + own[1:]
    return _signed(wrapper, with_alias_rows(params))


def with_aliases(fn: F) -> F:
    """Give the table options ``fn`` declares itself their other spellings (``kvplan models show
    --kv-cache-dtype``)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(fn).parameters.values()]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        resolve_aliases(kwargs)
        return fn(*args, **kwargs)

    return _signed(wrapper, with_alias_rows(own))


def _signed(wrapper: Any, params: list[inspect.Parameter]) -> Any:
    """``wrapper`` with the signature typer reads (``params``), not the wrapped function's."""
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__
    return wrapper
