"""`--dtype` is the dtype the engine runs the model in (weights too), and a `vllm serve` line can be pasted."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import kvplan
from kvplan.cli.app import app
from kvplan.engines import quantization_weights
from kvplan.errors import InputError
from kvplan.units import GiB, MiB

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"  # 8,030,261,248 parameters, 1,050,673,152 of them embedding + LM head


def test_dtype_float32_doubles_weights_and_activations():
    # vLLM logs 29.98 GiB of weights for Llama-3.1-8B under --dtype float32: the bf16 checkpoint's
    # 16,060,522,496 B doubled = 32,121,044,992 B (29.92 GiB) + the fp32 rotary cache (131,072 x 128 x 4 B = 64 MiB).
    bf16 = kvplan.estimate(LLAMA, gpu="H100")
    fp32 = kvplan.estimate(LLAMA, gpu="H100", dtype="float")  # vLLM's spelling of float32
    assert bf16.budget.weights.bytes == 16_060_522_496 + 32 * MiB
    assert fp32.model_dtype == "float32" and fp32.budget.weights.bytes == 2 * bf16.budget.weights.bytes == \
        32_121_044_992 + 64 * MiB
    assert abs(fp32.budget.weights.bytes / GiB - 29.98) < 0.01
    assert fp32.budget.activation_forward_bytes == 2 * bf16.budget.activation_forward_bytes
    assert fp32.kv_bytes_per_token_gpu == 2 * bf16.kv_bytes_per_token_gpu


def test_float16_and_bfloat16_are_the_same_size():
    half = kvplan.estimate(LLAMA, gpu="H100", dtype="half")
    bf16 = kvplan.estimate(LLAMA, gpu="H100", dtype="bfloat16")
    assert half.model_dtype == "float16"
    assert half.budget.kv_budget_bytes == bf16.budget.kv_budget_bytes and half.answer == bf16.answer


def test_online_fp8_quantization_keeps_embeddings_and_lm_head():
    # (8,030,261,248 - 1,050,673,152) x 1 B + 1,050,673,152 x 2 B = 9,080,934,400 B, + the 32 MiB rotary table
    p = kvplan.estimate(LLAMA, gpu="H100", quantization="fp8")
    assert p.budget.weights.bytes == 9_080_934_400 + 32 * MiB
    assert p.budget.weights.source.startswith("--quantization fp8")
    assert p.budget.weights.bytes == kvplan.estimate(LLAMA, gpu="H100", weights_dtype="fp8").budget.weights.bytes
    # a checkpoint format keeps the checkpoint's size (one stored in it: gpt-oss's mxfp4 experts); on a 16-bit
    # checkpoint it is refused, as vLLM refuses it; an unknown method is an error naming the choices
    gpt_oss = kvplan.estimate("openai/gpt-oss-20b", gpu="H100")
    assert kvplan.estimate("openai/gpt-oss-20b", gpu="H100", quantization="mxfp4").budget.weights.bytes == \
        gpt_oss.budget.weights.bytes
    with pytest.raises(InputError, match="bfloat16 checkpoint with no quantization_config"):
        kvplan.estimate(LLAMA, gpu="H100", quantization="awq")
    assert quantization_weights("bitsandbytes")[0] == "int4"
    with pytest.raises(InputError, match="unknown --quantization 'fp3'"):
        quantization_weights("fp3")


def test_a_vllm_serve_command_line_can_be_pasted():
    line = ("--tensor-parallel-size 2 --gpu-memory-utilization 0.95 --max-model-len 16384 --dtype half "
            "--kv-cache-dtype fp8 --quantization fp8 --enforce-eager --max-num-seqs 128")
    r = CliRunner().invoke(app, ["estimate", LLAMA, *line.split(), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    a, b = d["assumptions"], d["budget"]
    assert (a["tp"], a["gpu_util"], a["max_model_len"], a["dtype"], a["kv_dtype"], a["max_num_seqs"]) == (
        2, 0.95, 16384, "float16", "fp8_e4m3", 128)
    assert b["cudagraph_bytes"] == 0 and "--enforce-eager" in b["sources"]["cudagraph"]
    assert b["weights_bytes"] == 9_080_934_400 // 2 + 32 * MiB  # fp8 weights split over tp 2; the table on each GPU
    bad = CliRunner().invoke(app, ["estimate", LLAMA, "--quantization", "fp3"])
    assert bad.exit_code == 2 and "unknown --quantization 'fp3'" in bad.output
