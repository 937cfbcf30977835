"""`kvplan explain` on the line forms people's logs really have: the GPU's memory in every form, `--gpu` as a check,
SGLang's lines of each release, block sizes the engine chose, models kvplan cannot load, the one-line diagnosis,
vLLM's CPU backend and 0.32 `serve` logs, many logs at once, and bad input.

The log lines are the engines' own format strings (vLLM vllm/v1/worker/gpu_worker.py, vllm/utils/mem_utils.py,
vllm/v1/core/kv_cache_utils.py; SGLang srt/model_executor/model_runner.py, srt/mem_cache/memory_pool.py), filled
with the numbers of the corpus logs named beside them (benchmarks/corpus/).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.explain.logparse import parse_log
from kvplan.explain.reconcile import explain
from kvplan.units import GiB

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "corpus"
CPU = ROOT / "tests" / "fixtures" / "vllm_cpu"
runner = CliRunner()


def corpus_log(engine: str, entry: str) -> str:
    return (CORPUS / engine / f"{entry}.log").read_text()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# --------------------------------------------------------------------------------- the GPU's memory, every form

SNAPSHOT = ("(EngineCore_DP0 pid=1) DEBUG 05-01 10:00:01 [gpu_worker.py:284] worker init memory snapshot: torch_peak=0.0GiB, "
            "free_memory=78.6GiB, total_memory=79.19GiB, cuda_memory=0.59GiB, torch_memory=0.0GiB, "
            "non_torch_memory=0.59GiB, timestamp=1714557601.2, auto_measure=True\n"
            "(EngineCore_DP0 pid=1) DEBUG 05-01 10:00:01 [gpu_worker.py:286] worker requested memory: 71.27GiB\n")
V1_019 = ("INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.19.0\n"
          "INFO 05-01 10:00:00 [utils.py:1] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', "
          "'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 8192}\n")


def test_the_gpu_memory_comes_from_the_debug_snapshot():
    log = parse_log(V1_019 + SNAPSHOT + "INFO [gpu_worker.py:1] Available KV cache memory: 54.8 GiB\n")
    assert (log.total_memory_gib, log.requested_memory_gib) == (79.19, 71.27)
    assert log.non_torch_gib is None  # the snapshot's non_torch_memory is the CUDA context at init, not the term
    ex = explain(V1_019 + SNAPSHOT + "INFO [gpu_worker.py:1] Available KV cache memory: 54.8 GiB\n")
    assert ex.gpu_known and ex.plan.gpu.name == "H100-SXM-80GB"  # the catalogue's card with that total
    assert ex.plan.budget.total_bytes == round(79.19 * GiB)  # the log's total is planned
    assert any("79.19 GiB total is what H100-SXM-80GB reports" in n for n in ex.notes)


ACTUAL_USAGE = ("(Worker_TP2_EP2 pid=2080) INFO 09-24 20:54:35 [gpu_worker.py:391] Free memory on device (43.93/44.42 GiB) on "
                "startup. Desired GPU memory utilization is (0.9, 39.98 GiB). Actual usage is 27.72 GiB for weight, 1.4 GiB for "
                "peak activation, 0.21 GiB for non-torch memory, and 3.45 GiB for CUDAGraph memory. Replace "
                "gpu_memory_utilization config with `--kv-cache-memory=7564378828` to fit into requested memory, or "
                "`--kv-cache-memory=12411542937` to fully utilize gpu memory. Current kv cache memory in use is 10299473510 "
                "bytes.\n")


def test_the_info_free_memory_line_gives_the_total_and_all_four_measured_terms():
    # vLLM 0.10.2 INFO (0.11 - 0.25 DEBUG): was read as the total alone, the four terms lost
    log = parse_log(ACTUAL_USAGE)
    assert (log.free_memory_gib, log.total_memory_gib) == (43.93, 44.42)
    assert (log.gpu_memory_utilization, log.requested_memory_gib) == (0.9, 39.98)
    assert (log.weights_gib, log.activation_gib, log.non_torch_gib, log.cudagraph_actual_gib) == (27.72, 1.4, 0.21, 3.45)
    assert abs(log.available_kv_gib * GiB - 10_299_473_510) < 1  # "in use is N bytes" when no other KV line


WHEEL_PATH = ("WARNING 10-06 15:57:52 [fused_moe.py:798] Using default MoE config. Config file not found at "
              "['/home/u/vllm/.venv/lib/python3.12/site-packages/vllm/model_executor/layers/fused_moe/configs/x.json']\n")


def test_the_chunked_prefill_the_log_states_is_planned():
    from kvplan.explain.facts import log_values

    # V0's config line prints the resolved chunked_prefill_enabled; off at 40,000 tokens, the profile prefills them
    # at once (vllm-11251: 2.53 GiB of activation logged)
    line = ("INFO 12-19 09:27:26 llm_engine.py:249] Initializing an LLM engine (v0.6.5) with config: "
            "model='meta-llama/Llama-3.1-8B-Instruct', max_seq_len=40000, chunked_prefill_enabled={}, "
            "enable_prefix_caching=False\nINFO 12-19 distributed_gpu_executor.py:57] # GPU blocks: 4660, # CPU "
            "blocks: 4096\n")
    assert log_values(parse_log(line.format("False")))[0]["chunked_prefill"] is False
    assert log_values(parse_log(line.format("True")))[0]["chunked_prefill"] is True
    args = parse_log("INFO [utils.py:1] non-default args: {'model': 'x', 'enable_chunked_prefill': False}\n"
                     "INFO [gpu_worker.py:298] Available KV cache memory: 2.31 GiB\n")
    assert args.chunked_prefill is False


def test_a_wheel_install_plans_the_native_sampler_of_0_8_to_0_11():
    from kvplan.explain.facts import log_values

    # a site-packages path is a pip / uv install of the wheel: 0.9.1 - 0.11's wheels install no FlashInfer
    head = "INFO 10-06 15:57:00 [api_server.py:1] vLLM API server version {}\n"
    wheel = parse_log(head.format("0.11.0") + WHEEL_PATH + "INFO [gpu_worker.py:298] Available KV cache memory: 2.31 GiB\n")
    assert wheel.wheel_install
    values, notes = log_values(wheel)
    assert values["flashinfer"] is False and any("site-packages" in n for n in notes)
    # the sampler's own line wins; a Docker image's dist-packages path says nothing; 0.12+ do not depend on it
    said = parse_log(head.format("0.11.0") + WHEEL_PATH + "INFO [topk_topp_sampler.py:49] Using FlashInfer for top-p & "
                     "top-k sampling.\nINFO [gpu_worker.py:298] Available KV cache memory: 2.31 GiB\n")
    assert log_values(said)[0]["flashinfer"] is True
    image = parse_log(head.format("0.11.0") + WHEEL_PATH.replace("/home/u/vllm/.venv/lib/python3.12/site-packages",
                                                                  "/usr/local/lib/python3.12/dist-packages")
                      + "INFO [gpu_worker.py:298] Available KV cache memory: 2.31 GiB\n")
    assert not image.wheel_install and "flashinfer" not in log_values(image)[0]
    newer = parse_log(head.format("0.19.0") + WHEEL_PATH + "INFO [gpu_worker.py:298] Available KV cache memory: 2.31 GiB\n")
    assert "flashinfer" not in log_values(newer)[0]
    # a shell prompt with an activated environment before the command: the same (Vast.ai's /venv/main, a .venv)
    for prompt in ("(main) root@C.26183956:/workspace$ vllm serve Qwen/Qwen3-30B-A3B\n",
                   "(workspace) (main) root@C.1:/workspace$ vllm --version\n",
                   "(vllm) zp@server105:~/work/vllm$ python3 -m vllm.entrypoints.openai.api_server\n"):
        assert parse_log(prompt + head.format("0.10.2")).wheel_install, prompt
    for other in ("root@735f5acae43a:/vllm-workspace# vllm serve x\n", "(main) it is $ vllm serve x\n"):
        assert not parse_log(other + head.format("0.10.2")).wheel_install, other
    # the corpus' Qwen3-VL-30B-A3B start on 4 x RTX 3090 (vLLM 0.11.0 from a .venv): within 2% of its KV that way
    ex = explain(corpus_log("vllm", "vllm-file42514581982-4x3090-qwen3-vl-30b-a3b-tp4"),
                 {"model": "Qwen/Qwen3-VL-30B-A3B-Instruct", "gpu": "RTX-3090-24GB"})
    assert ex.plan.options.flashinfer is False
    assert abs(ex.plan.answer.num_blocks - 6297) / 6297 < 0.02


def test_from_0_27_the_printed_activation_is_compared_with_kvplans_activation_and_graphs():
    # 0.27+ print peak_activation_memory = the transient torch peak + the CUDA-graph estimate they subtract; the
    # "CUDAGraph memory" beside it is the graphs captured after the KV cache (vllm-f57923772900, 4 x RTX PRO 6000)
    log = parse_log(corpus_log("vllm", "vllm-f57923772900-rtxpro6000-qwen3-235b-fp8-tp4"))
    assert log.activation_holds_graphs and (log.activation_gib, log.cudagraph_actual_gib) == (0.76, 0.32)
    ex = explain(corpus_log("vllm", "vllm-f57923772900-rtxpro6000-qwen3-235b-fp8-tp4"),
                 {"model": "Qwen/Qwen3-235B-A22B", "weights_dtype": "fp8", "gpu": "RTX-PRO-6000-Blackwell-96GB",
                  "engine_version": "0.27.0"})
    rows = {row.name: row for row in ex.terms}
    b = ex.plan.budget
    assert b.cudagraph.bytes > 0 and rows["activation"].kvplan_bytes == b.activation.bytes + b.cudagraph.bytes
    assert rows["cudagraph"].logged_bytes == rows["cudagraph"].kvplan_bytes == 0
    assert "in the printed peak activation" in rows["cudagraph"].note
    assert not parse_log(ACTUAL_USAGE).activation_holds_graphs  # 0.10.2's line prints its terms apart


def test_v0_and_sglang_memory_lines():
    v0 = parse_log(corpus_log("vllm", "vllm-12330-a100-40-llama3-8b"))  # V0 0.6.5: "the current vLLM instance can use"
    assert (v0.total_memory_gib, v0.gpu_memory_utilization, v0.requested_memory_gib) == (39.5, 0.9, 35.55)
    sg = parse_log(corpus_log("sglang", "sglang-llmsinclouds-4xl4-qwq32b-tp4"))  # every rank prints its own line
    assert sg.engine == "sglang" and sg.sglang_avail_before_load_gib is not None
    assert sg.weights_gib is not None and sg.sglang_avail_after_load_gib is not None


def test_gpu_is_a_check_of_the_log():
    # an H200 named for an H100's log: said, and the log's total is planned (the card's SMs and links still used)
    text = V1_019 + SNAPSHOT + "INFO [gpu_worker.py:1] Available KV cache memory: 54.8 GiB\n"
    ex = explain(text, {"gpu": "H200"})
    assert ex.plan.budget.total_bytes == round(79.19 * GiB)
    (note,) = [n for n in ex.notes if "contradicts" in n]
    assert note.startswith("--gpu H200 (139.80 GiB) contradicts the log's total memory 79.19 GiB")
    assert "what H100-SXM-80GB reports" in note
    same = explain(text, {"gpu": "H100"})
    assert not any("contradicts" in n for n in same.notes)
    bad = runner.invoke(app, ["explain", "-", "--gpu", "H900"], input=text)
    assert bad.exit_code == 2 and "unknown GPU 'H900'" in bad.stderr


@pytest.mark.parametrize("gpu", ["A100-40GB", "L4", "T4", "RTX-4090", "H200", "B200"])
def test_a_gpu_that_contradicts_the_logs_total_is_said_not_refused(gpu):
    # a card smaller than the log's total was kept beside the total as --gpu-memory, which a plan refuses ("more than
    # the A100-SXM-40GB has"): a contradicting --gpu, smaller or larger, is said and the log's total planned on the
    # card that reports it
    text = V1_019 + SNAPSHOT + "INFO [gpu_worker.py:1] Available KV cache memory: 54.8 GiB\n"
    ex = explain(text, {"gpu": gpu})
    assert ex.plan.budget.total_bytes == round(79.19 * GiB)
    (note,) = [n for n in ex.notes if "contradicts" in n]
    assert note.startswith(f"--gpu {gpu} (") and note.endswith("on the H100-SXM-80GB")
    assert ex.plan.gpu.name == "H100-SXM-80GB"


# --------------------------------------------------------------------------------- SGLang's forms, each release


@pytest.mark.parametrize("line, tokens, kv_gib", [
    ("KV Cache is allocated. K size: 4.41 GB, V size: 4.41 GB.", None, 8.82),  # 0.4.3: no #tokens
    ("KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB", 46611, 2.84),  # 0.4.4 - 0.5.12
    ("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 330323, K size: 10.08 GB, V size: 10.08 GB", 330323, 20.16),
    ("KV Cache is allocated. #tokens: 274934, KV size: 17.99 GB", 274934, 17.99),  # MLA
])
def test_sglang_kv_lines_of_every_release(line, tokens, kv_gib):
    log = parse_log(f"[2025-05-05 03:55:08 TP0] {line}\n")
    assert log.engine == "sglang" and log.kv_cache_tokens == tokens and log.kv_gib == kv_gib


def test_sglang_scheduler_line_and_its_pool():
    text = corpus_log("sglang", "sglang-infernode-jetson-orin-tinyllama")  # 0.4.1: K/V sizes without #tokens
    log = parse_log(text)
    assert (log.kv_cache_tokens, log.max_running_requests, log.max_model_len) == (420_200, 4097, 2048)
    assert (log.model, log.gpu_memory_utilization) == ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 0.5)  # the command line
    r = runner.invoke(app, ["explain", "-", "--json"], input=text)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["log"]["engine"] == "sglang" and d["reconciled"]["terms"]["kv_budget"]["logged_gib"] == 8.82


def test_sglang_rows_and_diagnosis_are_worded_for_sglang():
    text = corpus_log("sglang", "sglang-docs-sendrequest-2025-01-h100-llama31-8b")
    ex = explain(text, {"gpu": "H100"})
    rows = {row.name: row for row in ex.terms}
    assert "activation" not in rows and "overhead" not in rows  # SGLang keeps both in 1 - mem_fraction_static
    assert rows["requested"].note.startswith("free before loading") and "mem_fraction_static" in rows["requested"].note
    assert "this SGLang pool" in ex.diagnosis


# --------------------------------------------------------------------------------- block sizes the engine chose


def test_a_block_size_the_engine_chose_is_a_fact_not_an_option():
    """was: 'invalid --block-size 544: vllm's choices are 1, 8, 16, ...' and exit 2"""
    text = corpus_log("vllm", "vllm-file7292846353-2xh200-qwen3-next-80b-tp2")
    log = parse_log(text)
    assert (log.engine_block_size, log.block_size) == (544, None)
    r = runner.invoke(app, ["explain", "-", "--json"], input=text)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["planned"]["block_size"] == 544  # kvplan's own hybrid layout gives the engine's block size


# --------------------------------------------------------------------------------- models kvplan cannot load


def test_a_model_kvplan_cannot_load_still_gets_the_logs_own_explanation():
    text = corpus_log("vllm", "dennislee-2xa100-80-qwen2-7b-tp2")  # Qwen2-7B-Instruct: not bundled, offline
    ex = explain(text)
    assert ex.plan is None and ex.from_logged is None
    rows = {row.name: row for row in ex.terms}
    assert rows["weights"].logged_bytes == round(7.1217 * GiB) and rows["kv_budget"].logged_bytes == round(31.83 * GiB)
    assert rows["cudagraph"].logged_bytes == 0 and "not subtracted in this release" in rows["cudagraph"].note
    (need,) = ex.needs
    assert "Qwen2-7B-Instruct" in need and "needs the model" in need
    r = runner.invoke(app, ["explain", "-"], input=text, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for shown in ("1,192,160", "74,510", "72.76x", "Custom allreduce is disabled", "needs the model"):
        assert shown in r.stdout, shown


def test_the_unprinted_part_is_requested_minus_the_printed_terms_and_the_kv_budget():
    # 0.10.2 INFO: "Free memory on device (78.66/79.19 GiB) ... (0.9, 71.27 GiB)" and weights + KV printed: the rest of
    # 71.27 is what no line prints (activation, non-torch and graphs are in that line here, so the rest is rounding)
    text = corpus_log("vllm", "vllm-f57923772900-rtxpro6000-qwen3-235b-fp8-tp4")
    ex = explain(text)
    rows = {row.name: row for row in ex.terms}
    assert rows["requested"].logged_bytes == round(85.51 * GiB)
    unprinted = rows.get("not printed")
    printed = sum(rows[n].logged_bytes for n in ("weights", "activation", "overhead", "cudagraph")
                  if rows[n].logged_bytes is not None)
    if unprinted is not None:
        assert unprinted.logged_bytes == rows["requested"].logged_bytes - printed - rows["kv_budget"].logged_bytes


# --------------------------------------------------------------------------------- the diagnosis


def test_the_diagnosis_is_one_line_from_the_tables_own_numbers():
    rid = "vllm-12330-a100-40-llama3-8b"  # V0, every term printed: kvplan's activation is 8.15 GiB under the log's
    ex = explain(corpus_log("vllm", rid), {"model": "meta-llama/Meta-Llama-3-8B"})
    kv = ex.term("kv_budget")
    gap = kv.difference_bytes
    blocks = ex.from_kvplan.num_blocks - ex.from_logged.num_blocks
    assert ex.diagnosis.startswith(f"kvplan's terms give {abs(gap) / GiB:,.2f} GiB ({gap / kv.logged_bytes:+.1%}, "
                                   f"{blocks:+,} blocks) more KV than this engine; ")
    activation = -ex.term("activation").difference_bytes  # KV that kvplan's lower activation leaves
    assert activation > gap > 0  # the other terms take some back (kvplan's overhead is the larger)
    assert ex.diagnosis.endswith(f"{activation / GiB:,.2f} GiB comes from the activation peak (the other terms take "
                                 f"back {(activation - gap) / GiB:,.2f} GiB)")
    assert "\n" not in ex.diagnosis


def test_model_overriding_the_logs_model_is_said():
    text = corpus_log("vllm", "dennislee-2xa100-80-qwen2-7b-tp2")
    ex = explain(text, {"model": "Qwen/Qwen2.5-7B-Instruct", "gpu": "A100-PCIe-80GB", "engine_version": "0.10.1.1"})
    assert "--model Qwen/Qwen2.5-7B-Instruct replaces the log's model Qwen2-7B-Instruct" in ex.notes
    assert ex.matches


def test_the_cuda_graph_memory_the_log_prints_is_in_its_row():
    # 0.20+: the estimate is subtracted; 0.19: logged, not subtracted
    sub = parse_log("INFO [gpu_model_runner.py:1] Estimated CUDA graph memory: 0.36 GiB total\n"
                    "INFO [gpu_worker.py:1] CUDA graph memory profiling is enabled (default since v0.21.0).\n"
                    "INFO [gpu_worker.py:1] Available KV cache memory: 20.0 GiB\n")
    from kvplan.explain.compare import _term_rows

    rows = {r.name: r for r in _term_rows(sub, None, False)}
    assert rows["cudagraph"].logged_bytes == round(0.36 * GiB) and "subtracted" in rows["cudagraph"].note
    old = parse_log("INFO [gpu_model_runner.py:1] Estimated CUDA graph memory: 0.36 GiB total\n"
                    "INFO [gpu_worker.py:1] In v0.19, CUDA graph memory profiling will be enabled by default\n"
                    "INFO [gpu_worker.py:1] Available KV cache memory: 20.0 GiB\n")
    rows = {r.name: r for r in _term_rows(old, None, False)}
    assert rows["cudagraph"].logged_bytes == 0 and "not subtracted in this release" in rows["cudagraph"].note


# --------------------------------------------------------------------------------- vLLM's CPU backend, 0.32 serve


@pytest.mark.parametrize("name", ["startup_info_prefix_on.log", "startup_debug_prefix_off.log"])
def test_a_real_vllm_cpu_server_start_up_log_is_read_with_no_flags(name):
    """A vLLM 0.32 CPU `serve` log (recorded from a real server): was read as model 'with' ('Restart vllm serve with
    --enable-scale-out'), no 'CPU KV cache size', the explicit budget ignored (kvplan planned the 4 GiB default)."""
    text = (CPU / name).read_text()
    log = parse_log(text)
    assert log.model.endswith("/benchmarks/real_server_model") and log.version == "0.32.0"
    assert (log.platform, log.kv_cache_tokens, log.max_concurrency, log.concurrency_len) == ("cpu", 36_864, 18.0, 2048)
    assert (log.kv_cache_memory_bytes, log.explicit_kv_gib, log.total_memory_gib) == (75_497_472, 0.07, 15.96)
    r = runner.invoke(app, ["explain", str(CPU / name)])
    assert r.exit_code == 0, r.output
    # kvplan's own plan of the same deployment (the recorded model's config, here), with the explicit budget
    ex = explain(text, {"model": str(CPU / "real_server_model")})
    assert ex.plan.budget.kv_budget_bytes == 75_497_472  # not 4 GiB: 57x the real pool
    assert ex.matches and ex.from_logged.kv_cache_tokens == 36_864 and ex.from_kvplan.kv_cache_tokens == 36_864
    assert ex.plan.layout.block_size == 128 and ex.plan.gpu.is_cpu


@pytest.mark.parametrize("line, model", [
    ("(APIServer pid=1) INFO [factories.py:89] Scale-out endpoints are disabled. Restart vllm serve with "
     "--enable-scale-out to enable them.", None),  # was: the model "with"
    ("$ vllm serve -tp 2 meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192", "meta-llama/Llama-3.1-8B-Instruct"),
    ("root@host:/# VLLM_USE_V1=1 vllm serve /models/Qwen2.5-7B-Instruct \\\n  --tensor-parallel-size 2", "/models/Qwen2.5-7B-Instruct"),
    ("With `vllm serve`, you should provide the model as a positional argument", None),
])
def test_the_model_of_a_vllm_serve_line(line, model):
    log = parse_log(line + "\n")
    assert log.model == model
    if model and "tensor-parallel" in line:
        assert log.tp == 2  # the flag on the continued line


def test_calibrating_a_cpu_log_says_it_prints_no_terms(tmp_path):
    """was: 'a DEBUG log (VLLM_LOGGING_LEVEL=DEBUG) prints all of them' - a CPU DEBUG log prints none"""
    r = runner.invoke(app, ["explain", str(CPU / "startup_debug_prefix_off.log"), "--model", str(CPU / "real_server_model"),
                            "--calibrate", str(tmp_path / "c.yaml")])
    assert r.exit_code == 2
    assert "the CPU backend prints no budget terms" in r.stderr and "DEBUG" not in r.stderr


# --------------------------------------------------------------------------------- many logs at once


def _folder(tmp_path: Path, entries: dict[str, str]) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name, (engine, entry) in entries.items():
        shutil.copy(CORPUS / engine / f"{entry}.log", logs / name)
    return logs


MANY = {"a.log": ("vllm", "vllm-12330-a100-40-llama3-8b"), "b.log": ("vllm", "dennislee-2xa100-80-qwen2-7b-tp2"),
        "c.log": ("sglang", "sglang-infernode-jetson-orin-tinyllama"), "d.log": ("vllm", "eole-gemma-3-1b-it-v0130-llm")}


def test_many_logs_give_one_row_each(tmp_path):
    logs = _folder(tmp_path, MANY)
    (logs / "notes.txt").write_text("GET /index.html 200\nGET /favicon.ico 404\n")  # another program's log: a row
    r = runner.invoke(app, ["explain", str(logs), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    rows = {Path(row["log"]).name: row for row in d["rows"]}
    assert sorted(rows) == ["a.log", "b.log", "c.log", "d.log", "notes.txt"]
    assert rows["notes.txt"]["error"].startswith("the log does not say enough to explain it: found nothing")
    assert rows["a.log"]["logged_blocks"] == 5691 and rows["a.log"]["engine"].startswith("vLLM")  # V0: blocks
    assert rows["b.log"]["logged_tokens"] == 1_192_160 and rows["b.log"]["kvplan_tokens"] is None  # needs the model
    assert rows["c.log"]["engine"] == "SGLang" and rows["c.log"]["logged_tokens"] == 420_200
    assert d["summary"] == {"logs": 5, "read": 4, "bad_input": 1, "reproduced": d["summary"]["reproduced"],
                            "not_reproduced": 0, "compared": d["summary"]["compared"]}
    assert set(d["explanations"]) == {str(logs / n) for n in MANY}
    table = runner.invoke(app, ["explain", *sorted(str(p) for p in logs.iterdir())], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "4 of 5 logs read" in table.stdout and "1 not read (bad input)" in table.stdout


def test_many_logs_piped_keep_every_name_whole_on_one_line(tmp_path):
    # not a terminal (a pipe, a file, CI): one tab-separated line per log, each cell whole, at any width; the
    # long names a corpus has (and one with a tab in it) are never cut into pieces over several lines
    long = {f"{'x' * 60}-{name}": where for name, where in MANY.items()}
    logs = _folder(tmp_path, long)
    (logs / "notes\tsecond.txt").write_text("GET /index.html 200\n")
    for columns in ("40", "80", "200"):
        r = runner.invoke(app, ["explain", str(logs)], env={"COLUMNS": columns})
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        assert lines[0].split("\t") == ["log", "model", "GPU", "engine", "log tokens", "kvplan (error)",
                                         "biggest term (GiB)"]
        rows = lines[1:1 + len(long) + 1]
        assert all(len(row.split("\t")) == 7 for row in rows), rows
        assert sorted(row.split("\t")[0] for row in rows) == sorted([*long, "notes second.txt"])
        assert lines[len(long) + 2].startswith("4 of 5 logs read")
    rows = {row.split("\t")[0]: row.split("\t") for row in rows}
    assert rows[f"{'x' * 60}-c.log"][3].startswith("SGLang") and rows[f"{'x' * 60}-c.log"][4] == "420,200"
    assert rows["notes second.txt"][1].startswith("the log does not say enough to explain it")


def test_calibrate_over_many_logs_writes_one_file(tmp_path):
    # two V0 logs that name their model and print their GPU's total (calibrated), two that cannot be (skipped, why)
    logs = _folder(tmp_path, {"gtx1080.log": ("vllm", "vllm-f19400629813-gtx1080-llama32-1b-v064"),
                              "t4.log": ("vllm", "vllm-f7884883735-t4-llama32-3b-v082-v0fallback"),
                              "qwen2.log": ("vllm", "dennislee-2xa100-80-qwen2-7b-tp2"),
                              "gemma.log": ("vllm", "eole-gemma-3-1b-it-v0130-llm")})
    cal = tmp_path / "calib.yaml"
    r = runner.invoke(app, ["explain", str(logs), "--calibrate", str(cal), "--json"])
    assert r.exit_code == 0, r.output
    written = json.loads(r.stdout)["calibration"]
    entries = yaml.safe_load(cal.read_text())["calibrations"]
    assert len(entries) == 2 and {Path(e["log"]).name for e in written["entries"]} == {"gtx1080.log", "t4.log"}
    assert {e["model"] for e in entries} == {"meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-3B-Instruct"}
    reasons = {Path(s["log"]).name: s["reason"] for s in written["skipped"]}
    assert "needs the model" in reasons["qwen2.log"] and "the GPU is not in the log" in reasons["gemma.log"]


# --------------------------------------------------------------------------------- bad input: one line, exit 2


@pytest.mark.parametrize("content, says", [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)) * 4, "a binary file (a NUL byte at offset 7"),
    (b'127.0.0.1 - - [10/Oct/2025:13:55:36] "GET / HTTP/1.1" 200 2326\n', "found nothing kvplan recognises"),
    (b"INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.1.1\n", "found version"),  # cut at the start
    ("GPU KV cache size: 4,0,96 tokens\n".encode(), "cannot read the number '4,0,96'"),  # garbled
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, content, says):
    path = tmp_path / "server.log"
    path.write_bytes(content)
    r = runner.invoke(app, ["explain", str(path)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"kvplan: error: {path}") and says in line, line


def test_gpus_by_memory_finds_the_card_a_log_total_is():
    from kvplan.gpus import find_gpu, gpus_by_memory

    h100 = find_gpu("H100").memory_bytes  # 79.20 GiB; logs print 79.18 - 79.22 for the same card
    assert gpus_by_memory(round(79.19 * GiB))[0].name == "H100-SXM-80GB"
    assert [g.name for g in gpus_by_memory(round(79.15 * GiB))][:1] == ["A100-SXM-80GB"]  # 0.05 GiB from an H100
    assert gpus_by_memory(h100 + 2 * GiB) == ()  # no card: a custom total
    assert {g.vendor for g in gpus_by_memory(round(191.98 * GiB), vendor="amd")} == {"amd"}
    assert gpus_by_memory(round(191.98 * GiB), vendor="nvidia") == ()


def test_the_cheap_look_before_each_pattern_never_skips_a_match():
    # parse_log tries a rule only on lines holding its needle (a server's log is mostly request lines): over every
    # corpus line, each rule whose pattern matches is among the rules tried
    from kvplan.explain import lines as L
    from kvplan.explain.logparse import _candidate_rules, _logical_lines

    checked = 0
    for path in sorted(CORPUS.glob("*/*.log")):
        for _, line in _logical_lines(path.read_text()):
            tried = set(_candidate_rules(line))
            matching = {rule for rule in L.LINES if rule.pattern.search(line)}
            assert matching <= tried, (path.name, line[:120], [r.pattern.pattern for r in matching - tried])
            checked += bool(matching)
    assert checked > 1500  # lines that match a rule


def test_a_real_vllm_cpu_server_that_sizes_its_own_kv_space_is_explained():
    """Recorded here from vLLM 0.32.0's CPU server on the benchmark's tiny Llama with no KV budget and
    --gpu-memory-utilization 0.5: "Auto set (7.22/15.96) GiB for KV cache on node 0, with 7.98 GiB requested memory
    for the worker. 0.77 GiB memory was consumed by non-kv usages". The log's own numbers reproduce its pool;
    kvplan's terms, the weights and its runtime estimate off the requested 7.98 GiB, promise less, not more."""
    text = (CPU / "startup_info_auto_set_util05.log").read_text()
    log = parse_log(text)
    assert (log.platform, log.total_memory_gib, log.requested_memory_gib, log.available_kv_gib) == ("cpu", 15.96, 7.98, 7.22)
    ex = explain(text, {"model": str(CPU / "real_server_model")})
    assert ex.matches and ex.from_logged.kv_cache_tokens == log.kv_cache_tokens == 3_783_040
    own = ex.plan.budget
    assert own.kv_budget_bytes == own.usable_bytes - own.weights.bytes - own.overhead.bytes
    assert 0.9 * 7.22 * 2**30 < own.kv_budget_bytes < 7.22 * 2**30  # within 10%, on the safe side


def test_the_log_s_multimodal_profile_is_set_beside_kvplan_s():
    from kvplan.explain.reconcile import mm_profile_note

    log = parse_log("(EngineCore_DP0 pid=1) INFO 10-01 [gpu_model_runner.py:3400] Encoder cache will be initialized "
                    "with a budget of 153600 tokens, and profiled with 1 video items of the maximum feature size.\n")
    assert (log.mm_budget_tokens, log.mm_items, log.mm_modality) == (153_600, 1, "video")
    assert mm_profile_note(log, (1, "video", 153_600)).startswith("the multimodal profile is the log's: 1 video item")
    assert "kvplan's plan profiles 2 image items within 16,384 tokens" in mm_profile_note(log, (2, "image", 16_384))
    assert "kvplan models no multimodal profile" in mm_profile_note(log, None)


# ---------------------------------------------------------------------------------------------
# SGLang logs: what they print is checked, and what they lack is said in one line


def _rendered(ex) -> str:  # noqa: ANN001
    import io

    from rich.console import Console

    from kvplan.render.explain import render_explanation

    console = Console(width=200, record=True, color_system=None, file=io.StringIO())
    console.print(render_explanation(ex))
    return " ".join(console.export_text().replace("│", " ").split())


@pytest.mark.parametrize("gpu", [None, "H100"])
def test_every_sglang_log_checks_the_tokens_it_prints_and_draws_no_empty_table(gpu):
    """Every SGLang corpus log kvplan reads (with no flags, and with a GPU given): a log that prints its pool's tokens
    is never told it printed none; where kvplan plans the deployment on a known GPU, one diagnosis line gives the KV
    gap; a log with no term to tabulate (no loadable model) gets one line saying why, not an empty budget table; no
    note says only vLLM does what both engines do (MTP layers)."""
    from kvplan.errors import KvplanError

    read = gaps = tokens_only = 0
    for path in sorted((CORPUS / "sglang").glob("*.log")):
        overrides = {"gpu": gpu} if gpu else {}
        try:
            ex = explain(path.read_text(encoding="utf-8", errors="replace"), overrides)
        except KvplanError:
            continue
        read += 1
        text = _rendered(ex)
        where = (path.name, gpu)
        if ex.log.kv_cache_tokens is not None:
            assert "no KV budget, blocks or tokens" not in text, where
        if ex.plan is not None and ex.log.kv_cache_tokens is not None and ex.log.starts is not False:
            assert ex.from_logged is not None and ex.from_logged.kv_cache_tokens == ex.log.kv_cache_tokens, where
            if ex.gpu_known:
                assert "kvplan's terms give" in ex.diagnosis, (where, ex.diagnosis)
                gaps += 1
            kv = ex.term("kv_budget")
            tokens_only += kv is not None and kv.note.startswith("implied")
        assert "budget per GPU (GiB) term logged" not in text or any(
            row.logged_bytes is not None or (ex.gpu_known and row.kvplan_bytes is not None) for row in ex.terms), where
        if not any(row.logged_bytes is not None or (ex.gpu_known and ex.plan is not None and row.kvplan_bytes is not None)
                   for row in ex.terms):
            assert "budget per GPU: no term to show" in text, where
        mtp = [n for n in (ex.plan.notes if ex.plan is not None else ()) if "multi-token-prediction" in n]
        assert all("SGLang" in n for n in mtp), mtp
    assert read >= 40
    assert not gpu or (gaps >= 5 and tokens_only >= 1)


def test_a_hybrid_swa_log_counts_the_full_pool_as_its_tokens():
    """SGLang's hybrid SWA pool logs "Use sliding window memory pool. full_layer_tokens=F, swa_layer_tokens=S" and a
    "KV Cache is allocated. #tokens: S" line for the SWA pool: the pool's token figure (max_total_num_tokens, what
    kvplan's plan reports) is F, and S is kept beside it."""
    log = parse_log(corpus_log("sglang", "sglang-pr18039-4gpu-mimo-v2-flash-tp4-swa-main"))
    assert (log.sglang_full_tokens, log.sglang_swa_tokens) == (375_360, 300_288)
    assert log.kv_cache_tokens == log.sglang_full_tokens


@pytest.mark.parametrize(("names", "tp", "pp"), [
    (("Worker_PP0", "Worker_PP1"), 1, 2),  # vLLM 0.11+ names a stage alone where tp is 1 (its TP suffix needs tp > 1)
    (("Worker_TP0", "Worker_TP1"), 2, 1),
    (("Worker_PP1_TP3", "Worker_PP0_TP0"), 4, 2),
    (("Worker_DP1_TP1", "Worker_DP0_TP0"), 2, 1),  # data-parallel ranks are engines of their own: not tp or pp
])
def test_the_worker_names_give_the_ranks_they_show(names, tp, pp):
    lines = "".join(f"({name} pid={600 + i}) INFO [gpu_model_runner.py:1] Model loading took 30.52 GiB and 9.0 seconds\n"
                    for i, name in enumerate(names))
    log = parse_log(lines)
    assert (log.workers_tp, log.workers_pp) == (tp, pp)
