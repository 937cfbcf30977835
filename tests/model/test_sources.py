"""kvplan.model.sources.load_spec: the one cache of resolved specs (estimate, check, report, models show)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.model.sources import clear_spec_cache, load_spec
from kvplan.model.spec import Overrides

from entry_point import assert_one_line, kvplan as run

LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 1000, "torch_dtype": "bfloat16"}


def test_a_spec_is_resolved_once() -> None:
    clear_spec_cache()
    first = load_spec("meta-llama/Llama-3.1-8B")
    assert load_spec("meta-llama/Llama-3.1-8B") is first
    # Overrides are part of the key: a different spec, itself cached.
    other = load_spec("meta-llama/Llama-3.1-8B", overrides=Overrides(num_layers=4))
    assert other is not first and other[0].num_layers == 4 and first[0].num_layers == 32
    assert load_spec("meta-llama/Llama-3.1-8B", overrides=Overrides(num_layers=4)) is other


def test_a_local_config_is_reread_when_it_changes(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    spec, source = load_spec(str(tmp_path))
    assert spec.num_layers == 2 and source.kind == "local"
    assert load_spec(str(tmp_path))[0] is spec
    config.write_text(json.dumps({**LLAMA, "num_hidden_layers": 12}))
    assert load_spec(str(tmp_path))[0].num_layers == 12


def test_capacity_and_report_share_the_cache(tmp_path: Path) -> None:
    """Before: capacity.spec_resolver and report._Planner each kept a dict of specs of their own."""
    import kvplan

    clear_spec_cache()
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    checked = kvplan.check({"defaults": {"model": str(tmp_path), "gpu": "H100", "weights_gib": 1},
                            "checks": [{"name": "a", "require": {"concurrency": 1}}]})
    swept = kvplan.sweep({"defaults": {"model": str(tmp_path), "weights_gib": 1}, "sweep": {"gpu": ["H100", "L4"]}})
    assert checked.results and swept.rows
    from kvplan.model import sources

    assert len(sources._SPECS) == 1  # one resolution served the check and both report rows


@pytest.mark.parametrize("typo,meant", [("meta-llama/Lama-3.1-8B", "meta-llama/Llama-3.1-8B"), ("Qwen/Qwen3-8b-", "Qwen/Qwen3-8B"),
                                        ("mistralai/Mistral-7B-v0.4", "mistralai/Mistral-7B-v0.3")])
def test_a_mistyped_model_id_offline_names_the_bundled_one(typo, meant):
    line = assert_one_line(run("estimate", typo, "--offline"))
    assert f"did you mean the bundled {meant}?" in line


def test_every_bundled_id_one_letter_off_is_named(monkeypatch):
    from kvplan.model.sources import bundled_ids, did_you_mean

    for model_id in bundled_ids():
        org, name = model_id.split("/")
        typo = f"{org}/{name[:3]}{name[4:]}"  # a letter dropped
        assert did_you_mean(typo) == model_id, (typo, did_you_mean(typo))
