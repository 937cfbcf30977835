"""transformers as the config oracle, sampled: kvplan reads each model type's configs as transformers does.

The full sweep over every model type is ``python3 benchmarks/transformers_sweep.py`` (docs/coverage.md);
this runs the same comparison on a fixed sample: each model type's default config saved the way
``save_pretrained`` writes it, in full, with nothing but its model_type, without layer_types, and with
variations (layer count, GQA, head_dim, sliding window, nested text_config), compared per layer with
transformers' own cache helpers. It also checks the generated defaults table is what transformers gives.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gen_model_type_defaults  # noqa: E402
import transformers_sweep as sweep  # noqa: E402

sweep.quiet_transformers()

AGREES = ["gemma", "gemma2", "gemma3_text", "gemma3", "paligemma", "mllama", "qwen2", "qwen3", "qwen3_next",
          "qwen2_5_vl", "mistral", "mixtral", "llama", "llama4", "deepseek_v2", "deepseek_v3", "falcon_h1", "gpt2",
          "gpt_neox", "phi3", "starcoder2", "jamba", "nemotron_h", "gpt_oss", "olmo2", "cohere", "cohere2",
          "gemma3n_text", "gemma4_text", "longcat_flash", "mimo_v2_flash"]
DIFFERENT = ["falcon", "deepseek_v32", "minicpm3"]  # listed in KNOWN_DIFFERENCES, with the reason
REFUSED = {"zamba2": "'hybrid' layers", "recurrent_gemma": "recurrent (RG-LRU) blocks", "bamba": "no attention layer",
           "granitemoehybrid": "no attention layer"}  # the last two: transformers' defaults are all Mamba
NOT_DECODERS = {"bert": "encoder-only", "t5": "encoder-decoder", "mamba": "attention-free recurrent",
                "siglip_vision_model": "vision model", "whisper": "encoder-decoder"}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sweep")


@pytest.mark.parametrize("model_type", AGREES)
def test_kvplan_reads_the_config_as_transformers_does(model_type: str, work: Path):
    result = sweep.check_decoder(model_type, work, verbose=False)
    assert result.outcome == "agrees", result.details or result.reason


@pytest.mark.parametrize("model_type", DIFFERENT)
def test_listed_differences_are_the_only_ones(model_type: str, work: Path):
    result = sweep.check_decoder(model_type, work, verbose=False)
    assert result.outcome == "different", result.reason
    assert result.reason == sweep.KNOWN_DIFFERENCES[model_type]


@pytest.mark.parametrize(("model_type", "why"), sorted(REFUSED.items()))
def test_decoders_kvplan_does_not_model_are_refused_with_the_reason(model_type: str, why: str, work: Path):
    result = sweep.check_decoder(model_type, work, verbose=False)
    assert result.outcome == "refused" and why in result.reason


@pytest.mark.parametrize(("model_type", "why"), sorted(NOT_DECODERS.items()))
def test_models_without_a_text_decoder_are_refused(model_type: str, why: str, work: Path):
    from kvplan.model import model_types

    result = sweep.check_non_decoder(model_type, model_types.role(model_type) or "", work)
    assert result.outcome == "refused" and why in result.reason


def test_the_defaults_table_is_what_transformers_gives():
    # kvplan/data/model_type_defaults.json is generated; a transformers upgrade or a new key kvplan reads
    # means rerunning benchmarks/gen_model_type_defaults.py (whose --check compares the whole table)
    stale = gen_model_type_defaults.check_entries(AGREES + DIFFERENT + sorted(REFUSED))
    assert stale == [], "rerun python3 benchmarks/gen_model_type_defaults.py (<keys>: kvplan reads a new config key)"
