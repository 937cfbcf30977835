"""``kvplan explain LOG...``: why the engine said N tokens - the log's terms next to kvplan's, term by term; many logs
(files or folders) as one table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, OfflineOpt, TokenOpt

EPILOG = ("Examples: kvplan explain vllm.log  ·  kubectl logs pod/vllm | kvplan explain - --json  ·  "
          "kvplan explain logs/  (one row per log)  ·  "
          "kvplan explain vllm.log --calibrate calib.yaml && kvplan estimate MODEL --calibration calib.yaml")
MAX_LOG_BYTES = 512 * 1024 * 1024
LOG_SUFFIXES = (".log", ".txt")  # what a folder's logs are named

_O = "deployment (when the log does not say)"


def read_log(path: str) -> str:
    """The log's text from a file or ``-`` (stdin); undecodable bytes become U+FFFD (a garbled log still parses),
    a binary file (a NUL byte) is an error naming it."""
    import sys

    from kvplan.errors import InputError

    if path == "-":
        data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
    else:
        from kvplan.io.files import read_bytes

        data = read_bytes(path, "start-up log", max_bytes=MAX_LOG_BYTES, error=InputError)
    nul = data.find(b"\x00", 0, MAX_LOG_BYTES)
    if nul >= 0:
        raise InputError(f"{'stdin' if path == '-' else path}: a binary file (a NUL byte at offset {nul:,}), not a "
                         "start-up log", "pass the engine's text log (kubectl logs, docker logs, the server's stdout)")
    return data[:MAX_LOG_BYTES].decode("utf-8", errors="replace")


def log_paths(args: list[str]) -> tuple[list[str], bool]:
    """The log files ``args`` name (a folder: its ``*.log`` / ``*.txt`` files, sorted), and whether they are many."""
    from kvplan.errors import InputError

    paths: list[str] = []
    folder = False
    for arg in args:
        p = Path(arg)
        if arg != "-" and p.is_dir():
            folder = True
            found = sorted(str(f) for f in p.iterdir() if f.is_file() and f.suffix in LOG_SUFFIXES)
            if not found:
                raise InputError(f"{arg}: a folder with no *.log or *.txt file", "pass the log files or their folder")
            paths += found
        else:
            paths.append(arg)
    if paths.count("-") > 1:
        raise InputError("stdin (-) named twice", "pass - once")
    return paths, folder or len(paths) > 1


def register(app: typer.Typer) -> None:
    from kvplan.cli.errors import handle_errors

    @app.command("explain", epilog=EPILOG)
    @handle_errors
    def explain(
        logs: Annotated[list[str], typer.Argument(help="vLLM (V0/V1, INFO or DEBUG, GPU or CPU) or SGLang start-up "
                                                  "log files, folders of them (one row per log), or - for stdin.",
                                                  show_default=False)],
        model: Annotated[Optional[str], typer.Option("--model", help="The model, when the log does not name it or "
                                                     "kvplan cannot load the one it names (a Hub id, bundled id or "
                                                     "local path).", rich_help_panel=_O)] = None,
        gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="The GPU (`kvplan gpus`), when the log does not "
                                                   "print its memory; checked against the total a log prints.",
                                                   rich_help_panel=_O)] = None,
        gpu_memory: Annotated[Optional[str], typer.Option("--gpu-memory", help="GPU memory as the runtime reports it.",
                                                          rich_help_panel=_O)] = None,
        engine_version: Annotated[Optional[str], typer.Option("--engine-version", help="The engine version, when the log "
                                                              "does not print it.", rich_help_panel=_O)] = None,
        tp: Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel size.", rich_help_panel=_O)] = None,
        pp: Annotated[Optional[int], typer.Option("--pp", help="Pipeline-parallel size.", rich_help_panel=_O)] = None,
        max_model_len: Annotated[Optional[int], typer.Option("--max-model-len", help="max_model_len.",
                                                             rich_help_panel=_O)] = None,
        usage_context: Annotated[Optional[str], typer.Option("--usage-context", help="serve (vllm serve) or llm (the LLM "
                                                             "class).", rich_help_panel=_O)] = None,
        weights_dtype: Annotated[Optional[str], typer.Option("--weights-dtype", help="Quantized weights: fp8, int8, int4.",
                                                             rich_help_panel=_O)] = None,
        kv_dtype: Annotated[Optional[str], typer.Option("--kv-dtype", help="The KV cache dtype, when the log does not "
                                                        "print it (fp8, ...).", rich_help_panel=_O)] = None,
        prefix_caching: Annotated[Optional[bool], typer.Option(
            "--prefix-caching/--no-prefix-caching", help="Prefix caching, when the log does not print it (it changes "
            "the blocks state layers keep).", rich_help_panel=_O, show_default=False)] = None,
        flashinfer: Annotated[Optional[bool], typer.Option(
            "--flashinfer/--no-flashinfer", help="Whether FlashInfer is installed (vLLM 0.8 - 0.11's sampler), when "
            "the log does not say.", rich_help_panel=_O, show_default=False)] = None,
        calibrate: Annotated[Optional[str], typer.Option("--calibrate", help="Write the measured terms to this "
                                                         "calibration file (YAML; updated in place) for --calibration; "
                                                         "with many logs, one entry per log.")] = None,
        offline: OfflineOpt = False,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Explain start-up logs: the log's own budget and pool, kvplan's plan of the same deployment term by term, and one line on where they part."""
        overrides = {"model": model, "gpu": gpu, "gpu_memory": gpu_memory, "engine_version": engine_version, "tp": tp,
                     "pp": pp, "max_model_len": max_model_len, "usage_context": usage_context,
                     "weights_dtype": weights_dtype, "kv_dtype": kv_dtype, "prefix_caching": prefix_caching,
                     "flashinfer": flashinfer, "offline": offline or None}
        paths, many = log_paths(logs)
        if calibrate:  # before the work: another kind of file is refused, untouched
            from kvplan.io.calibration import check_calibration_target

            check_calibration_target(calibrate)
        if many:
            _explain_many(paths, overrides, token, calibrate, json_out)
            return
        from kvplan.explain.reconcile import explain as run

        ex = _named(paths[0], lambda: run(read_log(paths[0]), overrides, token=token))
        written = _calibrate([(paths[0], ex)], calibrate, strict=True) if calibrate else None
        if json_out:
            from kvplan.render import print_json
            from kvplan.render.explain import explanation_to_dict

            out = explanation_to_dict(ex)
            if written:
                out["calibration"] = {"path": written["path"], **written["entries"][0]}
            print_json(out)
            return
        from kvplan.render import console
        from kvplan.render.explain import render_explanation

        out = console()
        out.print(render_explanation(ex))
        if written:
            w = written["entries"][0]
            out.print(f"calibration: {written['path']} ({w['action']} the entry for {w['key']})")

    _ = explain  # registered on the app


def _named(path: str, fn):  # noqa: ANN001, ANN202 - the explanation
    """``fn()``, its bad-input errors naming the log file (``vllm.log: the log does not say enough ...``)."""
    from kvplan.explain.account import ExplainError

    try:
        return fn()
    except ExplainError as exc:
        if path == "-":
            raise
        raise ExplainError(f"{path}: {exc.message}", exc.hint) from None


def _explain_many(paths: list[str], overrides: dict, token: str | None, calibrate: str | None, json_out: bool) -> None:
    from kvplan.errors import KvplanError
    from kvplan.explain.many import explain_many

    texts = []
    for path in paths:
        try:
            texts.append((path, read_log(path)))
        except KvplanError as exc:  # an unreadable or binary file is one row, not the end of the run
            texts.append((path, exc))
    good = explain_many([(n, t) for n, t in texts if isinstance(t, str)], overrides, token=token)
    by_name = {r.name: r for r in good}
    from kvplan.explain.many import LogResult

    results = [by_name[n] if isinstance(t, str) else LogResult(n, None, t.one_line()) for n, t in texts]
    written = _calibrate([(r.name, r.explanation) for r in results if r.explanation is not None], calibrate,
                         strict=False) if calibrate else None
    if json_out:
        from kvplan.render import print_json
        from kvplan.render.explain import many_to_dict

        print_json(many_to_dict(results, written))
        return
    from kvplan.render import console
    from kvplan.render.explain import many_text, render_many

    out = console()
    if sys.stdout.isatty():
        out.print(render_many(results))
    else:  # a pipe or a file: plain tab-separated lines, never names cut into pieces at 80 columns
        sys.stdout.write(many_text(results))
    if written:
        entries = written["entries"]
        out.print(f"calibration: {written['path']}: {len(entries)} entries written "
                  f"({sum(1 for e in entries if e['action'] == 'replaced')} replaced); "
                  f"{len(written['skipped'])} logs without terms to calibrate with", soft_wrap=True)


def _calibrate(explained: list, path: str, *, strict: bool) -> dict:  # noqa: ANN001 - (name, Explanation) pairs
    """Write each log's measured terms to the calibration file at ``path`` (one entry per deployment); what was
    written, and (``strict=False``) the logs skipped and why. ``strict``: a log that cannot calibrate is an error."""
    from kvplan.errors import InputError
    from kvplan.explain.calibrate import calibration_entry
    from kvplan.io.calibration import write_calibration

    entries, skipped = [], []
    for name, ex in explained:
        try:
            entry = calibration_entry(ex, "stdin" if name == "-" else Path(name).name)
        except InputError as exc:
            if strict:
                raise
            skipped.append({"log": name, "reason": exc.one_line()})
            continue
        _, replaced = write_calibration(path, entry)
        entries.append({"log": name, "action": "replaced" if replaced else "added", "entry": entry.to_dict(),
                        "key": f"{entry.model} on {entry.gpu}, {entry.engine} {entry.release}, tp {entry.tp}"})
    return {"path": path, "entries": entries, "skipped": skipped}
