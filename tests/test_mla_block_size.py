"""The block size vLLM's CUDA platform sets for MLA models, per release and GPU (docs/engines.md, "MLA block sizes").

vLLM 0.8 - 0.17 force FlashMLA's 64-token pages on Hopper (and from 0.10.1 CUTLASS MLA's 128 on Blackwell)
whatever ``--block-size`` says; from 0.18 the attention backend's preferred size applies only when the user
gives none. A V0 log that prints blocks and concurrency but no token count implies its block size.
"""

from __future__ import annotations

import pytest

from kvplan.engines import Device, vllm
from kvplan.explain.logparse import StartupLog
from kvplan.explain.reconcile import block_size_from_concurrency
from kvplan.planning.plan import Options, plan_for_spec
from kvplan.model.sources import load_bundled
from kvplan.model.spec import build_spec

HOPPER = Device(compute_capability="9.0")
BLACKWELL = Device(compute_capability="10.0")
AMPERE = Device(compute_capability="8.0")
ROCM = Device(platform="rocm")


@pytest.mark.parametrize(("version", "device", "kv", "user", "expected"), [
    ("0.7.3", HOPPER, None, None, None),          # before FlashMLA: Triton MLA at the default 16
    ("0.8.0", HOPPER, None, None, 64),            # FlashMLA on Hopper
    ("0.8.5", HOPPER, None, 16, 64),              # forced whatever --block-size says
    ("0.9.2", BLACKWELL, None, None, None),       # no CUTLASS MLA default before 0.10.1
    ("0.10.1", BLACKWELL, None, None, 128),       # CUTLASS MLA on Blackwell
    ("0.11.0", BLACKWELL, None, 256, 128),        # forced (block_size != 128)
    ("0.12.0", BLACKWELL, None, 256, None),       # a multiple of 128 stays from 0.12
    ("0.17.0", HOPPER, "fp8", None, 64),
    ("0.11.0", AMPERE, None, None, None),         # Triton MLA
    ("0.11.0", ROCM, None, None, None),           # not modelled on ROCm
    ("0.19.0", HOPPER, None, None, None),         # FlashAttention MLA takes any multiple of 16
    ("0.19.0", HOPPER, "fp8", None, 64),          # only FlashMLA takes an fp8 cache on Hopper
    ("0.19.0", HOPPER, "fp8", 16, None),          # from 0.18 the user's block size stays
    ("0.30", BLACKWELL, None, None, 32),          # FlashInfer MLA: 32 or 64, the smaller
    ("0.19.0", None, None, None, None),           # unknown GPU: the default
])
def test_mla_block_size_per_release_and_gpu(version, device, kv, user, expected):
    size, why = vllm.mla_block_size(version, device, kv, user)
    assert size == expected
    assert bool(why) == (expected is not None)


@pytest.fixture(scope="module")
def v2_lite():
    return build_spec(load_bundled("deepseek-ai/DeepSeek-V2-Lite-Chat"))


def _plan(spec, **kw):
    return plan_for_spec(spec, Options(model=spec.model_id, **kw))


def test_an_mla_plan_on_hopper_pages_by_64_and_says_why(v2_lite):
    p = _plan(v2_lite, gpu="H100", engine_version="0.11.0")
    assert p.layout.block_size == 64
    assert any("FlashMLA" in n and "block size 64" in n for n in p.engine.notes)
    # the same budget in 16-token pages: 4x the blocks, the same tokens to within one 64-token page
    p16 = _plan(v2_lite, gpu="A100-80GB", engine_version="0.11.0")
    assert p16.layout.block_size == 16


def test_a_dense_model_keeps_the_default_block_size():
    spec = build_spec(load_bundled("meta-llama/Llama-3.1-8B"))
    assert _plan(spec, gpu="H100", engine_version="0.11.0").layout.block_size == 16
    assert _plan(spec, gpu="B200", engine_version="0.11.0").layout.block_size == 16


def test_the_user_block_size_stays_from_018(v2_lite):
    assert _plan(v2_lite, gpu="H100", engine_version="0.19.0", kv_dtype="fp8").layout.block_size == 64
    assert _plan(v2_lite, gpu="H100", engine_version="0.19.0", kv_dtype="fp8", block_size=16).layout.block_size == 16
    assert _plan(v2_lite, gpu="H100", engine_version="0.11.0", block_size=16).layout.block_size == 64


def test_a_v0_log_implies_its_block_size_from_blocks_and_concurrency():
    log = StartupLog(engine="vllm", num_gpu_blocks=5266, max_concurrency=2.06, concurrency_len=163840)
    assert block_size_from_concurrency(log, vllm.BLOCK_SIZES) == 64
    # 16-token blocks are the default: nothing to imply
    assert block_size_from_concurrency(StartupLog(num_gpu_blocks=20186, max_concurrency=78.85,
                                                  concurrency_len=4096), vllm.BLOCK_SIZES) is None
    # a token line says more than the concurrency: left to it
    assert block_size_from_concurrency(StartupLog(num_gpu_blocks=5266, max_concurrency=2.06, concurrency_len=163840,
                                                  kv_cache_tokens=337024), vllm.BLOCK_SIZES) is None
    # no choice reproduces it: nothing implied
    assert block_size_from_concurrency(StartupLog(num_gpu_blocks=5266, max_concurrency=3.33,
                                                  concurrency_len=163840), vllm.BLOCK_SIZES) is None


# ---------------------------------------------------------------------------------------------
# prefix caching for models with state layers (docs/engines.md, "What vLLM forces for particular models")

@pytest.fixture(scope="module")
def qwen3_next():
    return build_spec(load_bundled("Qwen/Qwen3-Next-80B-A3B-Instruct"))


@pytest.mark.parametrize(("version", "asked", "expected"), [
    ("0.10.2", None, False),   # turned off: "not yet supported"
    ("0.10.2", True, False),   # whatever was asked
    ("0.11.0", True, False),
    ("0.11.1", None, False),   # off by default ("still experimental")
    ("0.11.1", True, True),    # the user may turn it on
    ("0.19.0", None, False),
    ("0.25.0", None, False),
    ("0.26.0", None, True),    # "Generative hybrid models support prefix caching"
    ("0.30", None, True),
])
def test_a_hybrid_model_s_prefix_caching_per_release(qwen3_next, version, asked, expected):
    p = _plan(qwen3_next, gpu="H200", tp=2, engine_version=version, prefix_caching=asked)
    assert p.prefix_caching is expected


def test_state_blocks_per_request_follow_the_prefix_caching_rule(qwen3_next):
    # vLLM 0.10.2's 7,162 blocks at 262,144 tokens: 482 attention blocks + 1 per state group = 485 -> 14.77x
    off = _plan(qwen3_next, gpu="H200", tp=2, engine_version="0.10.2", max_model_len=262144, context=262144)
    on = _plan(qwen3_next, gpu="H200", tp=2, engine_version="0.11.1", prefix_caching=True,
               max_model_len=262144, context=262144)
    assert off.demand.blocks(262144) < on.demand.blocks(262144)


def test_a_dense_model_keeps_prefix_caching_on_in_v1():
    spec = build_spec(load_bundled("meta-llama/Llama-3.1-8B"))
    assert _plan(spec, gpu="H100", engine_version="0.19.0").prefix_caching is True
    assert _plan(spec, gpu="H100", engine_version="0.7.3").prefix_caching is False  # V0
