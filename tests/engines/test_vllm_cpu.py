"""The ``cpu`` target (vLLM's CPU backend): an explicit KV budget is enough, and SSM state is float32.

vLLM 0.32 ``vllm/platforms/cpu.py``: on CPUs with AVX-512 BF16 ``mamba_ssm_cache_dtype`` is reset to
float32 ("Reset SSM cache type to float32 for accelerated GDN mamba backend") for every state kind, unless
float16/bfloat16 was asked for a gated-delta-net layer.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.engines import vllm

runner = CliRunner()
QWEN3_NEXT = "Qwen/Qwen3-Next-80B-A3B-Instruct"
# Qwen3-Next gated delta net per layer: conv (4 - 1) x (2 x 16 x 128 + 32 x 128) = 24,576 elements x 2 B
# (bf16 model dtype) = 49,152 B; SSM 32 value heads x 128 x 128 = 524,288 elements.
CONV_BYTES, SSM_ELEMENTS, GDN_LAYERS = 49_152, 524_288, 36


def _json(*args: str) -> dict:
    r = runner.invoke(app, ["estimate", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_cpu_with_a_kv_budget_needs_no_memory_size() -> None:
    """Before: 'GPU 'cpu' has no fixed memory (pass --gpu-memory SIZE)'."""
    doc = _json("Qwen/Qwen3-8B", "--gpu", "cpu", "--kv-budget", "0.25GiB", "--context", "2k")
    assert doc["budget"]["kv_budget_bytes"] == 2**28
    assert doc["assumptions"]["block_size"] == 128  # the CPU backend's


def test_cpu_without_a_budget_or_memory_still_asks_for_one() -> None:
    r = runner.invoke(app, ["estimate", "Qwen/Qwen3-8B", "--gpu", "cpu"])
    assert r.exit_code == 2 and "has no fixed memory" in r.stderr and "--kv-budget" in r.stderr


def test_cpu_keeps_gated_delta_net_state_in_float32() -> None:
    """Before: the bf16 SSM state (the oracle script had to force float32 itself)."""
    cpu = _json(QWEN3_NEXT, "--gpu", "cpu", "--kv-budget", "1GiB", "--context", "2k")
    gpu = _json(QWEN3_NEXT, "--gpu", "H100", "--context", "2k")
    # 36 layers x (49,152 + 524,288 x 4 B) = 36 x 2,146,304 = 77,266,944 B on CPU; x 2 B on a GPU: 36 x 1,097,728
    assert cpu["per_token"]["state_bytes_per_request_gpu"] == GDN_LAYERS * (CONV_BYTES + SSM_ELEMENTS * 4) == 77_266_944
    assert gpu["per_token"]["state_bytes_per_request_gpu"] == GDN_LAYERS * (CONV_BYTES + SSM_ELEMENTS * 2)
    # one note on the state's dtype, the one the numbers use (before: "SSM state in the model dtype" from the spec,
    # then "vllm on CPU stores the SSM state in float32")
    state = [n for n in cpu["notes"] if "SSM state" in n]
    assert len(state) == 1 and "SSM state in float32" in state[0] and "CPU backend resets it" in state[0], state
    assert [n for n in gpu["notes"] if "SSM state" in n] == [
        "state layers: conv state in the model dtype, SSM state in the model dtype (the config sets none)"]
    # --ssm-dtype bf16 keeps bf16 for gated-delta-net layers (vLLM's accelerated GDN kernel stores it as asked)
    kept = _json(QWEN3_NEXT, "--gpu", "cpu", "--kv-budget", "1GiB", "--context", "2k", "--ssm-dtype", "bf16")
    assert kept["per_token"]["state_bytes_per_request_gpu"] == gpu["per_token"]["state_bytes_per_request_gpu"]


@pytest.mark.parametrize("requested,kind,expected", [
    (None, "gated_delta_net", "float32"),
    ("bfloat16", "gated_delta_net", "bfloat16"),
    ("float16", "gated_delta_net", "float16"),
    (None, "mamba2", "float32"),
    ("bfloat16", "mamba2", "float32"),  # only the GDN kernel keeps a 16-bit state
    ("float32", "mamba1", "float32"),
])
def test_vllm_cpu_ssm_dtype_rule(requested: str | None, kind: str, expected: str) -> None:
    engine = vllm.defaults("0.19.0", None, False)
    for configured in (None, "float16"):
        assert vllm.ssm_dtype(engine, requested, configured, kind, "Qwen3NextForCausalLM", is_cpu=True)[0] == expected
    # GPUs: as asked; else (None) the model dtype, whatever the config says for a model vLLM reads no SSM dtype of
    assert vllm.ssm_dtype(engine, requested, "float32", kind, "Qwen3NextForCausalLM", is_cpu=False)[0] == requested


@pytest.mark.parametrize("version,architecture,configured,expected", [
    ("0.12.0", "NemotronHForCausalLM", "float32", None),  # before 0.13 vLLM reads no config key: the model dtype
    ("0.13.0", "NemotronHForCausalLM", None, "float16"),  # 0.13 - 0.19: mamba_ssm_cache_dtype, else float16
    ("0.19.0", "NemotronHForCausalLM", "float32", "float32"),
    ("0.20.2", "NemotronHForCausalLM", None, "float32"),  # 0.20+: DEFAULT_MAMBA_SSM_CACHE_DTYPE float32
    ("0.16.1", "Qwen3_5ForConditionalGeneration", "float32", "float32"),  # Qwen3.5: its text config's
    ("0.33.0", "Qwen3NextForCausalLM", "float32", None),  # not read for other models
])
def test_vllm_reads_the_configs_ssm_dtype_only_where_its_release_does(version, architecture, configured, expected):
    engine = vllm.defaults(version, None, False)
    dtype, why = vllm.ssm_dtype(engine, None, configured, "mamba2", architecture, is_cpu=False)
    assert dtype == expected
    assert bool(why) == (dtype != configured)  # a note exactly when the engine departs from the config


# ---------------------------------------------------------------------------------------------
# an unset VLLM_CPU_KVCACHE_SPACE, per release (engines.vllm.cpu_kv_budget)

QWEN25_15B = "Qwen/Qwen2.5-1.5B-Instruct"


def _budget(version: str, *extra: str) -> dict:
    return _json(QWEN25_15B, "--gpu", "cpu", "--engine-version", version, *extra)["budget"]


def test_an_unset_kv_space_is_4_gib_before_0_14_and_half_the_node_to_0_19():
    assert _budget("0.13.0", "--gpu-memory", "18GiB")["kv_budget_bytes"] == 4 * 2**30
    assert _budget("0.17.0", "--gpu-memory", "18GiB")["kv_budget_bytes"] == 9 * 2**30


def test_from_0_20_the_node_x_utilisation_less_the_worker_s_memory_is_the_kv_space():
    """vLLM 0.22's "Auto set (1.48/18.0) GiB for KV cache on node 0, with 5.4 GiB requested memory for the worker.
    3.92 GiB memory was consumed by non-kv usages" (Qwen2.5-1.5B, utilisation 0.3): kvplan takes the weights and
    its estimate of the worker's runtime off the requested 5.4 GiB, and the terms add up to it."""
    b = _budget("0.22.0", "--gpu-memory", "18GiB", "--gpu-util", "0.3")
    requested = -(-18 * 2**30 * 3 // 10)
    assert b["overhead_bytes"] == vllm.CPU_WORKER_RSS_BYTES
    assert b["kv_budget_bytes"] == requested - b["weights_bytes"] - b["overhead_bytes"]
    assert abs(b["kv_budget_bytes"] / 2**30 - 1.48) < 0.1
    # a measured runtime replaces the estimate: 3.92 GiB consumed less the 2.88 GiB weights
    given = _budget("0.22.0", "--gpu-memory", "18GiB", "--gpu-util", "0.3", "--overhead-gib", "1.04")
    assert given["kv_budget_bytes"] == requested - given["weights_bytes"] - round(1.04 * 2**30)


def test_without_the_node_s_memory_or_with_an_explicit_budget_the_auto_rule_does_not_apply():
    r = runner.invoke(app, ["estimate", QWEN25_15B, "--gpu", "cpu", "--engine-version", "0.22.0", "--kv-budget", "2GiB",
                            "--json"])
    b = json.loads(r.stdout)["budget"]
    assert b["kv_budget_bytes"] == 2 * 2**30 and b["overhead_bytes"] == 0
