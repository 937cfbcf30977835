"""The answer first, and one deployment per output.

- ``kvplan estimate`` printed 59 lines at 80 columns with the answer at line 38: the answer panel (KV tokens,
  requests at the context, max context, the verdict) now comes first, and ``--brief`` prints the engine's own
  KV-cache lines and the verdict, both from :func:`kvplan.render.estimate.answer_lines`;
- "max context at batch 32: 14,032 tokens" stood beside a launch line with ``--max-model-len 8192``: the
  line names the max_model_len it holds for (the fixed one caps it; a following one names the flag a launch
  needs), and that max_model_len, planned, runs the batch at that context;
- the memory bar's legend said "ovh 1.3" for two rows (overhead 0.33 + cudagraph 0.97) and derived figures
  were rounded on their own (79.20 - 72.87 shown as 6.34): each legend figure is its row's, and the
  figures add up as printed.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from rich.console import Console

from kvplan.model.sources import bundled_ids, load_bundled
from kvplan.model.spec import build_spec
from kvplan.planning.plan import Options, Plan, plan_for_spec
from kvplan.render.estimate import answer_lines, memory_figures, render_brief, render_plan
from kvplan.render.styled import Unsupported, draw
from kvplan.units import GiB, rounded_parts

sys.path.insert(0, str(Path(__file__).parents[1]))
from entry_point import kvplan  # noqa: E402

LLAMA = "meta-llama/Llama-3.1-8B"
SCENARIOS = ({"gpu": "H100", "context": 8192, "batch": 32}, {"gpu": "L4", "context": 32768, "batch": 4},
             {"gpu": "H100", "engine": "sglang", "context": 4096, "batch": 64},
             {"gpu": "A100-40GB", "context": 2048, "batch": 8, "max_model_len": 16384},
             {"gpu": "H200", "context": 8192, "batch": 1500})


@lru_cache(maxsize=None)
def spec_of(model_id: str):  # noqa: ANN201
    return build_spec(load_bundled(model_id))


def _text(renderable: object, width: int = 80) -> str:
    """What the console prints for ``renderable`` at ``width`` without colour: :func:`kvplan.render.styled.draw`,
    which tests/render/test_styled.py holds to rich's bytes for every bundled model's panels (a tenth of rich's
    time), else rich's console."""
    try:
        return draw(renderable, width)
    except Unsupported:
        console = Console(width=width, record=True, highlight=False, soft_wrap=False, color_system=None)
        console.print(renderable)
        return console.export_text()


def _flat(text: str) -> str:
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


@lru_cache(maxsize=None)
def _plans(model_id: str):  # noqa: ANN202
    """The model's plan for each scenario, planned once (a plan is frozen; two tests read every model's)."""
    return tuple(plan_for_spec(spec_of(model_id), Options(model=model_id, **values)) for values in SCENARIOS)


def test_the_answer_is_in_the_first_lines_and_brief_is_five():
    r = kvplan("estimate", LLAMA, "--gpu", "H100", "--context", "8k", "--batch", "32")
    lines = r.stdout.splitlines()
    assert lines[1].startswith("╭─ answer"), lines[:3]
    head = _flat("\n".join(lines[:9]))
    assert "KV cache: 444,688 tokens" in head and re.search(r"54 (\(\d+ - \d+\) )?concurrent requests \(", head)
    assert "max context at batch 32: 13,888 tokens (needs --max-model-len 13888)" in head
    assert "32 x 8,192 tokens: fits" in head
    brief = kvplan("estimate", LLAMA, "--gpu", "H100", "--context", "8k", "--batch", "32", "--brief").stdout
    # 27,793 blocks - 1 null block - 32 x 512 = 11,408 spare; 27,792 // 512 = 54 requests (the integer answer)
    assert _flat(brief) == " ".join([
        "Available KV cache memory: 54.28 GiB", "GPU KV cache size: 444,688 tokens",
        "Maximum concurrency for 8,192 tokens per request: 54.28x",
        "at 8,192 tokens/request: 54 (53 - 54) concurrent requests (the pool binds: 512 blocks each; max_num_seqs 1,024)",
        "32 x 8,192 tokens: fits (11,408 blocks = 182,528 tokens spare; 1 null block kept by vllm)"])


@pytest.mark.parametrize("model_id", bundled_ids())
def test_brief_and_the_answer_panel_come_from_one_function(model_id):
    """Over every bundled spec: the answer panel is the first thing printed and holds answer_lines; --brief is
    the engine's own log lines (or its refusal) and the same verdict line; the max context line names the
    max_model_len it holds for, and that max_model_len runs the batch."""
    for p in _plans(model_id):
        a = p.answer
        where = (model_id, p.gpu.name, p.engine.engine, a.context, a.batch)
        full = _text(render_plan(p), width=200)
        assert full.startswith("╭─ answer"), where
        answer = _flat(full.split("╰")[0])
        lines = [line.plain for line in answer_lines(p)]
        assert _flat(" ".join(lines)) in answer, where
        brief = _text(render_brief(p), width=200).splitlines()
        assert brief[-1] == lines[-1], where  # one verdict
        # the integer answer: the requests line of the panel, in --brief too
        requests = next(line for line in lines if line.startswith(f"at {a.context:,} tokens/request: "))
        assert brief[-2].split(" (")[0] == requests.split(" (")[0], where
        assert re.match(rf"at {a.context:,} tokens/request: {a.max_requests:,} ", brief[-2]), (where, brief[-2])
        # spare or short blocks are blocks - null block - the batch's blocks, and the verdict says why
        if "spare" in lines[-1] or "short by" in lines[-1]:
            assert "; 1 null block kept by " + p.engine.engine in lines[-1], (where, lines[-1])
            if not a.shared_prefix_tokens and p.layout.block_size > 1:
                blocks = a.num_blocks - 1 - a.batch * a.blocks_per_request
                assert (f"({blocks:,} block" if blocks >= 0 else f"short by {-blocks:,} block") in lines[-1], where
        if a.refusal:
            assert "will refuse to start" in brief[0], where
        else:
            assert brief[:-2] == list(p.rules.log_lines(p.launch)), where
            assert f"{a.kv_tokens:,} tokens" in brief[1] if p.engine.engine == "vllm" else \
                f"max_total_num_tokens={a.kv_tokens}," in brief[0], where
        context_line = next(line for line in lines if line.startswith("max context at batch"))
        m, fixed = a.max_context_at_batch, p.max_model_len_fixed
        if m < 1:
            assert "none (" in context_line, (where, context_line)
        elif fixed is not None:
            assert m <= fixed, where
            assert ("caps it" in context_line) == (m == fixed), (where, context_line)
        elif m > p.max_model_len:
            length_flag = "--context-length" if p.engine.engine == "sglang" else "--max-model-len"  # the engine's own
            assert f"(needs {length_flag} {m})" in context_line, (where, context_line)
            if p.engine.mode != "V0":  # a launch with that max_model_len runs the batch at that context
                at = plan_for_spec(p.spec, replace(p.options, context=m, max_model_len=m))
                assert at.answer.fits and at.max_model_len == m, where
        else:
            assert "--max-model-len" not in context_line and "--context-length" not in context_line, (where, context_line)


def _cents(figure: str) -> int:
    return int(figure.replace(",", "").replace(".", ""))


@pytest.mark.parametrize("model_id", bundled_ids())
def test_the_memory_figures_add_up_as_printed(model_id):
    """Each legend figure is its row's (the same name, the same digits); total = usable + unused and, where the
    KV budget is what the terms leave, usable = terms + KV budget, in the printed hundredths of a GiB."""
    for p in _plans(model_id):
        if p.gpu.is_cpu:
            continue
        where = (model_id, p.gpu.name, p.engine.engine, p.options.context)
        b, shown = p.budget, memory_figures(p)
        assert _cents(shown["total"]) == _cents(shown["usable"]) + _cents(shown["unused"]), where
        state = b.state_pool_bytes if b.state_slots else 0  # a hybrid's own state pool (SGLang's Mamba pool)
        if b.kv_budget_bytes >= 0 and b.usable_bytes == sum(t.bytes for t in b.terms) + state + b.kv_budget_bytes:
            assert _cents(shown["usable"]) == sum(_cents(shown[t.name]) for t in b.terms) + \
                _cents(shown.get("state pool", "0")) + _cents(shown["KV budget"]), where
        for name, figure in shown.items():  # rounded from the bytes, at most one hundredth off
            exact = {"total": b.total_bytes, "usable": b.usable_bytes, "unused": b.total_bytes - b.usable_bytes,
                     "KV budget": b.kv_budget_bytes,
                     "state pool": b.state_pool_bytes, **{t.name: t.bytes for t in b.terms}}[name]
            assert abs(_cents(figure) - exact * 100 / GiB) < 1, (where, name, figure)
        panel = _text(render_plan(p), width=200)
        rows = dict(re.findall(r"[−=] (\w[\w ]*?)\s+(-?[\d,]+\.\d\d) GiB", panel))
        legend = re.findall(r"■ (\w[\w ]*?) (-?[\d,]+\.\d\d)", panel)
        assert legend and len(legend) == len({n for n, _ in legend}), (where, legend)
        for name, figure in legend:
            assert figure == shown[name], (where, name)
            if name != "unused":
                assert rows[name] == figure, (where, name, rows)
        assert "ovh" not in panel and "■ act " not in panel, where


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1 << 44), min_size=1, max_size=8),
       st.sampled_from([GiB // 100, 1000, 7]))
def test_rounded_parts_add_up_and_stay_within_a_unit(parts, unit):
    whole = sum(parts)
    out = rounded_parts(whole, parts, unit)
    assert sum(out) == (2 * whole + unit) // (2 * unit)
    for got, part in zip(out, parts):
        assert part // unit <= got <= -(-part // unit)


def test_the_memory_panel_separates_thousands_beside_numbers_that_do():
    # "87960.93 GB" stood beside "79.20 GiB"-style figures with separators
    from rich.console import Console

    import kvplan as api
    from kvplan.render.estimate import render_plan

    console = Console(width=120, record=True, color_system=None)
    console.print(render_plan(api.estimate(LLAMA, gpu_memory="1000")))
    text = console.export_text()
    assert "1,073.74 GB" in text and "1,000.00 GiB" in text


# ---------------------------------------------------------------------------------------------
# thousands separators: every count kvplan computes and prints is grouped (`1,500 x 2,048`, not `1500 x 2,048`);
# what is left bare is what a flag or a log line takes as typed (`--max-model-len 131072`, `max_total_num_tokens=`)

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
                                     "duration_s: 1200\nprompt_tokens: 1500\noutput_tokens: 10\nmax_num_seqs: 2048\n")
    for args in (["check", str(tmp_path / "c.yaml")], ["report", str(tmp_path / "w.yaml")],
                 ["simulate", str(tmp_path / "s.yaml")]):
        r = runner.invoke(app, [*args, "--offline"], env={"COLUMNS": "200"})
        assert r.exit_code in (0, 1), r.output
        assert _bare_numbers(r.stdout) == [], (args[0], _bare_numbers(r.stdout), r.stdout)


def test_emoji_codes_in_a_path_or_a_name_print_as_typed(tmp_path):
    """rich reads ``:name:`` as an emoji code in markup: a local model in ``:thumbs_up:/`` printed its source as
    ``👍/config.json``. The console (:func:`kvplan.render.console`) and the panels' titles read markup without
    emoji codes, so a path or a name prints as typed, wherever it lands."""
    config = load_bundled(LLAMA).config
    folder = tmp_path / ":thumbs_up:"
    folder.mkdir()
    (folder / "config.json").write_text(__import__("json").dumps(dict(config)), encoding="utf-8")
    out = kvplan("estimate", str(folder), "--gpu", "H100").stdout
    assert ":thumbs_up:/config.json" in "".join(out.split()), out[:300]  # the source line, however it wraps
    assert "\N{THUMBS UP SIGN}" not in out
    plan = _plans(LLAMA)[0]
    named = replace(plan, gpu=replace(plan.gpu, name=":smile: H100"))
    text = _text(render_plan(named), width=120)  # this console reads emoji codes: the title is read before it
    assert "memory per GPU (1x :smile: H100)" in text
    assert "\N{SMILING FACE WITH OPEN MOUTH AND SMILING EYES}" not in text


# ---------------------------------------------------------------------------------------------
# words that belong to one engine or one kind of pool


@pytest.mark.parametrize("model", ["google/gemma-3-27b-it", "openai/gpt-oss-120b", "meta-llama/Llama-3.1-8B"])
def test_the_spare_figure_is_token_slots_where_a_block_spans_several_groups(model):
    # gemma-3 at 128k on an H200 said "KV cache: 519,579 tokens" and "fits (43,648 blocks = 698,368 tokens spare)":
    # with several groups a block id's slots are not one request's tokens, so the verdict calls them slots
    import kvplan
    from kvplan.render.estimate import _verdict

    p = kvplan.estimate(model, gpu="H200", context=32768)
    assert p.answer.fits
    text = _verdict(p).plain
    several = len(p.layout.groups) > 1
    assert ("token slots spare" in text) == several and ("tokens spare" in text) == (not several), text


@pytest.mark.parametrize("engine, name", [("vllm", "gpu_util"), ("sglang", "mem_fraction_static")])
def test_the_usable_row_names_the_engines_fraction(engine, name):
    import kvplan
    from kvplan.render.estimate import _memory_panel

    console = Console(width=120, record=True, color_system=None)
    console.print(_memory_panel(kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", engine=engine)))
    usable = next(line for line in console.export_text().splitlines() if "usable (x" in line)
    assert f"(total x {name})" in usable, usable


@pytest.mark.parametrize("engine, setting", [("vllm", "max_model_len"), ("sglang", "context_length")])
def test_the_default_context_note_names_the_engines_setting(engine, setting):
    import kvplan

    p = kvplan.estimate("microsoft/Phi-3-mini-4k-instruct", gpu="H100", engine=engine)
    (note,) = [n for n in p.notes if "below kvplan's default" in n]
    assert f"{engine}'s own default {setting} is the model's maximum" in note, note


@pytest.mark.parametrize("engine, kv_dtype", [("vllm", "int4"), ("vllm", "int8"), ("sglang", "int8"), ("sglang", "int4"),
                                              ("sglang", "fp16")])
def test_brief_says_a_kv_dtype_the_engine_cannot_run_is_a_what_if(engine, kv_dtype):
    # --brief printed "GPU KV cache size ..." as the engine's own lines for a dtype it has no --kv-cache-dtype for
    import kvplan

    p = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", engine=engine, kv_dtype=kv_dtype)
    assert p.launch.kv_cache_dtype is None
    first = render_brief(p)
    console = Console(width=200, record=True, color_system=None)
    console.print(first)
    text = console.export_text()
    assert text.startswith(f"a what-if: {p.engine.label} cannot run --kv-dtype {p.kv_dtype}"), text
    runnable = kvplan.estimate("meta-llama/Llama-3.1-8B", gpu="H100", engine=engine, kv_dtype="fp8")
    console = Console(width=200, record=True, color_system=None)
    console.print(render_brief(runnable))
    assert "what-if" not in console.export_text()
