"""``kvplan validate``: allocate the pool the plan says on a real device and compare (torch, lazily)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from kvplan.cli.options import JsonOpt, ModelArg, with_estimate_options

DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="Where to allocate: cuda or cpu (default: cuda if available).",
                                                  rich_help_panel="validate")]
ProbeOpt = Annotated[bool, typer.Option("--probe", help="CUDA only: allocate blocks until out of memory and compare with the plan.",
                                        rich_help_panel="validate")]

# Under torchrun, ranks other than 0 exit 0 whatever the verdict: rank 0 gathers every rank's result (or error)
# and exits with the verdict. A rank that failed first would make torchrun stop rank 0 before it says why.
_QUIET_RANK_EXIT = 0

EPILOG = ("Examples: kvplan validate meta-llama/Llama-3.1-8B --gpu H200  ·  "
          "kvplan validate Qwen/Qwen3-8B --gpu cpu --gpu-memory 8GiB --kv-budget 0.5GiB --context 2k  ·  "
          "torchrun --nproc-per-node 2 -m kvplan validate meta-llama/Llama-3.1-70B --gpu H100 --tp 2")


def register(app: typer.Typer) -> None:
    from kvplan.cli.errors import handle_errors

    @app.command(epilog=EPILOG)
    @handle_errors
    @with_estimate_options
    def validate(model: ModelArg, device: DeviceOpt = None, probe: ProbeOpt = False, json_out: JsonOpt = False, *,
                 values: dict[str, Any], token: Optional[str]) -> None:
        """Prove the estimate: allocate the planned KV pool in torch, measure it, fill it to the planned concurrency, check paged attention; exit 1 if the bytes or the concurrency disagree, 2 for a plan that fits no request."""  # noqa: E501 - one line: --help's summary
        values = {"model": model, **values}
        from kvplan.paged.validate import require_torch

        require_torch()
        from kvplan.errors import KvplanError
        from kvplan.paged.distributed import validate_distributed, world_from_env
        from kvplan.paged.validate import validate_plan
        from kvplan.planning.plan import estimate, options_from_values
        from kvplan.render import console, print_json
        from kvplan.render.validate import fill_progress, ranks_json, render_ranks, render_result, result_json

        plan = estimate(options_from_values(values), token=token)
        world = world_from_env()
        with fill_progress() as progress:
            if world is not None and world.size > 1:
                try:
                    results = validate_distributed(plan, world, device, probe=probe, progress=progress)
                except KvplanError:  # every rank raises the same error: rank 0 alone says it and fails
                    if world.rank != 0:
                        raise typer.Exit(_QUIET_RANK_EXIT) from None
                    raise
            else:
                results = [validate_plan(plan, device, probe=probe, progress=progress)]
        ok = all(r.ok for r in results)
        if world is not None and world.size > 1 and world.rank != 0:
            raise typer.Exit(_QUIET_RANK_EXIT)  # rank 0 holds every rank's result and gives the verdict
        if json_out:
            print_json(result_json(results[0], plan) if len(results) == 1 else ranks_json(results, plan))
        else:
            out = console()
            out.print(f"[grey62]source: {plan.source}[/]")
            if len(results) == 1:
                out.print(render_result(results[0], plan))
            else:  # rank 0's detail, then every rank in one table
                out.print(render_result(results[0], plan))
                out.print(render_ranks(results))
        if not ok:
            raise typer.Exit(1)
