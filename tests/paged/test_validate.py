"""``kvplan validate`` on CPU through typer's runner: 0 bytes difference, planned concurrency fills, one more
does not; failures exit 1; memory is released on OOM and Ctrl-C; no torch -> one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entry_point import script
from kvplan.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
CPU = ("--gpu", "cpu", "--gpu-memory", "8GiB")  # vLLM's CPU backend: block size 128, max_num_batched_tokens 4096


def run(*args: str):
    return runner.invoke(app, ["validate", *args])


def test_import_kvplan_cli_and_the_command_stay_torch_free():
    code = ("import sys, kvplan.cli.app, kvplan.cli.commands.validate, kvplan.paged.validate, kvplan.paged.distributed; "
            "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_without_torch_one_line_and_exit_2(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    r = run("meta-llama/Llama-3.1-8B", *CPU, "--kv-budget", "0.5GiB")
    assert r.exit_code == 2
    assert r.output.strip() == "kvplan: error: kvplan validate needs torch (pip install 'kvplan[torch]')"


torch = pytest.importorskip("torch")


def _json(*args: str) -> dict:
    r = run(*args, "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_llama_pool_matches_the_estimate_to_the_byte():
    doc = _json("meta-llama/Llama-3.1-8B", *CPU, "--kv-budget", "0.5GiB", "--context", "1k")
    v, plan = doc["validation"], doc["plan"]
    # block id = 128 tokens x 131,072 B/token = 16 MiB; 0.5 GiB / 16 MiB = 32 blocks = 536,870,912 B
    assert plan["num_blocks"] == v["num_blocks"] == 32 and v["block_bytes"] == 16_777_216
    m = v["measure"]
    assert m["estimate_bytes"] == m["storage_bytes"] == m["device_bytes"] == 536_870_912
    assert m["difference_bytes"] == 0 and m["num_tensors"] == 32
    # 1,024 tokens = 8 blocks a request; (32 - 1 null block) // 8 = 3 requests; 31 - 24 = 7 free < 8
    f = v["fill"]
    assert (f["planned_requests"], f["filled_requests"], f["peak_blocks"], f["free_blocks"]) == (3, 3, 8, 7)
    assert f["exact"] is True and f["one_more_fits"] is False
    assert [c["case"] for c in v["attention"]] == ["gqa", "gqa"] and all(c["ok"] for c in v["attention"])
    assert doc["ok"] is True and v["failures"] == []


@pytest.mark.parametrize(("model", "extra", "case"), [
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", ("--context", "2k"), "mla"),
    ("google/gemma-2-9b-it", ("--kv-budget", "1GiB", "--context", "1k"), "sliding(4096)"),
    ("tiiuae/falcon-7b", ("--context", "2k", "--kv-dtype", "fp8"), "mqa"),
])
def test_validate_bundled_models_on_cpu(model, extra, case):
    args = (model, *CPU, "--kv-budget", "0.5GiB", *extra)
    doc = _json(*args)
    v = doc["validation"]
    assert v["measure"]["difference_bytes"] == 0
    assert v["measure"]["storage_bytes"] == v["num_blocks"] * v["block_bytes"]
    assert v["fill"]["filled_requests"] == v["fill"]["planned_requests"] == doc["plan"]["max_requests"] >= 1
    assert v["fill"]["peak_blocks"] <= v["fill"]["planned_blocks_per_request"]
    assert case in {c["case"] for c in v["attention"]} and all(c["ok"] for c in v["attention"])
    assert doc["ok"] is True


def test_text_output_shows_estimate_and_measured_side_by_side():
    r = run("meta-llama/Llama-3.2-1B-Instruct", *CPU, "--kv-budget", "0.25GiB", "--context", "2k", "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert "estimate vs measured" in r.output and "0 B (0.00%)" in r.output
    assert "268,435,456 B" in r.output  # 0.25 GiB = 64 blocks x (128 x 32,768 B)
    assert "PASS" in r.output and "does not fit" in r.output


def test_a_plan_that_overstates_concurrency_exits_1(monkeypatch):
    from kvplan import memory

    real = memory.max_requests
    monkeypatch.setattr(memory, "max_requests", lambda blocks, per_req: real(blocks, per_req) + 1)
    r = run("meta-llama/Llama-3.1-8B", *CPU, "--kv-budget", "0.5GiB", "--context", "1k", "--device", "cpu")
    assert r.exit_code == 1, r.output
    assert "only 3 of the planned 4 requests" in " ".join(r.output.split())


def test_a_pool_size_that_differs_from_the_estimate_exits_1(monkeypatch):
    from kvplan import memory

    real = memory.pool_bytes
    monkeypatch.setattr(memory, "pool_bytes", lambda blocks, layout: real(blocks, layout) + 4096)
    r = run("meta-llama/Llama-3.1-8B", *CPU, "--kv-budget", "0.5GiB", "--context", "1k", "--device", "cpu", "--json")
    assert r.exit_code == 1
    m = json.loads(r.stdout)["validation"]["measure"]
    assert m["difference_bytes"] == -4096


def _capture_pools(monkeypatch) -> list:
    from kvplan.paged import pool as pool_mod

    pools, real = [], pool_mod.allocate_pool

    def capture(*args, **kwargs):
        pools.append(real(*args, **kwargs))
        return pools[-1]

    monkeypatch.setattr(pool_mod, "allocate_pool", capture)
    return pools


def test_out_of_memory_is_reported_and_the_pool_released(monkeypatch):
    from kvplan.paged import validate as validate_mod

    pools = _capture_pools(monkeypatch)

    def oom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(validate_mod, "_fill", oom)
    r = run("meta-llama/Llama-3.1-8B", *CPU, "--kv-budget", "0.5GiB", "--context", "1k", "--device", "cpu")
    assert r.exit_code == 1
    assert "out of memory while filling the pool: 512 MiB of 512 MiB allocated" in " ".join(r.output.split())
    assert len(pools) == 1 and pools[0].slots == [] and pools[0].layers == []


def test_ctrl_c_releases_the_pool(monkeypatch):
    from kvplan.paged import validate as validate_mod

    pools = _capture_pools(monkeypatch)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(validate_mod, "_fill", interrupt)
    r = run("meta-llama/Llama-3.1-8B", *CPU, "--kv-budget", "0.5GiB", "--context", "1k", "--device", "cpu")
    assert r.exit_code == 130
    assert pools[0].slots == [] and pools[0].storage_bytes == 0


def test_probe_needs_cuda():
    r = run("meta-llama/Llama-3.1-8B", *CPU, "--kv-budget", "0.5GiB", "--device", "cpu", "--probe")
    assert r.exit_code == 2 and "--probe needs a CUDA device" in r.output


def test_a_pool_bigger_than_the_machine_is_refused_with_a_hint():
    r = run("meta-llama/Llama-3.1-8B", "--gpu", "cpu", "--gpu-memory", "8TiB", "--kv-budget", "4096GiB", "--device", "cpu")
    assert r.exit_code == 2
    assert "does not fit in the" in r.output and "--kv-budget" in r.output


def test_progress_reaches_the_planned_concurrency():
    from kvplan.paged.validate import validate_plan
    from kvplan.planning.plan import estimate, options_from_values

    plan = estimate(options_from_values({"model": "tiiuae/falcon-7b", "gpu": "cpu", "gpu_memory": "8GiB",
                                         "kv_budget": "0.25GiB", "context": "512"}))
    calls: list[tuple[int, int]] = []
    result = validate_plan(plan, "cpu", progress=lambda done, total: calls.append((done, total)))
    # falcon-7b: 32 layers x 1 KV head x 64 x 2 B x 2 = 8 KiB a token; block 128 tokens = 1 MiB;
    # 256 blocks; 512 tokens = 4 blocks a request -> (256 - 1) // 4 = 63 requests
    assert result.fill.planned_requests == 63 and calls[-1] == (63, 63) and [d for d, _ in calls] == list(range(1, 64))
    assert result.ok


def test_pipeline_stage_layouts():
    from kvplan.paged.validate import rank_layout
    from kvplan.planning.plan import estimate, options_from_values

    plan = estimate(options_from_values({"model": "meta-llama/Llama-3.1-8B", "gpu": "cpu", "gpu_memory": "8GiB",
                                         "kv_budget": "0.25GiB", "tp": 2, "pp": 2}))
    # 32 layers over 2 stages: 16 each; tp 2 halves the 8 KV heads -> 4; ranks 0, 1 stage 0; 2, 3 stage 1
    for rank, stage in ((0, 0), (1, 0), (2, 1), (3, 1)):
        layout, got_stage, layers = rank_layout(plan, rank)
        assert got_stage == stage and layout.num_layers == 16 and len(layers) == 16
        assert layout.groups[0].cache.kv_heads == 4


def test_benchmark_script_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu_validate.json"
    proc = script(ROOT / "benchmarks" / "gpu_validate.py", str(out), "--device", "cpu", "--gpu", "cpu", "--gpu-memory",
                  "8GiB", "--kv-budget", "0.25GiB", "--context", "512", "--attention-tokens", "512")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["ok"] is True and len(doc["scenarios"]) == 4 and len(doc["attention"]) == 6
    for s in doc["scenarios"]:
        assert s["validation"]["measure"]["difference_bytes"] == 0


def test_out_of_memory_while_allocating_reports_how_far_it_got(monkeypatch):
    calls = {"n": 0}
    real_zeros = torch.zeros

    def zeros_until_oom(*args, **kwargs):  # the third slot tensor does not fit
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 MiB")
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", zeros_until_oom)
    r = run("meta-llama/Llama-3.1-8B", *CPU, "--kv-budget", "0.5GiB", "--context", "1k", "--device", "cpu", "--json")
    assert r.exit_code == 1
    v = json.loads(r.stdout)["validation"]
    # two of 32 slot tensors of 32 blocks x 512 KiB (16 MiB each) were allocated, then released
    assert v["error"] == "out of memory while allocating the pool: 32 MiB of 512 MiB allocated"
    assert v["measure"] is None and v["fill"] is None


def test_validate_takes_every_estimate_option():
    import inspect

    import typer.main

    from kvplan.cli import app as cli

    estimate_options = set(inspect.signature(cli.estimate).parameters) - {"json_out", "brief"}  # output flags
    validate = typer.main.get_command(app).commands["validate"]
    assert estimate_options <= {p.name for p in validate.params}


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


@pytest.mark.parametrize(("args", "why"), [
    # Qwen3-0.6B: 28 layers x 8 kv heads x 128 x 2 x 2 B = 114,688 B/token, 14 MiB per 128-token block; 0.25 GiB
    # is 18 blocks = 2,304 tokens, short of one 32k request
    (("Qwen/Qwen3-0.6B", *CPU, "--kv-budget", "0.25GiB", "--context", "32k"), "does not start"),
    # the same plan on SGLang, whose pool caps a request instead of refusing to start
    (("Qwen/Qwen3-0.6B", "--gpu", "H100", "--engine", "sglang", "--kv-budget", "0.01GiB", "--context", "32k",
      "--device", "cpu"), "nothing to validate"),
    # a budget smaller than one block besides the null block
    (("Qwen/Qwen3-0.6B", *CPU, "--kv-budget", "0.001GiB", "--context", "512"), "nothing to validate"),
])
def test_a_plan_of_no_request_is_bad_input_not_a_failed_validation(args, why):
    # `validate` exited 1 ("FAIL") when the plan fits no request: nothing was measured, so nothing failed; every
    # such plan (the engine refuses, its pool caps the request to nothing, no usable block) is one line, exit 2
    r = runner.invoke(app, ["validate", *args])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvplan: error: ") and why in lines[0], r.output
    assert "nothing to validate" in lines[0] and "FAIL" not in r.output


@pytest.mark.parametrize("width", [80, 64])
def test_validate_tables_are_framed_and_never_cut_a_figure(width):
    # the tables cut figures at 80 columns ("264,241,15…") and had no frame: every table of a validation, with
    # an H200-sized pool's figures, and the ranks table, keep each figure whole at the width and draw a frame
    from dataclasses import replace

    from rich.console import Console

    from kvplan.paged.validate import validate_plan
    from kvplan.planning.plan import estimate, options_from_values
    from kvplan.render.validate import render_ranks, render_result

    plan = estimate(options_from_values({"model": "Qwen/Qwen3-0.6B", "gpu": "cpu", "gpu_memory": "8GiB",
                                         "kv_budget": "0.25GiB", "context": "512"}))
    r = validate_plan(plan, "cpu")
    big = 123_456_789_012  # 115 GiB: the widest figure a 141 GB GPU's pool prints
    r = replace(r, measure=replace(r.measure, estimate_bytes=big, storage_bytes=big, device_bytes=big + 4_096,
                                   expected_device_bytes=big, rss_bytes=big + 3_067_904, released_bytes=0),
                num_blocks=8_410_152)
    figures = [f"{big:,}", f"{big + 4_096:,}"]  # whole, in the measure table and the ranks table
    for renderable in (render_result(r, plan, width=width), render_ranks([r, replace(r, rank=1)], width=width)):
        console = Console(width=width, record=True, color_system=None)
        console.print(renderable)
        text = console.export_text()
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= width, text
        assert "┏" in text and "└" in text, text  # framed
        for figure in figures:
            assert figure in text, (figure, text)
