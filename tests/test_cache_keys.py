"""The pricer's cache keys are kept by hand (ddplan.price: Pricer._group's tokens, the anatomy, parts, optimizer and
step keys): a key that leaves out a field a cached value depends on hands one layout another's figure. This walks
every field of ddplan.layout.Layout: a pricer that has already priced a layout and its neighbours (warm caches) must
price each neighbour, a layout that differs from it in that one field, exactly as a fresh pricer does (no shared
cache, no anatomy kept across pricers). A new Layout field fails the walk until it has a neighbour here."""

from __future__ import annotations

import dataclasses

import pytest

from ddplan import price
from ddplan.errors import DdplanError, LayoutError
from ddplan.layout import Layout
from ddplan.plan import PlanRequest, pricer_for
from ddplan.registry import load_hardware, load_model

# (name, model, hardware, fp8, base layout): together they let every field change alone within Layout's rules
BASES = [
    ("zero-1, tp and pp", "llama-3-8b", "h100-sxm", False,
     dict(dp=4, tp=2, pp=2, zero=1, micro_batch=1, grad_accum=8, sequence_parallel=True)),
    ("zero-3", "llama-3-8b", "h100-sxm", False, dict(dp=8, tp=1, pp=1, zero=3, micro_batch=1, grad_accum=4)),
    ("zero-3, full recompute", "llama-3-8b", "h100-sxm", False,
     dict(dp=8, tp=1, pp=1, zero=3, micro_batch=1, grad_accum=4, recompute="full")),
    ("hybrid sharding", "llama-3-8b", "h100-sxm", False,
     dict(dp=16, tp=1, pp=1, zero=3, shard_group=8, micro_batch=1, grad_accum=4)),
    ("zero-3, fp8", "llama-3-8b", "h100-sxm", True, dict(dp=8, tp=1, pp=1, zero=3, micro_batch=1, grad_accum=4)),
    ("zero-1, fp8", "llama-3-8b", "h100-sxm", True, dict(dp=8, tp=1, pp=1, zero=1, micro_batch=1, grad_accum=4)),
    ("context parallel", "llama-3-8b", "h100-sxm", False,
     dict(dp=2, tp=2, pp=1, cp=2, zero=1, micro_batch=1, grad_accum=8, sequence_parallel=True)),
    ("experts", "mixtral-8x7b", "h100-sxm", False,
     dict(dp=8, tp=2, pp=2, zero=1, micro_batch=1, grad_accum=8, sequence_parallel=True)),
]
# each field's other values (a pipeline schedule and its chunks change together)
OTHERS: dict[str, list] = {
    "dp": [2, 16], "tp": [1, 4], "pp": [1, 4], "cp": [2], "zero": [0, 1, 2, 3], "micro_batch": [2], "grad_accum": [2],
    "attention": ["fa2", "fa3"], "recompute": ["selective", "full"], "compiled": [True],
    "pp_schedule": [("interleaved", 2)], "pp_virtual_stages": [("interleaved", 2)],
    "tp_overlap": [True], "sequence_parallel": [False], "shard_group": [2, 4], "replica_reduce_once": [True], "reshard_after_forward": [False],
    "fsdp2": [True], "recompute_early_stop": [False],
    "overlap_param_gather": [True], "overlap_grad_reduce": [False], "cp_comm": ["all_gather"], "ep": [2, 4],
    "etp": [1], "fp8_all_gather": [True], "offload_optimizer": [True], "fp8_params": [True],
    "offload_activations": [4], "grad_bucket": ["megatron", "chunk", "134217728"],
}


def _neighbours(base: dict) -> list[tuple[str, Layout]]:
    """(field, layout) for each valid layout that differs from base in one field (a schedule with its chunks)."""
    out = []
    for name, values in OTHERS.items():
        for value in values:
            changed = dict(base, pp_schedule=value[0], pp_virtual_stages=value[1]) if isinstance(value, tuple) \
                else dict(base, **{name: value})
            if changed == base:
                continue
            try:
                out.append((name, Layout(**changed)))
            except LayoutError:
                continue
    return out


def _fresh(req: PlanRequest, hw, monkeypatch) -> price.Pricer:
    monkeypatch.setattr(price, "_SHARES", type(price._SHARES)())  # no anatomy kept from other pricers
    return pricer_for(req, hw)


def _priced(pricer: price.Pricer, lay: Layout) -> dict:
    """The priced row's data, or the error pricing it raised (a warm pricer must refuse what a fresh one refuses)."""
    try:
        p = pricer.price(lay)
    except (DdplanError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {k: v for k, v in p.row().items() if not k.startswith("_")}


def test_every_layout_field_has_a_neighbour():
    """The walk below covers every Layout field: a field added to Layout needs its other values in OTHERS, and at
    least one base where changing it alone is a valid layout."""
    fields = {f.name for f in dataclasses.fields(Layout)}
    assert set(OTHERS) == fields
    covered = {name for *_, base in BASES for name, _ in _neighbours(base)}
    assert covered == fields


@pytest.mark.parametrize(("model", "hardware", "fp8", "base"), [b[1:] for b in BASES], ids=[b[0] for b in BASES])
def test_a_warm_pricer_prices_each_neighbour_as_a_fresh_one(model, hardware, fp8, base, monkeypatch):
    spec, hw = load_model(model), load_hardware(hardware)
    attention = {a.name for a in hw.attention}
    req = PlanRequest(model=spec, hardware=(hw,), gpus=(base["dp"] * base["tp"] * base["pp"] * base.get("cp", 1),),
                      fp8=fp8)
    base = dict(base, attention=hw.default_attention)
    moe = spec.architecture.moe is not None
    layouts = [("base", Layout(**base))] + [(n, lay) for n, lay in _neighbours(base)
                                            if (n != "attention" or lay.attention in attention)
                                            and (moe or n not in ("ep", "etp"))]
    warm = pricer_for(req, hw)
    warm_rows = [(name, lay, _priced(warm, lay)) for name, lay in layouts]  # each on the caches of those before it
    for name, lay, row in reversed(warm_rows):  # and again, on the caches of every other
        assert _priced(warm, lay) == row, name
    for name, lay, row in warm_rows:
        assert row == _priced(_fresh(req, hw, monkeypatch), lay), name
