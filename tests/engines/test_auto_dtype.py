"""`--dtype auto` as the engines resolve it: a float32 checkpoint does not run in float32 unless asked.

vLLM (vllm/config/model.py _resolve_auto_dtype): float32 -> the platform's first supported dtype, bf16 on
compute capability >= 8.0 (and ROCm, and the CPU backend), fp16 below (T4 7.5, V100 7.0); gemma2/gemma3/glm4
never fp16. SGLang: float32 -> fp16 (Gemma: bf16).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvplan
from kvplan.cli.app import app
from kvplan.engines import sglang, vllm, vllm_overhead
from kvplan.gpus import find_gpu
from kvplan.model.source import WeightFacts
from kvplan.model.spec import spec_from_config

# PaliGemma-3B's language model (gemma, 18 layers, MQA, head_dim 256), float32 checkpoint.
PALIGEMMA = {
    "architectures": ["PaliGemmaForConditionalGeneration"], "model_type": "paligemma", "torch_dtype": "float32",
    "text_config": {"model_type": "gemma", "hidden_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 8,
                    "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 16384, "vocab_size": 257216},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
}
# 2 (K, V) x 18 layers x 1 KV head x 256 x 2 B = 18,432 B/token in bf16/fp16; x 4 B = 36,864 in float32.
BF16_BYTES, FP32_BYTES = 18_432, 36_864


@pytest.fixture
def paligemma(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(PALIGEMMA))
    return tmp_path


def _plan(folder: Path, *args: str) -> dict:
    r = CliRunner().invoke(app, ["estimate", str(folder), "--weights-gib", "6", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_float32_checkpoint_runs_in_bf16_on_h100(paligemma: Path) -> None:
    """Before: 36,864 B/token (float32), 2x what vLLM allocates."""
    doc = _plan(paligemma, "--gpu", "H100")
    assert doc["per_token"]["kv_bytes_per_token_gpu"] == BF16_BYTES
    assert doc["assumptions"]["dtype"] == doc["assumptions"]["kv_dtype"] == "bfloat16"
    assert any(n.startswith("dtype auto: vllm runs the float32 checkpoint in bfloat16") and "--dtype float32 keeps" in n
               for n in doc["notes"])


def test_without_bf16_the_checkpoint_runs_in_fp16(paligemma: Path) -> None:
    for gpu in ("T4", "V100"):
        doc = _plan(paligemma, "--gpu", gpu)
        assert doc["assumptions"]["dtype"] == "float16" and doc["per_token"]["kv_bytes_per_token_gpu"] == BF16_BYTES
        assert any("has no bfloat16: compute capability below 8.0" in n for n in doc["notes"]), doc["notes"]


@pytest.mark.parametrize("flag", ["float32", "fp32"])
def test_dtype_float32_still_gives_float32(paligemma: Path, flag: str) -> None:
    doc = _plan(paligemma, "--gpu", "H100", "--dtype", flag)
    assert doc["assumptions"]["dtype"] == "float32" and doc["per_token"]["kv_bytes_per_token_gpu"] == FP32_BYTES
    assert not any(n.startswith("dtype auto") for n in doc["notes"])


def test_dtype_auto_spelled_out_is_the_default(paligemma: Path) -> None:
    assert _plan(paligemma, "--dtype", "auto")["per_token"] == _plan(paligemma)["per_token"]


def test_cpu_backend_and_sglang(paligemma: Path) -> None:
    cpu = _plan(paligemma, "--gpu", "cpu", "--kv-budget", "1GiB")
    assert cpu["assumptions"]["dtype"] == "bfloat16"  # "Downcasting torch.float32 to torch.bfloat16"
    sg = _plan(paligemma, "--gpu", "H100", "--engine", "sglang")  # a gemma text model: SGLang picks bf16
    assert sg["assumptions"]["dtype"] == "bfloat16" and sg["per_token"]["kv_bytes_per_token_gpu"] == BF16_BYTES
    config = json.loads((paligemma / "config.json").read_text())
    config["text_config"]["model_type"] = "llama"
    (paligemma / "config.json").write_text(json.dumps(config))
    assert _plan(paligemma, "--gpu", "H100", "--engine", "sglang")["assumptions"]["dtype"] == "float16"


@pytest.mark.parametrize("checkpoint,model_type,bf16,expected", [
    ("float32", "llama", True, "bfloat16"),
    ("float32", "llama", False, "float16"),
    ("bfloat16", "llama", False, "float16"),   # bf16 not supported below 8.0: falls back to fp16
    ("float16", "llama", True, "float16"),
    ("bfloat16", "llama", True, "bfloat16"),
    ("float32", "gemma2", False, "float32"),   # no bf16 and no fp16 for gemma2: stays float32
    ("bfloat16", "gemma3_text", False, "float32"),
    ("float32", "gemma3_text", True, "bfloat16"),
])
def test_vllm_auto_dtype_rule(checkpoint: str, model_type: str, bf16: bool, expected: str) -> None:
    assert vllm.auto_dtype(checkpoint, model_type, bf16=bf16) == expected


def test_sglang_auto_dtype_rule() -> None:
    assert sglang.auto_dtype("float32", "llama", bf16=True) == "float16"
    assert sglang.auto_dtype("float32", "gemma2", bf16=True) == "bfloat16"
    assert sglang.auto_dtype("bfloat16", "llama", bf16=False) == "bfloat16"


def test_catalogue_knows_bf16_support() -> None:
    assert [find_gpu(n).supports_bf16 for n in ("H100", "A100", "L4", "T4", "V100", "MI300X", "cpu")] == [
        True, True, True, False, False, True, True]
    assert find_gpu("t4").compute_capability == "7.5" and find_gpu("v100-16gb").compute_capability == "7.0"


def test_weights_of_a_float32_checkpoint_are_loaded_in_bf16() -> None:
    # 1,000,000 F32 parameters (4,000,000 B) + 1,000 I8 scales (1,000 B): bf16 keeps the I8 bytes, halves the rest:
    # 1,000,000 x 2 + 1,000 = 2,001,000 B.
    w = WeightFacts(total_bytes=4_001_000, parameters=1_001_000, dtype="F32",
                    params_by_dtype={"F32": 1_000_000, "I8": 1_000})
    assert w.loaded_bytes("float32", "bfloat16") == 2_001_000
    assert w.loaded_bytes("float32", "float32") is None and w.loaded_bytes("bfloat16", "float16") is None
    # Upcasting a bf16 checkpoint (--dtype float32): 1,000 BF16 params x (4 - 2) B more.
    assert WeightFacts(total_bytes=2_000, params_by_dtype={"BF16": 1_000}).loaded_bytes("bfloat16", "float32") == 4_000
    spec = spec_from_config({**PALIGEMMA["text_config"], "torch_dtype": "float32"}, model_id="x", where="cfg",
                            weights=WeightFacts(total_bytes=4 * 10**9, parameters=10**9, dtype="float32"))
    plan = kvplan.planning.plan.plan_for_spec(spec, kvplan.planning.plan.options_from_values({"model": "x", "gpu": "H100"}))
    # 10**9 parameters x 2 B (bf16), not the checkpoint's 4 x 10**9 B; + the rotary table vLLM logs with them
    rope = vllm_overhead.rope_cache_bytes(spec, 2)
    assert rope > 0 and plan.budget.weights.bytes == 2 * 10**9 + rope and "float32 tensors loaded as bfloat16" in plan.budget.weights.source


def test_a_config_without_dtype_is_float32_unless_the_tensors_say_otherwise() -> None:
    config = {k: v for k, v in PALIGEMMA["text_config"].items()}
    assert spec_from_config(config, model_id="x", where="cfg").dtype == "float32"
    bf16 = WeightFacts(total_bytes=2, params_by_dtype={"BF16": 1})
    assert spec_from_config(config, model_id="x", where="cfg", weights=bf16).dtype == "bfloat16"
    mixed = WeightFacts(total_bytes=6, params_by_dtype={"BF16": 1, "F32": 1})
    assert spec_from_config(config, model_id="x", where="cfg", weights=mixed).dtype == "float32"
