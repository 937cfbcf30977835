"""``kvplan simulate workload.yaml``: the KV pool under a workload, contiguous vs paged vs prefix caching."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from kvplan.cli.options import JsonOpt, OfflineOpt, TokenOpt

EPILOG = ("Examples: kvplan simulate docs/examples/shared_prompt.yaml  ·  "
          "kvplan simulate workload.yaml --policy paged --policy prefix_caching --json  ·  "
          "kvplan simulate workload.yaml --plot pool.png  ·  "
          "kvplan simulate workload.yaml --timing docs/examples/timing.yaml")


def register(app: typer.Typer) -> None:
    from kvplan.cli.errors import handle_errors

    @app.command("simulate", epilog=EPILOG)
    @handle_errors
    def simulate(
        path: Annotated[str, typer.Argument(help="Workload file (YAML): deployment options + traffic.", show_default=False)],
        policy: Annotated[Optional[list[str]], typer.Option(
            "--policy", help="Policy to run (repeatable): contiguous, paged, prefix_caching (default: the file's, else all).")] = None,
        duration: Annotated[Optional[float], typer.Option("--duration", help="Override duration_s (simulated seconds).")] = None,
        seed: Annotated[Optional[int], typer.Option("--seed", help="Override the file's random seed.")] = None,
        plot: Annotated[Optional[str], typer.Option("--plot", help="Write a time-series plot (pool used, running) here (.png, .svg, .pdf; no suffix: .png).")] = None,
        timing: Annotated[Optional[str], typer.Option(
            "--timing", help="A step time fitted on a running server (kvplan observe --fit-timing FILE); replaces the "
            "workload's timing.file and the bandwidth roofline.", show_default=False)] = None,
        force: Annotated[bool, typer.Option("--force", help="Run even past the work bound (2e8 request-steps, a few minutes).")] = False,
        offline: OfflineOpt = False,
        token: TokenOpt = None,
        json_out: JsonOpt = False,
    ) -> None:
        """Simulate a continuous-batching server's KV pool under a workload: throughput, concurrency, utilisation, fragmentation, prefix hits, preemptions, queueing."""
        from dataclasses import replace

        from kvplan.errors import InputError
        from kvplan.render.progress import delayed_progress
        from kvplan.sim.simulate import POLICIES
        from kvplan.units import check_number
        from kvplan.sim.workload import load_workload
        from kvplan.sim.workload_run import run_workload
        from kvplan.sim.workload_schema import MAX_SECONDS

        changes: dict = {}
        if policy:
            bad = [p for p in policy if p not in POLICIES]
            if bad:
                raise InputError(f"unknown --policy {bad[0]!r}", "use one of: " + ", ".join(POLICIES))
            changes["policies"] = tuple(dict.fromkeys(policy))
        if duration is not None:
            changes["duration_s"] = float(check_number(duration, "--duration", low=0, low_open=True, high=MAX_SECONDS))
        plot_file = None
        if plot:  # checked before the work: a bad path must not cost a whole simulation
            from kvplan.render.simulate import plot_path

            plot_file = plot_path(plot)
        workload = load_workload(path)
        if seed is not None:
            changes["seed"] = seed
        if timing is not None:
            from pathlib import Path

            if workload.decode_step_s is not None:
                raise InputError(f"--timing and the workload's timing.decode_step_s are exclusive",
                                 "the file's step time grows with the batch; drop decode_step_s")
            changes["timing_file"] = Path(timing)
        if offline:
            changes["values"] = {**workload.values, "offline": True}
        if changes:
            workload = replace(workload, **changes)
        with delayed_progress("simulating") as progress:
            run = run_workload(workload, token=token, record_series=plot_file is not None, force=force,
                               progress=progress)
        if plot_file is not None:
            from kvplan.render.simulate import write_plot

            write_plot(run, plot_file)
        if json_out:
            from kvplan.render import print_json
            from kvplan.render.simulate import simulate_to_dict

            print_json(simulate_to_dict(run))
            return
        from kvplan.render import console
        from kvplan.render.simulate import render_simulation

        out = console()
        out.print(render_simulation(run))
        if plot_file is not None:
            out.print(f"[grey62]plot: {plot_file}[/]")
