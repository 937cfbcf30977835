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
