"""The promise for bad input, across commands: one line on stderr (``kvplan: error: ...``), exit 2, never a
traceback, never a runaway. Usage errors, a fuzz of files and option values, and the docs' examples."""

from __future__ import annotations

import re

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "configs"

sys.path.insert(0, str(ROOT / "tests"))
from entry_point import assert_one_line, kvplan, kvplan_process  # noqa: E402


@pytest.mark.parametrize("args,needles", [
    (["estimate", "meta-llama/Llama-3.1-8B", "--nope"], ["No such option: --nope", "(see kvplan estimate --help)"]),
    (["estimate"], ["Missing argument", "(see kvplan estimate --help)"]),
    (["estimate", "x", "--block-size", "abc"], ["'abc' is not a valid int"]),  # --tp takes a list: text, parsed by kvplan
    (["estimate", "x", "--tp", "abc"], ["invalid --tp 'abc': must be a positive integer"]),
    (["nocommand"], ["No such command 'nocommand'", "(see kvplan --help)"]),
    (["report", "--rows", "0", "x.yaml"], ["--rows"]),
    (["simulate", "docs/examples/shared_prompt.yaml", "--duration", "abc"], ["--duration"]),
])
def test_usage_errors_are_the_documented_one_line(args, needles):
    # typer printed a multi-line "Usage: ... ╭─ Error ─╮" box; docs/cli.md promises one line and exit 2
    assert_one_line(kvplan_process(*args), *needles)


def test_help_and_version_still_work():
    assert kvplan_process("--version").stdout.startswith("kvplan ")
    r = kvplan_process("estimate", "--help")
    assert r.returncode == 0 and "--context" in r.stdout


def test_reading_a_small_file_does_not_allocate_the_size_bound(tmp_path):
    # files.read_bytes used read(64 MiB + 1): 64 MiB allocated for every YAML, config or trace read
    import tracemalloc

    from kvplan.io.files import MAX_FILE_BYTES, read_text

    path = tmp_path / "small.yaml"
    path.write_text("defaults: {}\n")
    tracemalloc.start()
    assert read_text(path) == "defaults: {}\n"
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < MAX_FILE_BYTES // 64, f"peak {peak:,} B"


@pytest.mark.parametrize("value", ["abc", "8kb", "80,464", "8 GB", "-3"])
def test_token_count_errors_do_not_suggest_byte_units(value):
    from kvplan.errors import InputError
    from kvplan.units import parse_tokens

    with pytest.raises(InputError) as info:
        parse_tokens(value, "--context")
    line = info.value.one_line()
    said = line.replace(repr(value), "")  # the value as typed is echoed; the rest must not suggest bytes
    assert "--context" in line and not any(unit in said for unit in ("GB", "GiB", "MiB", "KB"))


# ---------------------------------------------------------------------------------------------
# 80 columns: never a cut number or id ("443,7…", "Qwen/Qwen3-Coder-480B-A35B-Instr…", "fp8-kv-doubles-the-po/ol")


def _render(renderable, width: int) -> list[str]:
    from rich.console import Console

    console = Console(width=width, record=True, highlight=False, soft_wrap=False, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def _assert_fits_and_uncut(lines: list[str], width: int, whole: list[str]) -> None:
    import re

    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= width
    assert not re.search(r"[\w,.]…", text), "a value was cut with an ellipsis"
    for value in whole:
        assert value in text, f"{value!r} is not shown whole"


def test_models_at_80_columns_shows_every_id_whole():
    from kvplan.render.catalogue import models_rows, render_models

    rows = models_rows()
    lines = _render(render_models(rows, width=80), 80)
    _assert_fits_and_uncut(lines, 80, [r["id"] for r in rows] + [f"{r['kv_bytes_per_token']:,}" for r in rows])
    assert any("not shown at this width" in line for line in lines) or any("params" in line for line in lines)


def test_check_at_80_columns_keeps_names_whole():
    from kvplan.checks.capacity import run_checks
    from kvplan.render.check import render_check
    from kvplan.checks.scenario import load_capacity

    report = run_checks(load_capacity(ROOT / "docs" / "examples" / "capacity.yaml"), offline=True)
    lines = _render(render_check(report, width=80), 80)
    _assert_fits_and_uncut(lines, 80, [r.name for r in report.results])
    assert "fp8-kv-doubles-the-pool" in "\n".join(lines)


MANY_AXES = """title: many axes
defaults: {batch: 8}
sweep:
  model: [meta-llama/Llama-3.1-8B, Qwen/Qwen3-8B]
  gpu: [H100, L40S]
  tp: [1, 2]
  engine: [vllm, sglang]
  kv_dtype: [auto, fp8]
  block_size: [16, 32]
  context: [8k, 32k]
  batch: [1, 16]
scenarios:
  - {name: 70B on 4x H100 with an fp8 KV cache, model: meta-llama/Llama-3.1-70B, tp: 4, kv_dtype: fp8, context: 32k}
"""


def _assert_results_shown(report, lines: list[str], limit: int) -> None:
    """Every row shown has its results on one line, in column order: KV tokens, requests, max context, fits."""
    import re

    text = "\n".join(lines)
    for r in [r for r in report.digest.sample(limit) if r is not None]:
        pattern = rf"{r.kv_tokens:,}\s+{r.max_requests:,}\s+{r.max_context_at_batch:,}\s+{'yes' if r.fits else 'no'}\b"
        assert re.search(pattern, text), f"results of {r.pool.labels()['model']} @ {r.context} not shown: {pattern}"


@pytest.mark.parametrize("source", ["docs", "many axes"])
def test_report_at_80_columns_shows_the_results_and_whole_ids(tmp_path, source):
    # at 80 columns the label columns took the width: every result column was dropped ("not shown at this width:
    # ..., KV tokens, fits") and, with nothing left to drop, the model column folded ids mid-word
    import shutil

    from kvplan.render.report import render_report
    from kvplan.checks.report import build_report
    from kvplan.checks.scenario import load_whatif

    if source == "docs":
        shutil.copy(ROOT / "docs" / "examples" / "whatif.yaml", tmp_path / "whatif.yaml")
    else:
        (tmp_path / "whatif.yaml").write_text(MANY_AXES)
    report = build_report(load_whatif(tmp_path / "whatif.yaml"), offline=True)
    lines = _render(render_report(report, limit=12, width=80), 80)
    shown = [r for r in report.digest.sample(12) if r is not None]
    _assert_fits_and_uncut(lines, 80, [r.pool.labels()["model"] for r in shown] + [r.pool.labels()["gpu"] for r in shown])
    _assert_results_shown(report, lines, 12)
    assert not any(line.startswith("not shown at this width") and ("fits" in line or "reqs" in line) for line in lines)
    wide = _render(render_report(report, limit=12, width=200), 200)
    _assert_fits_and_uncut(wide, 200, [f"{r.kv_tokens:,}" for r in shown])
    _assert_results_shown(report, wide, 12)
    assert not any("not shown at this width" in line for line in wide)  # nothing dropped when it fits
    assert sum("H100-SXM-80GB" in line for line in wide) >= sum(r.pool.labels()["gpu"] == "H100-SXM-80GB" for r in shown)


def test_gpus_at_80_columns():
    from kvplan.gpus import load_gpus
    from kvplan.render.catalogue import render_gpus

    catalogue = load_gpus()
    # aliases wrapped at spaces: "H200 SXM" / "141GB" (an alias is what people type: keep each whole)
    aliases = [a for g in catalogue for a in g.aliases[:4]]
    assert any(" " in a for a in aliases)
    for width in (80, 60, 120):
        lines = _render(render_gpus(catalogue, width=width), width)
        _assert_fits_and_uncut(lines, width, [g.name for g in catalogue] + (aliases if width >= 80 else []))


def test_fitted_table_property():
    # any rigid cell that fits the width on its own is shown whole; no line passes the width
    from hypothesis import given, settings, strategies as st

    from kvplan.render.fit import COMPACT, Col, fitted_table

    word = st.text(alphabet="abcdefghij0123456789,./-", min_size=1, max_size=14)

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(st.lists(word, min_size=1, max_size=4), st.booleans(), st.one_of(st.none(), st.integers(0, 5))),
                    min_size=1, max_size=8), st.integers(30, 120))
    def check(spec, width):
        cols = [Col(f"c{i}", cells=cells if not wrap else [" ".join(cells)], wrap=wrap, drop=drop)
                for i, (cells, wrap, drop) in enumerate(spec)]
        table, dropped = fitted_table(cols, width, **COMPACT)
        lines = _render(table, width)
        assert max(len(line) for line in lines) <= width
        kept = [c for c in cols if c.title not in dropped]
        if sum(c.min_width for c in kept) + 2 * len(kept) <= width:  # it fit without folding
            text = "\n".join(lines)
            for c in kept:
                if not c.wrap:
                    for cell in c.cells:
                        assert cell in text

    check()


def test_wrap_items_breaks_only_between_items():
    from hypothesis import given, settings, strategies as st

    from kvplan.render.fit import wrap_items

    item = st.text(alphabet="ab 0-", min_size=1, max_size=12).map(str.strip).filter(bool)

    @settings(max_examples=100, deadline=None)
    @given(st.lists(item, min_size=1, max_size=8), st.sampled_from([", ", " · "]), st.integers(14, 60))
    def check(items, sep, width):
        text = wrap_items(items, width, sep)
        lines = text.split("\n")
        assert all(len(line) <= width for line in lines)
        # joining the lines back with the separator's space gives the one-line text: no item was split
        assert " ".join(lines) == sep.join(items)
        assert len(lines) == 1 or all(line.endswith(sep.rstrip()) for line in lines[:-1])

    check()


# ---------------------------------------------------------------------------------------------
# options that were accepted silently: one validator (kvplan.options / units.check_number)


@pytest.mark.parametrize("args,needles", [
    (["-c", "32k", "--max-model-len", "8k"], ["--context 32768 exceeds --max-model-len 8192"]),
    (["--dtype", "int8"], ["invalid --dtype 'int8'", "--weights-dtype"]),
    (["--tp", "1024"], ["--tp 1024 does not divide the model's 32 attention heads"]),
    (["--block-size", "3"], ["invalid --block-size 3", "1, 8, 16, 32, 64, 128, 256"]),
    (["--gpu-memory", "1e30"], ["invalid --gpu-memory", "must be at most 16 TiB"]),  # one device (kvplan.limits)
    (["--context", "1e12"], ["invalid --context 1e12: must be at most 4294967296"]),
    (["--batch", "99999999999"], ["invalid --batch", "must be at most 1048576"]),
    # one object per layer: a million layers planned for ~40 s in 2 GB before this bound (kvplan.limits)
    (["--layers", "1000000"], ["invalid --layers 1000000", "must be at most 4096"]),
    # the overrides take the bounds the same fields have in a config (kvplan.limits: one table)
    (["--head-dim", "1000000"], ["invalid --head-dim 1000000", "must be at most 65536"]),
    (["--kv-heads", "100000"], ["invalid --kv-heads 100000", "must be at most 65536"]),
])
def test_out_of_range_options_are_one_line_errors(args, needles):
    assert_one_line(kvplan("estimate", "meta-llama/Llama-3.1-8B", *args), *needles)


@pytest.mark.parametrize("field,value,needle", [
    ("num_hidden_layers", 1_000_000, "field num_hidden_layers = 1000000 is invalid: expected an integer from 1 to 4,096"),
    ("layer_types", ["full_attention"] * 5000, "field layer_types = '<5,000 entries>' is invalid: expected at most 4,096"),
    ("max_position_embeddings", 10**12, "expected an integer from 1 to 4,294,967,296"),
    ("quantization_config", {"quant_method": "gptq", "bits": 1_000_000}, "quantization_config.bits = 1000000"),
    # was: planned, with a 1,024 GiB rotary-table term (4,294,967,296 positions x 128 x 2 B) and a -966 GiB budget
    ("max_position_embeddings", 1 << 32, "the rotary cos/sin table of max_position_embeddings 4,294,967,296 x "
     "rotary_dim 128 is 549,755,813,888 elements (1,024 GiB in bf16): at most 17,179,869,184"),
    ("rope_scaling", {"rope_type": "linear", "factor": 1e6}, "max_position_embeddings 32,768 x linear factor 1e+06"),
    # was: OverflowError traceback (ceil of 4,096 x 1e300 as a float is infinity); found by the fuzz's "bounds" inputs
    ("rope_scaling", {"rope_type": "yarn", "factor": 1e300, "original_max_position_embeddings": 4096},
     "the rotary cos/sin table of original_max_position_embeddings 4,096 x yarn factor 1e+300 x rotary_dim 128"),
    # was: planned with 2e19 B of weights and a -2e19 B KV budget
    ("head_dim", 10**9, "field head_dim = 1000000000 is invalid: expected an integer from 1 to 65,536"),
    ("hidden_size", 10**9, "field hidden_size = 1000000000 is invalid: expected an integer from 1 to 1,048,576"),
    ("vocab_size", 10**12, "field vocab_size = 1000000000000 is invalid: expected an integer from 1 to 16,777,216"),
    ("intermediate_size", 1 << 47, "field intermediate_size = 140737488355328 is invalid: expected an integer from 1 to 1,048,576"),
    ("num_local_experts", 1 << 40, "field num_local_experts = 1099511627776 is invalid: expected an integer from 0 to 65,536"),
    ("num_attention_heads", 1 << 40, "field num_attention_heads = 1099511627776 is invalid: expected an integer from 1 to 65,536"),
    # fields each within their bound whose product is not a model: the parameter count is bounded too
    ({"hidden_size": 1 << 20, "intermediate_size": 1 << 20, "num_hidden_layers": 4096}, None,
     "parameters (4,096 layers, hidden_size 1,048,576, intermediate_size 1,048,576, vocab_size 32,000, 0 experts): "
     "at most 8,796,093,022,208"),
    # GPTQ / AWQ: -1 is one group per row (as vLLM reads it); 0 and other negatives were silently one group
    ("quantization_config", {"quant_method": "gptq", "bits": 4, "group_size": 0},
     "field quantization_config.group_size = 0 is invalid: expected a positive integer, or -1 for one group per row"),
    ("quantization_config", {"quant_method": "awq", "bits": 4, "group_size": -5}, "quantization_config.group_size = -5"),
    ("quantization_config", {"quant_method": "gptq", "bits": 4, "group_size": 1 << 40},
     "expected an integer from 1 to 1,048,576"),
    # compressed-tensors: strategy group needs a positive group_size (a missing one was silently per row)
    ("quantization_config", {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 0}}}},
     "field quantization_config.config_groups.g.weights.group_size = 0 is invalid: expected a positive integer with "
     "strategy 'group'"),
    ("quantization_config", {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}},
     "weights.group_size = None is invalid: expected a positive integer with strategy 'group'"),
])
def test_config_fields_past_their_bound_are_one_line_errors(tmp_path, field, value, needle):
    # the bounds of kvplan.limits hold for config files as for options: a typo'd or hostile config must not
    # plan a million layers (or a 10^12-row rotary table) for minutes
    config = json.loads((FIXTURES / "mistral_v01.json").read_text())
    if field == "layer_types":  # the layer count from the pattern (no count, no model type default for it)
        del config["num_hidden_layers"]
        config["model_type"] = "not_a_transformers_type"
    config.update(field if isinstance(field, dict) else {field: value})
    (tmp_path / "config.json").write_text(json.dumps(config))
    line = assert_one_line(kvplan("estimate", str(tmp_path)), needle)
    assert str(tmp_path / "config.json") in line


# each bounded config field at its bound (kvplan.limits.CONFIG_MAXIMA), as the Mistral fixture spells it
AT_BOUND = {"num_hidden_layers": "num_layers", "max_position_embeddings": "max_position_embeddings",
            "sliding_window": "sliding_window", "hidden_size": "hidden_size", "intermediate_size": "intermediate_size",
            "head_dim": "head_dim", "num_attention_heads": "num_attention_heads", "num_key_value_heads": "kv_heads",
            "vocab_size": "vocab_size", "num_local_experts": "num_experts", "num_experts_per_tok": "num_experts_per_token"}


@pytest.mark.parametrize("key", sorted(AT_BOUND))
def test_a_config_field_at_its_bound_plans_sanely_or_is_a_located_error(tmp_path, key):
    """The largest value a bound accepts must still give a plan whose every term is bounded (no GPU's fixed
    overhead past the GPU, no size past 1 PiB), or a ConfigError naming the file: never a 1,024 GiB term."""
    import kvplan as api
    from kvplan.errors import ConfigError
    from kvplan.limits import CONFIG_MAXIMA, MAX_SIZE_BYTES

    config = json.loads((FIXTURES / "mistral_v01.json").read_text())
    config[key] = CONFIG_MAXIMA[AT_BOUND[key]]
    if key == "num_experts_per_tok":
        config["num_local_experts"] = 8
    (tmp_path / "config.json").write_text(json.dumps(config))
    try:
        plan = api.estimate(str(tmp_path / "config.json"), gpu="H100")
    except ConfigError as exc:
        assert str(tmp_path / "config.json") in exc.one_line() and "\n" not in exc.one_line()
        return
    budget = plan.to_dict()["budget"]
    terms = {k: v for k, v in budget.items() if k.endswith("_bytes")}
    assert all(abs(v) <= MAX_SIZE_BYTES for v in terms.values()), terms
    assert budget["overhead_bytes"] <= budget["total_bytes"], terms


def test_api_rejects_a_context_past_max_model_len():
    import kvplan as api
    from kvplan.errors import InputError

    with pytest.raises(InputError, match="exceeds --max-model-len"):
        api.estimate("meta-llama/Llama-3.1-8B", context="32k", max_model_len="8k")


def test_gpus_alone_implies_tensor_parallelism_and_says_so():
    # "--gpus 8" alone used to be an error ("--tp 1 x --pp 1 = 1 does not match --gpus 8")
    import kvplan as api

    plan = api.estimate("meta-llama/Llama-3.1-8B", gpus=8)
    assert (plan.options.tp, plan.options.pp, plan.options.gpu_count) == (8, 1, 8)
    assert any(n.startswith("--gpus 8 without --tp/--pp: tensor parallelism over all of them (tp 8)") for n in plan.notes)
    with pytest.raises(Exception, match="does not match --gpus 8"):
        api.estimate("meta-llama/Llama-3.1-8B", gpus=8, tp=2, pp=2)  # a contradiction stays an error


def test_a_yaml_context_past_max_model_len_is_located(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("defaults: {model: meta-llama/Llama-3.1-8B}\nchecks:\n"
                    "  - name: long\n    context: 32k\n    max_model_len: 8k\n    require: {fits: true}\n")
    # in the file's words (its keys, not the CLI's flags), at the key the error names first
    line = assert_one_line(kvplan("check", str(path), "--offline"), "context 32768 exceeds max_model_len 8192")
    assert "c.yaml:4:" in line and "--" not in line
    path.write_text("defaults: {model: meta-llama/Llama-3.1-8B, max_model_len: 8k}\nsweep: {context: [4k, 32k]}\n")
    line = assert_one_line(kvplan("report", str(path), "--offline"), "context 32768 exceeds max_model_len 8192")
    assert "--" not in line
    # a sweep's rows are checked before the first is written, by their (context, max_model_len) pairs: the first
    # row past its length names it, whatever the batch axis beside (600 rows, 6 pairs; 8k x 16k is the first)
    path.write_text("defaults: {model: meta-llama/Llama-3.1-8B}\nsweep:\n  batch: [" + ", ".join(map(str, range(1, 101)))
                    + "]\n  context: [4k, 16k, 32k]\n  max_model_len: [8k, 64k]\n")
    line = assert_one_line(kvplan("report", str(path), "--offline"), "context 16384 exceeds max_model_len 8192")


def test_one_concurrent_request_is_singular():
    # "1 concurrent requests" (Llama-3.1-8B at 128k on an A100-40GB fits one)
    r = kvplan("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "A100-40GB", "-c", "128k")
    assert r.returncode == 0, r.stderr
    assert re.search(r": 1 (\(\d+ - \d+\) )?concurrent request \(", r.stdout) and "concurrent requests" not in r.stdout
    assert ": 1 request, " in r.stdout


# ---------------------------------------------------------------------------------------------
# suggestions and commands that must work when pasted


def _plan(**kw):
    import kvplan as api

    return api.estimate(kw.pop("model", "meta-llama/Llama-3.1-8B"), **kw)


def test_suggestions_are_flags_that_parse_and_fit():
    # "try --context 80,464": the option rejects commas; every suggestion must re-plan and fit
    from kvplan.options import options_from_values
    from kvplan.planning.plan import estimate

    p = _plan(gpu="A100-40GB", context="128k", batch=4)
    # tp 2 does not fit 4 x 128k: the smallest tp that does is suggested (before: only the first, tp 2, was tried)
    assert p.answer.fix == "--batch 1 or --context 40032 or --tp 4"
    for flag in p.answer.fix.split(" or "):
        name, value = flag.removeprefix("--").split(" ")
        values = {"model": "meta-llama/Llama-3.1-8B", "gpu": "A100-40GB", "context": "128k", "batch": 4, name: value}
        assert estimate(options_from_values(values)).answer.fits, flag


def test_no_fp8_suggestion_when_the_weights_do_not_fit():
    # Llama-3.1-70B's 131 GiB of weights on a 24 GB RTX 4090: no KV dtype, batch or context helps; eight of them
    # do (131.42 / 8 = 16.4 GiB of weights each)
    p = _plan(model="meta-llama/Llama-3.1-70B", gpu="rtx4090")
    assert "fp8" not in p.answer.fix and p.answer.fix == "--tp 8"
    assert _plan(model="meta-llama/Llama-3.1-70B", gpu="rtx4090", tp=8).answer.fits
    # 64 x 128k: no single change fits, nor any catalogue GPU: nothing is suggested (tests/planning/test_suggest.py)
    assert _plan(model="meta-llama/Llama-3.1-70B", gpu="rtx4090", context="128k", batch=64).answer.fix is None


def test_no_context_suggested_past_the_models_limit():
    # a 443,696-token context was suggested for a 131,072-token model
    p = _plan(context="500k")
    assert "--context 131072" in p.answer.fix


def test_serve_names_a_local_folder(tmp_path):
    import shutil

    folder = tmp_path / "my-model"
    folder.mkdir()
    shutil.copy(ROOT / "tests" / "fixtures" / "configs" / "mistral_v01.json", folder / "config.json")
    p = _plan(model=str(folder), gpu="H100")
    assert p.rules.serve_command(p.launch).startswith(f"vllm serve {folder} --max-model-len")
    r = kvplan("estimate", "my-model", "--gpu", "H100", cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "vllm serve my-model --max-model-len" in r.stdout  # the folder vLLM loads, not a name


def test_no_serve_line_for_a_deployment_the_engine_refuses():
    r = kvplan("estimate", "meta-llama/Llama-3.1-8B", "--gpu", "rtx4090", "-c", "128k")
    text = r.stdout
    assert "will refuse to start" in text and "vllm serve" not in text
    longest = _plan(gpu="rtx4090", context="128k").answer.longest_startable_len
    flat = " ".join(text.replace("│", " ").split())
    # "--max-model-len {longest}" with -c 128k is a flag the options reject: the length is stated, the flag to
    # paste is the context (tests/planning/test_suggest.py)
    assert f"the longest max_model_len it starts with is {longest:,}" in flat and f"--max-model-len {longest}" not in flat
    assert f"try --context {longest}" in flat
    assert _plan(gpu="rtx4090", context=longest).answer.engine_starts  # the suggestion starts


def test_max_num_seqs_is_not_capped_at_full_context_capacity():
    # 2 requests of 128k fit an A100-40GB: "--max-num-seqs 2" would have capped short requests at 2 too
    p = _plan(gpu="A100-40GB", context="128k")
    assert "--max-num-seqs" not in p.rules.serve_command(p.launch)
    # a batch above the engine's default does not run at once (the scheduler takes 1,024): the suggestion raises
    # it, re-planned (a bigger max_num_seqs profiles a bigger sampler), and that plan's command carries it
    big = _plan(context=128, batch=2000)
    assert not big.answer.fits and big.answer.max_requests == 1024 and "--max-num-seqs 2000" in big.answer.fix
    raised = _plan(context=128, batch=2000, max_num_seqs=2000)
    assert raised.answer.fits and "--max-num-seqs 2000" in raised.rules.serve_command(raised.launch)
    assert raised.budget.activation.bytes > big.budget.activation.bytes
    assert "--max-num-seqs 7" in _plan(max_num_seqs=7).rules.serve_command(_plan(max_num_seqs=7).launch)


def test_contiguous_reserves_max_model_len_in_sliding_layers_too():
    # gemma-2-9b: 42 layers, half sliding (window 4,096), 2 x 8 kv heads x 256 x 2 B = 8,192 B/token/layer,
    # 344,064 B/token in all. "Reserve max_model_len" at 8,192 tokens is 8,192 x 344,064 B in every layer
    # (it reserved only the window in the sliding half: 8,192 x 172,032 + 4,096 x 172,032).
    p = _plan(model="google/gemma-2-9b-it", context="8k")
    f = p.fragmentation
    assert p.kv_bytes_per_token_gpu == 42 * 8192 == 344_064
    # ... and never less than the engine holds there: at 8,192 tokens the sliding layers keep
    # ceil(min(4,095 + in-flight tokens, 8,192) / 16) + 1 = 513 blocks, one more than 512: + 21 x 16 x 8,192 B
    assert f.contiguous_request_bytes == 8192 * 344_064 + 21 * 16 * 8192 == p.demand.bytes(8192)
    assert f.raw_request_bytes == 8192 * 172_032 + 4096 * 172_032  # what the request itself holds
    assert f.contiguous_waste_bytes == 4096 * 172_032 + 21 * 16 * 8192


# ---------------------------------------------------------------------------------------------
# found by the fuzz (tests/e2e/test_fuzz.py)


@pytest.mark.parametrize("value,needle", [("1e308", "too large"), ("1e999", "not a finite number")])
def test_sizes_that_overflow_a_float_are_one_line(value, needle):
    # 1e308 GiB and 1e999 raised OverflowError (a traceback)
    assert_one_line(kvplan("estimate", "meta-llama/Llama-3.1-8B", "--gpu-memory", value), needle)


def test_a_key_with_a_newline_stays_on_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('defaults: {model: meta-llama/Llama-3.1-8B}\nchecks:\n  - {name: a, require: {fits: true}, "x\\ny": 1}\n')
    line = assert_one_line(kvplan("check", str(path), "--offline"), "unknown key")
    assert "checks[0]['x\\ny']" in line


def test_a_huge_simulated_pool_is_refused_before_it_is_allocated(tmp_path):
    # kv_budget 8 TiB = 8 x 2^40 / 2^21 = 4,194,304 blocks of 2 MiB: ~680 MB of allocator state at 163 B a
    # block (the fuzz's worker grew to 24 GB before it was stopped); on a 16 TiB device, so the budget fits it
    path = tmp_path / "w.yaml"
    path.write_text("model: meta-llama/Llama-3.1-8B\ngpu_memory: 16TiB\nkv_budget: 8TiB\nmax_model_len: 4096\n"
                    "timing: {prefill_s_per_token: 1.0e-6, decode_step_s: 0.01}\narrivals: {rate: 1}\n"
                    "num_requests: 10\nprompt_tokens: 10\noutput_tokens: 10\n")
    assert_one_line(kvplan("simulate", str(path), "--offline"), "blocks, past the 2,000,000 the simulator holds")


def test_a_validation_that_checks_no_request_does_not_pass():
    # the docs' old laptop example: 0.25 GiB = 14 blocks of 128 tokens (18 MiB each); a 2,048-token request
    # needs 16: the plan fits 0 requests, the fill checks nothing, and it printed PASS. It then failed (exit 1,
    # "FAIL") as if the pool disagreed with the plan; a plan of no request is bad input: one line, exit 2
    pytest.importorskip("torch")
    r = kvplan("validate", "Qwen/Qwen3-8B", "--gpu", "cpu", "--gpu-memory", "8GiB", "--kv-budget", "0.25GiB",
               "--context", "2k", timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    line = r.stderr.strip()
    assert line.startswith("kvplan: error: the plan fits no request of 2,048 tokens (vllm does not start: "), line
    assert "): nothing to validate (try --context " in line, line


# ---------------------------------------------------------------------------------------------
# MoE: compute and per-step reads use the parameters tokens are routed through; memory holds them all


def test_moe_active_parameters_by_hand():
    from kvplan.model.sources import load_spec

    spec, _ = load_spec("Qwen/Qwen3-30B-A3B", offline=True)
    # 48 MoE layers of 128 experts, 8 per token; an expert is 3 x 2,048 x 768 = 4,718,592 parameters.
    # One token leaves 120 experts idle in each layer: 48 x 120 x 4,718,592 = 27,179,089,920 not read.
    assert (spec.routed_expert_layers, spec.num_experts, spec.num_experts_per_token) == (48, 128, 8)
    assert spec.expert_parameters == 4_718_592
    assert spec.parameters_read(1) == spec.parameters - 27_179_089_920 == 3_353_032_704  # the "A3B"
    # a batch touches more experts: 128 x (1 - (120/128)^64) = 126.7 per layer at 64 tokens
    assert spec.parameters_read(1) < spec.parameters_read(8) < spec.parameters_read(64) < spec.parameters
    dense, _ = load_spec("meta-llama/Llama-3.1-8B", offline=True)
    assert dense.parameters_read(1) == dense.parameters_read(1000) == dense.parameters


def test_deepseek_v3_roofline_and_prefill_use_active_parameters():
    # they used all 684B parameters: a decode step of one request read every expert
    p = _plan(model="deepseek-ai/DeepSeek-V3", gpu="h200", tp=8, context="8k", prefix_tokens=2000)
    spec, r = p.spec, p.roofline
    active = spec.parameters_read(1)
    assert 30e9 < active < 60e9 < spec.parameters  # 671B routed through 8 of 256 experts (the MTP layer is not loaded)
    assert r.batch == 1 and r.weight_bytes < p.budget.weights.bytes / 10
    assert r.weight_bytes == -(-p.budget.weights.bytes * active // spec.parameters)
    assert p.budget.weights.bytes * 8 >= spec.parameters  # memory still holds every expert
    assert p.prefix.prefill_flops_saved == 2 * active * p.prefix.prefill_tokens_saved


def test_gpu_memory_without_a_gpu_is_custom_without_bandwidth_figures():
    # "--gpu-memory 24GiB" without --gpu was labelled H100-SXM-80GB and used H100 bandwidth
    p = _plan(gpu_memory="24GiB")
    assert p.gpu.name == "custom" and not p.gpu.bandwidth_bytes_per_s
    assert p.roofline is None and p.to_dict()["roofline"] is None
    r = kvplan("estimate", "meta-llama/Llama-3.1-8B", "--gpu-memory", "24GiB")
    assert "1x custom" in r.stdout and "H100" not in r.stdout and "roofline" not in r.stdout
