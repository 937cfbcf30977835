"""The core planner, checked against numbers derived by hand (DESIGN.md sections 3-4)."""

import math

import pytest
from hypothesis import given, settings, strategies as st

import kvplan
from kvplan import memory
from kvplan.engines.vllm_overhead import rope_cache_bytes
from kvplan.errors import InputError, KvplanError, ModelNotFoundError
from kvplan.planning.plan import Options, estimate, options_from_values, plan_for_spec
from kvplan.model.sources import load_bundled
from kvplan.model.spec import LayerKind, build_spec
from kvplan.units import GiB, parse_dtype

LLAMA = "meta-llama/Llama-3.1-8B"
BF16 = parse_dtype("bf16")


def plan(**kw):
    kw.setdefault("model", LLAMA)
    kw.setdefault("gpu", "H100")
    return estimate(Options(**kw))


def test_llama_31_8b_costs_128_kib_per_token():
    # 2 (K and V) x 32 layers x 8 kv heads x 128 head_dim x 2 B (bf16) = 131,072 B = 128 KiB
    p = plan()
    assert p.kv_bytes_per_token_gpu == 2 * 32 * 8 * 128 * 2 == 131_072
    assert p.spec.provenance["kv_heads"] == "num_key_value_heads"
    assert p.spec.kind_summary == "gqa"


def test_one_8k_request_is_one_gib():
    # 131,072 B/token x 8,192 tokens = 2^30 B; 8,192 / 16 = 512 blocks of 16 x 128 KiB = 2 MiB each
    p = plan(context=8192)
    assert p.answer.blocks_per_request == 512
    assert p.demand.bytes(8192) == GiB
    assert p.layout.block_bytes == 16 * 131_072


def test_fp8_kv_halves_the_token():
    assert plan(kv_dtype="fp8").kv_bytes_per_token_gpu == 131_072 // 2


def test_tp2_halves_the_per_gpu_slice_and_tp16_keeps_one_head():
    # tp 2: 8 kv heads -> 4 per rank; tp 16 > 8 heads: max(1, 8 // 16) = 1 head per rank (replicated)
    assert plan(tp=2).kv_bytes_per_token_gpu == 131_072 // 2
    p16 = plan(tp=16)
    assert p16.kv_bytes_per_token_gpu == 2 * 32 * 1 * 128 * 2
    assert p16.heads_replicated and any("replicated" in n for n in p16.notes)


def test_qwen3_32b_uses_its_explicit_head_dim():
    # hidden 5120 / 64 heads = 80, but head_dim is 128: 2 x 64 layers x 8 x 128 x 2 = 262,144
    p = plan(model="Qwen/Qwen3-32B")
    assert p.kv_bytes_per_token_gpu == 262_144
    assert p.spec.provenance["head_dim"] == "head_dim"


def test_falcon_7b_is_multi_query():
    # one KV head: 2 x 32 layers x 1 x (4544 / 71 = 64) x 2 B = 8,192 B/token
    p = plan(model="tiiuae/falcon-7b")
    assert p.spec.kind_summary == "mqa"
    assert p.kv_bytes_per_token_gpu == 2 * 32 * 1 * 64 * 2
    assert "multi_query" in p.spec.provenance["kv_heads"]


def test_budget_terms_add_up():
    p = plan()
    b = p.budget
    assert b.usable_bytes == math.ceil(b.total_bytes * b.gpu_util)
    assert b.kv_budget_bytes == b.usable_bytes - sum(t.bytes for t in b.terms)
    # 1 GPU holds all of it, and the rotary table vLLM builds while loading (logged with the weights)
    assert b.weights.bytes == p.spec.weights.total_bytes + rope_cache_bytes(p.spec, 2)
    assert p.answer.num_blocks == b.kv_budget_bytes // (16 * 131_072)


def test_every_budget_term_can_be_overridden():
    p = estimate(options_from_values({"model": LLAMA, "gpu": "H100", "weights_gib": "15", "activation_gib": "1",
                                      "overhead_gib": 0, "cudagraph_gib": "0.5", "gpu_util": 0.9}))
    b = p.budget
    assert (b.weights.bytes, b.activation.bytes, b.overhead.bytes, b.cudagraph.bytes) == (15 * GiB, GiB, 0, GiB // 2)
    assert b.kv_budget_bytes == math.ceil(b.total_bytes * 0.9) - 16.5 * GiB


def test_explicit_kv_budget_sets_the_pool():
    # 1 GiB / 2 MiB per block = 512 blocks; one 8k request needs 512 blocks but block 0 is the null block
    p = plan(kv_budget_bytes=GiB, context=8192)
    assert p.answer.num_blocks == 512
    assert p.answer.max_requests == 0 and not p.answer.fits
    assert not p.answer.engine_starts
    assert p.answer.longest_startable_len == 511 * 16
    assert p.answer.max_concurrency == 1.0  # what vLLM would log: 512 / 512


def test_tp_splits_the_weights_and_each_pp_stage_holds_its_own():
    tp2 = plan(model="meta-llama/Llama-3.1-70B", tp=2)
    rope = rope_cache_bytes(tp2.spec, 2)  # 131,072 x 128 x 2 B, on every GPU
    assert tp2.budget.weights.bytes == math.ceil(141_107_412_992 / 2) + rope == 70_553_706_496 + 32 * 2**20
    p = plan(model="meta-llama/Llama-3.1-70B", tp=2, pp=3)
    assert p.options.gpu_count == 6
    # 80 layers over 3 stages: [27, 27, 26]; the embedding (128,256 x 8,192 x 2 B) on the first, the LM head on
    # the last, the rest of the checkpoint's 141,107,412,992 B by the stages' layers, each split over tp 2
    assert memory.pp_layer_counts(80, 3) == [27, 27, 26]
    table = 128_256 * 8_192 * 2
    rest = 141_107_412_992 - 2 * table
    expected = [round(rest * 27 / 80) + table, round(rest * 27 / 80), round(rest * 26 / 80) + table]
    assert [s.weights_bytes for s in p.stages] == pytest.approx([math.ceil(b / 2) + rope for b in expected], abs=1)
    # 8 heads / tp 2 = 4: 2 x 27 x 4 x 128 x 2 per token on the first two stages, 2 x 26 x 4 x 128 x 2 on the last;
    # the first stage has the embedding and as many layers as the second: the fewest blocks, so it decides
    assert p.kv_bytes_per_token_gpu == 2 * 27 * 4 * 128 * 2
    assert p.stages[0].blocks == min(s.blocks for s in p.stages) == p.answer.num_blocks
    assert p.budget.weights.bytes == p.stages[0].weights_bytes
    assert p.stages[0].blocks < p.stages[1].blocks  # the same layers, an embedding less
    for s in p.stages:
        layers = 26 if s.stage.last else 27
        assert s.blocks == s.kv_budget_bytes // (layers * 4 * 128 * 2 * 2 * p.layout.block_size)


def test_the_last_stage_runs_the_sampler_and_may_decide():
    # Llama-3.1-8B at pp 2: 16 layers each; the last stage holds the LM head (as large as the embedding) and runs
    # the dummy sampler, the first does not: the last stage has the smaller budget and the fewest blocks
    p = plan(model="meta-llama/Llama-3.1-8B-Instruct", pp=2)
    first, last = p.stages
    assert first.weights_bytes == pytest.approx(last.weights_bytes, abs=1)
    assert last.kv_budget_bytes < first.kv_budget_bytes and p.answer.num_blocks == last.blocks
    assert "layers per pipeline stage: 16, 16; blocks per stage" in " ".join(p.budget.notes)


def test_quantized_weights_use_the_parameter_count():
    spec = build_spec(load_bundled(LLAMA))
    p = plan(weights_dtype="int4")
    # embeddings and the untied LM head stay bf16: 2 x 128,256 vocab x 4,096 hidden
    embed = 2 * 128_256 * 4096
    assert spec.embedding_parameters == embed
    q = spec.parameters - embed
    # int4: half a byte per parameter + one fp16 scale per 128 parameters
    assert p.weights_total_bytes == math.ceil(q / 2) + math.ceil(q / 128) * 2 + 2 * embed
    assert plan(weights_dtype="fp8").weights_total_bytes == q + 2 * embed


def test_weights_beyond_memory_is_an_answer_not_a_crash():
    p = plan(model="meta-llama/Llama-3.1-405B", gpu="A100-40GB")
    assert p.budget.kv_budget_bytes < 0
    assert p.answer.num_blocks == 0 and not p.answer.fits and not p.answer.engine_starts
    assert any("weights alone" in n for n in p.notes)


def test_prefix_sharing_stores_the_prefix_once():
    # 2,000-token prefix, block 16: floor(2000 / 16) = 125 full blocks shared
    p = plan(context=4096, prefix_tokens=2000)
    pre = p.prefix
    assert pre.shared_blocks == 125
    assert pre.blocks_per_request_shared == 256 - 125
    assert pre.max_requests_shared > pre.max_requests_unshared
    assert pre.prefill_tokens_saved == (pre.max_requests_shared - 1) * 125 * 16


def test_contiguous_reservation_wastes_what_paging_keeps():
    p = plan(context=1000, max_model_len=32768)
    f = p.fragmentation
    assert f.contiguous_request_bytes == 32768 * 131_072
    assert f.raw_request_bytes == 1000 * 131_072
    assert f.paged_request_bytes == 63 * 16 * 131_072  # ceil(1000 / 16) = 63 blocks
    assert f.paged_max_requests > 30 * f.contiguous_max_requests


def test_roofline_reads_weights_and_kv():
    p = plan(batch=4)
    r = p.roofline
    assert r.batch == 4
    expected = (p.budget.weights.bytes + 4 * GiB) / r.bandwidth_bytes_per_s
    assert r.step_seconds == pytest.approx(expected)
    assert r.tokens_per_s == pytest.approx(4 / expected)


def test_fit_failure_names_a_fix():
    # 27,793 blocks (27,792 usable); 32,768 tokens = 2,048 blocks: 13 requests fit; at batch 1,000 each
    # request gets 27 blocks = 432 tokens. An fp8 cache (2x blocks -> 27 requests) would not fit 1,000,
    # so it is not suggested: every suggestion is re-planned and printed only when it fits.
    p = plan(batch=1000, context=32768)
    assert not p.answer.fits
    assert p.answer.fix == "--batch 13 or --context 432"
    # 64 x 8,192 needs 64 x 512 = 32,768 blocks > 27,792; fp8 doubles the blocks, tp 2 splits the heads
    p = plan(batch=64, context=8192)
    assert p.answer.fix == "--batch 54 or --context 6944 or --kv-dtype fp8 or --tp 2"
    for flag in p.answer.fix.split(" or "):
        name, value = flag.removeprefix("--").split(" ")
        changed = {"kv_dtype": value} if name == "kv-dtype" else {name: int(value)}
        assert plan(**{"batch": 64, "context": 8192, **changed}).answer.fits, flag


@pytest.mark.parametrize("kw,needle", [
    ({"tp": 3}, "--tp 3"),
    ({"gpu_count": 4, "tp": 2}, "--gpus"),
    ({"context": 0}, "--context"),
    ({"gpu_util": 1.5}, "--gpu-util"),
    ({"engine": "tgi"}, "engine"),
    ({"prefix_tokens": 9000, "context": 8192}, "prefix"),
])
def test_bad_options_are_input_errors(kw, needle):
    with pytest.raises(InputError, match=needle.replace("-", r"\-")):
        plan(**kw)


# --- properties ------------------------------------------------------------------------------

SPEC = build_spec(load_bundled(LLAMA))


@settings(max_examples=60, deadline=None)
@given(context=st.integers(1, 200_000), budget_mib=st.integers(1, 60_000))
def test_max_requests_is_exact(context, budget_mib):
    """N = pool_requests fits in (num_blocks - 1) blocks; N + 1 does not; the requests running at once are
    those the scheduler takes of them (max_num_seqs 1,024 on an H100), none when the engine refuses."""
    p = plan_for_spec(SPEC, Options(model=LLAMA, context=context, kv_budget_bytes=budget_mib << 20))
    a, usable = p.answer, max(0, p.answer.num_blocks - memory.NULL_BLOCKS)
    assert a.pool_requests * a.blocks_per_request <= usable
    assert (a.pool_requests + 1) * a.blocks_per_request > usable
    assert a.max_num_seqs == 1024
    assert a.max_requests == (min(a.pool_requests, 1024) if a.engine_starts else 0)


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 64), budget_mib=st.integers(64, 60_000))
def test_max_context_is_exact(batch, budget_mib):
    p = plan_for_spec(SPEC, Options(model=LLAMA, batch=batch, kv_budget_bytes=budget_mib << 20))
    a = p.answer
    per = p.demand.blocks
    if a.max_context_at_batch:
        assert batch * per(a.max_context_at_batch) <= a.num_blocks - 1
    if a.max_context_at_batch < SPEC.max_position_embeddings:
        assert batch * per(a.max_context_at_batch + 1) > a.num_blocks - 1


@settings(max_examples=60, deadline=None)
@given(c1=st.integers(1, 100_000), c2=st.integers(1, 100_000), b1=st.integers(1, 64), b2=st.integers(1, 64))
def test_monotone_in_context_and_batch(c1, c2, b1, b2):
    lo_c, hi_c = sorted((c1, c2))
    lo_b, hi_b = sorted((b1, b2))
    small = plan_for_spec(SPEC, Options(model=LLAMA, context=lo_c, batch=lo_b))
    large = plan_for_spec(SPEC, Options(model=LLAMA, context=hi_c, batch=hi_b))
    assert large.answer.max_requests <= small.answer.max_requests
    assert large.answer.fits_margin_blocks <= small.answer.fits_margin_blocks
    assert large.answer.max_context_at_batch <= small.answer.max_context_at_batch


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(1, 300_000))
def test_paged_within_one_block_per_group_of_raw(tokens):
    p = plan_for_spec(SPEC, Options(model=LLAMA, context=tokens))
    raw = memory.raw_request_bytes(p.rank_layers, tokens, BF16, BF16)
    paged = p.demand.bytes(tokens)
    assert raw <= paged < raw + len(p.layout.groups) * p.layout.block_bytes


def test_sliding_layers_are_all_sliding_in_mistral_v01():
    spec = build_spec(load_bundled("mistralai/Mistral-7B-v0.1"))
    assert {layer.kind for layer in spec.layers} == {LayerKind.SLIDING}
    assert spec.layers[0].window_tokens == 4096


def test_python_api_returns_the_same_plan_as_options():
    import kvplan

    p = kvplan.estimate(LLAMA, gpu="H100", context="8k", kv_dtype="fp8")
    assert p.kv_bytes_per_token_gpu == 65_536
    assert "Llama-3.1-8B" in repr(p) and "65,536 B/token" in repr(p)
    assert p.to_dict()["answer"]["max_requests"] == p.answer.max_requests
    with pytest.raises(InputError):
        kvplan.estimate(LLAMA, gpu="H100", context="lots")


def test_max_model_len_auto_is_the_longest_that_starts():
    # 1 GiB = 512 blocks of 2 MiB; vLLM 0.32 keeps the null block: 511 blocks x 16 = 8,176 tokens
    p = estimate(options_from_values({"model": LLAMA, "gpu": "H100", "kv_budget": "1GiB", "max_model_len": "auto",
                                      "context": "4k"}))
    assert p.max_model_len == 511 * 16
    assert p.answer.engine_starts and any("auto" in n for n in p.notes)
    # a given context longer than that is the same error as --context 8k --max-model-len 8176: vLLM rejects it
    with pytest.raises(InputError, match="--context 8192 exceeds --max-model-len auto = 8176") as err:
        estimate(options_from_values({"model": LLAMA, "gpu": "H100", "kv_budget": "1GiB", "max_model_len": "auto",
                                      "context": "8k"}))
    assert err.value.hint == "lower --context to 8176"
    # the default context (none given) follows what auto chose, and says so
    p = estimate(options_from_values({"model": LLAMA, "gpu": "H100", "kv_budget": "1GiB", "max_model_len": "auto"}))
    assert p.options.context == p.max_model_len == 8176
    assert any(n.startswith("context 8,176 tokens: the longest --max-model-len auto starts with") for n in p.notes)
    # capped at max_position_embeddings when memory is plentiful
    big = estimate(options_from_values({"model": LLAMA, "gpu": "H100", "max_model_len": "auto"}))
    assert big.max_model_len == big.spec.max_position_embeddings == 131_072


def test_refusal_rule_follows_the_engine_version():
    # 512 blocks, one 8,192-token request needs 512: vLLM 0.32 refuses (null block), 0.11 starts
    new = plan(kv_budget_bytes=GiB, context=8192, engine_version="0.32")
    old = plan(kv_budget_bytes=GiB, context=8192, engine_version="0.11")
    assert not new.answer.engine_starts and old.answer.engine_starts
    assert (new.answer.longest_startable_len, old.answer.longest_startable_len) == (511 * 16, 512 * 16)


def test_early_v1_prints_the_raw_pool_in_tokens():
    p = plan(kv_budget_bytes=GiB, context=4096, engine_version="0.10")
    assert p.answer.kv_tokens == 512 * 16
    assert plan(kv_budget_bytes=GiB, context=4096).answer.kv_tokens == 512 * 4096 // 256  # floor(2.0 x 4,096)


def test_usage_context_is_validated():
    with pytest.raises(InputError, match="usage-context"):
        plan(usage_context="batch")
    assert plan(usage_context="llm").engine.usage_context == "llm"


def test_an_empty_kv_budget_names_the_terms_that_took_the_memory():
    # A10G: 22.49 GiB x 0.9 = 20.29 GiB usable; the 14.96 GiB of weights fit, a 12 GiB activation does not:
    # the note must not blame "weights alone" for what the terms take together
    plan = estimate(options_from_values({"model": LLAMA, "gpu": "A10G", "activation_gib": "12"}))
    note = next(n for n in plan.notes if n.startswith("no memory left for the KV cache"))
    assert "weights alone" not in note and "activation 12.00" in note and "weights 14.99" in note
    taken = sum(t.bytes for t in plan.budget.terms) / GiB
    assert note.endswith(f"= {taken:.2f} GiB of {plan.budget.usable_bytes / GiB:.2f} GiB usable per GPU")
    heavy = estimate(options_from_values({"model": LLAMA, "gpu": "A10G", "weights_gib": "30"}))
    assert any(n.startswith("no memory left for the KV cache: weights alone take 30.00 GiB of") for n in heavy.notes)


def test_a_model_described_by_options_alone_is_planned():
    p = kvplan.estimate("mymodel", layers=32, kv_heads=8, head_dim=128, weights_gib=15)
    # 2 x 32 layers x 8 kv_heads x 128 head_dim x 2 B (bfloat16) = 131,072 B/token; 15 GiB of weights
    assert p.kv_bytes_per_token_gpu == 131_072 and p.budget.weights.bytes == 15 * GiB
    assert p.source == "no config, described by --layers 32 --kv-heads 8 --head-dim 128"
    assert any("described by --layers 32" in n for n in p.notes)
    # the same through a check file (one resolver for every command)
    assert kvplan.check({"checks": [{"name": "m", "model": "mymodel", "layers": 32, "kv_heads": 8, "head_dim": 128,
                                     "weights_gib": 15, "require": {"concurrency": 8}}]}).passed
    with pytest.raises(ModelNotFoundError, match="not a local path") as err:
        kvplan.estimate("mymodel", layers=32, kv_heads=8)  # one of the three missing
    assert "describe it: --layers N --kv-heads N --head-dim N --weights-gib SIZE" in err.value.hint
    with pytest.raises(KvplanError, match="no weight facts"):
        kvplan.estimate("mymodel", layers=32, kv_heads=8, head_dim=128)


# every user-given term that, with a given KV budget, asks the device for more than it has: the KV budget alone,
# or beside a given weights / activation / overhead / CUDA-graph term, or on a --gpu-memory smaller than the pool;
# on each engine and on the CPU backend with a host size
IMPOSSIBLE_BUDGETS = [
    dict(kv_budget="900GiB"),
    dict(kv_budget="62GiB"),  # 79.20 - 14.96 - 1.79 - 0.33 - 0.97 = 61.16 GiB is what an H100 leaves
    dict(kv_budget="60GiB", overhead_gib="30"),
    dict(kv_budget="40GiB", activation_gib="30"),
    dict(kv_budget="50GiB", cudagraph_gib="20"),
    dict(kv_budget="6GiB", weights_gib="200"),
    dict(kv_budget="60GiB", gpu="H100", gpu_memory="64GiB"),
    dict(kv_budget="64GiB", engine="sglang"),  # SGLang holds no activation or graph term here: 63.67 GiB left
    dict(kv_budget="80GiB", gpu="cpu", gpu_memory="64GiB"),
]


@pytest.mark.parametrize("kw", IMPOSSIBLE_BUDGETS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_a_kv_budget_past_what_the_device_holds_is_refused(kw):
    # --kv-budget 900GiB on an H100 planned 899 requests, "fits" and a launch line vLLM fails on: the engine
    # allocates the cache it is told to, beside everything else it holds, so the plan is refused with the figures
    values = {"model": LLAMA, "gpu": "H100", **kw}
    with pytest.raises(InputError) as exc:
        estimate(options_from_values(values))
    message = exc.value.message
    assert message.startswith(f"--kv-budget {options_from_values(values).kv_budget_bytes / GiB:,.2f} GiB does not fit")
    assert "leaves" in message and "GiB for the KV cache" in message
    if "gpu_memory" in kw:
        assert "--gpu-memory 64.00 GiB" in message
    else:
        assert "79.20 GiB" in message  # the H100's runtime-reported total


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("gib", [1, 20, 61, 62, 63, 70, 79, 80])
def test_a_given_kv_budget_either_fits_the_device_or_is_refused(engine, gib):
    # the property: whatever is given, an answered plan's KV budget and every other term fit in the device
    try:
        p = estimate(options_from_values({"model": LLAMA, "gpu": "H100", "engine": engine, "kv_budget": f"{gib}GiB"}))
    except InputError as exc:
        assert "does not fit" in exc.message
        return
    assert p.budget.kv_budget_bytes + sum(t.bytes for t in p.budget.terms) <= p.gpu.memory_bytes


def test_a_cpu_backend_sized_by_its_kv_space_alone_is_not_refused():
    # the CPU backend without a host size plans VLLM_CPU_KVCACHE_SPACE as given: there is no total to hold it to
    p = estimate(options_from_values({"model": LLAMA, "gpu": "cpu", "kv_budget": "900GiB", "context": "4k"}))
    assert p.budget.kv_budget_bytes == 900 * GiB


def test_a_gpu_memory_past_what_the_named_gpu_has_is_refused():
    # `--gpu H100 --gpu-memory 200GiB` planned 200 GiB on an H100. Over the catalogue: a named GPU takes any
    # --gpu-memory up to what it has by any count (runtime total, nvidia-smi's, the box's), none above
    from kvplan.gpus import load_gpus
    from kvplan.units import MiB

    for g in (g for g in load_gpus() if not g.is_cpu and g.memory_bytes):
        counts = [g.memory_bytes, (g.smi_memory_mib or 0) * MiB, round((g.marketing_gb or 0) * GiB)]
        for ok in {c for c in counts if c} | {g.memory_bytes // 2}:
            p = estimate(Options(model="Qwen/Qwen3-0.6B", gpu=g.name, gpu_memory_bytes=ok))
            assert p.gpu.memory_bytes == ok, g.name
        with pytest.raises(InputError, match=f"is more than the {g.name} has"):
            estimate(Options(model="Qwen/Qwen3-0.6B", gpu=g.name, gpu_memory_bytes=max(counts) + MiB))


def test_the_mtp_draft_lives_on_the_last_stage():
    # vLLM builds the drafter on the last pipeline rank only: its weights and its KV layer are the last stage's
    plain = kvplan.estimate("deepseek-ai/DeepSeek-V3", gpu="H200", tp=8, pp=2)
    mtp = kvplan.estimate("deepseek-ai/DeepSeek-V3", gpu="H200", tp=8, pp=2, speculative="mtp")
    assert mtp.stages[0].weights_bytes == plain.stages[0].weights_bytes
    assert mtp.stages[1].weights_bytes > plain.stages[1].weights_bytes
    assert mtp.stages[1].blocks < plain.stages[1].blocks
    # 61 layers at pp 2 (vLLM 0.8+): [31, 30]; the last stage caches its 30 layers + the draft layer
    assert mtp.answer.num_blocks == mtp.stages[1].blocks and len(mtp.rank_layers) == 30 + 1


def test_vllm_v0_splits_the_pool_among_its_virtual_engines():
    # V0 at pp 2 runs one scheduler per virtual engine, each on num_gpu_blocks // 2 blocks (vllm/core/scheduler.py)
    v0 = kvplan.estimate("meta-llama/Llama-3.1-8B-Instruct", gpu="L4", pp=2, engine_version="0.7.2", context=8192)
    blocks = v0.answer.num_blocks
    assert v0.engine.pool_shards == 2
    # 8,192 tokens = 512 blocks of 16; each half keeps one null block out: 2 x ((blocks // 2 - 1) // 512)
    assert v0.answer.pool_requests == 2 * ((blocks // 2 - 1) // 512)
    # one request is at most one half: 16 tokens x (blocks // 2 - 1)
    assert v0.answer.max_context_at_batch == 16 * (blocks // 2 - 1)
    assert "2 virtual engines" in " ".join(v0.budget.notes)
    v1 = kvplan.estimate("meta-llama/Llama-3.1-8B-Instruct", gpu="L4", pp=2, engine_version="0.8", context=8192)
    # V1 has one pool: a request may take all of it, up to the model's 131,072 positions
    assert v1.engine.pool_shards == 1
    assert v1.answer.max_context_at_batch == min(131_072, 16 * (v1.answer.num_blocks - 1)) > 16 * v1.answer.num_blocks // 2
