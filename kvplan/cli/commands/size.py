"""``kvplan size MODEL --concurrency N --context L``: the smallest deployments that hold N requests
(:mod:`kvplan.planning.size`), by GPUs or, with ``--prices``, by cost."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.options import HubOpt, JsonOpt, ModelArg, OfflineOpt, OneKvDtypeOpt, RevisionOpt, TokenOpt

EPILOG = ("Examples: kvplan size meta-llama/Llama-3.3-70B-Instruct --concurrency 200 --context 8k  ·  "
          "kvplan size Qwen/Qwen3-32B -n 64 -c 32k --gpu H100,H200,L40S --engine sglang  ·  "
          "kvplan size deepseek-ai/DeepSeek-R1 -n 100 -c 16k --prices docs/examples/prices.yaml --json")


def register(app: typer.Typer) -> None:
    from kvplan.cli.errors import handle_errors

    @app.command("size", epilog=EPILOG)
    @handle_errors
    def size(
        model: ModelArg,
        concurrency: Annotated[str, typer.Option("--concurrency", "-n", help="Requests that must run at once.",
                                                 show_default=False)],
        context: Annotated[Optional[str], typer.Option("--context", "-c", help="Tokens per request (prompt + "
                                                       "output), e.g. 8192, 8k, 128k (default: 8192, at most the "
                                                       "model's maximum).", show_default=False)] = None,
        prefix_tokens: Annotated[Optional[str], typer.Option("--prefix-tokens", help="Tokens of a prefix every "
                                                             "request shares (stored once with prefix caching).",
                                                             show_default=False)] = None,
        gpu: Annotated[Optional[str], typer.Option("--gpu", "-g", help="GPUs to search, comma-separated "
                                                   "(default: the catalogue's datacenter GPUs; with --prices, "
                                                   "the priced ones).", show_default=False)] = None,
        tp: Annotated[Optional[str], typer.Option("--tp", help="Tensor-parallel sizes to try, comma-separated "
                                                  "(default: every size within one node the engine accepts).",
                                                  show_default=False)] = None,
        at: Annotated[str, typer.Option("--at", help="Judge each replica at the low end of kvplan's range (low) "
                                        "or at its estimate (estimate).")] = "low",
        prices: Annotated[Optional[str], typer.Option("--prices", help="YAML file of your prices per GPU-hour with "
                                                      "their source and date (docs/examples/prices.yaml): adds "
                                                      "cost per hour and ranks by it.", show_default=False)] = None,
        kv_dtype: OneKvDtypeOpt = None,
        engine: Annotated[Optional[str], typer.Option("--engine", help="Serving engine: vllm or sglang "
                                                      "(default: vllm).", show_default=False)] = None,
        engine_version: Annotated[Optional[str], typer.Option("--engine-version", help="Engine release to model "
                                                              "(default: the newest modelled).",
                                                              show_default=False)] = None,
        revision: RevisionOpt = None,
        token: TokenOpt = None,
        hub: HubOpt = False,
        offline: OfflineOpt = False,
        csv_out: Annotated[bool, typer.Option("--csv", help="Print one CSV line per deployment on stdout.")] = False,
        json_out: JsonOpt = False,
    ) -> None:
        """The smallest deployments (GPU x tp x pp x replicas) that hold N requests of L tokens, judged at the low end of kvplan's range; by cost with --prices."""
        from kvplan.errors import InputError
        from kvplan.planning.size import size_model

        if csv_out and json_out:
            raise InputError("--csv and --json: give one of them")
        sizing = size_model(model, concurrency, context, gpus=gpu, tps=tp, at=at, prices=prices, token=token,
                            prefix_tokens=prefix_tokens, kv_dtype=kv_dtype, engine=engine,
                            engine_version=engine_version, revision=revision, hub=hub or None,
                            offline=offline or None)
        if json_out:
            from kvplan.render import print_json

            print_json(sizing.to_dict())
            return
        if csv_out:
            import sys

            from kvplan.render.size import size_csv

            sys.stdout.write(size_csv(sizing))
            return
        from kvplan.render import console
        from kvplan.render.size import render_size

        out = console()
        out.print(f"[grey62]source: {sizing.source}[/]")
        out.print(render_size(sizing))

    _ = size  # registered on the app
