"""The README's "Install" and "Run and test" commands are the ones CI (.ci/run) runs.

A user on a fresh machine follows the README; CI claims to run exactly those steps. This test
reads both files so the two cannot drift apart (e.g. an install line without the test extra,
after which ``python -m pytest tests`` finds no pytest).
"""
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _first_code_block(text, heading):
    """Lines of the first fenced block after the ``## heading`` line."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)^```\n(.*?)^```", text, re.M | re.S)
    assert match, f"README.md has no code block under '## {heading}'"
    return match.group(2).splitlines()


def readme_commands():
    """``(argv, comment)`` of each README install / run / test command, in order."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for heading in ("Install", "Run and test"):
        for line in _first_code_block(text, heading):
            command, _, comment = line.partition("#")
            if command.strip():
                commands.append((shlex.split(command), comment))
    return commands


def ci_commands():
    """argv of each ``readme_step`` of .ci/run, in order, spelled as the README spells it:
    ``python3 -m pip`` -> ``pip``, ``python3`` -> ``python``."""
    commands = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        if not line.startswith("readme_step "):
            continue
        argv = shlex.split(line)[2:]  # readme_step "name" command...
        if argv[:3] == ["python3", "-m", "pip"]:
            argv = ["pip"] + argv[3:]
        elif argv[:1] == ["python3"]:
            argv = ["python"] + argv[1:]
        commands.append(argv)
    return commands


def test_readme_install_includes_the_test_extra():
    installs = [argv for argv, _ in readme_commands() if argv[:2] == ["pip", "install"]]
    assert any(arg.startswith(".[") and "test" in arg for argv in installs for arg in argv), (
        "the README's install step must install the test extra (pip install \".[test]\"), "
        "else its test command fails with 'No module named pytest'"
    )
    assert ["python", "-m", "pytest", "tests"] in [argv for argv, _ in readme_commands()]


def test_ci_runs_exactly_the_readme_commands():
    readme = readme_commands()
    ci = ci_commands()
    assert len(ci) == len(readme), (ci, readme)
    for ci_argv, (readme_argv, comment) in zip(ci, readme):
        if ci_argv != readme_argv:
            # The one allowed difference: CI pins torch to the version the README names.
            pinned = [arg for arg in ci_argv if arg.startswith("torch==")]
            assert readme_argv == ["pip", "install", "torch"] and len(pinned) == 1, (
                f".ci/run runs {ci_argv}; the README says {readme_argv}"
            )
            assert ci_argv == ["pip", "install", pinned[0]]
            assert pinned[0] in comment, (
                f".ci/run pins {pinned[0]}; the README's torch line must name it ({comment!r})"
            )
