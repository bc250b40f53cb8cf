"""Bad input never ends in a traceback, a hang or a non-finite result.

A regression corpus (the cases a fuzz pass found, issues 10 and 33) and seeded fuzz tests (hypothesis,
derandomized, a fixed number of examples: 500 in all) that mutate built-in specs (60), flag values (120),
calibration files (130), Hugging Face configs (130) and output paths (60), and assert: exit 0 with finite numbers
on stdout, or exit 1/2 with exactly one `error:` line; never "internal error"; a value of another kind than the
one it replaced (a bool or text for a number) refused, never read as something else.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_helpers import data_lines

from ddplan import cli
from ddplan.registry import builtin_dir

NASTY = [0, -1, 1e30, 10**40, float("inf"), float("-inf"), float("nan"), "x", None, [], {}, True, 1e-300, 2**63]
FLAG_VALUES = ["0", "-1", "nan", "inf", "-inf", "1e400", "1e-300", "999999999999999999999999999999", "abc", "",
               "8,8", "1,", ",", "1.5", "3",
               # and values that can be right for some flag, so that the fuzz also reaches priced results
               "1", "2", "4", "8", "16", "1000", "0.1", "none", "full", "bf16", "fp32", "L", "SSSL", "2048"]
SCALES = [0.5, 2.0, 10.0, 1e-3]  # a plausible spec edit: a number scaled
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


OUTCOMES: dict[int, int] = {}  # exit code -> count, to see that the fuzz reaches both outcomes
# one pytest-xdist worker runs the module in file order: test_the_fuzz_reached_both_outcomes reads what the fuzz
# tests before it counted in the same process
pytestmark = pytest.mark.xdist_group("fuzz")


def check_outcome(argv: list[str]) -> int:
    """Exit 0 with finite csv figures, or exit 1/2 with one `error:` line; never an internal error."""
    code, out, err = run(argv)
    OUTCOMES[code] = OUTCOMES.get(code, 0) + 1
    assert "internal error" not in err and "Traceback" not in err, (argv, err)
    if code == 0:
        if "--format" in argv and argv[argv.index("--format") + 1] == "csv":
            for row in csv.DictReader(io.StringIO(data_lines(out))):
                for key, value in row.items():
                    try:
                        number = float(value)
                    except (TypeError, ValueError):
                        continue
                    assert math.isfinite(number), (argv, key, value)
        return code
    assert code in (1, 2), (argv, code, err)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.count("\n") == 1, (argv, err)
    return code


# --------------------------------------------------------------------------------------------
# the regression corpus


@pytest.mark.parametrize("argv", [
    ["plan", "--model", "d12", "--gpus", "1000000000"],
    ["memory", "--model", "d99999999"],
    ["specs", "show", "d99999999"],
    *[["table", "--model", "d24", "--tokens", v] for v in ("inf", "nan", "1e400", "1e-300")],
    *[["table", "--model", "d24", "--param-data-ratio", v] for v in ("inf", "nan")],
    ["table", "--model", "d24", "--price", "nan"],
    ["table", "--model", "d24", "--price", "inf"],
    ["table", "--model", "d24", "--measured-step-time", "nan"],
    *[["table", "--model", "d24", "--startup-min", v] for v in ("nan", "inf")],
    ["memory", "--model", "d24", "--measured-peak", "nan"],
    ["table", "--model", "d24", "--gpus", "999999999999999999999999999999"],
    ["plan", "--model", "d24", "--gpus", "1,2,4,8,16,32,64,128,256,512", "--hardware",
     "mi300x,mi325x,mi355x,h100-sxm,h100-pcie,h200,b200,a100-sxm-80gb"],
], ids=lambda a: " ".join(a[:1] + a[3:]))
def test_regression_flags_are_one_line_errors(argv):
    assert check_outcome(argv) in (1, 2)


def test_duplicate_gpu_counts_give_one_row_each():
    code, out, _ = run(["table", "--model", "d24", "--gpus", "8,8", "--attention", "sdpa-fused", "--window", "L",
                        "--format", "csv"])
    assert code == 0 and len(list(csv.DictReader(io.StringIO(data_lines(out))))) == 1


def _write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return str(path)


def _spec_text(kind: str, name: str, **changes) -> str:
    data = yaml.safe_load((builtin_dir(kind) / f"{name}.yaml").read_text(encoding="utf-8"))
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize("name, text, words", [
    ("latin1.yaml", b"kind: model\nname: caf\xe9\n", "not UTF-8"),
    ("deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("bigint.yaml", "kind: model\nnum: " + "9" * 5000 + "\n", "4,300 digits"),
    ("dup.yaml", "kind: model\nname: a\nname: b\n", "duplicate key 'name' on lines 2 and 3"),
    ("inf-latency.yaml", _spec_text("hardware", "mi300x", **{"intra_node.latency_us.value": float("inf")}),
     "intra_node.latency_us.value"),
    ("inf-peak.yaml", _spec_text("hardware", "mi300x", **{"peak.bf16_tflops.value": float("inf")}),
     "peak.bf16_tflops.value"),
    ("huge-eval.yaml", _spec_text("models", "nanochat-d24", **{"recipe.evaluation.tokens": 10**30}),
     "recipe.evaluation.tokens"),
], ids=lambda x: x if isinstance(x, str) and x.endswith(".yaml") else "")
def test_regression_spec_files_are_one_line_errors(tmp_path, name, text, words):
    path = _write(tmp_path, name, text)
    code, _, err = run(["specs", "show", path])
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"error: {path}: "), err
    assert words in err, err


def test_regression_a_folder_given_as_a_spec(tmp_path):
    code, _, err = run(["table", "--model", str(tmp_path)])
    assert code == 1 and "folder" in err and err.count("\n") == 1


def test_regression_calibration_with_an_infinite_size(tmp_path):
    path = _write(tmp_path, "cal.yaml", yaml.safe_dump({
        "kind": "calibration", "version": 1, "hardware": "mi300x",
        "collectives": [{"collective": "all_reduce", "group_size": 8, "size_bytes": float("inf"), "time_s": 1e-3}]}))
    code, _, err = run(["table", "--model", "d24", "--calibration", path])
    assert code == 1 and "collectives.0.size_bytes" in err and err.count("\n") == 1, err


# --------------------------------------------------------------------------------------------
# seeded fuzz: specs


def _leaves(node, prefix=()):
    """(path, value) of every scalar in a parsed spec."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, (*prefix, i))
    else:
        yield prefix, node


SPECS = [("hardware", "mi300x"), ("hardware", "h100-sxm"), ("models", "nanochat-d24"), ("models", "llama-3-8b"),
         ("models", "gpt2-124m")]


@FUZZ
@given(spec=st.sampled_from(SPECS), pick=st.integers(0, 10**6),
       value=st.one_of(st.sampled_from(NASTY), st.sampled_from(SCALES).map(lambda f: ("scale", f))))
def test_fuzz_mutated_specs(tmp_path_factory, spec, pick, value):
    kind, name = spec
    data = yaml.safe_load((builtin_dir(kind) / f"{name}.yaml").read_text(encoding="utf-8"))
    changed = _mutate(data, pick, value)  # ("scale", f): a number scaled, an integer kept an integer
    if changed is None:
        return
    file = tmp_path_factory.mktemp("fuzz") / f"{name}.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    check_typed(["specs", "show", str(file)], *changed)
    which = ["--hardware", str(file), "--model", "d12"] if kind == "hardware" else ["--model", str(file)]
    check_typed(["table", *which, "--gpus", "8", "--format", "csv"], *changed)


# --------------------------------------------------------------------------------------------
# seeded fuzz: flags

TABLE_FLAGS = ["--gpus", "--tp", "--pp", "--vp", "--zero", "--device-batch-size", "--recompute", "--seq-len",
               "--dtype", "--price", "--steps", "--tokens", "--param-data-ratio", "--total-batch-size", "--headroom",
               "--measured-step-time", "--startup-min", "--eval-every", "--eval-tokens", "--checkpoint-every",
               "--window"]
MEMORY_FLAGS = ["--gpus", "--tp", "--pp", "--vp", "--zero", "--device-batch-size", "--recompute", "--seq-len",
                "--dtype", "--headroom", "--measured-peak", "--window"]
PLAN_FLAGS = ["--gpus", "--deadline", "--budget", "--price", "--total-batch-size", "--seq-len", "--dtype", "--top",
              "--headroom", "--startup-min"]


@settings(FUZZ, max_examples=120)
@given(command=st.sampled_from(["table", "memory", "plan"]), picks=st.lists(st.integers(0, 1000), min_size=1,
                                                                           max_size=2),
       values=st.lists(st.sampled_from(FLAG_VALUES), min_size=3, max_size=3))
def test_fuzz_flags(command, picks, values):
    flags = {"table": TABLE_FLAGS, "memory": MEMORY_FLAGS, "plan": PLAN_FLAGS}[command]
    argv = [command, "--model", "d12", "--format", "csv"]
    if command == "plan":
        argv += ["--gpus", "8"]
    for pick, value in zip(picks, values):
        argv += [flags[pick % len(flags)], value]
    check_outcome(argv)


def test_the_fuzz_reached_both_outcomes():
    """Run after the fuzz tests (file order): some mutated inputs still price, most are refused."""
    if not OUTCOMES:
        pytest.skip("run with the fuzz tests")
    assert OUTCOMES.get(0, 0) > 0 and OUTCOMES.get(1, 0) + OUTCOMES.get(2, 0) > 0, OUTCOMES


def test_reference_lists_every_flag_range():
    from ddplan import bounds

    readme = (Path(__file__).resolve().parent.parent / "docs" / "reference.md").read_text(encoding="utf-8")
    for flag in bounds.RANGES:
        assert f"| `{flag}` | {bounds.describe(flag)} |" in readme, flag


# --------------------------------------------------------------------------------------------
# second review's findings, kept as tests


def test_yaml_merge_keys_still_load_and_same_line_duplicates_do_not(tmp_path):
    from ddplan.specfile import read_yaml
    from ddplan.errors import SpecError

    merge = Path(_write(tmp_path, "merge.yaml", "base: &b {x: 1, y: 2}\nthing:\n  <<: *b\n  y: 3\n"))
    assert read_yaml(merge)["thing"] == {"x": 1, "y": 3}
    same_line = Path(_write(tmp_path, "same.yaml", "a: {k: 1, k: 2}\n"))
    with pytest.raises(SpecError, match="duplicate key 'k' on lines 1 and 1"):
        read_yaml(same_line)


def test_an_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = _write(tmp_path, "laughs.yaml", "\n".join(lines) + "\n")
    code, _, err = run(["specs", "show", path])
    assert code == 1 and "aliases are expanded" in err and err.count("\n") == 1


# --------------------------------------------------------------------------------------------
# seeded fuzz: calibration files, Hugging Face configs and output paths (issue 33)


def _kind(value) -> str:
    """A value's kind as a YAML or JSON file has it: number, bool, text, list, mapping or null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "text", list: "list", dict: "mapping"}.get(type(value), "other")


def _mutate(data, pick: int, value):
    """data with one scalar leaf replaced (or scaled: ("scale", f)); (old, new) values, or None to skip."""
    leaves = list(_leaves(data))
    path, _ = leaves[pick % len(leaves)]
    node = data
    for p in path[:-1]:
        node = node[p]
    old = node[path[-1]]
    if isinstance(value, tuple):
        if isinstance(old, bool) or not isinstance(old, (int, float)):
            return None
        value = type(old)(old * value[1]) if isinstance(old, float) else max(1, int(old * value[1]))
    node[path[-1]] = value
    return old, value


def check_typed(argv: list[str], old, new) -> None:
    """check_outcome, and a value of another kind than the one it replaced (a bool or text for a number, a
    mapping for a list, ...) is refused, never read as something else (null may be an optional field's)."""
    code = check_outcome(argv)
    if _kind(new) not in (_kind(old), "null"):
        assert code in (1, 2), (argv, old, new)


CALIBRATION = {
    "kind": "calibration", "version": 1, "hardware": "mi300x", "seq_len": 2048, "dtype": "bf16",
    "hbm_tbyte_per_s": 4.1, "kernel_overhead_us": 8.0, "peak_gemm_tflops": 700.0,
    "gemm": [{"m": 65536, "n": 1536, "k": 1536, "dtype": "bf16", "tflops": 480.0, "spread_pct": 2.0},
             {"m": 65536, "n": 6144, "k": 1536, "dtype": "bf16", "tflops": 520.0}],
    "attention": [{"implementation": "sdpa-fused", "batch": 32, "heads": 12, "seq_len": 2048, "window": 2048,
                   "head_dim": 128, "fwd_tflops": 250.0, "bwd_tflops": 70.0}],
    "collectives": [{"collective": "all_reduce", "group_size": 8, "size_bytes": 1e9, "time_s": 0.0056}],
    # another model's step: validated and checked against the hardware, not fitted (a fit costs 0.5 s a case;
    # fits of absurd steps are in the flags' fuzz, --measured-step-time, and test_strict_inputs)
    "step_times": [{"model": "nanochat-d4", "gpus": 1, "step_time_s": 0.2, "device_batch_size": 32,
                    "total_batch_tokens": 524288, "attention": "sdpa-fused", "window_pattern": "L",
                    "peak_memory_gb": 40.0, "source": "fuzz base"}],
}
HF_CONFIGS = [
    {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8,
     "num_hidden_layers": 4, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048,
     "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "attention_bias": False},
    {"model_type": "mixtral", "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
     "num_hidden_layers": 4, "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048,
     "num_local_experts": 8, "num_experts_per_tok": 2},
    {"model_type": "gpt2", "n_embd": 256, "n_layer": 4, "n_head": 4, "vocab_size": 50257, "n_positions": 1024,
     "resid_pdrop": 0.1, "attn_pdrop": 0.1},
]
FUZZ_FILES = settings(max_examples=130, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@FUZZ_FILES
@given(pick=st.integers(0, 10**6),
       value=st.one_of(st.sampled_from(NASTY), st.sampled_from(SCALES).map(lambda f: ("scale", f))))
def test_fuzz_mutated_calibrations(tmp_path_factory, pick, value):
    import copy

    data = copy.deepcopy(CALIBRATION)
    changed = _mutate(data, pick, value)
    if changed is None:
        return
    file = tmp_path_factory.mktemp("fuzz") / "cal.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    check_typed(["table", "--model", "d12", "--gpus", "8", "--attention", "sdpa-fused", "--window", "L",
                 "--calibration", str(file), "--format", "csv"], *changed)


@FUZZ_FILES
@given(which=st.integers(0, len(HF_CONFIGS) - 1), pick=st.integers(0, 10**6),
       value=st.one_of(st.sampled_from(NASTY), st.sampled_from(SCALES).map(lambda f: ("scale", f))))
def test_fuzz_mutated_hf_configs(tmp_path_factory, which, pick, value):
    import json

    data = json.loads(json.dumps(HF_CONFIGS[which]))
    changed = _mutate(data, pick, value)
    if changed is None:
        return
    from ddplan.hf import NOT_COST

    file = tmp_path_factory.mktemp("fuzz") / "config.json"
    try:
        file.write_text(json.dumps(data, allow_nan=True), encoding="utf-8")
    except ValueError:  # an integer past Python's str limit: not a config anyone writes
        return
    argv = ["table", "--model", str(file), "--gpus", "8", "--attention", "sdpa-fused", "--window", "L", "--format",
            "csv"]
    if any(data.get(k) == changed[1] and HF_CONFIGS[which].get(k) != changed[1] for k in NOT_COST):
        check_outcome(argv)  # a field ddplan does not read (rms_norm_eps): its type is the config's business
    else:
        check_typed(argv, *changed)


OUTPUTS = ["a folder", "a file as its folder", "a new folder", "a wrong suffix", "spaces", "a dot file",
           "an existing file"]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["specs import", "from-log", "plot"]), where=st.sampled_from(OUTPUTS),
       suffix=st.sampled_from([".yaml", ".png", ".svg", ".txt", ""]))
def test_fuzz_output_paths(tmp_path_factory, command, where, suffix):
    """Every output path is written whole or refused in one line before any work; never an internal error."""
    import json

    root = tmp_path_factory.mktemp("out")
    (root / "taken").write_text("x")
    (root / f"dir{suffix}").mkdir()
    (root / f"existing{suffix}").write_text("old")
    out = {"a folder": root / f"dir{suffix}", "a file as its folder": root / "taken" / f"x{suffix}",
           "a new folder": root / "new" / "deeper" / f"x{suffix}", "a wrong suffix": root / f"x{suffix}.bak",
           "spaces": root / f"with space{suffix}", "a dot file": root / f".hidden{suffix}",
           "an existing file": root / f"existing{suffix}"}[where]
    config = root / "config.json"
    config.write_text(json.dumps(HF_CONFIGS[0]), encoding="utf-8")
    log = Path(__file__).parent / "data" / "nanochat_train.log"
    argv = {"specs import": ["specs", "import", str(config), "-o", str(out)],
            "from-log": ["calibrate", "-m", "d24", "--hardware", "mi300x", "--from-log", str(log), "-o", str(out)],
            "plot": ["table", "-m", "d12", "--gpus", "8", "--attention", "sdpa-fused", "--window", "L",
                     "--plot", str(out), "--format", "csv"]}[command]
    code = check_outcome(argv)
    if code == 0:
        assert out.is_file() and out.stat().st_size > 0 and out.read_bytes() != b"old"
    assert not [p for p in root.rglob(".*.tmp")]  # no temporary file left behind
