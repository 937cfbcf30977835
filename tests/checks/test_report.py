"""What-if reports: sweep rows equal full plans, the example runs as-is, every output format parses,
plots are embedded, writes are atomic."""

from __future__ import annotations

import csv
import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.planning.plan import estimate, options_from_values
from kvplan.checks.report import build_report
from kvplan.checks.rows import LABEL_FIELDS, ROW_FIELDS, Pool, make_row
from kvplan.checks.scenario import load_whatif

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def write(tmp_path: Path, text: str, name: str = "whatif.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_rows_equal_full_plans(tmp_path):
    """Every sweep row (pool planned once, rows from memory.py) equals plan_for_spec for that scenario."""
    path = write(tmp_path, """\
        defaults: {prefix_caching: false}
        sweep:
          model: [meta-llama/Llama-3.1-8B, google/gemma-2-9b-it, Qwen/Qwen3-Next-80B-A3B-Thinking]
          gpu: [H100, A100-40GB]
          tp: [1, 2]
          kv_dtype: [auto, fp8]
          max_model_len: [32k, 128k]
          context: [1000, 8k, 32k]
          batch: [1, 7, 64]
        """)
    report = build_report(load_whatif(path), offline=True)
    assert len(report.rows) == 3 * 2 * 2 * 2 * 2 * 3 * 3
    figures = ("kv_bytes_per_token", "weights_bytes", "kv_budget_bytes", "num_blocks", "kv_tokens", "max_requests",
               "max_concurrency", "max_context_at_batch", "fits", "engine_starts", "decode_tokens_per_s")
    for row in report.rows[::7]:
        d = row.to_dict()
        plan = estimate(options_from_values({
            "model": d["model"], "gpu": d["gpu"], "tp": d["tp"], "kv_dtype": d["kv_dtype"], "context": d["context"],
            "batch": d["batch"], "max_model_len": d["max_model_len"], "prefix_caching": False, "offline": True}))
        a = plan.answer
        expected = {
            "kv_bytes_per_token": plan.kv_bytes_per_token_gpu, "weights_bytes": plan.budget.weights.bytes,
            "kv_budget_bytes": plan.budget.kv_budget_bytes, "num_blocks": a.num_blocks, "kv_tokens": a.kv_tokens,
            "max_requests": a.max_requests, "max_concurrency": round(a.max_concurrency, 4),
            "max_context_at_batch": a.max_context_at_batch, "fits": a.fits, "engine_starts": a.engine_starts,
            "decode_tokens_per_s": round(plan.roofline.tokens_per_s, 1) if plan.roofline else None,
        }
        assert {k: d[k] for k in figures} == expected, d


def test_every_option_that_changes_the_plan_is_a_column():
    # engine_version, max_num_seqs and prefix_tokens were missing from the rows (a hand-written column list):
    # the columns come from the option table, only where-to-read options (hub, offline, refresh) left out
    from kvplan.options import SOURCE_ONLY, YAML_OPTIONS

    assert {o.name for o in YAML_OPTIONS} - set(ROW_FIELDS) == set(SOURCE_ONLY)
    assert {"engine_version", "max_num_seqs", "prefix_tokens", "max_num_batched_tokens", "usage_context"} <= set(ROW_FIELDS)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_row_plans_again_from_its_own_columns(tmp_path, engine):
    """Feeding a CSV/JSON row's option columns back into the planner gives the row's figures: every option
    that changes the plan is in the row, as the planner takes it."""
    path = write(tmp_path, f"""\
        defaults: {{engine: {engine}, prefix_tokens: 512, usage_context: llm}}
        sweep:
          model: [meta-llama/Llama-3.1-8B, Qwen/Qwen3-Next-80B-A3B-Thinking]
          gpu: [H100, L40S]
          engine_version: [{'"0.10.1", "0.29"' if engine == 'vllm' else '"0.5.4"'}]
          max_model_len: [16k, 32k]
          context: [1k, 16k]
          batch: [1, 40]
        scenarios:
          - {{model: meta-llama/Llama-3.1-8B, gpu_memory: 23.5GiB, tp: 2, gpu_util: 0.8, block_size: 32, enforce_eager: true,
              max_num_batched_tokens: 4096, kv_dtype: fp8, context: 4k}}
          - {{model: meta-llama/Llama-3.1-8B, max_num_seqs: 8, kv_budget: 9.5GiB, context: 2k, batch: 9}}
          - {{model: Qwen/Qwen3-Next-80B-A3B-Thinking, tp: 4, weights_gib: 170.25, activation_gib: 1.5, max_model_len: 64k}}
        """)
    report = build_report(load_whatif(path), offline=True)
    rows = [r.to_dict() for r in report.rows]
    labels = [k for k in ROW_FIELDS if k in LABEL_FIELDS and k != "name"]
    sample = rows[::5] + rows[-3:]
    assert len({(d["engine_version"], d["max_num_seqs"], d["kv_budget"], d["weights_gib"]) for d in sample}) > 3
    for d in sample:
        plan = estimate(options_from_values({**{k: d[k] for k in labels}, "offline": True}))
        again = make_row(Pool(plan, {}), d["context"], d["batch"], d["max_model_len"], d["name"]).to_dict()
        assert again == d, ({k: v for k, v in d.items() if k in labels and v is not None}, {k: (d[k], again[k]) for k in d if d[k] != again[k]})
        assert d["prefix_tokens"] == 512 and d["usage_context"] == "llm" and d["engine"] == engine


def test_hand_derived_row(tmp_path):
    # Llama-3.1-8B bf16: 131,072 B/token, 2 MiB blocks; a 10 GiB KV budget = 5,120 blocks.
    path = write(tmp_path, """\
        defaults: {model: meta-llama/Llama-3.1-8B, gpu: H100, kv_budget: 10GiB}
        sweep:
          context: [8k, 16k]
          batch: [2]
        """)
    rows = [r.to_dict() for r in build_report(load_whatif(path), offline=True).rows]
    # 8k: 512 blocks/request -> (5,120 - 1) // 512 = 9; 16k: 1,024 blocks -> 4
    assert [r["max_requests"] for r in rows] == [9, 4]
    # KV cache size at max_model_len = context: 5,120 x 8,192 // 512 = 81,920 tokens (both lengths)
    assert [r["kv_tokens"] for r in rows] == [81_920, 81_920]
    # batch 2: 2 x ceil(L/16) <= 5,119 -> L <= 40,944 (independent of the context axis)
    assert [r["max_context_at_batch"] for r in rows] == [40_944, 40_944]
    assert rows[0]["num_blocks"] == 5120 and rows[0]["kv_bytes_per_token"] == 131_072


def test_zip_and_explicit_scenarios(tmp_path):
    path = write(tmp_path, """\
        defaults: {model: meta-llama/Llama-3.1-8B}
        sweep:
          gpu: [H100, A100-40GB, L4]
          tp: [1, 2, 4]
          context: [4k, 8k]
        zip: [[gpu, tp]]
        scenarios:
          - {name: big, model: meta-llama/Llama-3.1-70B, tp: 4, context: 8k}
        """)
    report = build_report(load_whatif(path), offline=True)
    pairs = [(r.to_dict()["gpu"], r.to_dict()["tp"]) for r in report.rows]
    # zipped: 3 (gpu, tp) pairs x 2 contexts, then the explicit row
    assert pairs == [("H100-SXM-80GB", 1)] * 2 + [("A100-SXM-40GB", 2)] * 2 + [("L4-24GB", 4)] * 2 + [("H100-SXM-80GB", 4)]
    assert report.rows[-1].name == "big" and report.rows[-1].to_dict()["model"] == "meta-llama/Llama-3.1-70B"


def test_example_runs_as_is_and_writes_every_format(tmp_path):
    shutil.copy(EXAMPLES / "whatif.yaml", tmp_path / "whatif.yaml")
    r = runner.invoke(app, ["report", str(tmp_path / "whatif.yaml"), "--offline"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "whatif-report"
    n = 2 * 3 * 2 * 7 + 1  # models x GPUs x KV dtypes x contexts + one explicit scenario
    assert f"({n} scenarios)" in r.stdout and "rows not shown" in r.stdout  # 85 rows > 40 in the terminal

    with open(out / "report.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == n and tuple(rows[0]) == ROW_FIELDS
    assert rows[-1]["name"] == "70B on 4x H100, fp8 KV" and rows[-1]["tp"] == "4"

    doc = json.loads((out / "report.json").read_text())
    assert doc["num_rows"] == n and len(doc["rows"]) == n
    assert doc["rows"][0]["kv_bytes_per_token"] == 131_072 and doc["rows"][0]["context"] == 2048
    assert {"model", "gpu", "kv_dtype", "context"} <= set(doc["varying"])

    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from the network
    md = (out / "report.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert links == ["report-concurrency.png", "report-memory.png"]
    for link in links:
        assert (out / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*.tmp"))  # no temporary files left behind


def test_json_on_stdout(tmp_path):
    path = write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nsweep: {gpu: [H100, L4]}\n")
    r = runner.invoke(app, ["report", str(path), "--offline", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [row["gpu"] for row in doc["rows"]] == ["H100-SXM-80GB", "L4-24GB"]


def test_error_leaves_existing_reports_untouched(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "r.csv").write_text("name,model\nOLD,x\n")  # an earlier report's CSV: kvplan may replace it
    path = write(tmp_path, """\
        defaults: {model: meta-llama/Llama-3.1-8B}
        sweep: {tp: [1, 3]}
        outputs: [out/r.csv, out/r.html]
        """)
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 2 and "tp 3 does not divide" in r.stderr
    assert (out / "r.csv").read_text() == "name,model\nOLD,x\n" and not (out / "r.html").exists()
    assert sorted(p.name for p in out.iterdir()) == ["r.csv"]


def test_missing_matplotlib_is_one_line_and_reports_still_written(tmp_path, monkeypatch):
    from kvplan.render import report_plots

    def no_pyplot():
        raise report_plots.PlotsUnavailable("matplotlib is not installed: reports written without plots")

    monkeypatch.setattr(report_plots, "_pyplot", no_pyplot)
    path = write(tmp_path, """\
        defaults: {model: meta-llama/Llama-3.1-8B}
        sweep: {context: [4k, 8k]}
        outputs: [out/r.html, out/r.md]
        """)
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 0, r.output
    assert r.stderr.strip() == "kvplan: warning: matplotlib is not installed: reports written without plots"
    assert "data:image/png" not in (tmp_path / "out" / "r.html").read_text()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r.html", "r.md"]


def test_progress_callback_reaches_the_total(tmp_path):
    path = write(tmp_path, """\
        defaults: {model: meta-llama/Llama-3.1-8B}
        sweep: {gpu: [H100, L4, A100], context: [4k, 8k]}
        """)
    calls = []
    build_report(load_whatif(path), offline=True, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (6, 6) and [c[0] for c in calls] == sorted(c[0] for c in calls)


@pytest.mark.parametrize("rows", [5, 40])
def test_terminal_truncation_says_so(tmp_path, rows):
    path = write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nsweep: {context: [1k, 2k, 3k, 4k, 5k, 6k, 7k, 8k]}\n")
    r = runner.invoke(app, ["report", str(path), "--offline", "--rows", str(rows)])
    assert r.exit_code == 0
    assert ("3 of 8 rows not shown" in r.stdout) == (rows == 5)


# ---------------------------------------------------------------------------------------------
# size bounds, streaming, temporary files


def _values(n: int) -> str:
    return "[" + ", ".join(str(i) for i in range(1, n + 1)) + "]"


def test_ten_million_rows_are_refused_with_the_count(tmp_path):
    # used to run 3 min 48 s, take 6.9 GB and write a 2.3 GB CSV without a word
    path = write(tmp_path, f"defaults: {{model: meta-llama/Llama-3.1-8B}}\nsweep:\n  context: {_values(1000)}\n"
                           f"  batch: {_values(10_000)}\noutputs: [out/r.csv]\n")
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 2
    err = r.stderr.strip()
    assert err.startswith("kvplan: error:") and "\n" not in err
    assert "10,000,000 rows (context 1,000 x batch 10,000), past the bound of 1,000,000 rows" in err and "--force" in err
    assert not (tmp_path / "out").exists()


def test_too_many_configurations_are_refused(tmp_path):
    utils = "[" + ", ".join(f"{0.5 + i / 100_000:.5f}" for i in range(10_001)) + "]"
    path = write(tmp_path, f"defaults: {{model: meta-llama/Llama-3.1-8B}}\nsweep: {{gpu_util: {utils}}}\n")
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 2 and "up to 10,001 configurations to plan" in r.stderr and "10,000" in r.stderr
    with pytest.raises(Exception, match="configurations to plan"):
        build_report(load_whatif(path), offline=True)


def test_streamed_outputs_equal_the_whole_report(tmp_path):
    # the CLI streams rows into CSV / JSON; the files equal the ones rendered from every row at once
    from kvplan.render.report import to_csv, to_json

    path = write(tmp_path, """\
        defaults: {model: meta-llama/Llama-3.1-8B}
        sweep: {gpu: [H100, L4], kv_dtype: [auto, fp8], context: [2k, 8k, 32k], batch: [1, 16]}
        scenarios: [{name: "a, \\"quoted\\" row", gpu: A100, context: 4k}]
        outputs: [out/r.csv, out/r.json]
        """)
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 0, r.output
    whole = build_report(load_whatif(path), offline=True)
    assert (tmp_path / "out" / "r.csv").read_text() == to_csv(whole)
    assert (tmp_path / "out" / "r.json").read_text() == to_json(whole) == json.dumps(whole.to_dict(), indent=1) + "\n"
    r = runner.invoke(app, ["report", str(path), "--offline", "--json"])
    assert json.loads(r.stdout) == whole.to_dict()


# The report's peak memory above what the process held before it (after a small report: imports are not the
# report's memory), as the resident set's high-water mark shows it (Linux's VmHWM, reset to the current size
# first where the kernel allows; not ru_maxrss, which keeps the pytest worker's size from before the exec). It counts
# every allocation, C extensions' too, and bounds the peak from above (an unreset mark only makes it larger).
# Where /proc is missing, tracemalloc's peak of Python's allocations (it slows every allocation: the report ran 6x
# longer under it).
_PEAK = """
import os, sys, tracemalloc
from typer.testing import CliRunner
from kvplan.cli.app import app
runner = CliRunner()
assert runner.invoke(app, ["report", sys.argv[1], "--offline"]).exit_code == 0

def status(key):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(key + ":"))

if os.path.exists("/proc/self/status"):
    before = status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # the high-water mark := the current resident set
    except OSError:
        pass
    r = runner.invoke(app, ["report", sys.argv[2], "--offline"])
    print(status("VmHWM") - before)
else:
    tracemalloc.start()
    r = runner.invoke(app, ["report", sys.argv[2], "--offline"])
    print(tracemalloc.get_traced_memory()[1])
sys.stderr.write(r.stderr)
sys.stdout.write(r.stdout)
sys.exit(r.exit_code)
"""


def test_a_large_report_is_announced_and_streamed_in_flat_memory(tmp_path):
    # 20,000 rows: the old code held every row and both files' text (134 MiB); streaming keeps a head and a tail
    import subprocess
    import sys

    path = write(tmp_path, f"defaults: {{model: meta-llama/Llama-3.1-8B}}\nsweep:\n  context: {_values(20)}\n"
                           f"  batch: {_values(1000)}\noutputs: [out/r.csv, out/r.json]\n")
    warm = write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nsweep: {context: [1k, 2k]}\n"
                           "outputs: [warm/r.csv, warm/r.json]\n", "warm.yaml")
    r = subprocess.run([sys.executable, "-c", _PEAK, str(warm), str(path)], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    peak = int(r.stdout.split("\n", 1)[0])
    assert r.stderr.startswith("kvplan: 20,000 rows (context 20 x batch 1,000) -> ")
    assert "out/r.csv" in r.stderr and "out/r.json" in r.stderr
    with open(tmp_path / "out" / "r.csv", newline="") as fh:
        assert sum(1 for _ in csv.reader(fh)) == 20_001
    assert "19,960 of 20,000 rows not shown" in r.stdout
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.0f} MiB"  # measured: 6 MiB (the old code: 134 MiB)


def test_output_paths_are_checked_before_the_work(tmp_path, monkeypatch):
    from kvplan.checks import report as report_mod

    monkeypatch.setattr(report_mod.Sweep, "plan", lambda self, progress=None: pytest.fail("planned before the check"))
    (tmp_path / "file").write_text("not a folder")
    path = write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nsweep: {gpu: [H100]}\noutputs: [file/r.csv]\n")
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 2 and "cannot write output" in r.stderr and "is not a folder" in r.stderr


def test_temporary_files_of_killed_reports_are_cleaned(tmp_path):
    # kill -9 mid-report leaves a hidden .tmp file (it cannot clean up); the next report removes it
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    path = write(tmp_path, f"defaults: {{model: meta-llama/Llama-3.1-8B}}\nsweep:\n  context: {_values(100)}\n"
                           f"  batch: {_values(5000)}\noutputs: [out/r.csv, out/r.json]\n")
    proc = subprocess.Popen([sys.executable, "-m", "kvplan", "report", str(path), "--offline"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out.is_dir() and any(p.stat().st_size > 0 for p in out.glob(".*.tmp"))):
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = sorted(p.name for p in out.glob(".*.tmp"))
    assert left and all(re.fullmatch(rf"\.r\.(csv|json)\.{proc.pid}\.[0-9a-f]+\.tmp", n) for n in left), left
    # a legacy temporary file (no PID), an hour old, and one of a live writer (this test's own parent)
    legacy = out / ".r.csv.abcdefgh.tmp"
    legacy.write_text("x")
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))
    live = out / f".r.csv.{os.getppid()}.0123abcd.tmp"
    live.write_text("a live writer's")
    small = write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nsweep: {context: [1k, 2k]}\noutputs: [out/r.csv]\n",
                  "small.yaml")
    r = runner.invoke(app, ["report", str(small), "--offline"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.glob(".*.tmp")) == [live.name]


# ---------------------------------------------------------------------------------------------
# size: sizing questions answered by kvplan size's search, in the report's JSON, Markdown and HTML

SIZED = """\
title: sized
defaults: {model: meta-llama/Llama-3.1-8B, context: 8k, engine: sglang}
sweep:
  gpu: [H100, L40S]
size:
  - concurrency: 200
    gpus: [H100, L40S]
  - name: 70B chat
    model: meta-llama/Llama-3.3-70B-Instruct
    concurrency: 100
    at: estimate
    prices: prices.yaml
outputs: [out/report.md, out/report.html, out/report.json]
"""


def test_size_questions_are_the_size_commands_answers(tmp_path):
    import kvplan

    shutil.copy(EXAMPLES / "prices.yaml", tmp_path / "prices.yaml")
    path = write(tmp_path, SIZED)
    report = build_report(load_whatif(path), offline=True)
    (first_name, first), (second_name, second) = report.sizes
    assert (first_name, second_name) == ("200 x meta-llama/Llama-3.1-8B", "70B chat")
    # the defaults fill what a question leaves out (context, engine); the same answer as kvplan size
    alone = kvplan.size("meta-llama/Llama-3.1-8B", concurrency=200, context="8k", gpus=["H100", "L40S"],
                        engine="sglang")
    assert first.to_dict() == alone.to_dict()
    priced = kvplan.size("meta-llama/Llama-3.3-70B-Instruct", concurrency=100, context="8k", engine="sglang",
                         at="estimate", prices=EXAMPLES / "prices.yaml")
    assert [r.to_dict() for r in second.rows] == [r.to_dict() for r in priced.rows]
    assert second.ranked_by == "cost" and second.requirement.at == "estimate"
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert [q["name"] for q in data["size"]] == [first_name, second_name]
    assert data["size"][0]["deployments"] == [row.to_dict() for row in first.rows]
    md = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    for sizing in (first, second):
        assert sizing.best.serve_command in md
        assert sizing.best.serve_command in page
        for row in sizing.rows:
            assert f"| {row.gpu} | {row.replicas} x tp {row.tp}" in md


@pytest.mark.parametrize("entry,words", [
    ("  - {concurrency: 4, context: 1000k}", "maximum length is 131,072"),
    ("  - {concurrency: 4, gpus: [H1000]}", "H1000"),
    ("  - {concurrency: 4, colour: red}", "colour"),
    ("  - {context: 8k}", "concurrency"),
    ("  - {concurrency: 4, prices: missing.yaml}", "missing.yaml"),
])
def test_a_bad_size_question_is_one_located_line(tmp_path, entry, words):
    path = write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nsweep:\n  gpu: [H100]\nsize:\n" + entry + "\n")
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.strip().splitlines()
    assert re.search(r"whatif\.yaml:5:\d+: ", line) and words in line, line


def test_rows_over_a_models_maximum_length_say_why_and_stay_off_the_plot(tmp_path):
    # each model's rows past its maximum length (4k, 4k, 128k) do not fit whatever the memory: every one says why
    # (the same rule as estimate's refusal), no row within its length does, and the plot's lines end at the limit
    path = write(tmp_path, """\
        sweep:
          model: [microsoft/Phi-3-mini-4k-instruct, meta-llama/Llama-2-7b-hf, meta-llama/Llama-3.1-8B]
          gpu: [H200]
          context: [2k, 4k, 8k, 128k, 256k]
        outputs: [r.md, r.csv]
        plots: false
        """)
    report = build_report(load_whatif(path), offline=True)
    limits = {"microsoft/Phi-3-mini-4k-instruct": 4096, "meta-llama/Llama-2-7b-hf": 4096, "meta-llama/Llama-3.1-8B": 131072}
    for row in report.rows:
        d = row.to_dict()
        over = row.context > limits[d["model"]]
        assert (row.why is not None) == over, d
        if over:
            assert not row.fits and f"over the model's maximum length {limits[d['model']]:,}" in row.why
            refusal = estimate(options_from_values({"model": d["model"], "gpu": "H200", "context": row.context,
                                                    "offline": True})).answer.refusal
            assert f"maximum length {limits[d['model']]:,}" in refusal  # one rule, the estimate's
    for pool, points in report.digest.lines.values():  # the concurrency plot: no point past the model's length
        assert max(points) <= limits[pool.labels()["model"]] and min(points.values()) > 0
    note = next(n for n in report.notes if "maximum length" in n)
    assert "Phi-3-mini-4k-instruct" in note and "131,072" in note
    r = runner.invoke(app, ["report", str(path), "--offline"])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "r.md").read_text()
    assert md.count("no: over the model's maximum length 4,096 (max_position_embeddings)") == 2 * 3
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert sum(1 for r in rows if r["why"]) == 3 + 3 + 1
    assert "no (len)" in r.stdout


def test_a_big_reports_plot_shows_every_model_and_names_what_it_leaves_out(tmp_path):
    # 6 models x 2 GPUs x 2 KV dtypes = 24 lines, more than one panel holds (12): one panel per model, all 6 there
    from kvplan.render.report_plots import MAX_SERIES, concurrency_panels

    models = ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B", "google/gemma-2-9b-it", "mistralai/Mistral-7B-v0.1",
              "meta-llama/Llama-3.2-3B", "Qwen/Qwen2.5-7B-Instruct"]
    path = write(tmp_path, f"""\
        sweep: {{model: [{', '.join(models)}], gpu: [H100, L40S], kv_dtype: [auto, fp8], context: [2k, 8k]}}
        """)
    report = build_report(load_whatif(path), offline=True)
    panels, note = concurrency_panels(report)
    assert [m for m, _ in panels] == models and all(len(lines) == 4 for _, lines in panels) and note is None
    # 14 lines of one model: one panel, 12 lines, and the note says 2 are left out
    path = write(tmp_path, """\
        sweep: {model: [meta-llama/Llama-3.1-8B], gpu: [H100, L40S], tp: [1, 2], kv_dtype: [auto, fp8], gpu_util: [0.8, 0.9], context: [2k, 8k]}
        """)
    report = build_report(load_whatif(path), offline=True)
    panels, note = concurrency_panels(report)
    assert len(panels) == 1 and len(panels[0][1]) == MAX_SERIES and note.startswith(f"{MAX_SERIES} of 16 configurations plotted")
    # a second model past 12 lines each: two panels, and the note names the lines each leaves out
    path = write(tmp_path, """\
        sweep: {model: [meta-llama/Llama-3.1-8B, Qwen/Qwen3-8B], gpu: [H100, L40S], tp: [1, 2], kv_dtype: [auto, fp8], gpu_util: [0.8, 0.9], context: [2k, 8k]}
        """)
    report = build_report(load_whatif(path), offline=True)
    panels, note = concurrency_panels(report)
    assert [m for m, _ in panels] == ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-8B"]
    assert "24 of 32 configurations plotted" in note and "Llama-3.1-8B (4 of 16)" in note and "Qwen3-8B (4 of 16)" in note


@pytest.mark.parametrize("engine, dtypes, cannot", [("vllm", "[auto, fp8, int4]", 1), ("sglang", "[auto, fp8, int8, int4]", 2)])
def test_rows_whose_kv_dtype_the_engine_cannot_run_are_said_to_be_a_what_if(tmp_path, engine, dtypes, cannot):
    # check and size said so; a report's rows of int8 / int4 carried the engine's figures with no word
    path = write(tmp_path, f"""\
        defaults: {{model: meta-llama/Llama-3.1-8B, gpu: H100, engine: {engine}}}
        sweep: {{kv_dtype: {dtypes}}}
        """)
    report = build_report(load_whatif(path), offline=True)
    (note,) = [n for n in report.notes if "cannot run" in n]
    assert note.startswith(f"{cannot} of {len(report.rows)} configurations plan a KV dtype their engine cannot run")
    runnable = write(tmp_path, f"defaults: {{model: meta-llama/Llama-3.1-8B, gpu: H100, engine: {engine}}}\n"
                               "sweep: {kv_dtype: [auto, fp8]}\n", name="runnable.yaml")
    assert not any("cannot run" in n for n in build_report(load_whatif(runnable), offline=True).notes)
