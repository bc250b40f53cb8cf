"""Small fixes of the answer-first issue (#38) that land early: --version, `specs show` takes what --model takes,
and the verdicts' templates have no slips ("GPU(s)", "1 -> 1 micro-batches", "-0")."""

from __future__ import annotations

import json

import pytest

from cli_helpers import run, run_ok

from ddplan import __version__


def test_version(capsys):
    code, out, err = run(capsys, ["--version"])
    assert (code, out, err) == (0, f"ddplan {__version__}\n", "")


def test_specs_show_takes_a_config_json_as_model_does(capsys, tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8,
           "num_hidden_layers": 4, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048}
    (tmp_path / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    for name in (str(tmp_path / "config.json"), str(tmp_path)):  # the file, or the folder holding it
        data = json.loads(run_ok(capsys, ["specs", "show", name, "--format", "json"]))
        assert data["spec"]["architecture"]["num_layers"] == 4


@pytest.mark.parametrize("argv", [
    ["table", "--model", "d24", "--gpus", "1,8"],
    ["table", "--model", "d24", "--gpus", "8,16", "--device-batch-size", "32", "--total-batch-size", "524288"],
    ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8,16,64"],
    ["table", "--model", "gpt2", "--hardware", "h100-sxm", "--gpus", "1,2", "--measured-step-time", "2.5",
     "--total-batch-size", "524288", "--device-batch-size", "16"],
    ["plan", "--model", "d24", "--gpus", "1,8"],
    ["memory", "--model", "d24", "--gpus", "1"],
], ids=lambda a: " ".join(a))
def test_no_template_slips_in_the_sentences(capsys, argv):
    code, out, err = run(capsys, [*argv, "--format", "json"])
    assert code == 0, err
    data = json.loads(out)
    words = " ".join(str(x) for key in ("verdict", "reasons", "warnings", "assumptions") for x in data.get(key, []))
    assert words
    for slip in ("GPU(s)", "(s)", "1 -> 1 micro", " -0 ", " -0%", "  "):
        assert slip not in words, (slip, words)


@pytest.mark.parametrize("flag, value, line", [
    ("--fit", "bogus", "error: --fit: 'bogus' is not one of 'auto', 'gemm', 'attention', 'compute'."),
    ("--headroom", "x", "error: --headroom: must be a number"),
    ("--steps", "1.5", "error: --steps: must be a whole number"),
])
def test_flag_type_errors_speak_ddplan_s_words(capsys, flag, value, line):
    """click's "Invalid value for '--fit': Value error, ..." and pydantic's "Input should be a valid number, unable
    to parse string as a number" (issue 33: Python's words), in the form of every other error."""
    from cli_helpers import fails

    _, err = fails(capsys, ["table", "--model", "d24", flag, value])
    assert err == line


def test_hours_band_by_hand():
    from ddplan.units import hours_band

    assert hours_band(0.3501, 0.4952) == "0.35-0.495 h"
    assert hours_band(3.12, 5.4) == "3.1-5.4 h"
    assert hours_band(23771.6, 35161.2) == "23,772-35,161 h"


def test_gradient_buckets_in_a_row_s_words():
    """verdicts.grad_bucket_words: each rule as a row names it; one bucket a chunk without interleaving overlaps
    nothing, which the row says (its reduce waits for the whole backward, its gather blocks the next forward)."""
    from ddplan.layout import Layout
    from ddplan.verdicts import dp_option_words, grad_bucket_words

    assert grad_bucket_words("megatron") == "Megatron-Core's grad buckets"
    assert grad_bucket_words("134217728") == "grad buckets of 134M params"
    assert grad_bucket_words("chunk") == "one grad bucket a chunk"
    assert dp_option_words(Layout(dp=8, zero=1)) == []
    assert dp_option_words(Layout(dp=8, zero=1, grad_bucket="chunk")) == [
        "one grad bucket a chunk (reduce and gather exposed)"]
    assert dp_option_words(Layout(dp=2, pp=4, pp_virtual_stages=2, pp_schedule="interleaved", zero=1,
                                  grad_bucket="chunk")) == ["one grad bucket a chunk"]
