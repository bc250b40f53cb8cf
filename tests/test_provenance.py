"""Every output says what produced it: ddplan's version and a short hash of each spec it read (issue 15)."""

from __future__ import annotations

import json

from ddplan import __version__
from ddplan.provenance import line, provenance, spec_hash
from ddplan.registry import builtin_dir, load_hardware

from cli_helpers import run_ok


def test_hash_follows_what_ddplan_reads_not_how_the_file_is_written(tmp_path):
    src = (builtin_dir("hardware") / "h100-sxm.yaml").read_text(encoding="utf-8")
    same = tmp_path / "same.yaml"
    same.write_text("# a comment that changes nothing\n" + src, encoding="utf-8")
    changed = tmp_path / "changed.yaml"
    changed.write_text(src.replace("value: 989.4", "value: 990.0", 1), encoding="utf-8")
    base = spec_hash(load_hardware("h100-sxm"))
    assert len(base) == 12 and spec_hash(load_hardware(str(same))) == base
    assert spec_hash(load_hardware(str(changed))) != base


def test_every_format_carries_it(capsys):
    argv = ["table", "--model", "d24", "--gpus", "1", "--attention", "sdpa-fused", "--window", "L"]
    hw_hash = spec_hash(load_hardware("mi300x"))
    csv_out = run_ok(capsys, argv + ["--format", "csv"])
    assert csv_out.splitlines()[0].startswith(f"# ddplan {__version__}; model nanochat-d24 (")
    assert f"hardware mi300x ({hw_hash})" in csv_out.splitlines()[0]
    data = json.loads(run_ok(capsys, argv + ["--format", "json"]))
    assert data["provenance"]["ddplan"] == __version__ and data["provenance"]["hardware"]["sha256"] == hw_hash
    md = run_ok(capsys, argv + ["--format", "markdown"])
    assert md.rstrip().endswith(f"hardware mi300x ({hw_hash}).") and "Produced by ddplan" in md
    for cmd in (["memory", "--model", "d24", "--format", "csv"], ["plan", "--model", "d24", "--gpus", "8",
                                                                   "--format", "csv"]):
        assert run_ok(capsys, cmd).startswith(f"# ddplan {__version__}; model nanochat-d24 (")


def test_line_names_each_role():
    prov = provenance(model=load_hardware("b200"), calibration=None, dataset=("runs.yaml", load_hardware("b200")))
    assert line(prov).startswith(f"ddplan {__version__}; model b200 (") and "dataset runs.yaml (" in line(prov)
    assert "calibration" not in prov
