"""What a search prices once per group of layouts (ddplan.price.Pricer._group, Layout.parallel_key,
ddplan.memory.fixed_terms, Pricer.least_fitting): each shortcut gives what the long way gives, to the bit."""

from __future__ import annotations

import dataclasses

import pytest

from ddplan.layout import Layout
from ddplan.memory import fixed_terms, memory_per_gpu, model_states, state_floor_bytes
from ddplan.plan import PlanRequest, layouts_for, pricer_for
from ddplan.registry import load_hardware, load_model

CASES = [("llama-3-70b", "h100-sxm", 64), ("d24", "mi300x", 8), ("mixtral-8x7b", "h100-sxm", 16)]


def _groups(model: str, hardware: str, gpus: int):
    spec, hw = load_model(model), load_hardware(hardware)
    req = PlanRequest(model=spec, hardware=(hw,), gpus=(gpus,))
    return spec, pricer_for(req, hw), list(layouts_for(spec, hw, gpus, spec.recipe.total_batch_tokens, req))


def test_parallel_key_is_every_field_but_the_batch_and_recompute():
    """Layouts with equal parallel keys differ at most in micro-batch, accumulation and recompute (what a search
    group's layouts differ in), and a change to any other field changes the key."""
    base = Layout(dp=4, tp=2, pp=2, zero=3, micro_batch=2, grad_accum=8, attention="fa3", sequence_parallel=True)
    assert base.at_batch(4, 4, "full").parallel_key == base.parallel_key
    others = {"dp": 8, "tp": 4, "pp": 4, "cp": 2, "zero": 1, "attention": "fa2", "compiled": True,
              "pp_schedule": "interleaved", "pp_virtual_stages": 2, "tp_overlap": True, "sequence_parallel": False,
              "shard_group": 2, "reshard_after_forward": False, "overlap_param_gather": True, "cp_comm": "all_gather",
              "ep": 2, "etp": 1, "fp8_all_gather": True, "offload_optimizer": True, "fp8_params": True,
              "offload_activations": 4, "overlap_grad_reduce": False,
              "replica_reduce_once": True, "fsdp2": True, "recompute_early_stop": False, "grad_bucket": "megatron"}
    names = {f.name for f in dataclasses.fields(Layout)} - {"micro_batch", "grad_accum", "recompute"}
    assert set(others) == names
    for name, value in others.items():
        changed = dict(base.__dict__, **{name: value})
        changed = {k: v for k, v in changed.items() if not k.startswith("_")}
        other = Layout.__new__(Layout)  # the key only: some of these changes alone break Layout's rules
        other.__dict__.update(changed)
        assert other.parallel_key != base.parallel_key, name


@pytest.mark.parametrize(("model", "hardware", "gpus"), CASES)
def test_fixed_terms_add_up_to_the_state_floor_and_memory_per_gpu_takes_them(model, hardware, gpus):
    """fixed_terms sum to state_floor_bytes; memory_per_gpu given a layout's states, fixed terms and activation
    bytes gives the breakdown it works out alone (the search's cached parts change no figure)."""
    spec, pricer, groups = _groups(model, hardware, gpus)
    window = spec.architecture.window_pattern
    for group in groups[::7]:
        for lay in group[0]:
            states = model_states(spec, lay)
            fixed = fixed_terms(spec, lay, states, pricer.assumptions)
            assert sum(fixed.values()) == state_floor_bytes(spec, lay, states, pricer.assumptions)
            alone = memory_per_gpu(spec, lay, pricer.anatomy(lay, window), pricer.hw.memory.usable_bytes,
                                   pricer.assumptions, headroom=pricer.plan.headroom)
            cached = pricer.memory(lay, window)
            assert (cached.terms, cached.total, cached.limit, cached.notes) == (
                alone.terms, alone.total, alone.limit, alone.notes)


@pytest.mark.parametrize(("model", "hardware", "gpus"), CASES)
def test_least_fitting_is_the_first_layout_whose_memory_fits(model, hardware, gpus):
    """Pricer.least_fitting is the first of a micro-batch's layouts that memory() says fits; its memory is what
    a fresh pricer (no shared cache) works out for each layout of every group."""
    spec, pricer, groups = _groups(model, hardware, gpus)
    window = spec.architecture.window_pattern
    fresh = pricer_for(PlanRequest(model=spec, hardware=(pricer.hw,), gpus=(gpus,)), pricer.hw)
    for group in groups:
        for by_rc in group:
            expected = next((j for j, lay in enumerate(by_rc) if fresh.memory(lay, window).fits), None)
            assert pricer.least_fitting(by_rc, window) == expected
            for lay in by_rc:
                assert pricer.memory(lay, window).total == fresh.memory(lay, window).total


@pytest.mark.parametrize(("model", "hardware", "gpus"), CASES)
def test_model_flops_kept_once_per_share_are_each_anatomys_own(model, hardware, gpus):
    """Pricer.flops keeps the model FLOPs once per share (every recompute policy's anatomy has the share's ops):
    for each layout of a micro-batch, they are that layout's own anatomy's forward + backward FLOPs, and the
    recomputed FLOPs its own, to the bit."""
    spec, pricer, groups = _groups(model, hardware, gpus)
    window = spec.architecture.window_pattern
    for group in groups[::5]:
        for lay in group[0]:
            an = pricer.anatomy(lay, window)
            assert pricer.flops(lay, window) == (an.flops_fwd() + an.flops_bwd(), an.recompute_flops())
