"""Polish an acceptance run found, each checked as a class:

- provenance named a model type's default (``num_experts <- num_local_experts (qwen3_moe default)``) for a value
  the file itself gives: a key the file holds wins over one the defaults filled in, whatever the order of the
  aliases;
- validate's attention table had two rows that looked the same: each row names its request;
- the report's memory plot put its legend over the axis label, and summed overhead and CUDA graphs in one
  segment: the legend sits beside the bars, one segment per budget term.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvplan.model.config_reader import ConfigReader
from kvplan.model.sources import bundled_ids, load_bundled
from kvplan.model.spec import build_spec


@settings(max_examples=200, deadline=None)
@given(st.permutations(["num_local_experts", "n_routed_experts", "num_experts"]), st.integers(1, 512),
       st.integers(1, 512), st.integers(0, 2))
def test_a_key_the_file_gives_wins_over_a_defaulted_one(keys, given_value, default_value, which):
    given_key = keys[which]
    defaulted = {k: default_value for k in keys if k != given_key}
    config = {given_key: given_value, **defaulted, "model_type": "qwen3_moe"}
    r = ConfigReader(config, "config.json", defaulted=frozenset(defaulted))
    assert r.int("num_experts", tuple(keys)) == given_value
    assert r.provenance["num_experts"] == given_key


@pytest.mark.parametrize("model_id", bundled_ids())
def test_no_bundled_value_the_file_gives_is_credited_to_a_default(model_id):
    source = load_bundled(model_id)
    spec = build_spec(source)
    config = source.config.get("text_config", source.config)
    for field, where in spec.provenance.items():
        if where.endswith(" default)"):
            key = where.split(" (")[0].split(".")[-1]
            assert key not in config, (model_id, field, where)


def test_validate_names_the_request_of_each_attention_row():
    pytest.importorskip("torch")
    from rich.console import Console

    import kvplan
    from kvplan.paged.validate import validate_plan
    from kvplan.render.validate import render_result

    plan = kvplan.estimate("Qwen/Qwen3-0.6B", gpu="cpu", gpu_memory="8GiB", kv_budget="0.25GiB", context=512)
    result = validate_plan(plan, device="cpu")
    rows = [(c.case, c.request) for c in result.attention]
    assert len(rows) == len(set(rows)) >= 2 and {r for _, r in rows} == {1, result.fill.filled_requests}
    console = Console(width=80, record=True, color_system=None)
    console.print(render_result(result, plan))
    text = console.export_text()
    assert f"1 of {result.fill.filled_requests}" in text and "…" not in text


@pytest.mark.parametrize("gpus", [["H100"], ["H100", "A100-40GB", "L4"], ["H100", "H200", "A100-40GB", "L4", "L40S",
                                                                          "MI300X", "B200"]])
def test_the_memory_plot_legend_clears_the_axis_label(gpus):
    pytest.importorskip("matplotlib")
    import kvplan
    from kvplan.render.report_plots import _pyplot, memory_figure

    report = kvplan.sweep({"defaults": {"model": "meta-llama/Llama-3.1-8B"}, "sweep": {"gpu": gpus}})
    fig, _ = memory_figure(report)
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    for label in (ax.xaxis.label, ax.title):
        assert not legend.overlaps(label.get_window_extent()), label.get_text()
    assert not legend.overlaps(ax.get_window_extent())  # beside the bars, not over them
    names = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "overhead" in names and "cudagraph" in names and not any("+" in n for n in names)
    _pyplot().close(fig)


# ---------------------------------------------------------------------------------------------
# thousands separators: every count kvplan computes and prints is grouped (`1,500 x 2,048`, not `1500 x 2,048`);
# what is left bare is what a flag or a log line takes as typed (`--max-model-len 131072`, `max_total_num_tokens=`)

import re  # noqa: E402

_BARE = re.compile(r"(?<![\w.,/=+-])\d{4,}(?![\w.]|,\d)")  # 4+ digits, not part of a grouped number, id or decimal
_AS_TYPED = re.compile(r"(--[a-z-]+|[a-z_]+=|try|was) ?\d+")  # a flag's value, a log line's key=value, a suggestion


def _bare_numbers(text: str) -> list[str]:
    text = _AS_TYPED.sub("", " ".join(re.sub(r"[│╭╮╰╯─┃┏┓┗┛━┡┩╇┳┻╋┼└┘┴┬├┤]", " ", text).split()))
    return _BARE.findall(text)


SCENARIOS = [dict(batch=1500, context=2048), dict(batch=1200, context=100_000, prefix_tokens=2000),
             dict(batch=3, context=8192, max_num_seqs=2048), dict(batch=20_000, context=1024, kv_dtype="fp8")]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "google/gemma-3-27b-it", "Qwen/Qwen3-30B-A3B"])
def test_every_figure_of_the_answer_and_paging_is_grouped(model, engine):
    from rich.console import Console

    import kvplan
    from kvplan.render.estimate import _paging_panel, answer_lines, render_brief

    for values in SCENARIOS:
        p = kvplan.estimate(model, gpu="H200", engine=engine, **values)
        console = Console(width=200, record=True, color_system=None)
        for line in answer_lines(p):
            console.print(line)
        console.print(_paging_panel(p))
        console.print(render_brief(p))
        text = console.export_text()
        assert _bare_numbers(text) == [], (model, engine, values, _bare_numbers(text), text)


def test_every_figure_of_check_report_and_simulate_is_grouped(tmp_path):
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    runner = CliRunner()
    (tmp_path / "c.yaml").write_text("defaults: {model: meta-llama/Llama-3.1-8B, gpu: H100}\nchecks:\n"
                                     "  - {name: many, batch: 1500, context: 2k, require: {fits: true, headroom_pct: 5}}\n"
                                     "  - {name: long, context: 100k, require: {concurrency: 2000, context: 200000}}\n")
    (tmp_path / "w.yaml").write_text("defaults: {model: meta-llama/Llama-3.1-8B, gpu: H100}\n"
                                     "sweep: {batch: [1500, 3000], context: [2k, 100k]}\noutputs: [out/r.csv]\n")
    (tmp_path / "s.yaml").write_text("model: meta-llama/Llama-3.1-8B\ngpu: H100\narrivals: {rate: 5}\n"
                                     "duration_s: 3600\nprompt_tokens: 1500\noutput_tokens: 10\nmax_num_seqs: 2048\n")
    for args in (["check", str(tmp_path / "c.yaml")], ["report", str(tmp_path / "w.yaml")],
                 ["simulate", str(tmp_path / "s.yaml")]):
        r = runner.invoke(app, [*args, "--offline"], env={"COLUMNS": "200"})
        assert r.exit_code in (0, 1), r.output
        assert _bare_numbers(r.stdout) == [], (args[0], _bare_numbers(r.stdout), r.stdout)


# ---------------------------------------------------------------------------------------------
# one duration format: "3600 s" sat beside "3,600.0 s" (simulate's traffic line and its table)


@pytest.mark.parametrize(("seconds", "text"), [(0.25, "250 ms"), (1, "1.0 s"), (3600, "3,600.0 s"), (90_061.5, "90,061.5 s")])
def test_one_duration_format(seconds, text):
    from kvplan.units import fmt_seconds

    assert fmt_seconds(seconds) == text


def test_every_duration_a_simulation_prints_has_one_format(tmp_path):
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    (tmp_path / "s.yaml").write_text("model: meta-llama/Llama-3.1-8B\ngpu: H100\narrivals: {users: 2, think_s: 2}\n"
                                     "duration_s: 3600\nprompt_tokens: 100\noutput_tokens: 10\n")
    r = CliRunner().invoke(app, ["simulate", str(tmp_path / "s.yaml"), "--offline"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    durations = re.findall(r"([\d,.]+) (s|ms)\b", r.stdout)
    assert durations and all(re.fullmatch(r"\d{1,3}(,\d{3})*\.\d", n) for n, unit in durations if unit == "s"), durations
    assert "3,600.0 s" in r.stdout and "think 2.0 s" in r.stdout
