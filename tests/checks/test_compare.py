"""Comparisons: a list of values for an option plans each and prints one row per deployment (kvplan.checks.compare)."""

from __future__ import annotations

import json

import pytest

import kvplan

from entry_point import kvplan as run


LLAMA = "meta-llama/Llama-3.1-8B"


def test_a_list_of_gpus_prints_one_row_each_with_the_answers_figures():
    r = run("estimate", LLAMA, "--gpu", "H100,H200,MI300X", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [row["values"]["gpu"] for row in rows] == ["H100", "H200", "MI300X"]
    for row in rows:  # each row is the plan of that GPU alone
        alone = kvplan.estimate(LLAMA, gpu=row["values"]["gpu"]).to_dict()
        assert row["plan"]["answer"] == alone["answer"] and row["error"] is None
    table = run("estimate", LLAMA, "--gpu", "H100,H200,MI300X", "--tp", "1,3", "-b", "32").stdout
    assert all(len(line) <= 80 for line in table.splitlines()), table
    h100 = kvplan.estimate(LLAMA, gpu="H100", batch=32).answer
    assert f"{h100.kv_tokens:,}" in table and "error (1)" in table and "--tp 3 does not divide" in table


@pytest.mark.parametrize("flag,values", [("--tp", "1,2"), ("--kv-dtype", "auto,fp8"), ("--context", "8k,32k"),
                                         ("--gpu", "h100,a100-40gb")])
def test_every_listed_option_compares(flag, values):
    r = run("estimate", "Qwen/Qwen3-8B", flag, values, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["rows"]) == 2 and all(row["plan"] for row in doc["rows"])
    answers = {(row["plan"]["answer"]["kv_tokens"], row["plan"]["answer"]["max_requests"]) for row in doc["rows"]}
    assert len(answers) == 2  # each value changes the plan
