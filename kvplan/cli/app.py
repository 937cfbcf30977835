"""The ``kvplan`` command line: one thin function per command (load, compute, render).

Errors: a :class:`~kvplan.errors.KvplanError` becomes one line on stderr and its exit code
(2: bad input); ``KVPLAN_DEBUG=1`` shows the traceback (:mod:`kvplan.cli.errors`). Commands other than
the core ones live in ``kvplan/cli/commands/<name>.py`` and register themselves on the app (each imports its
heavy modules lazily, and never imports this module).

Start-up: the console entry point is :func:`kvplan.cli.entry.main`, which runs a plain ``kvplan estimate``
line without typer and hands every other line to :func:`main` here. :func:`main` builds a typer app holding
only the command it runs (:func:`build_app`), so neither the other commands' modules nor their typer
parameters are made; ``app`` (every command: ``--help``, the docs, typer's test runner) is built on first use.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from kvplan import __version__
from kvplan.cli.errors import handle_errors
from kvplan.cli.options import (
    BriefOpt, HubOpt, JsonOpt, ModelArg, OfflineOpt, OneKvDtypeOpt, RefreshOpt, RevisionOpt, TokenOpt, with_aliases,
    with_estimate_options,
)

if TYPE_CHECKING:  # pragma: no cover
    app: typer.Typer


def _new_app() -> typer.Typer:
    new = typer.Typer(
        name="kvplan",
        help="Plan KV-cache memory for LLM serving: how many requests, at what context, fit on this GPU.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    new.callback()(_root)
    return new


def version_callback(value: bool) -> None:
    if value:
        print(f"kvplan {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=version_callback, is_eager=True,
                                                    help="Show the version and exit.")] = None,
) -> None:
    """kvplan: KV-cache capacity planning for LLM serving."""


ESTIMATE_EPILOG = ("Examples: kvplan estimate meta-llama/Llama-3.1-8B --gpu H100 --context 8k  ·  "
                   "kvplan estimate Qwen/Qwen3-32B -g a100 --tp 2 --kv-dtype fp8 --batch 32 --json")


@handle_errors
@with_estimate_options
def estimate(model: ModelArg, json_out: JsonOpt = False, brief: BriefOpt = False, *, values: dict[str, Any],
             token: str | None) -> None:
    """How many requests at what context fit: the answer first, then per-token bytes, memory budget, blocks."""
    from kvplan.cli import estimate as body  # shared with the plain path that runs without typer

    body.estimate_command(model, json_out, brief, values=values, token=token)


@handle_errors
def models(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """List the bundled model specs (`kvplan models show MODEL` for one)."""
    if ctx.invoked_subcommand is not None:
        return
    from kvplan.render.catalogue import models_rows, render_models

    rows = models_rows()
    if json_out:
        from kvplan.render import print_json

        print_json(rows)
        return
    from kvplan.render import console

    console().print(render_models(rows))


@handle_errors
@with_aliases
def models_show(
    model: ModelArg,
    revision: RevisionOpt = None,
    token: TokenOpt = None,
    hub: HubOpt = False,
    offline: OfflineOpt = False,
    refresh: RefreshOpt = False,
    kv_dtype: OneKvDtypeOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """One resolved spec: where it came from and what each layer group caches."""
    from kvplan.render.catalogue import model_detail, render_model_detail
    from kvplan.model.sources import load_spec

    spec, source = load_spec(model, revision=revision, token=token, force_hub=hub, offline=offline, refresh=refresh)
    detail = model_detail(spec, source.describe(), kv_dtype)
    if json_out:
        from kvplan.render import print_json

        print_json(detail)
        return
    from kvplan.render import console

    console().print(render_model_detail(detail))


@handle_errors
def gpus(json_out: JsonOpt = False) -> None:
    """The GPU catalogue: memory the runtime reports, bandwidth, aliases."""
    from kvplan.gpus import load_gpus

    catalogue = load_gpus()
    if json_out:
        from kvplan.render import print_json

        print_json([g.to_dict() for g in catalogue])
        return
    from kvplan.render import console
    from kvplan.render.catalogue import render_gpus

    console().print(render_gpus(catalogue))


def _register_estimate(target: typer.Typer) -> None:
    target.command("estimate", epilog=ESTIMATE_EPILOG)(estimate)


def _register_models(target: typer.Typer) -> None:
    models_app = typer.Typer(help="Bundled model specs (offline, pinned).", invoke_without_command=True,
                             no_args_is_help=False)
    models_app.callback(invoke_without_command=True)(models)
    models_app.command("show")(models_show)
    target.add_typer(models_app, name="models")


def _register_gpus(target: typer.Typer) -> None:
    target.command("gpus")(gpus)


def _register_module(name: str) -> Callable[[typer.Typer], None]:
    """A command of ``kvplan/cli/commands/<name>.py``, its module imported only when it is registered."""
    def register(target: typer.Typer) -> None:
        from importlib import import_module

        import_module(f"kvplan.cli.commands.{name}").register(target)

    return register


# every command, in the order --help lists them: name -> how it is registered on an app
COMMANDS: dict[str, Callable[[typer.Typer], None]] = {
    "estimate": _register_estimate, "models": _register_models, "gpus": _register_gpus,
    **{name: _register_module(name) for name in ("size", "validate", "check", "report", "schema", "simulate",
                                                 "observe", "explain")},
}


def build_app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or with the command ``only`` alone (what :func:`main` runs)."""
    new = _new_app()
    for name, register in COMMANDS.items():
        if only is None or name == only:
            register(new)
    return new


_FULL: list[typer.Typer] = []


def __getattr__(name: str) -> Any:
    """``app``: the app with every command, built on first use."""
    if name == "app":
        if not _FULL:
            _FULL.append(build_app())
        return _FULL[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "app"])


def _command_of(args: list[str]) -> str | None:
    """The command ``args`` run (their first word, when it names one; options come after it)."""
    first = args[0] if args else ""
    return first if first in COMMANDS else None


def usage_error_line(exc: BaseException) -> str | None:
    """A command-line usage error (unknown option, missing argument, bad value) as one line, or None.

    typer raises click's usage exceptions; only their public attributes are read (``format_message``,
    ``exit_code``, ``ctx``), so no typer internals are imported.
    """
    fmt, code = getattr(exc, "format_message", None), getattr(exc, "exit_code", None)
    if not callable(fmt) or not isinstance(code, int):
        return None
    message = " ".join(str(fmt()).split())
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None) or "kvplan"
    return f"{message} (see {path} --help)" if message else f"usage error (see {path} --help)"


def main(args: list[str] | None = None) -> None:
    """Console-script entry point: usage errors are one line on stderr and exit 2, like every other error."""
    if args is None:
        args = sys.argv[1:]
    command = typer.main.get_command(build_app(_command_of(args)))
    try:
        rv = command.main(args=args, prog_name="kvplan", standalone_mode=False)
    except typer.Abort:
        sys.stderr.write("kvplan: error: interrupted\n")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - only click's usage errors are handled here
        line = usage_error_line(exc)
        if line is None or os.environ.get("KVPLAN_DEBUG"):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # `kvplan` alone: the help, as typer shows it (exit 2)
            ctx = getattr(exc, "ctx", None)
            sys.stdout.write((ctx.get_help() if ctx is not None else line) + "\n")
            sys.exit(getattr(exc, "exit_code", 2))
        sys.stderr.write(f"kvplan: error: {line}\n")
        sys.exit(getattr(exc, "exit_code", 2) or 2)
    sys.exit(rv if isinstance(rv, int) else 0)
