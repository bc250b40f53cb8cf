"""Issue 38: the verdict, reason and warning templates over a grid of cases read as sentences: no "(s)" plural
hedge, no "1 -> 1" non-change, no "-0" or "+0%", no empty clause ("()", ": .", ", ,")."""

from __future__ import annotations

import re

import pytest

from cli_helpers import run

SLIPS = {
    "plural hedge": re.compile(r"\(s\)"),
    "non-change": re.compile(r"(?<![\d.,])(\d+) -> \1(?![\d.])"),
    "signed zero": re.compile(r"(?<![\w.])[-+]0(?:\.0+)?%?(?![.\d])"),
    "empty clause": re.compile(r"\(\s*\)|:\s*\.|,\s*,|,\s*\.|\s\.$"),
}

GRID = [
    ["table", "--model", "d24", "--gpus", "1,8"],
    ["table", "--model", "d24", "--gpus", "1,8", "--total-batch-size", "524288", "--device-batch-size", "32",
     "--window", "L,SSSL", "--measured-step-time", "7.7", "--measured-attention", "sdpa-fused",
     "--measured-window", "L", "--steps", "29000", "--price", "2"],
    ["table", "--model", "d26", "--hardware", "h100-sxm", "--gpus", "1,8"],
    ["table", "--model", "gpt2", "--hardware", "h100-sxm", "--gpus", "1,2,8"],
    ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8,16", "--tp", "1,2"],
    ["table", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "64", "--ep", "8", "--zero", "1",
     "--attention", "fa3"],
    ["table", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--gpus", "8"],
    ["memory", "--model", "d24", "--gpus", "1"],
    ["memory", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "2"],
    ["memory", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "3",
     "--device-batch-size", "2"],
    ["memory", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--gpus", "64", "--zero", "3"],
    ["plan", "--model", "d24", "--gpus", "8"],
    ["plan", "--model", "gpt2", "--hardware", "h100-sxm", "--gpus", "1-16", "--objective", "cost"],
    ["plan", "--model", "d26", "--hardware", "all", "--gpus", "8-64", "--budget", "10"],
]


@pytest.mark.parametrize("argv", GRID, ids=lambda a: " ".join(a[:7]))
def test_every_sentence_reads_without_template_slips(capsys, argv):
    code, out, err = run(capsys, [*argv, "--format", "markdown"])
    assert code in (0, 1), err
    sentences = [t[2:] for t in out.splitlines() if t.startswith("- ")] + err.splitlines()
    assert sentences
    found = [(name, t) for t in sentences for name, slip in SLIPS.items() if slip.search(t)]
    assert found == [], found[:3]
