"""Communication at scale (issue 12, item 6): which groups cross nodes, the NICs they share, ZeRO-3 /
FSDP priced as it runs (hybrid sharding, resharding after forward), Megatron's overlapped parameter
gather, and the published layouts these change.

Hand figures use the hardware specs' numbers: H100 SXM nodes carry 8 x 400 Gb/s NICs (50 GB/s per
GPU) at busbw 0.85 of line rate; DGX A100 8 x 200 Gb/s (25 GB/s per GPU) at 0.85.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from cli_helpers import csv_rows, fails, run, run_ok
from ddplan import comm
from ddplan.errors import LayoutError
from ddplan.layout import Layout, Options, layout_for, placement
from ddplan.memory import model_states
from ddplan.params import param_counts
from ddplan.registry import load_hardware, load_model


# --------------------------------------------------------------------------------------------
# Where groups sit


@pytest.mark.parametrize("dp, tp, pp, expected", [
    # 1,024 GPUs, tp 2: a dp group strides by 2, so 4 of its members share a node and it crosses nodes
    (512, 2, 1, dict(tp_per_node=2, tp_crosses=False, dp_per_node=4, dp_crosses=True, pp_crosses=False)),
    # tp 8 fills a node: every dp group has one member per node (one NIC)
    (48, 8, 1, dict(tp_per_node=8, tp_crosses=False, dp_per_node=1, dp_crosses=True, pp_crosses=False)),
    # one node of pure dp: nothing crosses
    (8, 1, 1, dict(tp_per_node=1, tp_crosses=False, dp_per_node=8, dp_crosses=False, pp_crosses=False)),
    # 16 GPUs, tp 2 x dp 2 x pp 4: dp inside a node (4 consecutive ranks), stages 4 ranks apart cross nodes
    (2, 2, 4, dict(tp_per_node=2, tp_crosses=False, dp_per_node=2, dp_crosses=False, pp_crosses=True)),
    # tp 16 spans two nodes
    (1, 16, 1, dict(tp_per_node=8, tp_crosses=True, dp_per_node=1, dp_crosses=False, pp_crosses=False)),
])
def test_placement_by_hand(dp, tp, pp, expected):
    """Ranks ordered tp, dp, pp (Megatron-Core's tp-cp-ep-dp-pp) on 8-GPU nodes."""
    got = placement(Layout(dp=dp, tp=tp, pp=pp), 8)
    assert {k: getattr(got, k) for k in expected} == expected


@pytest.mark.parametrize("n, stride, total, expected", [
    (12, 1, 24, (4, True)),   # dp 12 at tp 1: 8 ranks on one node, 4 on the next: the ring runs at 4 NICs
    (3, 4, 48, (1, True)),    # dp 3 at tp 4: ranks 0, 4 on node 0 and rank 8 alone on node 1
    (6, 1, 96, (2, True)),    # tp 6 on 8-GPU nodes: ranks 6-11 straddle two nodes, 2 on one of them
    (4, 2, 1024, (4, False)),  # 4 ranks 2 apart: 8 consecutive ranks, one node
    (48, 8, 384, (1, True)),  # dp 48 at tp 8: one member a node
])
def test_groups_on_nodes_by_hand(n, stride, total, expected):
    from ddplan.layout import group_on_nodes

    assert group_on_nodes(n, stride, 8, total) == expected


def test_a_tp_group_straddling_nodes_crosses():
    got = placement(Layout(dp=16, tp=6), 8)
    assert got.tp_crosses and got.tp_per_node == 2


def test_placement_of_a_hybrid_shard_group():
    """dp 64 at tp 1, shard group 8: the shard group is one node; plain FSDP's group spans 8 nodes."""
    got = placement(Layout(dp=64, zero=3, shard_group=8), 8)
    assert (got.shard_per_node, got.shard_crosses) == (8, False)
    plain = placement(Layout(dp=64, zero=3), 8)
    assert (plain.shard_per_node, plain.shard_crosses) == (8, True)


# --------------------------------------------------------------------------------------------
# The NICs a group drives


def test_inter_node_busbw_is_the_members_nics():
    """H100: a group with 1 member per node runs at one NIC: 50e9 x 0.85 = 42.5 GB/s; with 4, 170 GB/s; with
    all 8, the node's 340 GB/s (each also bounded by NVLink's busbw among the members on a node)."""
    h100 = load_hardware("h100-sxm")
    one = comm.tier_for(h100, "all_reduce", 48, per_node=1)
    four = comm.tier_for(h100, "all_reduce", 48, per_node=4)
    full = comm.tier_for(h100, "all_reduce", 48)
    assert one.name == four.name == full.name == "inter_node"
    assert one.busbw_bytes_per_s == pytest.approx(50e9 * 0.85)
    assert four.busbw_bytes_per_s == pytest.approx(min(4 * 50e9 * 0.85, comm.tier_for(h100, "all_reduce", 4)
                                                       .busbw_bytes_per_s))
    assert full.busbw_bytes_per_s == pytest.approx(min(400e9 * 0.85, comm.tier_for(h100, "all_reduce", 8)
                                                       .busbw_bytes_per_s))
    # two ranks on two nodes, one each: still the NICs, not NVLink
    assert comm.tier_for(h100, "all_reduce", 2, per_node=1).name == "inter_node"
    with pytest.raises(ValueError):
        comm.tier_for(h100, "all_reduce", 16, per_node=9)


def test_a_ring_over_one_nic_per_node_by_hand():
    """Reduce-scatter of 16 GB of fp32 gradients over 48 ranks, one per node, H100: NCCL's PAT latency, floor(log2 48)
    x alpha / 3.5 + 2.8 us x 48 (shorter than the ring's 47 alpha; comm.ring_latency_s), + 16e9 x 47/48 / 42.5e9 =
    0.368627 s."""
    h100 = load_hardware("h100-sxm")
    alpha = h100.inter_node.latency_us.value * 1e-6
    t = comm.GroupTimer(h100, 1).time_s("reduce_scatter", 16e9, 48)
    assert t == pytest.approx(5 * alpha / 3.5 + 2.8e-6 * 48 + 16e9 * 47 / 48 / 42.5e9, rel=1e-12)
    assert 16e9 * 47 / 48 / 42.5e9 == pytest.approx(0.368627, abs=1e-6)


# --------------------------------------------------------------------------------------------
# Overlap formulas


def test_fsdp_pipelined_comm_by_hand():
    """comm.fsdp_pipelined_comm_s docstring examples: rs 30, ag 20, forward 50, backward 100 ms, accum 8, 10 units."""
    kept = comm.fsdp_pipelined_comm_s(0.030, 0.020, 0.050, 0.100, 8, 10, reshard=False)
    assert kept == pytest.approx((0.050, 0.032))  # 20 + 30; 30 + max(0, 20 - 50) + 20 / 10
    assert comm.fsdp_pipelined_comm_s(0.030, 0.020, 0.050, 0.100, 8, 10, reshard=True) == \
        pytest.approx((0.190, 0.046))  # 8 x 20 + 30; 30 + 8 x (0 + 2)
    # the replicas' all-reduce runs once, after the reduce-scatter: on both, in full
    assert comm.fsdp_pipelined_comm_s(0.030, 0.020, 0.050, 0.100, 8, 10, reshard=False,
                                      replica_all_reduce_s=0.080) == pytest.approx((0.130, 0.112))
    # a gather longer than the first forward shows its excess
    assert comm.fsdp_pipelined_comm_s(0.030, 0.070, 0.050, 0.100, 8, 10, reshard=False)[1] == \
        pytest.approx(0.030 + 0.020 + 0.007)
    # against the per-micro-batch rule (fsdp_comm_s): 8 x (2 x 20 + 30) = 560 ms sent
    assert comm.fsdp_comm_s(0.030, 0.020, 0.150, 8, 10)[0] == pytest.approx(0.560)


def test_fsdp_comm_by_hand():
    """comm.fsdp_comm_s docstring examples."""
    assert comm.fsdp_comm_s(0.030, 0.020, 0.050, 2, 10) == pytest.approx((0.140, 0.048))
    assert comm.fsdp_comm_s(0.030, 0.020, 0.050, 2, 10, gathers=1) == pytest.approx((0.100, 0.004))
    assert comm.fsdp_comm_s(0.030, 0.020, 0.050, 2, 10, replica_all_reduce_s=0.080) == pytest.approx((0.300, 0.068))
    # once a step: by hand, total 2 x (2 x 20 + 30) + 80 = 220 ms; exposed (2 - 1) x (70 - 50) + (80 - 50)
    # + 2 x 2 x 20 / 10 = 20 + 30 + 8 = 58 ms
    assert comm.fsdp_comm_s(0.030, 0.020, 0.050, 2, 10, replica_all_reduce_s=0.080, replica_once=True) == \
        pytest.approx((0.220, 0.058))
    # the shard group across nodes too (separate_links False: both on the NICs, busy = 70 + 80 = 150 ms), by hand:
    # every micro-batch, total 300, exposed 2 x ((150 - 50) + 4) = 208 ms; once a step, total 220, exposed
    # (70 - 50) + (150 - 50) + 8 = 128 ms
    assert comm.fsdp_comm_s(0.030, 0.020, 0.050, 2, 10, replica_all_reduce_s=0.080, separate_links=False) == \
        pytest.approx((0.300, 0.208))
    assert comm.fsdp_comm_s(0.030, 0.020, 0.050, 2, 10, replica_all_reduce_s=0.080, separate_links=False,
                            replica_once=True) == pytest.approx((0.220, 0.128))
    # one micro-batch: once a step is every micro-batch
    assert comm.fsdp_comm_s(0.030, 0.020, 0.050, 1, 10, replica_all_reduce_s=0.080, replica_once=True) == \
        pytest.approx(comm.fsdp_comm_s(0.030, 0.020, 0.050, 1, 10, replica_all_reduce_s=0.080))
    with pytest.raises(ValueError):
        comm.fsdp_comm_s(0.03, 0.02, 0.05, 2, 10, gathers=3)


def test_param_gather_overlap_by_hand():
    """comm.param_gather_exposed_s and zero1_comm_s docstring examples."""
    assert comm.param_gather_exposed_s(0.020, 0.001, None) == pytest.approx(0.020)
    assert comm.param_gather_exposed_s(0.020, 0.001, 0.015) == pytest.approx(0.005)
    assert comm.param_gather_exposed_s(0.020, 0.001, 0.050) == pytest.approx(0.001)
    assert comm.zero1_comm_s(0.030, 0.020, 0.001, 0.100) == pytest.approx((0.050, 0.021))
    assert comm.zero1_comm_s(0.030, 0.020, 0.001, 0.100, 0.050) == pytest.approx((0.050, 0.002))


# --------------------------------------------------------------------------------------------
# Layout options


def test_layout_refuses_options_where_they_cannot_apply():
    with pytest.raises(LayoutError, match="hybrid sharding needs ZeRO-3"):
        Layout(dp=16, zero=1, shard_group=8)
    with pytest.raises(LayoutError, match="divides dp x cp=16"):
        Layout(dp=16, zero=3, shard_group=3)
    with pytest.raises(LayoutError):
        Layout(dp=16, zero=3, shard_group=16)  # all of dp: plain ZeRO-3, say so by leaving it 0
    with pytest.raises(LayoutError, match="ZeRO-1 or 2"):
        Layout(dp=16, zero=3, overlap_param_gather=True)
    with pytest.raises(LayoutError, match="ZeRO-3 option"):
        Layout(dp=16, zero=1, reshard_after_forward=False)


def test_options_apply_only_where_they_can():
    o = Options(sequence_parallel=True, tp_overlap=True, shard_group=8, reshard_after_forward=False,
                overlap_param_gather=True, fp8_all_gather=True, fp8_params=True, offload_activations=12,
                overlap_grad_reduce=False, replica_reduce_once=True, fsdp2=True, recompute_early_stop=False)
    assert o.for_layout(tp=1, ranks=64, zero=3) == dict(sequence_parallel=False, tp_overlap=False, shard_group=8,
                                                        replica_reduce_once=True, fsdp2=True,
                                                        recompute_early_stop=False,
                                                        reshard_after_forward=False, overlap_param_gather=False,
                                                        cp_comm="ring", etp=0, fp8_all_gather=True,
                                                        offload_optimizer=False, fp8_params=False,
                                                        offload_activations=12, overlap_grad_reduce=True,
                                                        grad_bucket="group")
    assert o.for_layout(tp=2, ranks=8, zero=1) == dict(sequence_parallel=True, tp_overlap=True, shard_group=0,
                                                       replica_reduce_once=False, fsdp2=False,
                                                       recompute_early_stop=False,
                                                       reshard_after_forward=True, overlap_param_gather=True,
                                                       cp_comm="ring", etp=0, fp8_all_gather=False,
                                                       offload_optimizer=False, fp8_params=True,
                                                       offload_activations=12, overlap_grad_reduce=False,
                                                       grad_bucket="group")
    # the stack's gradient buckets where ZeRO 0-2 reduces beside backward over more than one rank, else "group"
    buckets = Options(grad_bucket="megatron")
    assert buckets.for_layout(tp=2, ranks=8, zero=1)["grad_bucket"] == "megatron"
    assert buckets.for_layout(tp=2, ranks=8, zero=0)["grad_bucket"] == "megatron"
    assert [buckets.for_layout(tp=1, ranks=r, zero=z)["grad_bucket"] for r, z in ((8, 3), (1, 1))] == ["group"] * 2
    assert replace(buckets, overlap_grad_reduce=False).for_layout(tp=1, ranks=8, zero=1)["grad_bucket"] == "group"
    with pytest.raises(LayoutError, match="gradient buckets"):
        Layout(dp=8, zero=3, grad_bucket="megatron")
    # nanochat's sharded optimizer (its native ZeRO-1) reduces its own way, per shape group: no buckets there
    nano = buckets.for_model(load_model("d24"))
    assert [nano.for_layout(tp=1, ranks=8, zero=z)["grad_bucket"] for z in (1, 2)] == ["group", "megatron"]
    # a search keeps activation offload to the layouts without a pipeline (Megatron-Core refuses it with pp > 1)
    assert o.searched(tp=2, ranks=8, zero=1, pp=1)["offload_activations"] == 12
    assert o.searched(tp=2, ranks=8, zero=1, pp=2)["offload_activations"] == 0
    assert o.for_layout(tp=1, ranks=8, zero=3)["shard_group"] == 0  # the group is all of dp: plain ZeRO-3
    assert not o.for_layout(tp=1, ranks=8, zero=3)["replica_reduce_once"]  # no replicas to all-reduce across
    assert not o.searched(tp=1, ranks=36, zero=3)["replica_reduce_once"]  # 8 does not divide 36: plain ZeRO-3
    with pytest.raises(LayoutError, match="needs hybrid sharding"):
        Layout(dp=8, zero=3, replica_reduce_once=True)
    with pytest.raises(LayoutError, match="FSDP2's copies .* a ZeRO-3 option; got ZeRO-1"):
        Layout(dp=8, zero=1, fsdp2=True)
    # whole experts only where tp > 1 (with tp 1 the experts' tp is 1 anyway)
    whole = Options(expert_tp=1)
    assert whole.for_layout(tp=2, ranks=8, zero=1)["etp"] == 1 and whole.for_layout(tp=1, ranks=8, zero=1)["etp"] == 0


# --------------------------------------------------------------------------------------------
# Memory


def test_hybrid_sharding_divides_model_states_by_the_shard_group():
    """llama-3-8b on 64 GPUs, ZeRO-3 sharded over 8: parameters, gradients and optimizer state are 1/8 of the
    model's (not 1/64), exactly 8x plain ZeRO-3's."""
    spec = load_model("llama-3-8b")
    plain = model_states(spec, Layout(dp=64, zero=3))
    hybrid = model_states(spec, Layout(dp=64, zero=3, shard_group=8))
    for term in ("params", "gradients", "optimizer"):
        assert sum(hybrid[term].values()) == pytest.approx(8 * sum(plain[term].values()))


# --------------------------------------------------------------------------------------------
# Priced steps


def _price(model, hw_name, layout, tokens=None):
    from ddplan.price import Pricer, RunPlan

    spec, hw = load_model(model), load_hardware(hw_name)
    pricer = Pricer(spec, hw, RunPlan(spec.recipe.budget, hw.price))
    return pricer.price(layout, spec.architecture.window_pattern)


def test_gpt3_175b_zero3_on_1024_a100_is_communication_bound():
    """Issue 12's example: dp 512 x tp 2, ZeRO-3, micro-batch 1 x 3 on 1,024 A100 (3,145,728 tokens a step).
    Each micro-batch all-gathers the tp rank's parameters twice (bf16) and reduce-scatters its gradients
    (fp32) over 512 ranks, 4 per node: 4 NICs x 25 GB/s x 0.85 = 85 GB/s. By hand the bandwidth term alone
    is 3 x (2 x 2 + 4) bytes x params/2 x 511/512 / 85e9; with the gathers and reduce-scatter over 5 s of
    compute per micro-batch, most of it is exposed (the step was '98% compute' before). Each of those runs as one
    collective a unit (96 blocks, and the root's embedding tables), each paying the ring's latency over 128 nodes:
    127 network steps at 10 us and 384 inside a node at 4 us, 2.81 ms a call."""
    spec = load_model("gpt3-175b")
    lay = Layout(dp=512, tp=2, zero=3, micro_batch=1, grad_accum=3, attention="fa2")
    p = _price("gpt3-175b", "a100-sxm-80gb", lay)
    counts = param_counts(spec.architecture)
    params = sum(counts.values())
    calls = 96 + sum(1 for g in ("wte", "wpe", "lm_head") if counts[g])
    hand = 3 * (2 * 2 + 4) * params / 2 * 511 / 512 / 85e9 + 3 * 3 * calls * (127 * 10e-6 + 384 * 4e-6)
    assert p.step.dp_comm_total_s == pytest.approx(hand, rel=0.02)  # embeddings not split by tp
    assert p.step.dp_comm_exposed_s > 0.3 * p.step.compute_s
    assert p.mfu_pct < 50


def test_hybrid_sharding_by_hand():
    """llama-3-8b on 64 H100 at ZeRO-3 sharded over one node (8), replicated x8, micro-batch 1 x 4. Per
    micro-batch: two all-gathers of the bf16 parameters and a reduce-scatter of the fp32 gradients over the
    node's 8 GPUs (NVLink), and an all-reduce of each GPU's 1/8 of the gradients over its 8 replicas, one per
    node (one NIC, 42.5 GB/s). Plain ZeRO-3 over all 64 runs its ring at the node's 8 NICs (340 GB/s), so on
    bandwidth alone hybrid sharding does not win here (its cross-node bytes per GPU: 2 x 7/8 x 1/8 = 0.22 of
    the gradients a micro-batch, against 1/8 of the gradients + 2 x 1/8 of the bf16 parameters = 0.25 for
    plain): it buys fewer ring steps and a smaller group, and costs 8x the model-state memory."""
    spec = load_model("llama-3-8b")
    lay = Layout(dp=64, zero=3, shard_group=8, micro_batch=1, grad_accum=4, attention="fa3")
    p = _price("llama-3-8b", "h100-sxm", lay)
    counts = param_counts(spec.architecture)
    total = sum(counts.values())
    calls = 32 + 2  # a collective a block (its matrices and norms), and the root's embedding and head, one each
    assert [g for g, n in counts.items() if n] == ["wte", "lm_head", "block_matrices", "norms"]
    alpha_nv, alpha_ib = 4e-6, 10e-6  # the spec's intra- and inter-node latencies
    # per pass, one gather (bf16) a unit and one reduce-scatter (fp32) a unit over 8 ranks on NVSwitch:
    # alpha x 7 steps a call + S x 7/8 / busbw (all-gather 361.4 GB/s, reduce-scatter 362.9 GB/s)
    gathers = calls * 7 * alpha_nv + 2 * total * 7 / 8 / 361.4e9
    node = 2 * gathers + calls * 7 * alpha_nv + 4 * total * 7 / 8 / 362.9e9
    # the replicas' all-reduce of each unit's fp32 shard (1/8 of the gradients) over 8 ranks, one a node (one NIC,
    # 42.5 GB/s): alpha x min(14, 2 x 3) a call + S x 14/8 / busbw
    nic = calls * 6 * alpha_ib + 4 * total / 8 * 14 / 8 / 42.5e9
    assert p.step.dp_comm_total_s == pytest.approx(4 * (node + nic), rel=1e-9)
    # exposed: the NVLink and NIC streams overlap: max of the two beyond the micro-batch, plus the first gathers
    mb = p.step.fwd_s + p.step.bwd_s
    hand = 4 * (max(0.0, max(node, nic) - mb) + 2 * gathers / spec.architecture.num_layers)
    # and the hidden rest slows the compute it runs under: (1 - 0.841) of it (h100-sxm's overlapped_compute)
    hand += (1 - 0.841) * (4 * (node + nic) - hand)
    assert p.step.dp_comm_exposed_s == pytest.approx(hand, rel=1e-9)
    plain = _price("llama-3-8b", "h100-sxm", Layout(dp=64, zero=3, micro_batch=1, grad_accum=4, attention="fa3"))
    assert sum(p.memory.by_group["params"].values()) == pytest.approx(8 * sum(plain.memory.by_group["params"].values()))


def test_keeping_gathered_parameters_halves_the_gathers_and_costs_memory():
    base = dict(dp=16, zero=3, micro_batch=1, grad_accum=4, attention="fa3")
    resharded = _price("llama-3-8b", "h100-sxm", Layout(**base))
    kept = _price("llama-3-8b", "h100-sxm", Layout(**base, reshard_after_forward=False))
    assert kept.step.dp_comm_total_s < resharded.step.dp_comm_total_s
    assert kept.memory.total > resharded.memory.total


def test_plan_for_gpt3_175b_on_1024_a100_is_no_longer_zero3_at_77_percent(capsys):
    """Issue 12: `plan` recommended dp 512 x tp 2 ZeRO-3 at 76.7% MFU with the step '98% compute'. Priced with
    the NICs that group shares, the best layout uses pipeline parallelism and lands near the ~50% MFU that
    published runs of this size reach (Narayanan et al. 2021: 52% of peak on 1,024 A100)."""
    out = run_ok(capsys, ["plan", "--model", "gpt3-175b", "--hardware", "a100-sxm-80gb", "--gpus", "1024",
                          "--total-batch-size", "3145728", "--format", "csv"])
    best = csv_rows(out)[0]
    assert int(best["pp"]) > 1 and int(best["zero"]) < 3
    assert 45 < float(best["mfu_pct"]) < 60


# --------------------------------------------------------------------------------------------
# CLI


def test_shard_group_on_the_command_line(capsys):
    argv = ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "64", "--zero", "3",
            "--device-batch-size", "1", "--attention", "fa3", "--format", "csv"]
    (plain,) = csv_rows(run_ok(capsys, argv))
    (hybrid,) = csv_rows(run_ok(capsys, argv + ["--shard-group", "8"]))
    (kept,) = csv_rows(run_ok(capsys, argv + ["--no-reshard-after-forward"]))
    assert "sharded over 8, replicated x8" in hybrid["config"] and "no reshard after forward" in kept["config"]
    assert float(hybrid["memory_gib"]) > float(plain["memory_gib"])
    assert float(kept["dp_comm_total_s"]) < float(plain["dp_comm_total_s"])


def test_a_shard_group_some_rows_cannot_take_is_said_with_the_rows(capsys):
    """--shard-group 8 at 8 and 64 GPUs: at 8 the group is all of dp (no hybrid sharding: dropped), at 64 it
    applies. The warning names the rows it missed; where it fits no row it says that instead."""
    argv = ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--zero", "3", "--device-batch-size", "1",
            "--attention", "fa3", "--shard-group", "8", "--format", "csv"]
    code, _, err = run(capsys, argv + ["--gpus", "8,64"])
    assert code == 0
    line = next(s for s in err.splitlines() if "--shard-group 8" in s)
    assert "applies to 1 of 2 rows" in line and "not to the ZeRO-3 rows on 8 GPUs" in line
    code, _, err = run(capsys, argv + ["--gpus", "8"])
    assert code == 0 and "--shard-group 8 applies to no row" in err
    code, _, err = run(capsys, argv + ["--gpus", "64"])
    assert code == 0 and "--shard-group" not in err


@pytest.mark.parametrize("argv, flag", [
    (["--shard-group", "1"], "--shard-group"),
    (["--shard-group", "0"], "--shard-group"),
])
def test_bad_shard_group_is_one_line(capsys, argv, flag):
    code, line = fails(capsys, ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "64",
                                "--zero", "3", *argv])
    assert code == 2 and flag in line


def test_layout_for_applies_options():
    spec = load_model("llama-3-8b")
    lay = layout_for(spec, gpus=64, zero=3, micro_batch=1, grad_accum=1, attention="fa3",
                     options=Options(shard_group=8))
    assert lay.shard_group == 8 and lay.shard_degree == 8
    assert math.isclose(lay.dp / lay.shard_degree, 8)


def test_overlapped_param_gather_hides_under_the_next_forward():
    """Megatron's --overlap-param-gather, end to end: ZeRO-1 on 16 H100 (two nodes, 8 NICs each), the
    parameter all-gather after the step exposed beyond one micro-batch's forward (comm.param_gather_exposed_s)
    instead of in full; the reduce-scatter is unchanged."""
    base = dict(dp=16, zero=1, micro_batch=1, grad_accum=4, attention="fa3")
    blocking = _price("llama-3-8b", "h100-sxm", Layout(**base))
    over = _price("llama-3-8b", "h100-sxm", Layout(**base, overlap_param_gather=True))
    assert over.step.dp_comm_total_s == pytest.approx(blocking.step.dp_comm_total_s)
    assert over.step.dp_comm_exposed_s < blocking.step.dp_comm_exposed_s
    saved = blocking.step.dp_comm_exposed_s - over.step.dp_comm_exposed_s
    assert saved == pytest.approx(min(saved, over.step.fwd_s), rel=1e-9)  # at most one forward hides it


def test_gradient_reduce_after_backward_is_exposed_whole():
    """Megatron-LM's default (no --overlap-grad-reduce): the gradients are reduced after the whole backward, so
    nothing hides them. DDP on 16 H100: exposed = the all-reduce's total; ZeRO-1: the reduce-scatter's total plus
    the parameter gather (itself exposed, no --overlap-param-gather) = the whole total. Overlapped (the default),
    less is exposed and the total is the same; the compute is unchanged."""
    for zero in (0, 1):
        base = dict(dp=16, zero=zero, micro_batch=1, grad_accum=4, attention="fa3")
        over = _price("llama-3-8b", "h100-sxm", Layout(**base))
        after = _price("llama-3-8b", "h100-sxm", Layout(**base, overlap_grad_reduce=False))
        assert after.step.dp_comm_total_s == pytest.approx(over.step.dp_comm_total_s, rel=1e-12)
        assert after.step.dp_comm_exposed_s == pytest.approx(after.step.dp_comm_total_s, rel=1e-12)
        assert over.step.dp_comm_exposed_s < after.step.dp_comm_exposed_s
        assert after.step.compute_s == over.step.compute_s and after.step_s > over.step_s


def test_gradient_reduce_option_rules():
    """ZeRO-3 reduce-scatters each unit during backward: refusing the option there, naming the flag; a search's
    Options keep it overlapped on ZeRO-3 layouts and as given on ZeRO 0-2, and overlapped with one data-parallel
    rank (nothing to reduce, so no row says it reduces after backward)."""
    with pytest.raises(LayoutError, match="always overlapped") as e:
        Layout(dp=8, zero=3, overlap_grad_reduce=False)
    assert e.value.field == "--no-overlap-grad-reduce"
    opts = Options(overlap_grad_reduce=False)
    assert opts.for_layout(1, 8, 3)["overlap_grad_reduce"] is True
    assert [opts.for_layout(1, 8, z)["overlap_grad_reduce"] for z in (0, 1, 2)] == [False] * 3
    assert opts.for_layout(8, 1, 0)["overlap_grad_reduce"] is True


def test_megatron_core_profile_reduces_after_backward_unless_told(capsys):
    """--framework megatron-core applies the stack's default (the reduce after backward: a longer step on 16 GPUs
    in two nodes); --overlap-grad-reduce, as Megatron-Core takes it, wins over the profile, and the reduce then runs
    in the stack's buckets (its grad_bucket item: max(40M, 1M x dp) parameters, the last exposed); the row says it."""
    argv = ["table", "-m", "llama-3-8b", "--hardware", "h100", "--gpus", "16", "--zero", "1", "--attention", "fa3",
            "--format", "csv"]
    (plain,) = csv_rows(run_ok(capsys, argv + ["--grad-bucket", "megatron"]))
    (core,) = csv_rows(run_ok(capsys, argv + ["--framework", "megatron-core"]))
    (told,) = csv_rows(run_ok(capsys, argv + ["--framework", "megatron-core", "--overlap-grad-reduce"]))
    assert float(core["dp_comm_exposed_s"]) > float(told["dp_comm_exposed_s"])
    assert float(told["dp_comm_exposed_s"]) == pytest.approx(float(plain["dp_comm_exposed_s"]), rel=0.05)
    text = " ".join(run_ok(capsys, argv[:-2] + ["--no-overlap-grad-reduce"]).split())
    assert "grad reduce after backward" in text


def test_memory_ranks_its_fixes_with_the_profile_s_gradient_reduce(capsys):
    """`memory` ranks the ways to fit by step time, so it takes the option too: under megatron-core's profile (the
    reduce after backward) ZeRO-2's exposed reduce-scatter makes it slower than ZeRO-3 on 8 H100 (as `table` prices
    them), and memory's one-change fix is ZeRO-3, not ZeRO-2 as it said while it priced every reduce overlapped."""
    argv = ["-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--framework", "megatron-core",
            "--attention", "sdpa-fused"]
    rows = csv_rows(run_ok(capsys, ["table", *argv, "--zero", "2,3", "--device-batch-size", "1", "--format", "csv"]))
    zero2, zero3 = (float(r["step_s"]) for r in rows)
    assert zero2 > zero3
    text = " ".join(run_ok(capsys, ["memory", *argv]).split())
    assert "Fastest to fit with 1 change: ZeRO-3:" in text
    told = " ".join(run_ok(capsys, ["memory", *argv, "--overlap-grad-reduce"]).split())
    assert "Fastest to fit with 1 change: ZeRO-2 (another training setup):" in told


def test_pipeline_sends_across_nodes_use_one_nic():
    """pp 2 on 16 H100 at tp 8: each stage is a node, and each GPU sends to its peer over its own NIC
    (50 GB/s x 0.85), not the node's eight."""
    spec = load_model("llama-3-8b")
    p = _price("llama-3-8b", "h100-sxm", Layout(dp=1, tp=8, pp=2, micro_batch=1, grad_accum=8, attention="fa3"))
    a = spec.architecture
    sent = 1 * spec.recipe.seq_len * a.d_model * 2 / 8  # b s h bf16, split over tp (Narayanan et al. 2021 sec. 4.1)
    p2p = 8 * 2 * (sent / (50e9 * 0.85) + 10e-6)  # accum x 2 directions x (bytes / busbw + latency)
    from ddplan import pipeline

    bubble = pipeline.bubble_time_s(p.step.compute_s + p.step.tp_comm_s, 2, 8, 1)
    assert p.step.bubble_s == pytest.approx(bubble + p2p, rel=1e-9)


@pytest.mark.parametrize("flag", [["--shard-group", "16"], ["--no-reshard-after-forward"], ["--overlap-param-gather"],
                                  ["--no-overlap-grad-reduce"], ["--cp", "1,2"]])
def test_plan_takes_every_option(capsys, flag):
    """Each option through `plan` (a search rebuilds layouts at other ZeRO stages: the options must follow)."""
    out = run_ok(capsys, ["plan", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "64", "--seq-len",
                          "8192", *flag, "--format", "csv"])
    rows = csv_rows(out)
    assert rows
    if flag[0] == "--cp":
        assert {r["cp"] for r in rows} >= {"1", "2"}


def test_zero3_exposed_is_at_least_what_compute_cannot_hide():
    """A ZeRO-3 layout whose traffic exceeds its compute: GPT-3 175B on 1,024 A100 at dp 512 x tp 2, each
    micro-batch gathering ~175 GB of parameters (twice) over one NIC per node. Exposed communication is at
    least accum x (gathers + reduce-scatter - compute) a step (comm.fsdp_comm_s)."""
    from ddplan.anatomy import build_anatomy, for_tp
    from ddplan.layout import Layout
    from ddplan.registry import load_hardware, load_model
    from ddplan.roofline import rates
    from ddplan.step import step_time

    spec, hw = load_model("gpt3-175b"), load_hardware("a100-sxm-80gb")
    lay = Layout(dp=512, tp=2, zero=3, micro_batch=1, grad_accum=3, attention="fa2", sequence_parallel=True)
    an = for_tp(build_anatomy(spec, batch=1, attention="flash_package"), 2, sequence_parallel=True)
    st = step_time(spec, hw, lay, an, rates(hw, "fa2"))
    comm_mb, compute_mb = st.mb_gather_s + st.mb_scatter_s, st.fwd_s + st.bwd_s
    assert comm_mb > compute_mb  # the case the check is about
    assert st.dp_comm_exposed_s >= st.accum * (comm_mb - compute_mb)
    assert st.dp_comm_total_s == pytest.approx(st.accum * comm_mb)


def test_plan_says_what_zero3_exposes(capsys):
    from cli_helpers import run_ok

    out = run_ok(capsys, ["plan", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "64", "--top", "1",
                          "--format", "markdown"])
    line = next(l for l in out.splitlines() if "ZeRO-3: each micro-batch all-gathers" in l)
    assert "reduce-scatters its gradients in" in line and "a micro-batch exposed" in line


def test_reshard_under_a_pipeline_follows_its_own_option():
    """torchtitan's "default" reshard policy (distributed/fsdp.py@b5bcd76 L112-136): reshard after forward without
    a pipeline, keep the gathered parameters with one (Options.reshard_under_pipeline False, its profile's); the
    option leaves pp 1 and the other stages alone, and --no-reshard-after-forward still keeps them everywhere."""
    titan = Options(reshard_under_pipeline=False)
    assert titan.for_layout(tp=1, ranks=8, zero=3, pp=1)["reshard_after_forward"]
    assert not titan.for_layout(tp=1, ranks=8, zero=3, pp=4)["reshard_after_forward"]
    assert titan.for_layout(tp=1, ranks=8, zero=1, pp=4)["reshard_after_forward"]  # not a ZeRO-3 option
    assert Options().for_layout(tp=1, ranks=8, zero=3, pp=4)["reshard_after_forward"]
    assert not Options(reshard_after_forward=False).for_layout(tp=1, ranks=8, zero=3, pp=1)["reshard_after_forward"]
    assert not titan.searched(tp=1, ranks=8, zero=3, pp=4)["reshard_after_forward"]


def test_an_option_no_layout_can_take_is_said(capsys):
    """An option given that none of the command's layouts can take (Options.for_layout leaves it out: a ZeRO-3 option
    on ZeRO-1 rows) is said in one warning line, and the command still runs; where one row can take it, nothing is
    said; a profile's options are not the user's and are not said."""
    from cli_helpers import run

    code, _, err = run(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "1",
                                "--fsdp2", "--attention", "fa3"])
    assert code == 0 and "warning: --fsdp2 changes nothing here: none of the layouts asked for can take it" in err
    code, _, err = run(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "1,3",
                                "--fsdp2", "--attention", "fa3"])
    assert code == 0 and "changes nothing" not in err
    code, _, err = run(capsys, ["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "1",
                                "--no-reshard-after-forward"])
    assert code == 0 and "warning: --no-reshard-after-forward changes nothing here" in err
    code, _, err = run(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "0",
                                "--framework", "torchtitan", "--attention", "fa3"])  # its --fsdp2 on DDP rows
    assert code == 0 and "changes nothing" not in err


def test_etp_sequence_parallel_and_skipped_rows_are_weighed_too(capsys):
    """--etp 1 where every layout has tp 1 changes nothing (experts are whole at tp 1 whatever it says); on a mixture
    of experts --sequence-parallel changes nothing at tp > 1 (Options.for_model turns it on: Megatron-Core requires
    it) and --no-sequence-parallel is overridden there, each said why; an option that only skipped rows could take
    (cp 2 with unfused attention, which context parallelism refuses) changes nothing either."""
    from cli_helpers import run

    moe = ["-m", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "8", "--attention", "fa3"]
    code, _, err = run(capsys, ["table", *moe, "--etp", "1"])
    assert code == 0 and "warning: --etp changes nothing here: none of the layouts asked for can take it" in err
    code, _, err = run(capsys, ["table", *moe, "--etp", "1", "--tp", "2", "--ep", "4"])
    assert code == 0 and "--etp changes nothing" not in err
    code, _, err = run(capsys, ["table", *moe, "--tp", "2", "--ep", "4", "--sequence-parallel"])
    assert code == 0 and ("warning: --sequence-parallel changes nothing here: mixtral-8x7b is a mixture of experts, "
                          "which runs sequence parallelism at tp > 1 anyway") in err
    code, _, err = run(capsys, ["memory", *moe[:-2], "--tp", "2", "--ep", "4", "--no-sequence-parallel"])
    assert code == 0 and "warning: --no-sequence-parallel is overridden: mixtral-8x7b is a mixture of experts" in err
    code, _, err = run(capsys, ["table", *moe, "--tp", "1", "--ep", "4", "--no-sequence-parallel"])
    assert code == 0 and "sequence-parallel" not in err  # tp 1: nothing to override
    code, _, err = run(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--tp", "2",
                                "--sequence-parallel", "--attention", "fa3"])
    assert code == 0 and "sequence-parallel" not in err  # a dense model: the flag does what it says
    dense = ["-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--cp", "1,2", "--cp-comm", "all-gather"]
    code, _, err = run(capsys, ["table", *dense, "--attention", "sdpa-math"])
    assert code == 0 and "warning: --cp-comm changes nothing here" in err and "skipped" in err
    code, _, err = run(capsys, ["table", *dense, "--attention", "fa3"])
    assert code == 0 and "--cp-comm changes nothing" not in err
    # whether recompute stops early, where no row re-runs anything
    plain = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--attention", "fa3"]
    code, _, err = run(capsys, [*plain, "--no-recompute-early-stop"])
    assert code == 0 and "warning: --no-recompute-early-stop changes nothing here: no row re-runs anything" in err
    code, _, err = run(capsys, [*plain, "--no-recompute-early-stop", "--recompute", "none,full"])
    assert code == 0 and "recompute-early-stop" not in err


def test_of_two_options_that_do_the_same_only_the_redundant_one_is_said(capsys):
    """--no-reshard-after-forward and --no-reshard-under-pipeline on a pipelined ZeRO-3 table: either alone keeps the
    gathered parameters, so together one of them changes nothing; the other does, and is not said."""
    from cli_helpers import run

    code, _, err = run(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--pp", "2",
                                "--zero", "3", "--no-reshard-after-forward", "--no-reshard-under-pipeline",
                                "--attention", "fa3"])
    assert code == 0 and err.count("changes nothing here") == 1
    code, _, err = run(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "1",
                                "--shard-group", "4", "--attention", "fa3"])
    assert code == 0 and "--shard-group changes nothing" not in err and "--shard-group 4 applies to no row" in err
