"""Pipeline stages: which decoder layers each stage holds (the engines' ``get_pp_indices``), the cache entries of
those layers, and the weight bytes a stage loads (its own layers, the embedding on the first stage, the LM head on
the last). Pure functions over a :class:`~kvplan.model.spec.ModelSpec`; :mod:`kvplan.memory` re-exports them.

How the engines split ``n`` layers over ``pp`` stages when ``n % pp = r`` is not 0 (``VLLM_PP_LAYER_PARTITION`` /
``SGLANG_PP_LAYER_PARTITION`` unset), :data:`PARTITIONS`:

- ``last`` (vLLM before 0.8, SGLang before 0.5.6): ``n // pp`` each, the last stage takes all ``r`` more
  (61 layers at pp 2: ``[30, 31]``; at pp 4: ``[15, 15, 15, 16]``);
- ``before-last`` (vLLM 0.8+, PR #13839): one more each to the ``r`` stages before the last, counting back from the
  second to last (the last stage holds the final norm and the LM head): 61 at pp 2 ``[31, 30]``, at pp 4
  ``[15, 15, 16, 15]``;
- ``last-each`` (SGLang 0.5.6+): one more each to the last ``r`` stages: 61 at pp 4 ``[15, 15, 15, 16]``, 62 at
  pp 4 ``[15, 15, 16, 16]``.

Where the embedding and the LM head live (vLLM's ``make_layers`` / ``PPMissingLayer`` models; SGLang's the same):
``embed_tokens`` on the first stage, ``lm_head`` on the last; a model with tied embeddings builds the embedding on
the last stage too (``is_first_rank or (tie_word_embeddings and is_last_rank)``) and ties the head to it, so at
pp >= 2 two stages hold a copy. Each engine's workers profile their own memory, so every stage has its own weights
and its own KV bytes per token (its own layers); vLLM takes the minimum of the stages' block counts.
"""

from __future__ import annotations

from kvplan.errors import InputError
from kvplan.frozen import frozen
from kvplan.model.spec import LayerCache, ModelSpec
from kvplan.units import plural

PARTITIONS = ("before-last", "last", "last-each")


@frozen
class PipelineStage:
    """Stage ``index`` of ``count``: decoder layers ``start`` up to ``end`` (exclusive)."""

    index: int
    count: int
    start: int
    end: int

    @property
    def num_layers(self) -> int:
        return self.end - self.start

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def describe(self) -> str:
        """``stage 2 of 2 (layers 31 - 60)``."""
        return f"stage {self.index + 1} of {self.count} (layers {self.start} - {self.end - 1})"


def pp_layer_counts(num_layers: int, pp: int, partition: str = "before-last") -> list[int]:
    """Layers per pipeline stage as the engine's ``get_pp_indices`` splits them (``partition``: :data:`PARTITIONS`).
    61 layers over 4 stages: ``[15, 15, 16, 15]`` (before-last), ``[15, 15, 15, 16]`` (last, last-each)."""
    if pp < 1:
        raise InputError(f"invalid --pp {pp}: must be at least 1")
    if pp > num_layers:
        raise InputError(f"--pp {pp} exceeds the model's {plural(num_layers, 'layer')}")
    if partition not in PARTITIONS:
        raise ValueError(f"unknown pipeline partition {partition!r}")
    counts = [num_layers // pp] * pp
    extra = num_layers % pp
    if partition == "last":
        counts[-1] += extra
    elif partition == "last-each":
        for i in range(pp - extra, pp):
            counts[i] += 1
    else:
        for i in range(2, extra + 2):
            counts[-i] += 1
    return counts


def pipeline_stages(num_layers: int, pp: int, partition: str = "before-last") -> tuple[PipelineStage, ...]:
    """The ``pp`` stages of ``num_layers`` decoder layers, in order."""
    out, start = [], 0
    for i, count in enumerate(pp_layer_counts(num_layers, pp, partition)):
        out.append(PipelineStage(i, pp, start, start + count))
        start += count
    return tuple(out)


def stage_caches(spec: ModelSpec, stage: PipelineStage) -> tuple[LayerCache, ...]:
    """The cache entries of the stage's decoder layers (two per layer for parallel hybrids such as Falcon-H1)."""
    if stage.count == 1:
        return spec.layers
    n, entries = spec.num_layers_decoder, len(spec.layers)
    return spec.layers[stage.start * entries // n: stage.end * entries // n]


def stage_weight_bytes(spec: ModelSpec, stage: PipelineStage, total_bytes: int, embedding_bytes_per_parameter: int) -> int:
    """Weight bytes one stage loads over all its tensor-parallel ranks, of the model's ``total_bytes`` (each tensor
    once, as :func:`kvplan.planning.weights.weights_bytes` counts them).

    The embedding and the LM head (``vocab x hidden`` each, in the model dtype: weight quantizers keep them 16-bit)
    go to the first and the last stage; a tied LM head is a second copy on the last stage at pp >= 2. The rest of
    ``total_bytes`` is split by the stage's share of the decoder layers' parameters (``spec.layer_parameters``:
    DeepSeek-V3's 3 dense layers hold 0.58 B parameters each, its MoE layers 11.5 B), or by its share of the layers
    when they were not counted. One stage is the whole model."""
    if stage.count == 1:
        return total_bytes
    params = spec.layer_parameters if len(spec.layer_parameters) == spec.num_layers_decoder else ()
    if params and sum(params):
        share = sum(params[stage.start:stage.end]) / sum(params)
    else:
        share = stage.num_layers / spec.num_layers_decoder
    table = spec.vocab_size * spec.hidden_size
    stored = (spec.embedding_parameters or table * (1 if spec.tied_embeddings else 2)) * embedding_bytes_per_parameter
    if not table or stored >= total_bytes:  # a --weights-gib below the embeddings' own size: by layers alone
        return round(total_bytes * share)
    return round((total_bytes - stored) * share) + table * embedding_bytes_per_parameter * (stage.first + stage.last)


__all__ = ["PARTITIONS", "PipelineStage", "pipeline_stages", "pp_layer_counts", "stage_caches", "stage_weight_bytes"]
