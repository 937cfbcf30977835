"""kvplan/io/kinds.py: what kind of file a path holds.

Two classes of mistake, each checked for every command it applies to:
- a command that writes a file the user named never replaces a file of another kind (a capacity file, a
  workload, ``hello: world``): exit 2, one line naming the file, the file byte for byte as it was; its own
  earlier output (and an empty or missing file) it does replace;
- a command given another command's file says what the file is and which command reads it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli.app import app
from kvplan.io.kinds import FORMATS, SUFFIX_FORMATS, sniff

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
runner = CliRunner()

SMALL_WHATIF = """\
defaults: {model: meta-llama/Llama-3.1-8B, gpu: H100}
sweep: {context: [4k, 8k]}
outputs: [{outputs}]
plots: [concurrency]
"""
OBSERVE = ["http://127.0.0.1:9/metrics", "--duration", "0.2", "--interval", "0.1"]  # nothing listens on port 9
LOG = next((REPO / "benchmarks" / "corpus" / "vllm").glob("vllm-12330-a100-40-llama3-8b.log"))

FOREIGN = {  # files a user may have at the path they typed: none is an output of the command writing there
    "capacity file": (EXAMPLES / "capacity.yaml").read_bytes(),
    "workload file": (EXAMPLES / "shared_prompt.yaml").read_bytes(),
    "mapping": b"hello: world\n",
    "notes": b"notes to self, not a kvplan file\n",
}


def _writers(tmp: Path, target: Path) -> dict[str, list[str]]:
    """Every command that writes a user-named file, writing to ``target``."""
    whatif = tmp / "w.yaml"
    whatif.write_text(SMALL_WHATIF.replace("{outputs}", target.name))
    return {
        "check --junit-xml": ["check", str(EXAMPLES / "capacity.yaml"), "--offline", "--junit-xml", str(target)],
        "report outputs": ["report", str(whatif), "--offline"],
        "simulate --plot": ["simulate", str(EXAMPLES / "shared_prompt.yaml"), "--plot", str(target)],
        "observe --csv": ["observe", *OBSERVE, "--model", "meta-llama/Llama-3.1-8B", "--csv", str(target)],
        "observe --plot": ["observe", *OBSERVE, "--model", "meta-llama/Llama-3.1-8B", "--plot", str(target)],
        "observe --fit-timing": ["observe", *OBSERVE, "--model", "meta-llama/Llama-3.1-8B",
                                 "--fit-timing", str(target)],
        "explain --calibrate": ["explain", str(LOG), "--model", "meta-llama/Meta-Llama-3-8B", "--calibrate", str(target)],
    }


TARGET_NAMES = {"check --junit-xml": "out.xml", "report outputs": "out.md", "simulate --plot": "out.png",
                "observe --csv": "out.csv", "observe --plot": "out.svg", "observe --fit-timing": "timing.yaml",
                "explain --calibrate": "calib.yaml"}


@pytest.mark.parametrize("foreign", sorted(FOREIGN))
@pytest.mark.parametrize("writer", sorted(TARGET_NAMES))
def test_no_command_replaces_a_file_of_another_kind(tmp_path, writer, foreign):
    if writer in ("simulate --plot", "observe --plot", "report outputs"):
        pytest.importorskip("matplotlib")
    target = tmp_path / TARGET_NAMES[writer]
    target.write_bytes(FOREIGN[foreign])
    r = runner.invoke(app, _writers(tmp_path, target)[writer])
    assert r.exit_code == 2, r.output
    assert target.read_bytes() == FOREIGN[foreign]  # untouched
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and target.name in err[0] and "Traceback" not in r.output
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_markdown_reports_plots_never_replace_another_file(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "w.yaml").write_text(SMALL_WHATIF.replace("{outputs}", "r.md, r.csv"))
    png = tmp_path / "r-concurrency.png"
    png.write_bytes(FOREIGN["capacity file"])
    r = runner.invoke(app, ["report", str(tmp_path / "w.yaml"), "--offline"])
    assert r.exit_code == 2 and "r-concurrency.png" in r.stderr and "capacity file" in r.stderr
    assert png.read_bytes() == FOREIGN["capacity file"]
    assert not (tmp_path / "r.md").exists() and not (tmp_path / "r.csv").exists()  # all or nothing


def test_each_command_replaces_its_own_output(tmp_path):
    pytest.importorskip("matplotlib")
    outs = ["r.md", "r.html", "r.csv", "r.json"]
    (tmp_path / "w.yaml").write_text(SMALL_WHATIF.replace("{outputs}", ", ".join(outs)))
    junit = tmp_path / "j.xml"
    for _ in range(2):  # the second run replaces the first's files
        r = runner.invoke(app, ["report", str(tmp_path / "w.yaml"), "--offline"])
        assert r.exit_code == 0, r.output
        r = runner.invoke(app, ["check", str(EXAMPLES / "capacity.yaml"), "--offline", "--junit-xml", str(junit)])
        assert r.exit_code in (0, 1), r.output
    written = [tmp_path / n for n in outs] + [tmp_path / "r-concurrency.png", junit]
    for path in written:  # what kvplan writes is told as the kind it writes
        assert sniff(path.read_bytes()) == FORMATS[SUFFIX_FORMATS[path.suffix]], path
    cut = (tmp_path / "r.json").read_bytes()[:40]  # a long JSON output is read in part: still JSON
    assert sniff(cut, whole=False) == "JSON"
    (tmp_path / "empty.md").write_text("")  # an empty file may be replaced
    (tmp_path / "w.yaml").write_text(SMALL_WHATIF.replace("{outputs}", "empty.md"))
    assert runner.invoke(app, ["report", str(tmp_path / "w.yaml"), "--offline"]).exit_code == 0


def test_calibrate_refuses_what_is_not_a_calibration_file(tmp_path):
    cases = {
        "cap.yaml": (FOREIGN["capacity file"], "cap.yaml is not a calibration file: it has defaults, checks"),
        "hello.yaml": (b"hello: world\n", "hello.yaml is not a calibration file: it has hello"),
        "list.yaml": (b"- 1\n- 2\n", "list.yaml is not a calibration file: it holds a list"),
        "bad.yaml": (b"calibrations: [\n", "bad.yaml:2:1: not valid YAML"),
        "zero.yaml": (b"0\n", "zero.yaml is not a calibration file: it holds the value '0'"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        r = runner.invoke(app, ["explain", str(LOG), "--model", "meta-llama/Meta-Llama-3-8B", "--calibrate", str(path)])
        assert r.exit_code == 2 and message in r.stderr, (name, r.output)
        assert path.read_bytes() == data
    folder = tmp_path / "dir"
    folder.mkdir()
    r = runner.invoke(app, ["explain", str(LOG), "--model", "meta-llama/Meta-Llama-3-8B", "--calibrate", str(folder)])
    assert r.exit_code == 2 and "is a directory" in r.stderr
    # --calibration reads the same way: a capacity file is named for what it is
    r = runner.invoke(app, ["estimate", "meta-llama/Llama-3.1-8B", "--calibration", str(tmp_path / "cap.yaml")])
    assert r.exit_code == 2 and "not a calibration file" in r.stderr and "kvplan check" in r.stderr


def test_calibrate_keeps_the_other_entries_of_a_calibration_file(tmp_path):
    cal = tmp_path / "calib.yaml"
    other = ("calibrations:\n- {model: x/y, gpu: H100-SXM-80GB, gpu_memory_bytes: 85045477376, engine: vllm, release: '0.18',\n"
             "   tp: 2, pp: 1, dtype: bfloat16, max_num_batched_tokens: 8192, max_num_seqs: 256,\n"
             "   terms: {weights_bytes: 1000}, source: other.log}\n")
    cal.write_text(other)
    r = runner.invoke(app, ["explain", str(LOG), "--model", "meta-llama/Meta-Llama-3-8B", "--calibrate", str(cal)])
    assert r.exit_code == 0, r.output
    import yaml

    entries = yaml.safe_load(cal.read_text())["calibrations"]
    assert [e["model"] for e in entries] == ["x/y", "meta-llama/Meta-Llama-3-8B"]
    assert entries[0]["terms"] == {"weights_bytes": 1000}


KIND_FILES = {  # each kind of kvplan file, and the command that reads it
    "capacity file": (EXAMPLES / "capacity.yaml", ["check"]),
    "what-if file": (EXAMPLES / "whatif.yaml", ["report"]),
    "workload file": (EXAMPLES / "shared_prompt.yaml", ["simulate"]),
    "timing file": (EXAMPLES / "timing.yaml", ["simulate", str(EXAMPLES / "shared_prompt.yaml"), "--timing"]),
}


@pytest.mark.parametrize("given", sorted(KIND_FILES))
@pytest.mark.parametrize("reader", sorted(KIND_FILES))
def test_a_command_given_another_commands_file_says_what_it_is(tmp_path, given, reader):
    if given == reader:
        return
    path = tmp_path / "file.yaml"
    shutil.copy(KIND_FILES[given][0], path)
    r = runner.invoke(app, [*KIND_FILES[reader][1], str(path), "--offline"])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, r.stderr  # one line, not the schema's allowed keys
    assert f"this is a {given}" in err[0] and f"not a {reader}" in err[0]
    reads = {"capacity file": "kvplan check", "what-if file": "kvplan report", "workload file": "kvplan simulate",
             "timing file": "kvplan simulate --timing"}
    assert f"which {reads[given]} reads" in err[0]


def test_a_calibration_file_given_to_a_command_says_what_it_is(tmp_path):
    cal = tmp_path / "c.yaml"
    cal.write_text("calibrations: []\n")
    for args in (["check", str(cal)], ["report", str(cal)], ["simulate", str(cal)]):
        r = runner.invoke(app, [*args, "--offline"])
        assert r.exit_code == 2 and "this is a calibration file, which the --calibration option reads" in r.stderr, r.output
