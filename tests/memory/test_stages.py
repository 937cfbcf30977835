"""Pipeline stages: the layers each engine release gives a stage, and the weights a stage loads (kvplan.memory.stages)."""

from __future__ import annotations

import pytest

from kvplan import memory
from kvplan.errors import InputError
from kvplan.model.sources import load_bundled
from kvplan.model.spec import build_spec

# DeepSeek-V3 (61 layers, first_k_dense_replace 3), counted by hand from its config:
# attention (MLA): q_a 1,536 x 7,168 + q_a_layernorm 1,536 + q_b 128 x 192 x 1,536 + kv_a 576 x 7,168
#   + kv_a_layernorm 512 + kv_b 128 x 256 x 512 + o 7,168 x 16,384 = 187,107,328; two norms 2 x 7,168 = 14,336
# dense MLP: 3 x 7,168 x 18,432 = 396,361,728 -> a dense layer 583,483,392
# MoE MLP: 256 experts x 3 x 7,168 x 2,048 + router 256 x 7,168 + e_score bias 256 + shared 3 x 7,168 x 2,048
#   = 11,320,164,608 -> a MoE layer 11,507,286,272
DENSE, MOE = 583_483_392, 11_507_286_272
TABLE = 129_280 * 7_168  # vocab x hidden: the embedding, and the (untied) LM head


@pytest.fixture(scope="module")
def v3():
    return build_spec(load_bundled("deepseek-ai/DeepSeek-V3"))


def test_each_engine_release_places_the_remainder_layers_its_own_way():
    # vLLM 0.8+ (PR #13839): one more each to the stages before the last, counting back from the second to last
    assert memory.pp_layer_counts(61, 2) == [31, 30]
    assert memory.pp_layer_counts(61, 4) == [15, 15, 16, 15]
    assert memory.pp_layer_counts(62, 4) == [15, 16, 16, 15]
    assert memory.pp_layer_counts(61, 8) == [7, 7, 8, 8, 8, 8, 8, 7]
    # vLLM 0.6 - 0.7.x and SGLang before 0.5.6: the last stage takes the whole remainder
    assert memory.pp_layer_counts(61, 2, "last") == [30, 31]
    assert memory.pp_layer_counts(61, 8, "last") == [7, 7, 7, 7, 7, 7, 7, 12]
    # SGLang 0.5.6+: one more each to the last stages
    assert memory.pp_layer_counts(61, 8, "last-each") == [7, 7, 7, 8, 8, 8, 8, 8]
    for partition in memory.PARTITIONS:
        assert sum(memory.pp_layer_counts(61, 8, partition)) == 61
    stages = memory.pipeline_stages(61, 4)
    assert [(s.start, s.end) for s in stages] == [(0, 15), (15, 30), (30, 46), (46, 61)]
    assert stages[0].first and stages[-1].last and not stages[1].first and not stages[1].last
    with pytest.raises(InputError, match="exceeds the model's 61 layers"):
        memory.pp_layer_counts(61, 62)


def test_the_engines_partition_follows_the_release():
    from kvplan.engines import sglang, vllm

    assert vllm.defaults("0.7.2", 80 << 30, False).pp_partition == "last"
    assert vllm.defaults("0.8", 80 << 30, False).pp_partition == "before-last"
    assert vllm.pp_partition((0, 7, 3)) == "last" and vllm.pp_partition((0, 8, 0)) == "before-last"
    assert sglang.defaults("0.5.5", 80 << 30, False).pp_partition == "last"
    assert sglang.defaults("0.5.6", 80 << 30, False).pp_partition == "last-each"
    assert sglang.defaults("0.5.6", 80 << 30, False).pp_free_min


def test_deepseek_v3_layers_are_counted_dense_and_moe(v3):
    assert v3.layer_parameters[:3] == (DENSE,) * 3 and set(v3.layer_parameters[3:]) == {MOE}
    assert v3.expert_layer_ids == tuple(range(3, 61)) and not v3.tied_embeddings


def test_deepseek_v3_stage_weights_at_pp_2_and_pp_4(v3):
    # a total of every layer's parameters at 1 B (fp8) + the embedding and the LM head at 2 B (bf16)
    layers = 3 * DENSE + 58 * MOE
    assert layers == sum(v3.layer_parameters) == 669_173_053_952
    total = layers + 2 * TABLE * 2

    def weights(pp: int, partition: str = "before-last") -> list[int]:
        return [memory.stage_weight_bytes(v3, s, total, 2) for s in memory.pipeline_stages(61, pp, partition)]

    # pp 2 (vLLM 0.8+: [31, 30]): stage 1 = 3 dense + 28 MoE + the embedding; stage 2 = 30 MoE + the LM head
    first, last = 3 * DENSE + 28 * MOE + 2 * TABLE, 30 * MOE + 2 * TABLE
    assert weights(2) == pytest.approx([first, last], abs=2)
    assert sum(weights(2)) == pytest.approx(total, abs=2)
    # vLLM 0.7.x ([30, 31]): stage 1 = 3 dense + 27 MoE + embedding; stage 2 = 31 MoE + LM head, 2 MoE layers more
    assert weights(2, "last") == pytest.approx([3 * DENSE + 27 * MOE + 2 * TABLE, 31 * MOE + 2 * TABLE], abs=2)
    # pp 4 ([15, 15, 16, 15]): 3 dense + 12 MoE + embedding; 15 MoE; 16 MoE; 15 MoE + LM head
    assert weights(4) == pytest.approx([3 * DENSE + 12 * MOE + 2 * TABLE, 15 * MOE, 16 * MOE, 15 * MOE + 2 * TABLE], abs=2)
    # the even split kvplan used to charge every GPU is 1/4 of the total: the third stage holds 9.4% more
    # (16 x 11,507,286,272 = 184,116,580,352 against 672,879,770,112 / 4 = 168,219,942,528)
    assert weights(4)[2] / (total / 4) == pytest.approx(184_116_580_352 / 168_219_942_528, abs=1e-6)
    # one stage is the whole model
    assert memory.stage_weight_bytes(v3, memory.pipeline_stages(61, 1)[0], total, 2) == total


def test_a_dense_model_with_a_remainder_and_a_tied_head():
    spec = build_spec(load_bundled("meta-llama/Llama-3.1-70B"))
    # Llama-3.1-70B: 80 identical layers (attention 150,994,944 + MLP 3 x 8,192 x 28,672 + norms 16,384)
    assert set(spec.layer_parameters) == {855_654_400}
    table = 128_256 * 8_192
    total = spec.weights.total_bytes  # 141,107,412,992 B: 70.55 B parameters x 2 B
    rest = total - 2 * table * 2  # the embedding and the untied LM head, 2 B each
    stages = memory.pipeline_stages(80, 3)  # [27, 27, 26]
    got = [memory.stage_weight_bytes(spec, s, total, 2) for s in stages]
    assert got == pytest.approx([rest * 27 / 80 + 2 * table, rest * 27 / 80, rest * 26 / 80 + 2 * table], abs=1)
    # a tied LM head is the embedding, built again on the last stage: two copies at pp 2, one at pp 1
    tied = build_spec(load_bundled("meta-llama/Llama-3.2-1B"))
    assert tied.tied_embeddings
    t_table = 128_256 * 2_048
    t_total = sum(tied.layer_parameters) * 2 + t_table * 2
    both = [memory.stage_weight_bytes(tied, s, t_total, 2) for s in memory.pipeline_stages(16, 2)]
    assert both == pytest.approx([t_total / 2 - t_table + 2 * t_table] * 2, abs=1)
    assert sum(both) == pytest.approx(t_total + 2 * t_table, abs=2)


def test_each_stage_caches_its_own_layers(v3):
    s1, s2 = memory.pipeline_stages(61, 2)
    assert len(memory.stage_caches(v3, s1)) == 31 and len(memory.stage_caches(v3, s2)) == 30
    assert memory.stage_caches(v3, memory.pipeline_stages(61, 1)[0]) == v3.layers
    assert memory.rank_layers(v3, 8, 2) == memory.stage_rank_layers(v3, 8, s1)
