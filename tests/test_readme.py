"""Issue 38: the README is a guide a person reads in a minute: at most 250 lines of at most 100 characters;
its set-up is the two commands .ci/run runs; every link to a file resolves; every `ddplan` command in it runs
(tests/test_help.py runs them with the help examples), and the answer each quoted output opens with is the
one the command prints today."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cli_helpers import run

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_short_and_narrow():
    lines = README.splitlines()
    assert len(lines) <= 250
    assert [(i + 1, len(t)) for i, t in enumerate(lines) if len(t) > 100] == []


def test_setup_is_what_ci_runs():
    """The test command is .ci/run's last line; the install matches .ci/run's (torch pinned first, then the
    project with its test extra)."""
    ci = [t for t in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if t.strip() and not t.startswith("#")]
    assert "    pip install \"torch==2.13.0\" && pip install -e \".[test]\" && python3 -m pytest -q" in README
    assert ci[-1] == "python3 -m pytest -q"
    assert any('"torch==2.13.0"' in t for t in ci) and any('-e ".[test]"' in t for t in ci)
    assert "    pip install . && ddplan table --model d24 --gpus 1,8" in README


def test_every_link_to_a_file_resolves():
    links = [m for m in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README) if not m.startswith("http")]
    assert links and [p for p in links if not (ROOT / p).exists()] == []


def quoted_outputs() -> list[tuple[str, str]]:
    """(command, the first paragraph of the output quoted under it, unwrapped) for each ```bash block that a
    ```text block follows."""
    out = []
    for m in re.finditer(r"```bash\n((?:(?!```).)*)```\s*\n```text\n(.*?)```", README, re.S):
        command = " ".join(m.group(1).replace("\\\n", " ").split())
        first, *rest = m.group(2).splitlines()
        para = [first] + [t for t in (rest[:next((i for i, t in enumerate(rest) if not t.startswith("  ")),
                                                 len(rest))])]
        out.append((command, " ".join(" ".join(para).split())))
    return out


@pytest.mark.parametrize("command,opening", quoted_outputs(), ids=lambda x: x[:40] if isinstance(x, str) else x)
def test_quoted_output_opens_as_the_command_does_today(capsys, command, opening):
    """Each quoted output's opening paragraph (its answer) is the command's first line today, word for word:
    a README that quotes yesterday's answer fails here."""
    code, out, _ = run(capsys, [*shlex.split(command)[1:], "--format", "markdown"])
    assert code == 0
    first = out.splitlines()[0]
    assert first.removeprefix("- ") == opening
