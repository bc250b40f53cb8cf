"""Context parallelism (issue 12, item 2): each sequence split over cp GPUs, attention over the whole
sequence by ring exchange (or all-gather) of K and V, gradients reduced over dp x cp.

Hand figures use the H100 SXM spec: NVSwitch all-gather busbw 361.4 GB/s, reduce-scatter 362.9 GB/s,
4 us a step inside a node.
"""

from __future__ import annotations

import pytest

from cli_helpers import csv_rows, fails, run_ok
from ddplan import comm
from ddplan.anatomy import build_anatomy, for_cp, for_tp
from ddplan.errors import LayoutError
from ddplan.layout import Layout, check_layout, placement
from ddplan.memory import model_states
from ddplan.layout import context_parallel_degrees
from ddplan.registry import load_hardware, load_model
from ddplan.specs import run_variant

SEQ = 8192


def _spec():
    return run_variant(load_model("llama-3-8b"), seq_len=SEQ)


@pytest.mark.parametrize("cp, tp, sp", [(2, 1, False), (4, 2, True)])
def test_a_cp_share_is_one_cp_th_of_the_work_and_the_saved_tensors(cp, tp, sp):
    """Llama-3-8B at 8192 tokens, flash attention: every op's FLOPs and the saved activations of one cp rank,
    times cp, are the whole sequence's (GEMMs on s / cp tokens; the attention core's balanced chunks), except
    the weights' bf16 casts autocast saves, which every rank holds whole."""
    spec = _spec()
    full = for_tp(build_anatomy(spec, batch=1, attention="flash_package"), tp, sp)
    short = for_tp(build_anatomy(spec, batch=1, seq_len=SEQ // cp, attention="flash_package"), tp, sp)
    share = for_cp(full, short, cp)
    assert share.cp == cp and share.seq_len == SEQ // cp
    assert cp * (share.flops_fwd() + share.flops_bwd()) == pytest.approx(full.flops_fwd() + full.flops_bwd(),
                                                                         rel=1e-12)
    def split(an):
        kept = an.saved_tensors()
        casts = sum(t.bytes for name, t in kept.items() if name.endswith(".weight_cast"))
        return sum(t.bytes for t in kept.values()) - casts, casts

    (acts, casts), (full_acts, full_casts) = split(share), split(full)
    assert casts == full_casts > 0
    assert cp * acts == pytest.approx(full_acts, rel=1e-9)


def test_for_cp_refuses_mismatched_shares():
    spec = _spec()
    full = build_anatomy(spec, batch=1, attention="flash_package")
    with pytest.raises(ValueError):
        for_cp(full, build_anatomy(spec, batch=1, seq_len=SEQ // 2, attention="flash_package"), 4)


def test_ring_and_block_by_hand():
    """comm.cp_kv_block_bytes and comm.cp_ring_exposed_s docstring examples."""
    assert comm.cp_kv_block_bytes(1, 8192, 8, 128, 2) == 33_554_432
    assert comm.cp_ring_exposed_s(0.002, 4, 0.004, 0.010) == pytest.approx((0.003, 0.0065))
    # hidden under attention, but for the gradients' last hop home
    assert comm.cp_ring_exposed_s(0.001, 4, 0.008, 0.020) == pytest.approx((0.0, 0.001))
    # everything the ring sends, hidden or not: 3 sends forward; 3 x 2 + 1 backward
    assert comm.cp_ring_sent_s(0.002, 4) == pytest.approx((0.006, 0.014))


def test_all_gather_cp_step_by_hand():
    """Llama-3-8B, 8192 tokens, cp 4 inside one node (16 H100: dp 4), micro-batch 1 x accum: per layer the
    all-gather variant gathers the 4 KV blocks in forward, and gathers them again and reduce-scatters their
    gradients in backward. Block: 2 x 1 x 2048 x 8 x 128 x 2 B = 8,388,608 B; whole = 4 x block.
    AG: 3 x 4 us + 4 x block x 3/4 / 361.4e9; RS: 3 x 4 us + 4 x block x 3/4 / 362.9e9."""
    from ddplan.price import Pricer, RunPlan

    spec, hw = _spec(), load_hardware("h100-sxm")
    lay = Layout(dp=4, cp=4, zero=3, micro_batch=1, grad_accum=8, attention="fa3", cp_comm="all_gather")
    p = Pricer(spec, hw, RunPlan(spec.recipe.budget, hw.price)).price(lay)
    whole = 4 * 2 * 2048 * 8 * 128 * 2
    ag = 3 * 4e-6 + whole * 3 / 4 / 361.4e9
    rs = 3 * 4e-6 + whole * 3 / 4 / 362.9e9
    assert p.step.cp_comm_s == pytest.approx(8 * spec.architecture.num_layers * (ag + ag + rs), rel=1e-9)


def test_ring_cp_step_by_hand():
    """Llama-3-8B, 8192 tokens, 16 H100, tp 8 x cp 2: the cp pair is 8 ranks apart, on two nodes, so each send
    of a KV block goes over one NIC: 10 us + 2 x 1 x 4096 x (8 KV heads / 8) x 128 x 2 B / 42.5e9 B/s. Per
    layer the forward hides the send under half the layer's attention; backward sends twice the bytes under
    half its attention, plus the gradients' last hop: cp_comm = accum x layers x (fwd + bwd). What the ring sends
    beside attention slows it (comm.overlap_cost_s at h100-sxm's overlapped_compute 0.841): max(0, (1 - 0.841) x
    beside - 0.841 x outlasting), beside = sent - exposed (sent: 1 send forward, 2 + 1 backward), outlasting = the
    steps' excess (the last hop runs after the attention); here the sends outlast the attention, so nothing."""
    from ddplan.price import Pricer, RunPlan

    spec, hw = _spec(), load_hardware("h100-sxm")
    lay = Layout(dp=1, tp=8, cp=2, micro_batch=1, grad_accum=4, attention="fa3")
    pricer = Pricer(spec, hw, RunPlan(spec.recipe.budget, hw.price))
    p = pricer.price(lay)
    send = 10e-6 + 2 * 4096 * 1 * 128 * 2 / 42.5e9
    # the op times cached per (..., scenario, fitted, fp8 gather shards, gathers per micro-batch)
    parts = pricer._rated[("parts", 1, "fa3", "L", lay.compiled, lay.rank_share, "value", True, 0, 2, 1, False, None,
                           True)]
    layers = spec.architecture.num_layers
    attn_fwd = parts.fwd_by_kind[("layers", "attention")] / layers
    attn_bwd = parts.by_kind[("layers", "attention")] / layers - attn_fwd
    fwd = max(0.0, send - attn_fwd / 2)
    bwd = max(0.0, 2 * send - attn_bwd / 2) + send
    cost_fwd = max(0.0, (1 - 0.841) * (send - fwd) - 0.841 * fwd)
    cost_bwd = max(0.0, (1 - 0.841) * (3 * send - bwd) - 0.841 * (bwd - send))
    assert fwd > 0 and cost_fwd == cost_bwd == 0.0  # the sends outlast the attention they overlap
    fwd, bwd = fwd + cost_fwd, bwd + cost_bwd
    assert p.step.cp_comm_s == pytest.approx(4 * layers * (fwd + bwd), rel=1e-9)
    assert p.step.cp_comm_s > 0


def test_cp_needs_a_fused_attention_kernel(capsys):
    code, line = fails(capsys, ["memory", "--model", "d24", "--gpus", "8", "--cp", "2", "--attention", "sdpa-math"])
    assert code == 2 and "fused attention kernel" in line  # a layout from the flags: a usage error, as in table


def test_cp_reduces_activation_memory_and_shards_states_over_dp_x_cp():
    spec, hw = _spec(), load_hardware("h100-sxm")
    from ddplan.price import Pricer, RunPlan

    pricer = Pricer(spec, hw, RunPlan(spec.recipe.budget, hw.price))
    one = pricer.memory(Layout(dp=16, zero=3, micro_batch=1, grad_accum=2, attention="fa3"), "L")
    four = pricer.memory(Layout(dp=4, cp=4, zero=3, micro_batch=1, grad_accum=8, attention="fa3"), "L")
    # the activations split by 4, all but the weight casts every rank saves whole (test above)
    assert one.terms["activations"] / 4 < four.terms["activations"] < one.terms["activations"] / 2
    # ZeRO-3 over dp x cp = 16 ranks either way: the same model states
    a = model_states(spec, Layout(dp=16, zero=3))
    b = model_states(spec, Layout(dp=4, cp=4, zero=3))
    assert a == b


def test_cp_groups_sit_between_tp_and_dp():
    got = placement(Layout(dp=4, tp=2, cp=4), 8)  # 32 GPUs: a cp group is 4 ranks 2 apart, one node
    assert (got.cp_per_node, got.cp_crosses) == (4, False)
    assert (got.dp_per_node, got.dp_crosses) == (4, True)  # dp x cp = 16 ranks 2 apart: 4 a node


def test_layout_needs_2cp_to_divide_the_sequence():
    spec = run_variant(load_model("llama-3-8b"), seq_len=8190)
    with pytest.raises(LayoutError, match="2 x cp must divide"):
        check_layout(Layout(dp=1, cp=2), spec)


def test_plan_searches_cp_only_for_long_sequences():
    assert context_parallel_degrees(2048) == (1,)
    assert context_parallel_degrees(8192) == (1, 2)
    assert context_parallel_degrees(131072) == (1, 2, 4, 8, 16)


def test_table_and_memory_take_cp(capsys):
    rows = csv_rows(run_ok(capsys, ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "16",
                                    "--seq-len", "8192", "--cp", "1,2", "--attention", "fa3", "--format", "csv"]))
    assert [r["cp"] for r in rows] == ["1", "2"] and "cp 2" in rows[1]["config"]
    assert float(rows[1]["memory_gib"]) < float(rows[0]["memory_gib"])
    mem = csv_rows(run_ok(capsys, ["memory", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "16",
                                   "--seq-len", "8192", "--cp", "2", "--format", "csv"]))
    assert mem
    code, line = fails(capsys, ["table", "--model", "llama-3-8b", "--gpus", "16", "--cp-comm", "tree"])
    assert code == 2 and "--cp-comm" in line


def test_a_layer_policy_re_sends_only_for_the_layers_it_re_runs():
    """Found in review: context parallelism's exchange is repeated in backward for the layers a policy re-runs.
    every:4 in chunks of 2 layers (llama-3-8b, pp 8 x vp 2) re-runs none: the exchange is no recompute's; full:1
    re-runs half the layers: halfway between none's and full's."""
    from ddplan.price import Pricer, RunPlan
    from ddplan.specs import Budget

    spec, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    pricer = Pricer(spec, hw, RunPlan(Budget(steps=10), hw.price))
    cp = {rc: pricer.step(Layout(dp=1, tp=1, pp=8, cp=2, pp_schedule="interleaved", pp_virtual_stages=2,
                                 micro_batch=1, grad_accum=16, attention="fa3", recompute=rc, cp_comm="all_gather"),
                          spec.architecture.window_pattern).cp_comm_s for rc in ("none", "every:4", "full:1", "full")}
    assert cp["every:4"] == pytest.approx(cp["none"], rel=1e-12) and cp["none"] < cp["full"]
    assert cp["full:1"] == pytest.approx((cp["none"] + cp["full"]) / 2, rel=1e-9)
