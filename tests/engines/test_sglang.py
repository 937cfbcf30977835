"""SGLang's pool for Mamba / linear-attention hybrids (Qwen3.5, Qwen3-Next, Nemotron-H, ...): the state layers get a
pool of request slots of their own (``MambaPool``), carved out of the budget before the KV pool, whose token cell
counts the full-attention layers only; running requests are capped at the slots // 3 with the radix cache.

Numbers for Qwen3.5-9B (bundled spec: 24 Gated DeltaNet layers, 8 full-attention layers of 4 KV heads x 256) at tp 2:
- one slot (``mamba_cache_per_req``): conv (4 - 1) x (2 x 16 x 128 + 32 x 128) / 2 = 12,288 elements x 2 B (bf16)
  + SSM 32 / 2 x 128 x 128 = 262,144 elements x 4 B (float32) = 1,073,152 B per layer, x 24 = 25,755,648 B;
- one token (``cell_size``): 8 layers x 2 heads x 256 x 2 (K, V) x 2 B = 16,384 B.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from kvplan import memory
from kvplan.cli.app import app
from kvplan.engines import sglang, vllm_overhead
from kvplan.model.sources import load_spec
from kvplan.options import Options
from kvplan.planning.plan import plan_for_spec
from kvplan.units import GiB

PER_SLOT = 25_755_648
CELL = 16_384
CONTEXT = 262_144


@pytest.fixture(scope="module")
def qwen35():
    return load_spec("Qwen/Qwen3.5-9B")[0]


def _plan(spec, version="0.5.10", **kw):
    # rest = floor(20 GiB x 0.8) - 12 GiB / 2 GPUs - 0 = 16 GiB - 6 GiB = 10 GiB per GPU, exactly
    options = dict(model=spec.model_id, gpu_memory_bytes=20 * GiB, gpu_util=0.8, tp=2, engine="sglang",
                   engine_version=version, weights_bytes=12 * GiB, overhead_bytes=0, context=CONTEXT)
    return plan_for_spec(spec, Options(**(options | kw)))


def test_the_slot_and_the_cell_count_the_layers_each_pool_holds(qwen35):
    layers = memory.rank_layers(qwen35, 2, 1)
    layers = tuple(replace(x, ssm_dtype="float32") if x.is_state else x for x in layers)  # the config's, SGLang's
    assert sglang.mamba_cache_per_req(layers) == 24 * (12_288 * 2 + 262_144 * 4) == PER_SLOT
    plan = _plan(qwen35)
    assert plan.layout.block_size == 1 and plan.layout.block_bytes == CELL  # page 1, full-attention layers only
    assert not any(g.cache.is_state for g in plan.layout.groups)


def test_the_ratio_split_of_a_10_gib_budget(qwen35):
    # 0.5.10: state = 10 GiB x 0.9 / 1.9 = 5,086,018,018.9 B // 25,755,648 = 197 slots (5,073,862,656 B);
    # KV = 10,737,418,240 - 5,073,862,656 = 5,663,555,584 B // 16,384 = 345,676 tokens
    plan = _plan(qwen35)
    b = plan.budget
    assert (b.state_slots, b.state_pool_bytes) == (197, 197 * PER_SLOT)
    assert b.kv_budget_bytes == 10 * GiB - 197 * PER_SLOT == 5_663_555_584
    assert plan.answer.kv_tokens == 345_676 == plan.answer.num_blocks
    # running requests: min(tokens // 2, clamp(int(345,676 / 262,144 x 512), 2048, 4096)) = 2048, then 197 // 3 = 65
    assert plan.answer.max_num_seqs == 65 == plan.launch.max_num_seqs
    assert plan.engine.state_slots == 197 and plan.engine.state_slots_per_request == 3
    note = next(n for n in plan.notes if n.startswith("sglang splits the budget"))
    assert "Mamba state pool of 197 request slots" in note and "capped at 197 // 3 = 65 (radix cache on)" in note


def test_the_exp001_log_arithmetic():
    # sglang-exp001 (Qwen3.5-9B, 2x RTX 4090, tp 2): the pool's rest that gives the logged 327,310 tokens at 186 slots
    rest = 327_310 * CELL + 186 * PER_SLOT  # 10,153,197,568 B (9.46 GiB)
    assert sglang.mamba_slots("0.5.10", rest, PER_SLOT, radix_cache=True)[0] == 186  # 4.48 GiB // 25,755,648
    assert (rest - 186 * PER_SLOT) // CELL == 327_310
    assert 186 // sglang.mamba_slots_per_request("0.5.10", radix_cache=True) == 62  # the logged max_running_requests


def test_without_the_radix_cache(qwen35):
    # 0.5.10+: --disable-radix-cache alone keeps the ratio, and the cap counts one slot per request
    off = _plan(qwen35, prefix_caching=False)
    assert off.budget.state_slots == 197 and off.answer.max_num_seqs == 197
    # with --max-running-requests too, the slots are the requests: 100 x 25,755,648 B out of the 10 GiB
    capped = _plan(qwen35, prefix_caching=False, max_num_seqs=100)
    assert capped.budget.state_slots == 100 and capped.answer.max_num_seqs == 100
    assert capped.answer.kv_tokens == (10 * GiB - 100 * PER_SLOT) // CELL == 498_160
    # with the radix cache on, --max-running-requests caps the requests but the ratio sizes the slots
    on = _plan(qwen35, max_num_seqs=40)
    assert on.budget.state_slots == 197 and on.answer.max_num_seqs == 40
    assert "--max-running-requests 40" in on.rules.serve_command(on.launch)


def test_per_release(qwen35):
    assert [sglang.mamba_slots(v, 10 * GiB, PER_SLOT, radix_cache=True)[0] for v in ("0.4.8", "0.5.3", "0.5.4", "0.5.5")] \
        == [512, 512, 197, 197]
    # 0.5.4 - 0.5.9 without the radix cache: --max-running-requests, else 512; 0.5.10+: the ratio
    assert sglang.mamba_slots("0.5.5", 10 * GiB, PER_SLOT, radix_cache=False)[0] == 512
    assert sglang.mamba_slots("0.5.5", 10 * GiB, PER_SLOT, radix_cache=False, max_running_requests=64)[0] == 64
    assert sglang.mamba_slots("0.5.10", 10 * GiB, PER_SLOT, radix_cache=False)[0] == 197
    # 0.5.2 - 0.5.3: 512 slots and the radix cache off; the cap is the slots themselves
    old = _plan(qwen35, version="0.5.3", gpu_memory_bytes=40 * GiB)  # rest 32 GiB - 6 GiB = 26 GiB
    assert old.prefix_caching is False and old.budget.state_slots == 512
    assert old.answer.kv_tokens == (26 * GiB - 512 * PER_SLOT) // CELL
    assert old.answer.max_num_seqs == 512
    # Mamba2 models ran without the radix cache in 0.5.4 - 0.5.9, not in 0.5.10+
    assert sglang.mamba_radix_cache("0.5.5", {"mamba2"}) is False and sglang.mamba_radix_cache("0.5.10", {"mamba2"}) is None
    assert sglang.mamba_radix_cache("0.5.5", {"gated_delta_net"}) is None


def test_the_ssm_dtype_per_release(qwen35):
    e5, e10 = (sglang.defaults(v, 24 * GiB, False) for v in ("0.5.5", "0.5.10"))
    assert sglang.ssm_dtype(e10, None, "bfloat16", "gated_delta_net", "x", is_cpu=False)[0] == "bfloat16"
    assert sglang.ssm_dtype(e5, None, "bfloat16", "gated_delta_net", "x", is_cpu=False)[0] == "float32"
    assert sglang.ssm_dtype(e10, None, None, "mamba2", "x", is_cpu=False)[0] == "float32"
    assert sglang.ssm_dtype(e10, "bfloat16", None, "mamba2", "x", is_cpu=False)[0] == "bfloat16"


def test_a_model_without_state_layers_is_unchanged():
    spec = load_spec("Qwen/Qwen3-8B")[0]
    plan = plan_for_spec(spec, Options(model=spec.model_id, gpu="h100", engine="sglang", engine_version="0.5.10"))
    assert not plan.engine.state_pool and plan.budget.state_slots == 0 and plan.budget.state_pool_bytes == 0
    assert plan.answer.kv_tokens == plan.budget.kv_budget_bytes // sglang.cell_size_bytes(plan.rank_layers, plan.layout.kv_dtype)
    assert not any(n.startswith("sglang splits the budget") for n in plan.notes)


def test_every_output_reads_the_same_split(qwen35):
    runner = CliRunner()
    args = ["estimate", "Qwen/Qwen3.5-9B", "--engine", "sglang", "--engine-version", "0.5.10", "--gpu-memory",
            "20GiB", "--gpu-util", "0.8", "--tp", "2", "--weights-gib", "12", "--overhead-gib", "0", "--context",
            str(CONTEXT)]
    doc = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    assert doc["budget"]["state_slots"] == 197 and doc["budget"]["state_pool_bytes"] == 197 * PER_SLOT
    assert doc["budget"]["kv_budget_bytes"] == 5_663_555_584 and doc["answer"]["kv_tokens"] == 345_676
    assert any("Mamba state pool of 197 request slots" in n for n in doc["notes"])
    text = " ".join(runner.invoke(app, args).stdout.replace("│", " ").split())
    assert "max_total_num_tokens=345676, max_running_requests=65" in text
    assert "max_mamba_cache_size: 197" in text and "state pool" in text


def test_too_small_a_state_pool_refuses_to_start(qwen35):
    # rest 40 MiB: 41,943,040 x 0.9 / 1.9 = 19,867,229 B // 25,755,648 = 0 slots, though 2,560 tokens of KV would fit
    plan = _plan(qwen35, weights_bytes=2 * (16 * GiB - 40 * 2**20))
    assert plan.budget.state_slots == 0 and plan.answer.num_blocks == 40 * 2**20 // CELL
    assert not plan.answer.engine_starts and "state cache" in plan.answer.refusal
    assert plan.answer.max_requests == 0


def test_a_given_kv_budget_is_the_kv_pool(qwen35):
    # --kv-budget 5 GiB (like --max-total-tokens): 327,680 tokens; the state pool 0.9 x it: the rest 9.5 GiB,
    # 9.5 GiB x 0.9 / 1.9 = 4.5 GiB // 25,755,648 = 187 slots, 187 // 3 = 62 requests
    plan = _plan(qwen35, kv_budget_bytes=5 * GiB)
    assert plan.budget.kv_budget_bytes == 5 * GiB and plan.answer.kv_tokens == 5 * GiB // CELL == 327_680
    assert plan.budget.state_slots == 187 and plan.answer.max_num_seqs == 62
    assert any("--kv-budget is the KV pool" in n for n in plan.notes)


def test_explain_sets_the_logged_mamba_slots_beside_kvplan_s_and_keeps_stand_in_notes_out():
    """exp001 prints "Mamba Cache is allocated. max_mamba_cache_size: 186": the capacity table shows it beside the
    slots of kvplan's own plan (RTX 4090: 188); without a GPU the plan budgets a stand-in size, whose notes (its
    split of the budget, its --gpu-memory) are not the log's and are left out."""
    from pathlib import Path

    from rich.console import Console

    from kvplan.explain.reconcile import explain
    from kvplan.render.explain import _notes, render_explanation

    log = (Path(__file__).resolve().parents[2] / "benchmarks/corpus/sglang/sglang-exp001-2x4090-qwen35-9b-tp2.log"
           ).read_text(encoding="utf-8")
    with_gpu = explain(log, {"model": "Qwen/Qwen3.5-9B", "gpu": "RTX-4090-24GB"})
    console = Console(width=100, record=True)
    console.print(render_explanation(with_gpu))
    row = next(line for line in console.export_text().splitlines() if "Mamba state slots" in line)
    assert "186" in row and str(with_gpu.plan.engine.state_slots) in row
    no_gpu = explain(log, {"model": "Qwen/Qwen3.5-9B"})
    notes = _notes(no_gpu)
    assert not any(n.startswith("--gpu-memory:") or "Mamba state pool of" in n for n in notes)
    assert any("Mamba state pool of" in n for n in _notes(with_gpu))


def test_the_report_s_memory_plot_stacks_the_state_pool_where_there_is_one():
    """A hybrid on SGLang carves a Mamba state pool out of the budget: the memory plot shows it as its own segment
    (the bars still add up to the GPU's total); a model without one gets no such legend entry."""
    pytest.importorskip("matplotlib")
    import kvplan
    from kvplan.render.report_plots import _pyplot, memory_figure

    def legend(model):
        report = kvplan.sweep({"defaults": {"model": model, "engine": "sglang", "gpu": "H100"},
                               "sweep": {"context": [8192]}})
        fig, _ = memory_figure(report)
        names = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        widths = sum(patch.get_width() for patch in fig.axes[0].patches)
        _pyplot().close(fig)
        return names, widths, report.pools[0].plan.budget

    names, width, budget = legend("Qwen/Qwen3.5-9B")
    assert budget.state_pool_bytes > 0 and any(n.startswith("state pool") for n in names)
    assert width == pytest.approx(budget.total_bytes / 2**30, rel=1e-6)
    names, _, _ = legend("meta-llama/Llama-3.1-8B")
    assert not any(n.startswith("state pool") for n in names)


# --- the budget's terms, as SGLang's code and its log lines have them ----------------------------------------------


def _dense(version, tp=1, gpu="H100", **kw):
    import kvplan

    return kvplan.estimate("Qwen/Qwen3-8B", gpu=gpu, tp=tp, gpus=tp, context=8192, engine="sglang",
                           engine_version=version, **kw)


def test_the_weights_term_is_what_loading_holds_and_a_given_one_stands():
    """The weights term is "Load weight end ... mem usage": the weights' bytes and what SGLang's loading holds above
    them (LOAD_EXTRA_BYTES); a --weights-gib (a log's mem usage) is taken as it is."""
    vllm_weights = _dense("0.5.10").budget.weights.bytes
    import kvplan

    bare = kvplan.estimate("Qwen/Qwen3-8B", gpu="H100", context=8192, engine="vllm").budget.weights.bytes
    rope = vllm_overhead.rope_cache_bytes(_dense("0.5.10").spec, 2)  # vLLM's weights term holds its rotary table
    assert rope > 0 and vllm_weights == bare - rope + sglang.LOAD_EXTRA_BYTES
    given = _dense("0.5.10", weights_gib="15.5GiB").budget.weights
    assert given.bytes == round(15.5 * GiB) and given.source.startswith("--weights-gib")


def test_releases_that_reduce_the_free_memory_on_nccl_pay_their_late_communicator_in_full():
    """0.3 - 0.4.6 all-reduce the free memory's minimum on the default NCCL group, whose communicator NCCL creates
    after the first reading: at tp >= 2 on NVLink / NVSwitch boards the pool pays it in full (not x the fraction);
    0.4.7+ reduce on gloo, tp 1 has no collective, PCIe boards keep NCCL's buffers in host memory."""
    from kvplan.engines import Device

    switch, pcie = Device(interconnect="nvlink-switch"), Device(interconnect="pcie")
    first = sglang.pre_load(8, 1, switch)
    comm8 = first.communicators  # the default group's communicator spans the same 8 ranks as PyNccl's (no custom AR)
    assert comm8 > 0 and sglang.late_comm_bytes("0.4", 8, 1, switch) == comm8 == first.bytes - first.context - \
        first.custom_allreduce
    assert sglang.late_comm_bytes("0.4.6", 2, 1, switch) == sglang.pre_load(2, 1, switch).communicators
    assert [sglang.late_comm_bytes(v, 8, 1, switch) for v in ("0.4.7", "0.4.8", "0.5.10")] == [0, 0, 0]
    assert sglang.late_comm_bytes("0.4", 1, 1, switch) == 0 == sglang.late_comm_bytes("0.4", 4, 1, pcie)
    old, new = _dense("0.4.3", tp=8).budget, _dense("0.4.7", tp=8).budget
    before = sglang.pre_load_bytes(8, 1, switch)
    assert old.overhead.bytes == int(before * old.gpu_util) + comm8, old.overhead.source
    assert new.overhead.bytes == int(before * new.gpu_util)
    assert "after the first reading" in old.overhead.source and "after" not in new.overhead.source


def test_sglang_charges_other_processes_memory():
    """SGLang sizes the pool from the free memory before loading: what a desktop holds is charged (x the
    fraction), so a GeForce card's range allows for one."""
    assert sglang.defaults("0.4.3", 24 * GiB, False).charges_other_processes
    assert sglang.defaults("0.5.10", 80 * GiB, False).charges_other_processes
    p = _dense("0.4.3", gpu="RTX-3090")
    assert any(t.term == "desktop" for t in p.kv_range.terms)
    assert any("other processes hold on the GPU" in n for n in p.notes)
    assert not any(t.term == "desktop" for t in _dense("0.4.3").kv_range.terms)


def test_with_the_log_s_terms_put_in_kvplan_gives_sglang_s_pool():
    """SGLang's pool is ``free_before x frac - mem_usage`` and nothing else: on every corpus start planned from its
    inputs whose log prints both the free memory before loading and the weights' mem usage (calibration and
    validation; a check, nothing is fitted), kvplan with those two terms put in is within 0.5% of the logged pool, and
    only the weights and the memory in use before loading count (no activation, no CUDA graphs: they live in
    1 - mem_fraction_static)."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    spec = importlib.util.spec_from_file_location("corpus_agreement_sglang", root / "benchmarks" / "corpus_agreement.py")
    ca = importlib.util.module_from_spec(spec)
    sys.modules["corpus_agreement_sglang"] = ca
    spec.loader.exec_module(ca)
    done, _ = ca.rows()
    both = [r for r in done if r.engine == "sglang" and r.basis == "inputs" and set(r.deltas) == {"weights", "overhead"}]
    assert len(both) >= 5, [r.id for r in both]
    for r in both:
        assert abs(r.terms_err_pct) < 0.5 and r.rest_gib is not None and abs(r.rest_gib) < 0.1, (r.id, r.terms_err_pct)
