"""``kvplan explain LOG``: why the engine said N tokens - the log's terms next to kvplan's, term by term."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, OfflineOpt, TokenOpt

EPILOG = ("Examples: kvplan explain vllm.log --gpu H100  ·  kubectl logs pod/vllm | kvplan explain - --gpu a100 --json  ·  "
          "kvplan explain vllm.log --gpu H100 --calibrate calib.yaml && kvplan estimate MODEL --calibration calib.yaml")
MAX_LOG_BYTES = 512 * 1024 * 1024

_O = "deployment (when the log does not say)"


def read_log(path: str) -> str:
    """The log's text from a file or ``-`` (stdin); undecodable bytes become U+FFFD (a garbled log still parses)."""
    import sys

    if path == "-":
        data = sys.stdin.buffer.read(MAX_LOG_BYTES + 1)
    else:
        from kvplan.errors import InputError
        from kvplan.io.files import read_bytes

        data = read_bytes(path, "start-up log", max_bytes=MAX_LOG_BYTES, error=InputError)
    return data[:MAX_LOG_BYTES].decode("utf-8", errors="replace")


def register(app: typer.Typer) -> None:
    from kvplan.cli.errors import handle_errors

    @app.command("explain", epilog=EPILOG)
    @handle_errors
    def explain(
        log: Annotated[str, typer.Argument(help="vLLM (V0/V1, INFO or DEBUG) or SGLang start-up log file, or - for stdin.",
                                           show_default=False)],
        model: Annotated[Optional[str], typer.Option("--model", help="The model, when the log does not name it "
                                                     "(a Hub id, bundled id or local path).", rich_help_panel=_O)] = None,
        gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="The GPU (`kvplan gpus`); V1 logs do not print it.",
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
        calibrate: Annotated[Optional[str], typer.Option("--calibrate", help="Write the measured terms to this "
                                                         "calibration file (YAML; updated in place) for --calibration.")] = None,
        offline: OfflineOpt = False,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Reconcile a start-up log with kvplan's plan of the same deployment, term by term, ending with the KV tokens and concurrency from kvplan's terms and from the logged ones."""
        from kvplan.explain.reconcile import explain as run

        overrides = {"model": model, "gpu": gpu, "gpu_memory": gpu_memory, "engine_version": engine_version, "tp": tp,
                     "pp": pp, "max_model_len": max_model_len, "usage_context": usage_context,
                     "weights_dtype": weights_dtype, "offline": offline or None}
        ex = run(read_log(log), overrides, token=token)
        written = _calibrate(ex, calibrate, log) if calibrate else None
        if json_out:
            from kvplan.render import print_json
            from kvplan.render.explain import explanation_to_dict

            out = explanation_to_dict(ex)
            if written:
                out["calibration"] = written
            print_json(out)
            return
        from kvplan.render import console
        from kvplan.render.explain import render_explanation

        out = console()
        out.print(render_explanation(ex))
        if written:
            out.print(f"calibration: {written['path']} ({written['action']} the entry for {written['key']})")

    _ = explain  # registered on the app


def _calibrate(ex, path: str, log_path: str) -> dict:  # noqa: ANN001 - an Explanation
    """Write the log's measured terms to the calibration file at ``path``; what was written."""
    from pathlib import Path

    from kvplan.io.calibration import write_calibration
    from kvplan.explain.reconcile import calibration_entry

    entry = calibration_entry(ex, "stdin" if log_path == "-" else Path(log_path).name)
    _, replaced = write_calibration(path, entry)
    return {"path": path, "action": "replaced" if replaced else "added", "entry": entry.to_dict(),
            "key": f"{entry.model} on {entry.gpu}, {entry.engine} {entry.release}, tp {entry.tp}"}
