"""What vLLM chooses by itself for a model, a GPU and an installation (docs/engines.md).

- MLA block sizes: vLLM 0.8 - 0.17 force FlashMLA's 64-token pages on Hopper (and from 0.10.1 CUTLASS MLA's
  128 on Blackwell) whatever ``--block-size`` says; from 0.18 the attention backend's preferred size applies
  only when the user gives none. A V0 log that prints blocks and concurrency but no token count implies its
  block size.
- Prefix caching for models with state layers: off in 0.10 - 0.11.0 whatever was asked, off by default to
  0.25, on for hybrids from 0.26.
- The sampler path of 0.8 - 0.11's profile run: FlashInfer where it is installed, the native sort otherwise
  (``--flashinfer`` / ``--no-flashinfer``; the start-up log says which).
"""

from __future__ import annotations

import pytest

from kvplan.engines import Device, vllm
from kvplan.explain.startup_log import StartupLog
from kvplan.explain.facts import block_size_from_concurrency
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
    from kvplan.engines import release_tuple

    size, why = vllm.mla_block_size(release_tuple(version, "vllm"), device, kv, user)
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


# ---------------------------------------------------------------------------------------------
# the sampler path where it depends on the installation (vLLM 0.8 - 0.11)

@pytest.fixture(scope="module")
def qwen3_8b():
    return build_spec(load_bundled("Qwen/Qwen3-8B"))


def test_without_flashinfer_the_profile_samples_natively_and_the_range_needs_no_path_gap(qwen3_8b):
    unknown = _plan(qwen3_8b, gpu="A100-40GB", engine_version="0.9.2")
    without = _plan(qwen3_8b, gpu="A100-40GB", engine_version="0.9.2", flashinfer=False)
    with_ = _plan(qwen3_8b, gpu="A100-40GB", engine_version="0.9.2", flashinfer=True)
    assert without.budget.activation.bytes > unknown.budget.activation.bytes == with_.budget.activation.bytes
    # unknown: kvplan plans FlashInfer and its low end pays the native path; known: no such term
    assert unknown.budget.path_gap_bytes > 0
    assert without.budget.path_gap_bytes == with_.budget.path_gap_bytes == 0
    # the native path costs what the unknown plan's low end already allowed for
    assert unknown.budget.kv_budget_bytes - unknown.budget.path_gap_bytes == pytest.approx(
        without.budget.kv_budget_bytes, abs=1 << 20)


def test_the_switch_changes_nothing_where_the_release_does_not_depend_on_it(qwen3_8b):
    for version in ("0.7.3", "0.12.0", "0.19.0"):
        a = _plan(qwen3_8b, gpu="H100", engine_version=version)
        b = _plan(qwen3_8b, gpu="H100", engine_version=version, flashinfer=False)
        assert a.budget.kv_budget_bytes == b.budget.kv_budget_bytes, version


@pytest.mark.parametrize(("line", "expected"), [
    ("INFO 06-10 [topk_topp_sampler.py:49] Using FlashInfer for top-p & top-k sampling.", True),
    ("WARNING 06-10 [topk_topp_sampler.py:59] FlashInfer is not available. Falling back to the PyTorch-native "
     "implementation of top-p & top-k sampling. For the best performance, please install FlashInfer.", False),
    ("INFO 05-01 [topk_topp_sampler.py:44] FlashInfer is available, but it is not enabled. Falling back to the "
     "PyTorch-native implementation of top-p & top-k sampling.", False),
    ("WARNING 04-01 [topk_topp_sampler.py:40] Currently, FlashInfer top-p & top-k sampling sampler is disabled "
     "because FlashInfer>=v0.2.3 is not backward compatible. Falling back to the PyTorch-native implementation.", False),
    ("INFO 07-01 [topk_topp_sampler.py:35] FlashInfer version >= 0.2.3 required. Falling back to default sampling "
     "implementation.", False),
])
def test_the_log_says_which_sampler_path_ran(line, expected):
    from kvplan.explain.logparse import parse_log

    assert parse_log(line + "\n").flashinfer_sampler is expected


def test_the_log_s_prefix_caching_is_read_from_its_config_and_argument_lines():
    from kvplan.explain.logparse import parse_log

    config = ("INFO 06-10 [core.py:69] Initializing a V1 LLM engine (v0.9.2) with config: model='Qwen/Qwen3-8B', "
              "enable_prefix_caching=False, chunked_prefill_enabled=True\n")
    args = "INFO 07-09 [api_utils.py:273] non-default args: {'model': 'x', 'enable_prefix_caching': True}\n"
    assert parse_log(config).prefix_caching is False
    assert parse_log(args).prefix_caching is True
    assert parse_log("INFO GPU KV cache size: 1,000 tokens\n").prefix_caching is None


def test_explain_infers_prefix_caching_where_only_it_reproduces_a_hybrid_s_log():
    """A 4-line excerpt of a vLLM 0.24 Qwen3.6 start (no argument lines): its 567,978 tokens at 4.33x hold with
    2 blocks per state group (prefix caching on), not the 1 of 0.24's default for hybrids."""
    from kvplan.explain.reconcile import explain

    log = ("(EngineCore pid=107) INFO 07-06 22:52:09 [gpu_worker.py:508] Available KV cache memory: 5.98 GiB\n"
           "(EngineCore pid=107) INFO 07-06 22:52:09 [kv_cache_utils.py:2146] GPU KV cache size: 567,978 tokens\n"
           "(EngineCore pid=107) INFO 07-06 22:52:09 [kv_cache_utils.py:2147] Maximum concurrency for 131,072 tokens "
           "per request: 4.33x\n")
    given = {"model": "Qwen/Qwen3.6-35B-A3B", "gpu": "RTX-5090-32GB", "weights_dtype": "int4", "kv_dtype": "fp8",
             "engine_version": "0.24.0"}
    inferred = explain(log, given)
    assert inferred.matches and inferred.plan.prefix_caching is True
    assert any("prefix caching on: the log's capacity lines hold only with it" in n for n in inferred.notes)
    # the user's word wins, and then the mismatch is reported, not explained away
    told = explain(log, {**given, "prefix_caching": False})
    assert told.plan.prefix_caching is False and not told.matches


@pytest.mark.parametrize(("lines", "tp", "pp"), [
    (["(VllmWorker rank=0 pid=105) INFO x", "(VllmWorker rank=3 pid=108) INFO x"], 4, None),   # 0.8 - 0.10
    (["(Worker_TP0 pid=1) INFO x", "(Worker_TP1 pid=2) INFO x"], 2, 1),                         # 0.11+
    (["(Worker_TP7_EP7 pid=9) INFO x"], 8, 1),                                                  # expert parallel
    (["(Worker_PP1_TP3 pid=9) INFO x", "(Worker_PP0_TP0 pid=2) INFO x"], 4, 2),
    (["(VllmWorkerProcess pid=373712) INFO x", "INFO GPU KV cache size: 10 tokens"], None, None),  # V0: no index
])
def test_worker_names_give_a_lower_bound_of_the_parallel_sizes(lines, tp, pp):
    from kvplan.explain.logparse import parse_log

    log = parse_log("\n".join(lines) + "\n")
    assert (log.workers_tp, log.workers_pp) == (tp, pp)


def test_global_worker_ranks_over_a_stated_pipeline_are_tensor_parallel_ranks_times_it():
    from kvplan.explain.facts import log_values
    from kvplan.explain.logparse import parse_log

    log = parse_log("INFO x pipeline_parallel_size=2, something\n(VllmWorker rank=7 pid=9) INFO x\n"
                    "INFO 10-01 [kv_cache_utils.py:1] GPU KV cache size: 100,000 tokens\n")
    values, notes = log_values(log)
    assert (values["tp"], values["pp"]) == (4, 2) and any(n.startswith("tp 4:") for n in notes)
