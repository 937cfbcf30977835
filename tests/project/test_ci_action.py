"""The GitHub Action (action.yml) and the pre-commit hook (.pre-commit-hooks.yaml) run as declared.

The action's shell steps are run here as GitHub runs them (bash, the step's env with the inputs filled
in, GITHUB_ACTIONS=true); the ``uses:`` steps are checked for what they consume (the publish step reads
the JUnit file the check step wrote). Installing is recorded, not executed (no network in tests).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
CAPACITY = ROOT / "docs" / "examples" / "capacity.yaml"


def _inputs(**given: str) -> dict[str, str]:
    values = {name: str(spec.get("default", "")) for name, spec in ACTION["inputs"].items()}
    values.update(given)
    return values


def _expand(text: str, inputs: dict[str, str], action_path: Path) -> str:
    """GitHub's ``${{ inputs.x }}`` and ``${{ github.action_path }}`` substitution."""
    text = re.sub(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", lambda m: inputs[m.group(1)], text)
    return re.sub(r"\$\{\{\s*github\.action_path\s*\}\}", str(action_path), text)


@pytest.fixture
def shims(tmp_path: Path) -> Path:
    """`kvplan` runs this checkout (as the install step would provide it); `python -m pip` is recorded."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kvplan").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m kvplan "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path / "pip.log"}"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def run_action(workdir: Path, shims: Path, **given: str) -> tuple[int, str, dict[str, str]]:
    """Run the composite action's shell steps in order (stopping after a failed step, as GitHub does,
    except for steps marked always()). Returns (exit code of the check step, its stdout, inputs)."""
    inputs = _inputs(**given)
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "GITHUB_ACTIONS": "true",
           "PYTHONPATH": str(ROOT), "GITHUB_WORKSPACE": str(workdir)}
    code, out = 0, ""
    for step in ACTION["runs"]["steps"]:
        if "run" not in step:
            continue
        assert step["shell"] == "bash"
        step_env = {k: _expand(str(v), inputs, ROOT) for k, v in step.get("env", {}).items()}
        r = subprocess.run(["bash", "-eo", "pipefail", "-c", _expand(step["run"], inputs, ROOT)], cwd=workdir,
                           env={**env, **step_env}, capture_output=True, text=True, timeout=120)
        if step["name"] == "kvplan check":
            code, out = r.returncode, r.stdout + r.stderr
        elif r.returncode:
            raise AssertionError(f"step {step['name']!r} failed: {r.stderr}")
    return code, out, inputs


def _publish_step() -> dict:
    return next(s for s in ACTION["runs"]["steps"] if s.get("uses", "").startswith("mikepenz/action-junit-report"))


def _write(workdir: Path, text: str) -> None:
    (workdir / "capacity.yaml").write_text(text)


def test_the_action_checks_a_passing_file_and_installs_its_own_source(tmp_path, shims):
    _write(tmp_path, CAPACITY.read_text())
    code, out, inputs = run_action(tmp_path, shims)
    assert code == 0, out
    assert (tmp_path / "pip.log").read_text().split() == ["-m", "pip", "install", "--quiet", str(ROOT)]
    suite = ET.parse(tmp_path / inputs["junit-xml"]).getroot().find("testsuite")
    assert suite.get("failures") == "0" and int(suite.get("tests")) >= 1
    # the publish step runs always() and reads the file the check step wrote
    publish = _publish_step()
    assert "always()" in publish["if"] and _expand(publish["with"]["report_paths"], inputs, ROOT) == inputs["junit-xml"]


def test_the_action_annotates_and_publishes_a_failing_check(tmp_path, shims):
    _write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B, gpu: H100, context: 8k}\n"
                     "checks:\n  - name: too-many\n    require: {concurrency: 500}\n")
    code, out, inputs = run_action(tmp_path, shims, version="0.1.0")
    assert code == 1
    assert "::error file=capacity.yaml,line=3" in out and "too-many" in out
    assert (tmp_path / "pip.log").read_text().split() == ["-m", "pip", "install", "--quiet", "kvplan==0.1.0"]
    suite = ET.parse(tmp_path / inputs["junit-xml"]).getroot().find("testsuite")
    assert suite.get("failures") == "1" and suite.find("testcase/failure") is not None


def test_the_action_publishes_an_invalid_file_as_one_error(tmp_path, shims):
    _write(tmp_path, "defaults: {model: meta-llama/Llama-3.1-8B}\nchecks:\n  - name: a\n    require: {concurency: 4}\n")
    code, out, inputs = run_action(tmp_path, shims, **{"junit-xml": "reports/junit.xml"})
    assert code == 2
    assert "::error file=capacity.yaml,line=4" in out and "concurency" in out
    case = ET.parse(tmp_path / "reports" / "junit.xml").getroot().find("testsuite/testcase")
    assert case.get("name") == "capacity file is valid" and case.find("error") is not None


def test_the_pre_commit_hook_runs_kvplan_check(tmp_path):
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "kvplan-check")
    assert hook["language"] == "python" and hook["entry"].split()[0] == "kvplan"
    assert re.search(hook["files"], "ops/capacity.yaml") and re.search(hook["files"], "kvplan-capacity.yml")
    assert not re.search(hook["files"], "workload.yaml")
    _write(tmp_path, CAPACITY.read_text())
    # pre-commit runs `entry args` (pass_filenames: false) in the repository root
    cmd = [sys.executable, "-m", "kvplan", *hook["entry"].split()[1:], *hook["args"]]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "checks passed" in r.stdout
