"""The README's test command is the one CI runs."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    assert len(blocks) == 2, "the README gives exactly two set-up commands"
    install_run, tests = blocks
    assert "kvplan estimate" in install_run
    assert "pytest" in tests
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert tests.strip() in [line.strip() for line in ci]


def test_the_hub_config_checks_skip_on_a_plain_clone_and_fail_in_ci_without_their_folder(tmp_path):
    # a plain clone (no ../shared) skips tests/model/test_hub_configs.py and says why; CI (CI=true) must run them, so a
    # missing folder is an error there, never a silent skip
    import os
    import subprocess
    import sys

    def run(ci: str) -> subprocess.CompletedProcess:
        # without the installed plugins (hypothesis', xdist, ...: half of such a run's start-up), which the file needs not
        env = {**os.environ, "KVPLAN_HUB_CONFIGS": str(tmp_path / "missing"), "CI": ci, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                               str(REPO / "tests" / "model" / "test_hub_configs.py")], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=300)

    plain = run("")
    assert plain.returncode in (0, 5) and "1 skipped" in plain.stdout, plain.stdout  # 5: the file alone collects nothing
    assert "../shared/hub-configs beside the repository" in plain.stdout and "a plain clone does not" in plain.stdout
    ci = run("true")
    assert ci.returncode not in (0, 5) and "under CI these checks must run, not be skipped" in ci.stdout, ci.stdout
