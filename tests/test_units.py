"""Units: sizes (GB vs GiB), token counts (k = 1024), dtype byte counts."""

import math

import pytest
from hypothesis import given, strategies as st

from kvplan.errors import InputError
from kvplan.units import (BF16, FP8_E4M3, INT4, INT4_WEIGHTS, GB, GiB, cdiv, fmt_bytes, parse_bytes, parse_dtype,
                          parse_gib, parse_tokens)


@pytest.mark.parametrize("text,expected", [
    ("80GB", 80 * 10**9),
    ("80GiB", 80 * 2**30),
    ("24gib", 24 * 2**30),
    ("512MiB", 512 * 2**20),
    ("1.5GiB", 3 * 2**29),
    ("1000", 1000),
    ("1e9", 10**9),
])
def test_parse_bytes_knows_gb_from_gib(text, expected):
    assert parse_bytes(text) == expected


def test_parse_gib_treats_bare_numbers_as_gib():
    assert parse_gib("15") == 15 * GiB
    assert parse_gib(0.5) == GiB // 2
    assert parse_gib("80GB") == 80 * GB


@pytest.mark.parametrize("text,expected", [("8192", 8192), ("8k", 8192), ("128k", 131072), ("1m", 1 << 20), (4096, 4096)])
def test_parse_tokens_k_is_1024(text, expected):
    assert parse_tokens(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "-1", "0", "8q", "nan", "inf", "1.5"])
def test_bad_token_counts_are_input_errors(bad):
    with pytest.raises(InputError):
        parse_tokens(bad)


@pytest.mark.parametrize("bad", ["", "lots", "-5GB", "0", "12XB", float("nan"), True])
def test_bad_sizes_are_input_errors(bad):
    with pytest.raises(InputError):
        parse_bytes(bad)


def test_dtype_bytes():
    assert BF16.nbytes(128) == 256
    assert FP8_E4M3.nbytes(128) == 128
    # int4 KV: 128 values = 64 bytes packed + 128/32 = 4 fp16 scales = 8 bytes
    assert INT4.nbytes(128) == 72
    # int4 weights: 1,000,000 params = 500,000 B + ceil(1e6 / 128) = 7,813 scales x 2 B
    assert INT4_WEIGHTS.nbytes(1_000_000) == 500_000 + 7_813 * 2
    assert parse_dtype("torch.bfloat16") is BF16
    assert parse_dtype("fp8") is FP8_E4M3
    with pytest.raises(InputError):
        parse_dtype("fp7")


def test_cdiv_and_format():
    assert cdiv(8192, 16) == 512 and cdiv(8193, 16) == 513
    assert fmt_bytes(131072) == "128 KiB"
    assert fmt_bytes(GiB) == "1 GiB"
    assert fmt_bytes(1536 * 2**20) == "1.50 GiB"


@given(st.integers(0, 10**12), st.one_of(st.floats(0, 1e6), st.sampled_from([1e300, 4.0, 1.1, 0.1, 2.5, 0.0, 1 / 3])))
def test_scaled_is_the_exact_floor_and_ceiling_of_the_product(n, factor):
    # rope factors scale lengths and table rows: 4 x 1.1 must give 4, not floor(4.4000000000000004), and
    # 1e300 a huge integer (bounded by the caller), never an overflow
    from fractions import Fraction

    from kvplan.units import scaled

    exact = Fraction(n) * Fraction(factor)
    assert scaled(n, factor) == math.floor(exact) and scaled(n, factor, ceil=True) == math.ceil(exact)


# ---------------------------------------------------------------------------------------------
# one duration format: "3600 s" sat beside "3,600.0 s" (simulate's traffic line and its table)


@pytest.mark.parametrize(("seconds", "text"), [(0.25, "250 ms"), (1, "1.0 s"), (3600, "3,600.0 s"), (90_061.5, "90,061.5 s")])
def test_one_duration_format(seconds, text):
    from kvplan.units import fmt_seconds

    assert fmt_seconds(seconds) == text
