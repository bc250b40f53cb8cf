"""The built-in hardware specs (hardware/*.yaml): they validate, and key figures match the reference.

Figures are checked against /work/shared/reference/hardware.md, whose tags are cited in each test:
[S1] stas00/ml-engineering @744d01e compute/accelerator/README.md, [S2] the same repo's
network/README.md, and the nvidia-smi / rocm-smi totals of hardware.md 1.2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from ddplan.specs import Efficiency, HardwareSpec

HARDWARE_DIR = Path(__file__).resolve().parent.parent / "hardware"
EXPECTED = {"mi300x", "mi325x", "mi355x", "h100-sxm", "h100-pcie", "h200", "b200", "gb200", "b300", "gb300",
            "a100-sxm-80gb", "a100-sxm-40gb"}
PATHS = sorted(HARDWARE_DIR.glob("*.yaml"))


def load(path: Path) -> HardwareSpec:
    with path.open() as f:
        return HardwareSpec.model_validate(yaml.safe_load(f))


@pytest.fixture(scope="module")
def specs() -> dict[str, HardwareSpec]:
    return {p.stem: load(p) for p in PATHS}


def efficiencies(obj, path: str = ""):
    """Every Efficiency inside a spec, with its dotted path."""
    if isinstance(obj, Efficiency):
        yield path, obj
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from efficiencies(item, f"{path}[{getattr(item, 'name', i)}]")
    elif isinstance(obj, BaseModel):
        for field in type(obj).model_fields:
            yield from efficiencies(getattr(obj, field), f"{path}.{field}" if path else field)


def sources(obj, path: str = ""):
    """Every `source` string inside a spec (Sourced, Efficiency, Price), with its dotted path."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from sources(value, f"{path}.{key}")
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from sources(item, f"{path}[{i}]")
    elif isinstance(obj, BaseModel):
        for field in type(obj).model_fields:
            value = getattr(obj, field)
            if field == "source":
                yield path, value
            else:
                yield from sources(value, f"{path}.{field}" if path else field)


def test_every_expected_gpu_has_a_file():
    assert {p.stem for p in PATHS} == EXPECTED


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_validates_and_name_is_file_stem(path):
    spec = load(path)
    assert spec.kind == "hardware"
    assert spec.name == path.stem
    assert spec.gpus_per_node == (72 if path.stem in ("gb200", "gb300") else 8)  # GB200, GB300: the NVL72 NVLink domain
    assert spec.default_attention == "sdpa-fused"


def test_names_and_aliases_are_unique(specs):
    seen: dict[str, str] = {}
    for name, spec in specs.items():
        for key in [spec.name, *spec.aliases]:
            assert key not in seen, f"{key!r} is claimed by both {seen[key]} and {name}"
            seen[key] = name


def test_mi300x_figures(specs):
    """MI300X: 1307.4 dense bf16 TFLOP/s ([S1] TFLOPS table, note 17), rocm-smi total 205822885888 B
    = 191.69 GiB (hardware.md 1.2), 5.3 TB/s HBM ([S1] memory table), RCCL all-reduce busbw 47.7 GB/s
    on 2 GPUs and 312.9 GB/s on 8 ([S2] network/README.md, hardware.md 2.3)."""
    s = specs["mi300x"]
    assert s.peak.bf16_tflops.value == 1307.4
    assert s.memory.usable_gib.value == pytest.approx(205822885888 / 2**30, abs=0.005)
    assert s.memory.hbm_tbyte_per_s.value == 5.3
    all_reduce = s.intra_node.busbw_gbyte_per_s["all_reduce"]
    assert all_reduce[2].value == 47.7
    assert all_reduce[8].value == 312.9
    assert s.intra_node.topology == "full_mesh" and s.intra_node.links_per_gpu == 7
    assert s.intra_node.link_gbyte_per_s_per_direction.value == 64
    assert s.prices[0].usd_per_gpu_hour == 1.99 and s.prices[0].provider == "DigitalOcean"


def test_h100_sxm_figures(specs):
    """H100 SXM: 989.4 dense bf16 TFLOP/s ([S1] TFLOPS table), nvidia-smi 81559 MiB = 79.65 GiB
    (hardware.md 1.2), 3.35 TB/s HBM ([S1] memory table), NVLS all-reduce 480 GB/s on 8 ([S2])."""
    s = specs["h100-sxm"]
    assert s.peak.bf16_tflops.value == 989.4
    assert s.memory.usable_gib.value == pytest.approx(81559 / 1024, abs=0.005)
    assert s.memory.hbm_tbyte_per_s.value == 3.35
    assert s.intra_node.busbw_gbyte_per_s["all_reduce"][8].value == 480.0
    assert "h100" in s.aliases


def test_a100_figures(specs):
    """A100 SXM 80GB: 312 dense bf16 TFLOP/s and no FP8 units ([S1] TFLOPS table), 81920 MiB = 80 GiB."""
    s = specs["a100-sxm-80gb"]
    assert s.peak.bf16_tflops.value == 312
    assert s.peak.fp8_tflops is None
    assert s.memory.usable_gib.value == pytest.approx(80.0)
    with pytest.raises(ValueError):
        s.peak.flops_per_s("fp8")


def test_h200_collectives_measured(specs):
    """8x H200 ring reduce-scatter / all-gather busbw 362.9 / 361.4 GB/s ([S2], hardware.md 2.3) and
    32-rank EFA all-reduce 364.7 GB/s over 8 x 400 Gb/s = 400 GB/s of NICs ([S2])."""
    s = specs["h200"]
    assert s.intra_node.busbw_gbyte_per_s["reduce_scatter"][8].value == 362.9
    assert s.intra_node.busbw_gbyte_per_s["all_gather"][8].value == 361.4
    assert s.inter_node.busbw_fraction_of_nics.value == pytest.approx(364.7 / 400, abs=0.005)
    assert s.inter_node.busbw_fraction_of_nics.basis == "measured"


def test_gemm_best_is_mamf_over_peak(specs):
    """efficiency.gemm.best = MAMF / dense peak ([S1] MAMF table, hardware.md 2.1)."""
    mamf = {"mi300x": 668.4, "mi325x": 784.9, "mi355x": 1565.0, "h100-sxm": 794.5, "h200": 794.5,
            "b200": 1745.0, "a100-sxm-80gb": 271.2}
    for name, tflops in mamf.items():
        s = specs[name]
        assert s.efficiency.gemm.best.value == pytest.approx(tflops / s.peak.bf16_tflops.value, abs=0.001), name


def test_fa3_only_on_hopper(specs):
    for name, spec in specs.items():
        has_fa3 = "fa3" in {a.name for a in spec.attention}
        assert has_fa3 == (name in {"h100-sxm", "h100-pcie", "h200"}), name


def test_stack_matches_vendor(specs):
    for name, spec in specs.items():
        assert spec.software_stack == {"nvidia": "cuda", "amd": "rocm"}[spec.vendor], name
        assert spec.vendor == ("amd" if name.startswith("mi") else "nvidia"), name


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_sources_non_empty(path):
    spec = load(path)
    found = list(sources(spec))
    assert found
    for where, text in found:
        assert text.strip(), f"{path.stem}: empty source at {where}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_basis_agrees_with_source(path):
    """A `measured` efficiency never cites an assumption; an `assumed` one says so up front; a `fitted` one
    says what it was fitted to."""
    for where, eff in efficiencies(load(path)):
        starts_assumed = eff.source.lower().startswith("assumed")
        if eff.basis == "fitted":
            assert eff.source.startswith("fitted:") and "validation/published_runs.yaml" in eff.source, where
        elif eff.basis == "measured":
            assert not starts_assumed, f"{path.stem}: {where} is 'measured' but its source says assumed"
        else:
            assert starts_assumed, f"{path.stem}: {where} is 'assumed' but its source does not start with 'assumed'"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_backward_not_faster_than_forward(path):
    for impl in load(path).attention:
        assert impl.efficiency_bwd.value <= impl.efficiency_fwd.value, f"{path.stem}: {impl.name}"
