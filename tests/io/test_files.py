"""kvplan.io.files, the one reader for user files, and what the CLI makes of broken config files.

Every broken shape ends in one KvplanError line naming the file (exit 2 from the CLI), never a traceback;
``Infinity``/``NaN`` are kept as floats for the fields that read them to judge.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.errors import ConfigError, ScenarioError
from kvplan.io.files import MAX_JSON_DEPTH, parse_json, read_json, read_json_object, read_text

runner = CliRunner()

LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 1000, "torch_dtype": "bfloat16"}

# (file bytes, a phrase the one-line error must contain)
BROKEN: dict[str, tuple[bytes, str]] = {
    "invalid utf-8": (b'{"model_type": "llama\xff", "num_hidden_layers": 2}', "not valid UTF-8 (byte 0xff at offset 21)"),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary data (a NUL byte at offset 8)"),
    "4,301-digit integer": (b'{"num_hidden_layers": ' + b"7" * 4301 + b"}", "an integer with 4,301 digits"),
    "nested 2,000 deep": (b'{"a": ' + b"[" * 2000 + b"]" * 2000 + b"}", "nested too deeply"),
    "nested 151 deep": (b'{"a": ' + b"[" * 150 + b"]" * 150 + b"}", f"151 levels deep (more than {MAX_JSON_DEPTH})"),
    "truncated": (b'{"model_type": "llama", ', "not valid JSON"),
    "a list": (b"[1, 2]", "expected a JSON object, got an array"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_files_raise_one_config_error_naming_the_file(tmp_path: Path, case: str) -> None:
    data, phrase = BROKEN[case]
    path = tmp_path / "config.json"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        read_json_object(path, "config.json")
    line = info.value.one_line()
    assert str(path) in line and phrase in line, line
    assert "\n" not in line


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_cli_broken_config_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    """Before kvplan.io.files: invalid UTF-8, binary, huge ints and deep nesting ended in a traceback (exit 1)."""
    data, phrase = BROKEN[case]
    (tmp_path / "config.json").write_bytes(data)
    r = runner.invoke(app, ["estimate", str(tmp_path), "--json"])
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    err = r.stderr.strip()
    assert err.startswith("kvplan: error: ") and "\n" not in err and phrase in err, err


def test_non_finite_floats_are_kept() -> None:
    data = parse_json('{"time_step_limit": [0.0, Infinity], "x": -Infinity, "y": NaN}', "cfg")
    assert data["time_step_limit"] == [0.0, math.inf] and data["x"] == -math.inf and math.isnan(data["y"])


def test_duplicate_keys_last_wins_unless_rejected() -> None:
    assert parse_json('{"a": 1, "a": 2}', "cfg") == {"a": 2}  # as json.loads and transformers do
    with pytest.raises(ConfigError, match="cfg: key 'a' appears twice"):
        parse_json('{"a": 1, "a": 2}', "cfg", reject_duplicates=True)


def test_size_bound_is_checked_before_decoding(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"a: 1\n" * 100)  # 500 bytes
    with pytest.raises(ScenarioError, match=r"big.yaml: larger than 499 bytes; not a capacity file"):
        read_text(path, "capacity file", max_bytes=499, error=ScenarioError)
    assert read_text(path, "capacity file", max_bytes=500, error=ScenarioError).startswith("a: 1")


def test_missing_directory_and_bom(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.json: no such file"):
        read_json(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="is a directory"):
        read_json(tmp_path)
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(LLAMA).encode())
    assert read_json(tmp_path / "bom.json") == LLAMA
    with pytest.raises(ConfigError, match="shown.json"):  # the caller's name for the file
        read_json(tmp_path / "missing", display="shown.json")


def _estimate(tmp_path: Path, config: dict) -> tuple[int, str, str]:
    (tmp_path / "config.json").write_text(json.dumps(config))  # json.dumps writes Infinity / NaN
    r = runner.invoke(app, ["estimate", str(tmp_path), "--json"])
    return r.exit_code, r.stdout, r.stderr


def test_infinity_in_a_field_kvplan_does_not_size_with_is_accepted(tmp_path: Path) -> None:
    """Before: 'Infinity is not a valid number in a config' for the whole file (Nemotron-H's time_step_limit)."""
    config = {**LLAMA, "time_step_limit": [0.0, math.inf], "router_aux_loss_coef": math.nan}
    code, out, err = _estimate(tmp_path, config)
    assert code == 0, err
    # 2 layers x 2 kv heads x (256 / 4 = 64) x 2 (K, V) x 2 B = 1,024 B/token
    assert json.loads(out)["per_token"]["kv_bytes_per_token_gpu"] == 1024


@pytest.mark.parametrize("field", ["num_hidden_layers", "num_key_value_heads", "hidden_size", "vocab_size",
                                   "max_position_embeddings", "head_dim", "intermediate_size"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_non_finite_sizing_field_is_rejected_by_name(tmp_path: Path, field: str, value: float) -> None:
    code, _, err = _estimate(tmp_path, {**LLAMA, field: value})
    assert code == 2
    shown = {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan")
    assert f"config.json: field {field} = {shown} is invalid: expected a finite integer" in err, err


def test_non_finite_sliding_window_and_state_dims_are_rejected(tmp_path: Path) -> None:
    code, _, err = _estimate(tmp_path, {**LLAMA, "sliding_window": math.inf})
    assert code == 2 and "field sliding_window = inf" in err, err
    jamba = {**LLAMA, "model_type": "jamba", "attn_layer_period": 2, "attn_layer_offset": 1, "mamba_expand": 2,
             "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_dt_rank": math.inf}
    code, _, err = _estimate(tmp_path, jamba)
    assert code == 2 and "field mamba_dt_rank = inf" in err, err
