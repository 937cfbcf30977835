"""``kvplan size`` (:mod:`kvplan.planning.size`): every row re-plans with ``estimate`` to its own figures, the
smallest row is truly the smallest, prices rank by cost, bad input is one line (exit 2), and the outputs
(text, JSON, CSV) carry the same numbers."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvplan
from kvplan.cli.app import app
from kvplan.errors import InputError, KvplanError
from kvplan.gpus import find_gpu, load_gpus
from kvplan.model.sources import load_spec
from kvplan.options import options_from_values
from kvplan.planning.plan import plan_for_spec
from kvplan.planning.size import ESTIMATE, LOW, Requirement, default_gpus, size

sys.path.insert(0, str(Path(__file__).parent))
from entry_point import assert_one_line, kvplan as run_kvplan  # noqa: E402

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"

# one model of each kind the issue names: dense, MoE, MLA, sliding-window, hybrid (state layers)
KINDS = {
    "dense": "meta-llama/Llama-3.1-8B",
    "moe": "Qwen/Qwen3-30B-A3B",
    "mla": "deepseek-ai/DeepSeek-V2-Lite-Chat",
    "sliding": "google/gemma-3-27b-it",
    "hybrid": "Qwen/Qwen3-Next-80B-A3B-Instruct",
}
GPUS = ("H100", "L40S", "H200")


@lru_cache(maxsize=None)
def _sized(model: str, engine: str, n: int = 96, context: int = 8192, at: str = LOW):
    return kvplan.size(model, concurrency=n, context=context, gpus=list(GPUS), engine=engine, at=at)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_row_replans_with_estimate_to_the_same_figures(kind, engine):
    sizing = _sized(KINDS[kind], engine)
    assert sizing.rows
    for row in sizing.rows:
        share = math.ceil(96 / row.replicas)
        plan = kvplan.estimate(KINDS[kind], gpu=row.gpu, tp=row.tp, pp=row.pp, context=8192, batch=share,
                               engine=engine)
        assert plan.kv_range.low.max_requests == row.requests_per_replica_low, (kind, engine, row.gpu)
        assert plan.answer.max_requests == row.requests_per_replica, (kind, engine, row.gpu)
        assert plan.rules.serve_command(plan.launch) == row.serve_command
        # the replicas hold the requirement at the low end, and one fewer does not
        assert row.requests_low >= 96 > (row.replicas - 1) * row.requests_per_replica_low
        assert row.gpus == row.tp * row.pp * row.replicas


def _per_replica(model: str, gpu: str, tp: int, pp: int, context: int, engine: str, at: str) -> int:
    spec, _ = load_spec(model)
    try:
        plan = plan_for_spec(spec, options_from_values({"model": model, "gpu": gpu, "tp": tp, "pp": pp,
                                                        "context": context, "engine": engine}), suggest=False)
    except KvplanError:
        return 0  # a tp the engine cannot split the model by
    return (plan.kv_range.low if at == LOW else plan.answer).max_requests


@pytest.mark.parametrize("model,engine,n,context", [
    ("meta-llama/Llama-3.3-70B-Instruct", "vllm", 200, 8192),
    ("Qwen/Qwen3-30B-A3B", "sglang", 300, 16384),
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", "vllm", 500, 8192),
])
def test_the_smallest_row_is_truly_the_smallest(model, engine, n, context):
    """No tp, pp or replica count of the row's GPU with fewer GPUs holds the requirement (every tp within a node
    and every pp: a brute force over the shapes the search prunes)."""
    sizing = kvplan.size(model, concurrency=n, context=context, gpus=["H100", "L40S"], engine=engine)
    for row in sizing.rows:
        for tp in range(1, 9):
            for pp in range(1, row.gpus // tp + 1):
                if tp * pp >= row.gpus:
                    continue
                per = _per_replica(model, row.gpu, tp, pp, context, engine, LOW)
                fewest = math.ceil(n / per) if per else math.inf
                assert tp * pp * fewest >= row.gpus, (row.gpu, tp, pp, per, row.gpus)
    best = sizing.best
    assert all((best.gpus, -best.headroom) <= (r.gpus, -r.headroom) for r in sizing.rows)


def test_the_low_end_asks_for_at_least_as_much_as_the_estimate():
    for model in KINDS.values():
        low, est = _sized(model, "vllm"), _sized(model, "vllm", at=ESTIMATE)
        by_gpu = {r.gpu: r for r in est.rows}
        for row in low.rows:
            assert row.requests_per_replica_low <= row.requests_per_replica
            assert row.gpus >= by_gpu[row.gpu].gpus
        assert est.to_dict()["requirement"]["judged_at"] == "estimate"


def test_weights_that_need_stages_get_pipeline_parallelism_and_say_weights_bind():
    # Llama-3.1-405B: 756 GiB of bf16 weights; 8 L40S (40.8 GiB usable each) cannot hold them at tp 8, and 19
    # GPUs hold 39.8 GiB each, too much to leave a request's room: the replica needs pipeline stages
    (row,) = kvplan.size("meta-llama/Llama-3.1-405B", concurrency=16, context=8192, gpus=["L40S"]).rows
    assert row.pp > 1 and row.replicas == 1 and 19 < row.gpus <= 24
    # Llama-3.3-70B, one request on H100s: 1 GPU cannot load the 131 GiB of weights and tp 2 leaves too little
    # for a request (1.14 GiB for 1.25, its all-reduce buffers counted); 2 pipeline stages (no tp buffers) do
    (row,) = kvplan.size("meta-llama/Llama-3.3-70B-Instruct", concurrency=1, context=8192, gpus=["H100"]).rows
    assert (row.tp, row.pp, row.replicas, row.binds) == (1, 2, 1, "weights")
    assert "--pipeline-parallel-size 2" in row.serve_command and "tp 1: weights 131.4 GiB" in row.why_not_smaller
    (row,) = kvplan.size("meta-llama/Llama-3.1-405B", concurrency=16, context=8192, gpus=["L40S"]).rows
    assert "weights" in row.why_not_smaller
    assert f"--pipeline-parallel-size {row.pp}" in row.serve_command


def test_default_gpus_are_the_catalogues_datacenter_parts():
    names = {g.name for g in default_gpus()}
    assert {"H100-SXM-80GB", "H200-SXM-141GB", "MI300X-192GB", "L40S-48GB"} <= names
    assert not names & {"RTX-4090-24GB", "GB10", "cpu"}
    assert all(g.node_gpus for g in load_gpus() if g.name in names)
    sizing = kvplan.size("meta-llama/Llama-3.1-8B", concurrency=8, context=4096)
    assert {r.gpu for r in sizing.rows} | {g for g, _ in sizing.unfit} == names


def test_a_gpu_named_twice_is_searched_once():
    sizing = kvplan.size("meta-llama/Llama-3.1-8B", concurrency=8, context=4096, gpus="h100,H100-SXM-80GB,L4")
    assert [r.gpu for r in sizing.rows].count("H100-SXM-80GB") == 1 and len(sizing.rows) == 2


def test_tp_stays_within_one_node():
    sizing = kvplan.size("meta-llama/Llama-3.1-405B", concurrency=64, context=8192)
    for row in sizing.rows:
        assert row.tp <= find_gpu(row.gpu).node_gpus


# ---------------------------------------------------------------------------------------------
# prices


def _prices(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(body, encoding="utf-8")
    return path


def test_prices_rank_by_cost_and_give_cost_per_million_tokens_held(tmp_path):
    path = _prices(tmp_path, "currency: USD\nsource: my quote\ndate: 2026-11-30\n"
                             "prices: {H100: 2.0, H200: 100.0, L40S: 0.5}\n")
    sizing = kvplan.size("meta-llama/Llama-3.3-70B-Instruct", concurrency=100, context=8192, prices=path)
    assert sizing.ranked_by == "cost" and {r.gpu for r in sizing.rows} <= {"H100-SXM-80GB", "H200-SXM-141GB", "L40S-48GB"}
    costs = [r.cost_per_hour for r in sizing.rows]
    assert costs == sorted(costs)
    for row in sizing.rows:
        assert row.cost_per_hour == pytest.approx(row.price.per_gpu_hour * row.gpus)
        held_mtok = row.requests_low * 8192 / 1e6
        assert row.cost_per_million_tokens_hour == pytest.approx(row.cost_per_hour / held_mtok)
        assert row.price.source == "my quote" and row.price.date == "2026-11-30"
    # the GPU count ranks otherwise: H200 is the smallest here but not the cheapest
    by_gpus = kvplan.size("meta-llama/Llama-3.3-70B-Instruct", concurrency=100, context=8192,
                          gpus=["H100", "H200", "L40S"])
    assert by_gpus.ranked_by == "gpus" and by_gpus.best.gpu == "H200-SXM-141GB" != sizing.best.gpu


def test_the_example_price_file_loads_and_says_it_is_no_quote():
    from kvplan.io.prices import load_prices

    prices = load_prices(EXAMPLES / "prices.yaml")
    assert prices.currency and all(p.source and p.date for p in prices.entries)
    assert "not a quote" in prices.source
    text = (EXAMPLES / "prices.yaml").read_text(encoding="utf-8")
    assert "ships no prices" in text


@pytest.mark.parametrize("body,where,words", [
    ("prices: {H100: 2}\n", "1:10", "no source"),
    ("source: s\ndate: d\nprices: {H100: cheap}\n", "3:16", "positive number"),
    ("source: s\ndate: d\nprices: {H1000: 2}\n", "3:10", "H1000"),
    ("source: s\ndate: d\nprice: {H100: 2}\n", "3:1", "unknown key"),
    ("source: s\ndate: d\nprices: {H100: {per_gpu_hour: 2, cost: 3}}\n", "3:34", "unknown key"),
    ("source: s\ndate: d\nprices: {H100: 2, h100-sxm: 3}\n", "3:19", "priced twice"),
    ("- a list\n", "1:1", "mapping"),
])
def test_a_bad_price_file_is_one_located_line(tmp_path, body, where, words):
    path = _prices(tmp_path, body)
    r = run_kvplan("size", "meta-llama/Llama-3.1-8B", "-n", "4", "--prices", str(path))
    assert r.returncode == 2
    line = assert_one_line(r)
    assert f"prices.yaml:{where}" in line and words in line, line


# ---------------------------------------------------------------------------------------------
# bad input, outputs


@pytest.mark.parametrize("args,words", [
    (["-n", "4", "-c", "1000k"], "maximum length is 131,072"),
    (["-n", "4", "--gpu", "T4", "--tp", "1"], "no GPU holds one request"),  # 405B on 16 stages of one T4
    (["-n", "4", "--tp", "3"], "--tp 3 does not divide"),
    (["-n", "4", "--tp", "two"], "invalid --tp"),
    (["-n", "zero"], "--batch"),
    (["-n", "4", "--at", "median"], "invalid --at"),
    (["-n", "4", "--gpu", "cpu"], "size searches GPUs"),
    (["-n", "4", "--gpu", "H1000"], "H1000"),
    # an option every shape refuses is named as the option's own error, not "no GPU holds one request"
    (["-n", "4", "--kv-dtype", "int3"], "unknown --kv-dtype 'int3'"),
    (["-n", "4", "--kv-dtype", "auto,fp8", "--gpu", "H100,L4"], "unknown --kv-dtype 'auto,fp8'"),
])
def test_bad_input_is_one_line_exit_2(args, words):
    model = "meta-llama/Llama-3.1-405B" if "T4" in args else "meta-llama/Llama-3.1-8B"
    r = run_kvplan("size", model, *args)
    assert r.returncode == 2
    line = assert_one_line(r)
    assert words in line, line


def test_json_and_csv_carry_the_rows_figures():
    args = ["size", "Qwen/Qwen3-8B", "-n", "100", "-c", "32k", "--gpu", "H100,L4", "--engine", "sglang"]
    data = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    keys = {"gpu", "tp", "pp", "replicas", "gpus", "requests_per_replica_low", "requests_per_replica",
            "requests_low", "binds", "cost_per_hour", "serve_command"}
    assert data["deployments"] and all(keys <= set(d) for d in data["deployments"])
    assert data["schema_version"] == 1
    assert data["requirement"] == {"concurrency": 100, "context": 32768, "prefix_tokens": 0, "judged_at": "low end"}
    rows = list(csv.DictReader(io.StringIO(runner.invoke(app, args + ["--csv"]).stdout)))
    assert [(r["gpu"], int(r["gpus"]), int(r["requests_low"]), r["serve_command"]) for r in rows] == [
        (d["gpu"], d["gpus"], d["requests_low"], d["serve_command"]) for d in data["deployments"]]
    assert all(d["serve_command"].startswith("python -m sglang.launch_server") for d in data["deployments"])
    text = runner.invoke(app, args).stdout
    best = data["deployments"][0]
    flat = " ".join(text.split())
    assert f"{best['replicas']} x {best['gpu']} at tp {best['tp']}" in flat  # the answer first
    assert flat.index("smallest:") < flat.index("smallest deployment of each GPU")
    assert " ".join(best["serve_command"].split()) in flat


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("kv_dtype", ["auto", "bf16", "fp16", "fp8", "fp8_e5m2", "int8", "int4"])
def test_a_rows_launch_line_is_the_estimates_and_none_for_a_kv_dtype_the_engine_cannot_run(engine, kv_dtype):
    # every row's serve command is the one `kvplan estimate` of the row prints: None (no launch line, "a what-if"
    # said in its place) where the engine has no --kv-cache-dtype spelling for the dtype (vLLM int8 / int4,
    # SGLang fp16 / int8 / int4), never a line that silently drops the planned dtype
    model = "meta-llama/Llama-3.1-8B"
    sizing = kvplan.size(model, concurrency=24, context=8192, gpus=["H100", "L40S"], engine=engine,
                         kv_dtype=kv_dtype)
    assert sizing.rows
    for row in sizing.rows:
        plan = kvplan.estimate(model, gpu=row.gpu, tp=row.tp, pp=row.pp, context=8192, engine=engine,
                               kv_dtype=kv_dtype)
        assert row.serve_command == plan.serve_command, (engine, kv_dtype, row.gpu)
    args = ["size", model, "-n", "24", "--gpu", "H100,L40S", "--engine", engine, "--kv-dtype", kv_dtype]
    flat = " ".join(runner.invoke(app, args).stdout.split())
    best = sizing.rows[0]
    if best.serve_command is None:
        assert f"none: {best.plan.engine.label} cannot run --kv-dtype" in flat and "a what-if" in flat
        assert "launch_server --model-path" not in flat and "vllm serve" not in flat
    else:
        assert " ".join(best.serve_command.split()) in flat
    data = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    assert [d["serve_command"] for d in data["deployments"]] == [r.serve_command for r in sizing.rows]


def test_the_search_reuses_one_plan_per_gpu_tp_pp():
    sizing = _sized(KINDS["dense"], "vllm")
    for gpu, replicas in sizing.layouts.items():
        assert len(replicas.plans) == len(set(replicas.plans))
    spec, _ = load_spec(KINDS["dense"])
    base = options_from_values({"model": KINDS["dense"]})
    again = size(spec, base, Requirement(96, 8192), tuple(find_gpu(g) for g in GPUS))
    assert [r.to_dict() for r in again.rows] == [r.to_dict() for r in sizing.rows]


def test_a_shared_prefix_counts_once_with_prefix_caching():
    plain = kvplan.size("meta-llama/Llama-3.1-8B", concurrency=400, context=8192, gpus=["L40S"])
    shared = kvplan.size("meta-llama/Llama-3.1-8B", concurrency=400, context=8192, gpus=["L40S"],
                         prefix_tokens=4096)
    assert shared.best.requests_per_replica_low > plain.best.requests_per_replica_low
    assert shared.best.gpus <= plain.best.gpus


def test_the_python_api_checks_types():
    with pytest.raises(InputError, match=r"kvplan.size\(\): concurrency"):
        kvplan.size("meta-llama/Llama-3.1-8B", concurrency=[4])
    with pytest.raises(InputError, match="unknown option"):
        kvplan.size("meta-llama/Llama-3.1-8B", concurrency=4, colour="red")


def test_the_repr_reads_as_the_answer():
    sizing = kvplan.size("meta-llama/Llama-3.1-8B", concurrency=100, context="8k", gpus="H100,L4")
    best = sizing.best
    assert repr(sizing).startswith("Sizing(100 x 8,192 tokens of meta-llama/Llama-3.1-8B on vllm, at the low end: "
                                   "2 of 2 GPUs searched hold it")
    assert f"{best.replicas} x {best.gpu} tp {best.tp} pp {best.pp} = {best.gpus} GPUs" in repr(sizing)
    assert len(repr(sizing)) < 300  # no plans dumped
