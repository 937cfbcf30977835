"""``kvplan observe URL``: a running server's KV pool from its Prometheus ``/metrics``, against the plan.

Exit codes: 0 ok; 1 a ``--require`` gate failed; 2 bad input, or no poll could read the endpoint.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import typer

from kvplan.cli.options import JsonOpt

EPILOG = ("Examples: kvplan observe http://127.0.0.1:8000/metrics  ·  "
          "kvplan observe localhost:8000 --model meta-llama/Llama-3.1-8B-Instruct --gpu H100 --duration 60  ·  "
          "kvplan observe $URL --duration 120 --require 'usage_peak < 0.95' --require 'preemptions == 0' --json")

UrlArg = Annotated[str, typer.Argument(help="The server's metrics URL (http://host:8000/metrics); host:port gets /metrics.",
                                       show_default=False)]
ObsModelOpt = Annotated[Optional[str], typer.Option(
    "--model", help="Model to plan for the comparison (as in `kvplan estimate MODEL`); the estimate options apply.")]
ServedNameOpt = Annotated[Optional[str], typer.Option(
    "--served-model-name", help="The endpoint's model_name label for --model (vLLM's --served-model-name), when it is "
    "an alias: only that series is compared with the plan (default: the series named like --model).",
    show_default=False)]
IntervalOpt = Annotated[float, typer.Option("--interval", help="Seconds between polls (0.05 to 86,400).")]
DurationOpt = Annotated[Optional[float], typer.Option(
    "--duration", help="Seconds to observe, at most 2,592,000 (30 days) (default: until Ctrl-C).")]
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", help="Seconds one request may take before the poll counts as failed (0.05 to 600).")]
CsvOpt = Annotated[Optional[str], typer.Option("--csv", help="Write the samples here as CSV (one row per poll and series).")]
PlotOpt = Annotated[Optional[str], typer.Option("--plot", help="Plot usage, running/waiting and hit rate over time here (.png, .svg, .pdf).")]
RequireOpt = Annotated[Optional[list[str]], typer.Option(
    "--require", help="Gate (repeatable): 'usage_peak < 0.95', 'preemptions == 0', 'prefix_hit_rate > 0.5'; exit 1 if one fails.")]
FitTimingOpt = Annotated[Optional[str], typer.Option(
    "--fit-timing", help="Add this run's step-time measurement to FILE (a timing file; created if missing) and refit "
    "it, for kvplan simulate --timing FILE. Observe a few loads into one file.", show_default=False)]
HeaderOpt = Annotated[Optional[list[str]], typer.Option(
    "--header", help="HTTP header to send (repeatable), e.g. 'Authorization: Bearer TOKEN'. Never printed.", show_default=False)]


def _say(event: Any) -> None:
    message = " ".join(event.message.splitlines())  # a label value with a newline stays on its line
    sys.stderr.write(f"kvplan: [{event.elapsed_s:,.1f} s] {message}\n")


def _given(ctx: typer.Context, values: dict) -> frozenset[str]:
    """The estimate options the user typed (or set in the environment), not left at their defaults."""
    sources = {k: ctx.get_parameter_source(k) for k in values}
    return frozenset(k for k, src in sources.items() if src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT"))


def _pending(planner: Any) -> str | None:
    """Why the plan waits (for the endpoint's KV budget), or None."""
    if planner is None or planner.view is not None:
        return None
    return planner.pending.message if planner.pending is not None else "no plan"


def _compare(planner: Any, obs: Any) -> list[Any]:
    if planner is None:
        return []
    from kvplan.observe.compare import compare

    return [c for c in (compare(planner.view, s, planner) for s in obs.series) if c is not None]


def _observe(session: Any, planner: Any, live: bool) -> Any:
    """Run the loop; adopt the endpoint's cache config into the plan; redraw the live view each poll."""
    from kvplan.observe.session import run

    def adopt(s: Any) -> None:
        if planner is not None:
            config = next((r.cache_config for r in s.latest.values() if r.cache_config and planner.serves(r.labels)),
                          None)
            if config:
                planner.adopt(config)

    if not live:
        return run(session, on_poll=adopt)
    from rich.live import Live

    from kvplan.render import console
    from kvplan.render.observe import render_observation

    with Live(console=console(), refresh_per_second=4, transient=True) as view:
        def redraw(s: Any) -> None:
            adopt(s)
            obs = s.snapshot(with_polls=False)
            view.update(render_observation(obs, planner.view if planner else None, _compare(planner, obs),
                                           pending=_pending(planner)))

        return run(session, on_poll=redraw)


def _endpoint_model(values: dict, token: str | None, ctx: typer.Context) -> Any:
    """Without --model: a function of the run's series giving the planner for the bundled model they name
    (``model_name``; the endpoint's cache config adopted), or None (no label, several models, one kvplan does
    not bundle: no plan)."""
    def find(series: list) -> Any:  # noqa: ANN401 - a Planner or None
        from kvplan.errors import KvplanError
        from kvplan.observe.compare import Planner, served_bundled_model

        found = served_bundled_model([s.labels for s in series])
        if found is None:
            return None
        model, label = found
        try:
            planner = Planner({**values, "model": model}, token, given=_given(ctx, values), model_from=label)
        except KvplanError as exc:
            sys.stderr.write(f"kvplan: the endpoint serves {model} ({label}) but it cannot be planned: {exc.one_line()}\n")
            return None
        sys.stderr.write(f"kvplan: planning {model}, the bundled model the endpoint names ({label}); --model overrides\n")
        config = next((s.cache_config for s in series if s.cache_config and planner.serves(s.labels)), None)
        if config:
            planner.adopt(config)
        return planner

    return find


def _fit_timing(obs: Any, path: str, planner: Any, endpoint: str) -> tuple[Any, Any]:
    """Add this run to the timing file: ``((measure, timing file), None)``, or ``(None, error)`` to raise
    after the observation is shown (the run is not lost to a fit that cannot be made)."""
    from kvplan.errors import KvplanError
    from kvplan.observe.fit import timing_run
    from kvplan.sim.timing import add_run

    series = None
    if planner is not None and len(obs.series) > 1:
        served = [s.name for s in obs.series if planner.serves(s.labels)]
        series = served[0] if len(served) == 1 else None
    try:
        measure = timing_run(obs, series, source=f"kvplan observe {endpoint}, {obs.elapsed_s:,.0f} s")
        name = next((dict(s.labels).get("model_name") for s in obs.series if s.name == (series or obs.series[0].name)),
                    None)
        return (measure, add_run(path, measure.run, name)), None
    except KvplanError as exc:
        return None, exc


def _write_files(obs: Any, csv: Optional[str], plot_file: Any, fit_timing: Optional[str], planner: Any,
                 endpoint: str) -> tuple[dict[str, str], Any, Any]:
    """The files the run writes (``--csv``, ``--plot``, ``--fit-timing``: kind -> path), the timing fitted and the
    error fitting it raised (raised after the output)."""
    files = {}
    if csv:
        from kvplan.render.observe import write_csv

        write_csv(obs, csv)
        files["csv"] = str(csv)
    if plot_file and obs.read_polls:
        from kvplan.render.observe import write_plot

        files["plot"] = str(write_plot(obs, plot_file))
    timing, timing_error = None, None
    if fit_timing and obs.read_polls:
        timing, timing_error = _fit_timing(obs, fit_timing, planner, endpoint)
        if timing is not None:
            files["timing"] = str(fit_timing)
    return files, timing, timing_error


def _print(obs: Any, planner: Any, comparisons: list[Any], outcomes: list[Any], files: dict[str, str], timing: Any,
           json_out: bool, live: bool) -> None:
    """The observation, the comparison with the plan, the gates and the timing: as JSON, or rendered."""
    from kvplan.render import console, print_json
    from kvplan.render.observe import observation_to_dict, render_observation
    from rich.markup import escape

    if json_out:
        doc = observation_to_dict(obs, planner.view if planner else None, comparisons, outcomes, files)
        if timing is not None:
            from kvplan.render.observe import timing_to_dict

            doc["timing"] = timing_to_dict(*timing)
        print_json(doc)
    else:
        out = console()
        out.print(render_observation(obs, planner.view if planner else None, comparisons, outcomes,
                                     max_events=20 if live else 0,  # not live: each was on stderr already
                                     pending=_pending(planner)))
        if timing is not None:
            from kvplan.render.observe import render_timing

            out.print(render_timing(*timing))
        for kind, path in files.items():
            out.print(f"[grey62]{kind}: {escape(path)}[/]")


def _check_read(obs: Any, planner: Any, endpoint: str) -> None:
    """Fail when no poll read the metrics, or there is no plan to compare with (the reason named)."""
    if not obs.read_polls:
        last = obs.polls[-1].error if obs.polls else None
        said = last is not None and any(last in e.message for e in obs.events)  # shown once, above
        from kvplan.cli.errors import fail

        why = ("every poll failed, as said above" if said else last) if last else "interrupted before the first poll"
        raise fail(f"no metrics read from {endpoint} in {obs.num_polls} poll(s): {why}")
    if planner is not None and planner.view is None:
        from kvplan.cli.errors import fail

        pending = planner.pending
        served = any(planner.serves(s.labels) for s in obs.series)
        why = ("the endpoint did not report kv_cache_memory_bytes either" if served else
               "no series serves the planned model, so no endpoint kv_cache_memory_bytes was used (see the finding)")
        raise fail(f"no plan to compare with: {pending.message if pending else 'the plan could not be made'}; {why} "
                   "(pass --kv-budget, the server's KV cache size)")


def register(app: typer.Typer) -> None:
    from kvplan.cli.errors import handle_errors
    from kvplan.cli.options import with_estimate_options

    @app.command("observe", epilog=EPILOG)
    @handle_errors
    @with_estimate_options
    def observe(url: UrlArg, model: ObsModelOpt = None, served_model_name: ServedNameOpt = None, interval: IntervalOpt = 1.0,
                duration: DurationOpt = None, timeout: TimeoutOpt = 5.0, csv: CsvOpt = None, plot: PlotOpt = None, require: RequireOpt = None,
                header: HeaderOpt = None, fit_timing: FitTimingOpt = None, json_out: JsonOpt = False, *, ctx: typer.Context, values: dict,
                token: Optional[str]) -> None:
        """Measure a running vLLM or SGLang server's KV pool from its Prometheus /metrics: usage, running and waiting requests, preemptions, prefix hits, tokens/s; compare with the plan; gate CI on it."""
        from kvplan.observe.compare import Planner
        from kvplan.observe.gates import evaluate, parse_gate
        from kvplan.observe.scrape import endpoint
        from kvplan.observe.session import Session, check_timing
        from kvplan.io.atomic import check_writable
        from kvplan.render import plot_path

        check_timing(interval, duration, timeout, ("--interval", "--duration", "--timeout"))
        where = endpoint(url, header or ())
        gates = [parse_gate(text) for text in require or ()]
        if csv:
            check_writable(csv, "--csv", writes="csv")  # never over a file of another kind
        if fit_timing:
            check_writable(fit_timing, "--fit-timing", writes="timing")
        plot_file = plot_path(plot) if plot else None
        if served_model_name is not None and not model:
            from kvplan.cli.errors import fail

            raise fail("--served-model-name names the series of --model: pass --model too")
        planner = Planner({**values, "model": model}, token, given=_given(ctx, values),
                          served_name=served_model_name) if model else None
        live = sys.stdout.isatty() and not json_out
        session = Session(where, interval_s=interval, duration_s=duration, timeout_s=timeout,
                          on_event=None if live else _say)
        obs = _observe(session, planner, live)
        if planner is None and not model:  # after the run: planning never delays a poll
            planner = _endpoint_model(values, token, ctx)(obs.series)
        comparisons = _compare(planner, obs)
        outcomes = [evaluate(g, obs.summary, obs.failed_polls, obs.num_polls) for g in gates]
        files, timing, timing_error = _write_files(obs, csv, plot_file, fit_timing, planner, where.display)
        _print(obs, planner, comparisons, outcomes, files, timing, json_out, live)
        _check_read(obs, planner, where.display)
        if timing_error is not None:
            raise timing_error
        raise typer.Exit(0 if all(o.passed for o in outcomes) else 1)

    _ = observe  # registered on the app
