"""kvplan.model.config_reader: where each value came from.

Provenance named a model type's default (``num_experts <- num_local_experts (qwen3_moe default)``) for a value
the file itself gives: a key the file holds wins over one the defaults filled in, whatever the order of the
aliases.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from kvplan.model.config_reader import ConfigReader
from kvplan.model.sources import bundled_ids, load_bundled
from kvplan.model.spec import build_spec


@settings(max_examples=200, deadline=None)
@given(st.permutations(["num_local_experts", "n_routed_experts", "num_experts"]), st.integers(1, 512),
       st.integers(1, 512), st.integers(0, 2))
def test_a_key_the_file_gives_wins_over_a_defaulted_one(keys, given_value, default_value, which):
    given_key = keys[which]
    defaulted = {k: default_value for k in keys if k != given_key}
    config = {given_key: given_value, **defaulted, "model_type": "qwen3_moe"}
    r = ConfigReader(config, "config.json", defaulted=frozenset(defaulted))
    assert r.int("num_experts", tuple(keys)) == given_value
    assert r.provenance["num_experts"] == given_key


@pytest.mark.parametrize("model_id", bundled_ids())
def test_no_bundled_value_the_file_gives_is_credited_to_a_default(model_id):
    source = load_bundled(model_id)
    spec = build_spec(source)
    config = source.config.get("text_config", source.config)
    for field, where in spec.provenance.items():
        if where.endswith(" default)"):
            key = where.split(" (")[0].split(".")[-1]
            assert key not in config, (model_id, field, where)
