"""`ddplan specs list` and `ddplan specs show`, in-process through `ddplan.cli.main`."""

from __future__ import annotations

import json

import pytest
import yaml

from ddplan import cli, registry


def run_ok(capsys, *argv: str) -> str:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""
    return out


def hardware_names() -> list[str]:
    try:
        return registry.builtin_names("hardware")
    except Exception:  # no hardware/ folder yet
        return []


def table_rows(out: str) -> list[list[str]]:
    """The body rows of a rich table (lines starting with the vertical bar), split into cells."""
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in out.splitlines()
            if line.startswith("│")]


def test_specs_list_one_line_per_spec(capsys):
    out = run_ok(capsys, "specs", "list")
    rows = table_rows(out)
    expected = [("hardware", n) for n in hardware_names()] + \
               [("model", n) for n in registry.builtin_names("models")] + [("model", "nanochat-dN")] + \
               [("framework", n) for n in registry.builtin_names("frameworks")]
    # one line per spec: a wrapped cell would add a continuation line with an empty name
    assert [(r[0], r[1]) for r in rows] == expected
    assert all(len(r) == 4 and r[3] for r in rows)


def test_specs_list_shows_aliases(capsys):
    rows = {r[1]: r for r in table_rows(run_ok(capsys, "specs", "list"))}
    assert set(rows["gpt2-124m"][2].replace(",", " ").split()) == {"gpt2", "gpt2-small"}
    assert rows["nanochat-d24"][2] == "d24"
    assert "1,384M params" in rows["nanochat-d24"][3]


def test_specs_show_d24_json(capsys):
    """params: total for nanochat d24, by hand: wte 32,768 x 1,536 = 50,331,648; value embeddings on
    12 layers x 32,768 x 1,536 = 603,979,776; lm_head 50,331,648; blocks 24 x 12 x 1,536^2 = 679,477,248;
    VE gates 12 x 12 x 12 = 1,728; smear gate 24; scalars 24 x 2 + 2 = 50. Sum 1,384,122,122."""
    data = json.loads(run_ok(capsys, "specs", "show", "d24", "--format", "json"))
    assert data["spec"]["name"] == "nanochat-d24"
    derived = {d["figure"]: d for d in data["derived"]}
    assert derived["params: total"]["value"] == 1_384_122_122
    assert derived["params: total"]["unit"] == "params"
    parts = {"wte": 50_331_648, "value_embeddings": 603_979_776, "lm_head": 50_331_648,
             "block_matrices": 679_477_248, "ve_gates": 1_728, "smear_gate": 24, "scalars": 50}
    for group, n in parts.items():
        assert derived[f"params: {group}"]["value"] == n
    assert sum(parts.values()) == 1_384_122_122
    assert set(d["figure"] for d in data["derived"]) >= {"params: scaling (nanochat)", "windows per layer"}
    assert all(set(d) == {"figure", "value", "unit", "from"} for d in data["derived"])


def test_specs_show_text_is_yaml_then_derived_table(capsys):
    out = run_ok(capsys, "specs", "show", "gpt2")
    body, _, table = out.partition("\n\n")
    spec = yaml.safe_load(body)
    assert spec["name"] == "gpt2-124m" and spec["architecture"]["num_layers"] == 12
    assert "derived" in table and "params: total" in table and "124,439,808" in table


def test_specs_show_unshipped_depth(capsys):
    data = json.loads(run_ok(capsys, "specs", "show", "d12", "--format", "json"))
    assert data["spec"]["name"] == "nanochat-d12"
    assert data["spec"]["architecture"]["d_model"] == 768


def test_specs_show_is_case_insensitive(capsys):
    assert run_ok(capsys, "specs", "show", "NANOCHAT-D24") == run_ok(capsys, "specs", "show", "nanochat-d24")


def test_specs_show_user_yaml(capsys, tmp_path):
    text = (registry.builtin_dir("models") / "gpt2-124m.yaml").read_text(encoding="utf-8")
    text = text.replace("\nname: gpt2-124m\n", "\nname: my-gpt\n").replace("\n  num_layers: 12\n",
                                                                         "\n  num_layers: 6\n")
    path = tmp_path / "my gpt.yaml"  # a space in the path, too
    path.write_text(text, encoding="utf-8")
    data = json.loads(run_ok(capsys, "specs", "show", str(path), "--format", "json"))
    assert data["spec"]["name"] == "my-gpt"
    assert data["spec"]["architecture"]["num_layers"] == 6
    total = {d["figure"]: d["value"] for d in data["derived"]}["params: total"]
    assert total == 124_439_808 - 6 * (7_077_888 + 6_912 + 3_072)  # six fewer GPT-2 small blocks
    assert "name: my-gpt" in run_ok(capsys, "specs", "show", str(path))


def test_specs_show_relative_user_yaml(capsys, tmp_path, monkeypatch):
    (tmp_path / "m.yml").write_text((registry.builtin_dir("models") / "llama-3-8b.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    data = json.loads(run_ok(capsys, "specs", "show", "m.yml", "--format", "json"))
    assert data["spec"]["name"] == "llama-3-8b"


@pytest.mark.parametrize("name", hardware_names() or [pytest.param("none", marks=pytest.mark.skip(
    reason="no built-in hardware specs yet"))])
def test_specs_show_every_hardware(capsys, name):
    data = json.loads(run_ok(capsys, "specs", "show", name, "--format", "json"))
    assert data["spec"]["kind"] == "hardware" and data["spec"]["name"] == name
    figures = {d["figure"]: d["value"] for d in data["derived"]}
    assert figures["best bf16 GEMM"] > 0 and figures["ridge point (bf16 GEMM / HBM)"] > 0
    assert "derived" in run_ok(capsys, "specs", "show", name)


def test_specs_show_a_framework_profile_says_what_it_sets_and_what_it_leaves_out(capsys):
    """`specs list` lists the profiles, so `specs show` takes them: each field it sets and each thing ddplan does
    not price, with where the stack says so (a review: it said "unknown spec")."""
    import json

    out = run_ok(capsys, "specs", "show", "torchtitan", "--format", "json")
    data = json.loads(out)
    assert data["spec"]["name"] == "torchtitan" and data["spec"]["commit"].startswith("b5bcd76")
    figures = {d["figure"]: d for d in data["derived"]}
    assert figures["sets layout.zero"]["value"] == "3"
    assert figures["sets attention"]["value"] == "flex"
    assert figures["sets attention"]["from"].startswith("torchtitan/models/llama3/__init__.py@b5bcd76")
    assert figures["not priced: cuda_graphs"]["from"].startswith("torchtitan/config/configs.py@b5bcd76")
