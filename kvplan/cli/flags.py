"""The estimate options' command-line spellings, without typer: each option's own flags and other spellings
(:func:`split_flags`, :data:`ALIASES`), how typer's keyword arguments become a values dict
(:func:`split_values`), and a plain ``kvplan estimate`` command line read into those same keyword arguments
(:func:`plain_estimate`), so the common case runs without importing typer (~50 ms of start-up).

:func:`plain_estimate` reads only the forms it reads exactly as typer does: ``estimate MODEL`` and options in
any order, each given once, as ``--flag VALUE``, ``--flag=VALUE``, ``-f VALUE`` or an on/off ``--flag``; an
integer option's value all digits; no value starting with ``-``. Anything else (``--help``, an unknown or
repeated option, a missing value, shell completion) returns None and typer reads the line, so every usage
error is typer's. tests/test_cli.py holds the table to typer's own parameters and the keyword arguments to
typer's for generated command lines.

May import: kvplan.errors, kvplan.options
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from kvplan.errors import InputError
from kvplan.options import CLI_OPTIONS, KINDS, Opt


def split_flags(opt: Opt) -> tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]:
    """``(flags, others)``: the option's own flags (its first long flag and the short ones) and each other
    long spelling with whether it negates: vLLM's ``--tensor-parallel-size`` for ``--tp`` (an alias),
    ``--no-prefix-caching`` for ``--prefix-caching`` (a negation).

    Each other spelling is a parameter of its own, so ``--help`` lists every name whole on its own row:
    rich's options table puts an option's long names in one cell (and a negation in a column of its own)
    and cuts the cell to fit 80 columns (``--tp,--tensor-paral…``).
    """
    own: list[str] = []
    others: list[tuple[str, bool]] = []
    for flag in opt.cli_flags:
        positive, _, negative = flag.partition("/")
        if not positive.startswith("--") or not any(f.startswith("--") for f in own):
            own.append(positive)
        else:
            others.append((positive, False))
        if negative:
            others.append((negative, True))
    return tuple(own), tuple(others)


def cli_type(opt: Opt) -> type:
    """What typer parses an option's value as: ``str`` (values with units, lists), ``int`` or ``bool``."""
    return str if opt.compare else KINDS[opt.kind].cli_type  # a list of values is text


# other spellings: parameter name -> (option, flag, negates), e.g. ``tp__tensor_parallel_size`` ->
# (--tp, --tensor-parallel-size, False), ``prefix_caching__no_prefix_caching`` -> (..., True)
ALIASES: dict[str, tuple[Opt, str, bool]] = {f"{o.name}__{flag[2:].replace('-', '_')}": (o, flag, negates)
                                             for o in CLI_OPTIONS for flag, negates in split_flags(o)[1]}


def resolve_aliases(kwargs: dict[str, Any]) -> None:
    """Fold each other spelling's parameter into its option's, in place (``--no-prefix-caching``: False);
    the option and another spelling of it given different values is an :class:`InputError`."""
    for key, (opt, flag, negates) in ALIASES.items():
        given = kwargs.pop(key, None)
        if given is None:
            continue
        given = not given if negates else given
        value = kwargs.get(opt.name, opt.cli_value)
        if value != opt.cli_value and value != given:
            raise InputError(f"{split_flags(opt)[0][0]} and {flag} disagree" if negates else
                             f"{opt.flag} {value} and {flag} {given} disagree", "give one of them")
        kwargs[opt.name] = given


_NAMES = frozenset(o.name for o in CLI_OPTIONS)


def split_values(kwargs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``(values, token)`` from the keyword arguments typer passes a command with every estimate option:
    the other spellings folded in (:func:`resolve_aliases`), the estimate options moved out of ``kwargs``
    (in place) into ``values`` for :func:`kvplan.options.options_from_values`, the Hub token apart."""
    resolve_aliases(kwargs)
    values = {k: kwargs.pop(k) for k in list(kwargs) if k in _NAMES}
    return values, values.pop("token", None)


class Spelling(NamedTuple):
    """One flag of ``kvplan estimate``: the parameter it sets, what typer parses its value as (``bool``: an
    on/off flag, no value) and the parameter's default (what typer passes when the flag is absent)."""

    param: str
    type: type
    default: Any


def _spellings() -> dict[str, Spelling]:
    out: dict[str, Spelling] = {}
    for opt in CLI_OPTIONS:
        own, others = split_flags(opt)
        out.update({flag: Spelling(opt.name, cli_type(opt), opt.cli_value) for flag in own})
        for flag, negates in others:
            out[flag] = Spelling(f"{opt.name}__{flag[2:].replace('-', '_')}", bool if negates else cli_type(opt),
                                 None)
    # the command's own options (kvplan.cli.options.JsonOpt, BriefOpt)
    out.update({"--json": Spelling("json_out", bool, False), "--brief": Spelling("brief", bool, False)})
    return out


ESTIMATE_SPELLINGS: dict[str, Spelling] = _spellings()
COMPLETION_VARIABLE = "_KVPLAN_COMPLETE"  # set by the shell when it asks typer for completions


def plain_estimate(args: list[str]) -> dict[str, Any] | None:
    """The keyword arguments typer passes the ``estimate`` command for the command line ``args``
    (``["estimate", MODEL, options...]``), or None when ``args`` is not a plain estimate line (then typer
    reads it: help, usage errors, completion)."""
    if not args or args[0] != "estimate" or COMPLETION_VARIABLE in os.environ:
        return None
    kwargs: dict[str, Any] = {s.param: s.default for s in ESTIMATE_SPELLINGS.values()}
    model: str | None = None
    seen: set[str] = set()
    words = iter(args[1:])
    for word in words:
        if not word.startswith("-"):
            if model is not None:
                return None
            model = word
            continue
        flag, eq, inline = word.partition("=")
        spelling = ESTIMATE_SPELLINGS.get(flag)
        if spelling is None or spelling.param in seen or (eq and (not flag.startswith("--") or not inline)):
            return None
        seen.add(spelling.param)
        if spelling.type is bool:
            if eq:
                return None
            kwargs[spelling.param] = True
            continue
        value = inline if eq else next(words, None)
        if value is None or value.startswith("-"):
            return None
        if spelling.type is int:
            if not (value.isascii() and value.isdigit()):
                return None
            kwargs[spelling.param] = int(value)
        else:
            kwargs[spelling.param] = value
    if model is None:
        return None
    kwargs["model"] = model
    return kwargs
