"""Mixture of experts: parameters (total and active), FLOPs, memory under expert parallelism, the all-to-all
token exchange, layouts and the CLI.

The configs are written here with the fields of the published config.json files (no download); the
expected counts are the published ones: Mixtral 8x7B 46.7B total / 12.9B active (Jiang et al., arXiv
2401.04088, sec. 2; HF's exact count 46,702,792,704), Qwen2-57B-A14B 57.4B / 14B (Qwen2 report, arXiv
2407.10671, Table 1), Qwen3-30B-A3B 30.5B / 3.3B and Qwen3-235B-A22B 235B / 22B (Qwen3 report, arXiv
2505.09388, Table 2).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from ddplan import comm
from ddplan.anatomy import build_anatomy
from ddplan.comm import GroupTimer
from ddplan.errors import LayoutError
from ddplan.flops import flops_per_token, matmul_params
from ddplan.layout import Layout, check_layout, placement
from ddplan.memory import model_states
from ddplan.params import active_params, expert_params_per_layer, param_counts, total_params
from ddplan.registry import load_hardware, load_model
from ddplan.step import step_time
from ddplan.roofline import rates
from ddplan.specs import DROPLESS_IMBALANCE

from cli_helpers import csv_rows, fails, run_ok

MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
           "rope_theta": 1e6, "tie_word_embeddings": False, "sliding_window": None, "rms_norm_eps": 1e-5}
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 3584, "intermediate_size": 18944, "moe_intermediate_size": 2560,
             "shared_expert_intermediate_size": 20480, "num_attention_heads": 28, "num_key_value_heads": 4,
             "num_hidden_layers": 28, "num_experts": 64, "num_experts_per_tok": 8, "vocab_size": 151936,
             "max_position_embeddings": 32768, "tie_word_embeddings": False, "decoder_sparse_step": 1,
             "mlp_only_layers": []}
QWEN3_30B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48,
             "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
             "tie_word_embeddings": False}
QWEN3_235B = {**QWEN3_30B, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
              "num_attention_heads": 64, "num_hidden_layers": 94}


def _config(tmp_path, name: str, cfg: dict) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**cfg, "_name_or_path": f"org/{name}"}), encoding="utf-8")
    return str(folder)


@pytest.fixture
def mixtral(tmp_path):
    return _config(tmp_path, "mixtral-8x7b", MIXTRAL)


# --------------------------------------------------------------------------------------------
# Parameters and FLOPs


@pytest.mark.parametrize("cfg, total, active, tol", [
    (MIXTRAL, 46.7e9, 12.9e9, 0.05e9),
    (QWEN2_MOE, 57.4e9, 14.0e9, 0.3e9),  # the report rounds activated parameters to 14B
    (QWEN3_30B, 30.5e9, 3.3e9, 0.06e9),
    (QWEN3_235B, 235e9, 22e9, 0.5e9),
])
def test_published_total_and_active_parameters(tmp_path, cfg, total, active, tol):
    spec = load_model(_config(tmp_path, cfg["model_type"], cfg))
    a = spec.architecture
    assert total_params(a) == pytest.approx(total, abs=tol)
    assert active_params(a) == pytest.approx(active, abs=tol)


def test_mixtral_counts_by_hand(tmp_path, mixtral):
    a = load_model(mixtral).architecture
    assert total_params(a) == 46_702_792_704  # HF's count of mistralai/Mixtral-8x7B-v0.1
    # one layer's experts: 8 SwiGLU MLPs of 3 x 4096 x 14336
    assert expert_params_per_layer(a) == 8 * 3 * 4096 * 14336 == 1_409_286_144
    c = param_counts(a)
    assert c["experts"] == 32 * 1_409_286_144
    assert c["router"] == 32 * 4096 * 8
    assert c["block_matrices"] == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)  # attention only: no dense MLP
    # active: 2 of the 8 experts
    assert active_params(a) == total_params(a) - c["experts"] + c["experts"] // 4
    # the N of 6N: block matrices, router, lm_head and 2 of 8 experts (embeddings cost no matmul)
    assert matmul_params(a) == c["block_matrices"] + c["router"] + c["lm_head"] + c["experts"] // 4


def test_qwen2_moe_shared_expert_and_gate(tmp_path):
    a = load_model(_config(tmp_path, "qwen2-moe", QWEN2_MOE)).architecture
    assert a.moe.shared_experts == 1 and a.moe.shared_hidden_dim == 20480 and a.moe.shared_expert_gate
    c = param_counts(a)
    assert c["router"] == 28 * 3584 * (64 + 1)  # the router and the shared expert's sigmoid gate
    attention = 2 * 3584 * 3584 + 2 * 3584 * 512
    assert c["block_matrices"] == 28 * (attention + 3 * 3584 * 20480)  # shared experts count as block matrices


def test_dense_layers_keep_the_dense_mlp(tmp_path):
    cfg = {**QWEN2_MOE, "mlp_only_layers": [0, 1]}
    a = load_model(_config(tmp_path, "qwen2-moe-dense", cfg)).architecture
    assert a.moe.dense_layers == 2 and a.moe_layers == 26
    assert param_counts(a)["experts"] == 26 * 64 * 3 * 3584 * 2560


def test_anatomy_gemm_flops_are_six_active_n(tmp_path, mixtral):
    spec = load_model(mixtral)
    t = 4096
    for ep in (1, 8):
        an = build_anatomy(spec, batch=1, seq_len=t, ep=ep)
        gemm = sum(op.flops_fwd + op.flops_bwd for op in an.ops if op.kind == "gemm")
        # every GEMM of a token is 6 x its weights, the routed experts at top_k / num_experts
        assert gemm / t == pytest.approx(6 * matmul_params(spec.architecture), rel=1e-12)


def test_expert_parallelism_changes_rows_per_expert_and_weights_read(tmp_path, mixtral):
    spec = load_model(mixtral)
    one, eight = (build_anatomy(spec, batch=1, seq_len=4096, ep=ep) for ep in (1, 8))
    up1 = next(op for op in one.ops if op.name == "h0.experts.up")
    up8 = next(op for op in eight.ops if op.name == "h0.experts.up")
    # 4096 tokens x top-2 = 8192 rows: over 8 local experts 1024 each, over 1 expert (ep 8) all 8192
    assert up1.shape == (1024, 14336, 4096) and up8.shape == (8192, 14336, 4096)
    assert up1.flops_fwd == up8.flops_fwd == 2.0 * 8192 * 14336 * 4096
    # forward bytes: rows in and out the same, weights (bf16 cast of fp32 masters: 2 + 4 + 2 B) 8x fewer
    w = 14336 * 4096
    assert up1.bytes_fwd - up8.bytes_fwd == pytest.approx(7 * w * (2 + 4 + 2))


def test_capacity_factor_pads_the_experts_not_the_model_flops(tmp_path, mixtral):
    spec = load_model(mixtral)
    padded = spec.model_copy(update={"architecture": spec.architecture.model_copy(update={
        "moe": spec.architecture.moe.model_copy(update={"capacity_factor": 1.25})})})
    base, cf = (build_anatomy(s, batch=1, seq_len=2048) for s in (spec, padded))
    op = {o.name: o for o in cf.ops}["h0.experts.up"]
    assert op.flops_fwd == pytest.approx(1.25 * {o.name: o for o in base.ops}["h0.experts.up"].flops_fwd)
    assert matmul_params(padded.architecture) == matmul_params(spec.architecture)


def test_mfu_convention_counts_active_parameters(tmp_path, mixtral):
    a = load_model(mixtral).architecture
    attn = 12 * 32 * 128 * 4096 * 32
    assert flops_per_token(a, 4096, "palm") == 6 * matmul_params(a) + attn
    with pytest.raises(ValueError, match="dense GPT layers"):
        flops_per_token(a, 4096, "korthikanti")


# --------------------------------------------------------------------------------------------
# Memory and layouts


def test_expert_states_split_over_ep_and_sharded_over_the_rest(tmp_path, mixtral):
    spec = load_model(mixtral)
    experts = param_counts(spec.architecture)["experts"]
    for ep in (1, 2, 8):
        st = model_states(spec, Layout(dp=16, zero=1, ep=ep))
        assert st["params"]["experts"] == pytest.approx(4 * experts / ep)  # fp32 masters, 1 / ep of the experts
        assert st["gradients"]["experts"] == pytest.approx(4 * experts / ep)
        # AdamW m and v in fp32, ZeRO-1 over the 16 / ep ranks that hold the same experts
        assert st["optimizer"]["experts"] == pytest.approx(8 * experts / ep / (16 // ep))
        # everything else is sharded over all 16
        assert st["optimizer"]["block_matrices"] == pytest.approx(8 * param_counts(spec.architecture)["block_matrices"] / 16)


def test_layout_rules(tmp_path, mixtral):
    spec = load_model(mixtral)
    with pytest.raises(LayoutError, match="must divide dp x cp=4"):
        Layout(dp=4, ep=8)
    with pytest.raises(LayoutError, match="must divide the number of experts"):
        check_layout(Layout(dp=16, ep=16), spec)
    with pytest.raises(LayoutError, match="sequence parallelism"):
        check_layout(Layout(dp=8, tp=2, ep=8), spec)
    check_layout(Layout(dp=8, tp=2, ep=8, sequence_parallel=True), spec)
    with pytest.raises(LayoutError, match="is dense"):
        check_layout(Layout(dp=8, ep=2), load_model("llama-3-8b"))


def test_expert_groups_placement():
    # 64 GPUs on 8-GPU nodes, tp 2, dp 32, ep 8: an ep group strides by tp, so 8 members span 16 ranks, 2 nodes
    place = placement(Layout(dp=32, tp=2, ep=8, sequence_parallel=True), 8)
    assert (place.ep_per_node, place.ep_crosses) == (4, True)
    # the expert-data-parallel group (4 ranks, 16 apart) has one member a node
    assert (place.edp_per_node, place.edp_crosses) == (1, True)
    # tp 1: the 8 ep ranks fill one node
    assert placement(Layout(dp=64, ep=8), 8).ep_crosses is False


# --------------------------------------------------------------------------------------------
# Communication


def test_rows_bytes_by_hand():
    assert comm.moe_rows_bytes(4096, 2, 4096, 2) == 4096 * 2 * 4096 * 2 == 67_108_864
    assert comm.moe_rows_bytes(4096, 2, 4096, 2, rows_factor=1.5) == 1.5 * 67_108_864


def test_layer_exchange_by_hand():
    hw = load_hardware("h100-sxm")
    timer = GroupTimer(hw, 8)
    rows = 67_108_864.0
    tier = comm.tier_for(hw, "all_gather", 8, per_node=8)
    # one all-to-all over 8 = an all-gather with a 64 MiB output: 7 steps of latency + 7/8 of it at busbw
    a2a = 7 * tier.latency_s + rows * 7 / 8 / tier.busbw_bytes_per_s
    fwd, bwd = comm.moe_layer_comm_s(rows, 8, 1, timer, timer)
    assert fwd == bwd == pytest.approx(2 * a2a)
    # ep 1, tp 2: no all-to-all; the rows all-gathered over tp before the experts, reduce-scattered after
    tp_timer = GroupTimer(hw, 2)
    fwd, _ = comm.moe_layer_comm_s(rows, 1, 2, timer, tp_timer)
    assert fwd == pytest.approx(tp_timer.time_s("all_gather", 2 * rows, 2) + tp_timer.time_s("reduce_scatter", 2 * rows, 2))


def test_step_prices_the_exchange_per_moe_layer(tmp_path, mixtral):
    spec = load_model(mixtral)
    hw = load_hardware("h100-sxm")
    lay = Layout(dp=8, zero=3, ep=8, micro_batch=1, grad_accum=4)
    an = build_anatomy(spec, batch=1, ep=8, attention="flash_package")
    st = step_time(spec, hw, lay, an, rates(hw, "fa3"))
    # dropless routing: the busiest of the 8 ranks receives DROPLESS_IMBALANCE x the mean 4096 x top-2 rows
    rows = comm.moe_rows_bytes(4096, 2, 4096, 2, DROPLESS_IMBALANCE)
    fwd, bwd = comm.moe_layer_comm_s(rows, 8, 1, GroupTimer(hw, 8), GroupTimer(hw, 1))
    assert st.ep_comm_s == pytest.approx(4 * 32 * (fwd + bwd))
    assert st.total_s == pytest.approx(st.compute_s + st.ep_comm_s + st.dp_comm_exposed_s + st.optimizer_s)
    # full recompute re-runs each forward's two all-to-alls
    full = step_time(spec, hw, replace(lay, recompute="full"), replace(an, recompute="full"), rates(hw, "fa3"))
    assert full.ep_comm_s == pytest.approx(4 * 32 * (2 * fwd + bwd))


def test_expert_gradients_reduce_over_their_own_group(tmp_path, mixtral):
    spec = load_model(mixtral)
    hw = load_hardware("h100-sxm")
    from ddplan.step import grad_sync_buffers

    lay = Layout(dp=16, zero=1, ep=8)
    experts = grad_sync_buffers(spec, lay, experts=True)
    dense = grad_sync_buffers(spec, lay)
    n = param_counts(spec.architecture)["experts"]
    assert experts == [("reduce_scatter", 4 * n / 8), ("all_gather", 2 * n / 8)]
    assert all(size < 4 * n / 8 for _, size in dense)
    assert lay.expert_ranks == 2
    # with ep = dp x cp every rank holds its own experts: nothing to reduce for them
    solo = Layout(dp=8, zero=1, ep=8)
    an = build_anatomy(spec, batch=1, ep=8)
    t8 = step_time(spec, hw, solo, an, rates(hw, "fa3"))
    t_dense = step_time(spec, hw, replace(solo, ep=1), build_anatomy(spec, batch=1), rates(hw, "fa3"))
    assert t8.dp_comm_total_s < t_dense.dp_comm_total_s


# --------------------------------------------------------------------------------------------
# CLI


def test_table_takes_ep_and_shows_the_exchange(capsys, mixtral):
    rows = csv_rows(run_ok(capsys, ["table", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "64",
                                    "--ep", "1,8", "--attention", "fa3", "--zero", "3", "--format", "csv"]))
    by_ep = {int(r["ep"]): r for r in rows}
    assert set(by_ep) == {1, 8}
    assert float(by_ep[1]["ep_comm_s"]) == 0 and float(by_ep[8]["ep_comm_s"]) > 0
    assert float(by_ep[8]["memory_gib"]) < float(by_ep[1]["memory_gib"])  # 1/8 of the experts a GPU


def test_table_assumptions_name_the_moe_conventions(capsys, mixtral):
    out = run_ok(capsys, ["table", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "8", "--ep", "8",
                          "--attention", "fa3", "--format", "markdown", "--explain"])
    assert "12.9B of 46.7B parameters active" in out and "all-to-all" in out


def test_tp_runs_with_sequence_parallelism_for_moe(capsys, mixtral):
    rows = csv_rows(run_ok(capsys, ["table", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "16",
                                    "--tp", "2", "--ep", "8", "--attention", "fa3", "--format", "csv"]))
    assert rows[0]["sp"] == "True" and float(rows[0]["ep_comm_s"]) > 0


def test_plan_searches_expert_parallelism(capsys, mixtral):
    base = ["plan", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "64", "--format", "json"]
    forced = json.loads(run_ok(capsys, base + ["--moe-imbalance", "1"]))["rows"]
    assert all(r["ep_comm_s"] > 0 for r in forced if r["ep"] > 1)
    # routing forced balanced, on 8-GPU nodes the experts split beats holding all 46.7B a GPU
    assert forced[0]["ep"] > 1
    # dropless (the default): every rank waits for the busiest at each all-to-all, and the split costs more
    dropless = json.loads(run_ok(capsys, base))["rows"]
    assert dropless[0]["step_s"] > forced[0]["step_s"]


def test_ep_errors_are_one_line(capsys, mixtral):
    _, err = fails(capsys, ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--ep", "2"])
    assert "ep=2" in err and "dense" in err
    _, err = fails(capsys, ["table", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "8", "--ep", "16"])
    assert "ep=16" in err
    _, err = fails(capsys, ["table", "--model", mixtral, "--gpus", "8", "--ep", "0"])
    assert "--ep" in err


def test_builtin_moe_models_match_their_configs(tmp_path, mixtral):
    assert param_counts(load_model("mixtral-8x7b").architecture) == param_counts(load_model(mixtral).architecture)
    q = load_model("qwen3-30b-a3b").architecture
    assert total_params(q) == pytest.approx(30.5e9, abs=0.06e9) and active_params(q) == pytest.approx(3.3e9, abs=0.06e9)
    assert math.isclose(param_counts(q)["experts"], 48 * 128 * 3 * 2048 * 768)
    # RMSNorm weights: 2 a block + the final one, and Qwen3's per-head q_norm and k_norm (head_dim each)
    assert param_counts(q)["norms"] == (2 * 48 + 1) * 2048 + 48 * 2 * 128


def test_qk_norm_sees_every_head(tmp_path):
    """Qwen3's q is 32 heads x 128 = 4096 wide over a 2048-wide stream: its norm reads and saves q, not d_model."""
    spec = load_model("qwen3-30b-a3b")
    an = build_anatomy(spec, batch=1, seq_len=128)
    q_norm = next(op for op in an.ops if op.name == "h0.attn.q_norm")
    assert q_norm.shape == (128 * 4096,)
    assert next(sv for sv in q_norm.saves if sv.name == "h0.q_rope").bytes == 128 * 4096 * 2


def test_plan_ep_errors_name_the_flag(capsys, mixtral):
    _, err = fails(capsys, ["plan", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--ep", "2"])
    assert "--ep" in err and "dense" in err
    out = run_ok(capsys, ["plan", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "8", "--ep", "16",
                          "--format", "markdown"])
    assert "--ep 16 against the experts" in out


# --------------------------------------------------------------------------------------------
# Whole experts (expert tensor parallelism 1)


def test_whole_experts_let_ep_span_the_tp_ranks():
    with pytest.raises(LayoutError, match="must divide dp x cp=4"):
        Layout(dp=4, tp=2, ep=8, sequence_parallel=True)
    lay = Layout(dp=4, tp=2, ep=8, etp=1, sequence_parallel=True)
    assert (lay.expert_tp, lay.expert_rows_split, lay.expert_pool, lay.expert_ranks) == (1, 2, 8, 1)
    with pytest.raises(LayoutError, match="1 or the tp degree"):
        Layout(dp=4, tp=2, etp=2)
    # Megatron-Core's expert grid: ep strides by the experts' tp (1 here), so 8 consecutive ranks: one node
    assert placement(lay, 8).ep_crosses is False and placement(lay, 8).ep_per_node == 8


def test_whole_experts_compute_a_tp_ranks_own_rows(tmp_path, mixtral):
    from ddplan.anatomy import for_tp

    spec = load_model(mixtral)
    split = for_tp(build_anatomy(spec, batch=1, seq_len=1024, ep=4), 2, sequence_parallel=True)
    whole = for_tp(build_anatomy(spec, batch=1, seq_len=1024, ep=4, expert_rows=2), 2, sequence_parallel=True)
    up_split = next(op for op in split.ops if op.name == "h0.experts.up")
    up_whole = next(op for op in whole.ops if op.name == "h0.experts.up")
    # 1024 tokens x top-2 = 2048 rows over 2 local experts: split over tp by columns (1024 rows x 7168), or
    # whole on the rank's own 512 tokens (512 rows x 14336); the same FLOPs either way
    assert up_split.shape == (1024, 7168, 4096) and up_whole.shape == (512, 14336, 4096)
    assert up_whole.flops_fwd == up_split.flops_fwd == 2.0 * 1024 * 14336 * 4096
    # but the whole experts' weights: every element read (and its cast saved), not half
    w = 2 * 14336 * 4096
    assert up_whole.bytes_fwd - up_split.bytes_fwd == pytest.approx(w / 2 * (2 + 4 + 2))


def test_whole_experts_memory_and_exchange(tmp_path, mixtral):
    spec = load_model(mixtral)
    hw = load_hardware("h100-sxm")
    n = param_counts(spec.architecture)["experts"]
    whole = Layout(dp=4, tp=2, ep=8, etp=1, sequence_parallel=True, zero=1, micro_batch=1, grad_accum=1)
    split = Layout(dp=4, tp=2, ep=4, sequence_parallel=True, zero=1, micro_batch=1, grad_accum=1)
    # one expert a GPU either way: whole (8 of 8 split over ep 8), or 2 of 8 halved by tp 2
    assert model_states(spec, whole)["params"]["experts"] == pytest.approx(4 * n / 8)
    assert model_states(spec, split)["params"]["experts"] == pytest.approx(4 * n / 4 / 2)
    from ddplan.anatomy import for_tp

    r = rates(hw, "fa3")
    st_whole = step_time(spec, hw, whole, for_tp(build_anatomy(spec, batch=1, ep=8, expert_rows=2,
                                                               attention="flash_package"), 2, True), r)
    st_split = step_time(spec, hw, split, for_tp(build_anatomy(spec, batch=1, ep=4, attention="flash_package"),
                                                 2, True), r)
    # a tp rank's own 2,048 tokens (sequence parallel), the busiest rank's share under dropless routing
    rows = comm.moe_rows_bytes(4096 / 2, 2, 4096, 2, DROPLESS_IMBALANCE)
    fwd, bwd = comm.moe_layer_comm_s(rows, 8, 1, GroupTimer(hw, 8), GroupTimer(hw, 2))
    assert st_whole.ep_comm_s == pytest.approx(32 * (fwd + bwd))  # all-to-alls only: no gathers over tp
    fwd, bwd = comm.moe_layer_comm_s(rows, 4, 2, GroupTimer(hw, 4), GroupTimer(hw, 2))
    assert st_split.ep_comm_s == pytest.approx(32 * (fwd + bwd))


def test_etp_flag(capsys, mixtral):
    rows = csv_rows(run_ok(capsys, ["table", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "16", "--tp", "2",
                                    "--ep", "8", "--etp", "1", "--attention", "fa3", "--format", "csv"]))
    assert (rows[0]["ep"], rows[0]["etp"]) == ("8", "1") and "etp 1" in rows[0]["config"]
    _, err = fails(capsys, ["table", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "16", "--tp", "2",
                            "--etp", "2"])
    assert "--etp" in err
    _, err = fails(capsys, ["table", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--etp", "1"])
    assert "--etp" in err and "dense" in err


# --------------------------------------------------------------------------------------------
# Review findings, kept as tests


def test_all_to_all_across_nodes_goes_through_each_ranks_own_nic():
    from ddplan.comm import all_to_all_s

    hw = load_hardware("h100-sxm")  # 8 x 400 Gb/s NICs a node, 0.85 of line rate, 10 us across nodes
    size = 67_108_864.0
    # ep 8 as 4 + 4 on two nodes: half of each rank's buffer leaves its node through its one NIC
    nic = 400e9 / 8 * 0.85
    assert all_to_all_s(hw, size, 8, 4) == pytest.approx(size * 4 / 8 / nic + 10e-6)
    # twice the ring all-gather's time on the same group, which moves each remote block into a node once
    assert all_to_all_s(hw, size, 8, 4) > 1.9 * GroupTimer(hw, 4).time_s("all_gather", size, 8)
    # inside a node: the all-gather of the same buffer
    assert GroupTimer(hw, 8).all_to_all_s(size, 8) == GroupTimer(hw, 8).time_s("all_gather", size, 8)


def test_dense_layers_sit_on_the_first_stages():
    from ddplan.pipeline import moe_layers_by_stage
    from ddplan.memory import _stage_share

    q = load_model("qwen3-30b-a3b").architecture
    dense12 = q.model_copy(update={"moe": q.moe.model_copy(update={"dense_layers": 12})})
    assert moe_layers_by_stage(dense12, 4) == [0, 12, 12, 12]
    assert moe_layers_by_stage(q, 4) == [12, 12, 12, 12]
    # the experts on the busiest stage: 12 of the 36 MoE blocks, not a quarter of them
    assert _stage_share("experts", Layout(dp=4, pp=4, ep=4), 48, dense12) == pytest.approx(12 / 36)
    assert _stage_share("block_matrices", Layout(dp=4, pp=4, ep=4), 48, dense12) == pytest.approx(12 / 48)


@pytest.mark.parametrize("dense_layers", [0, 1, 11, 12, 13, 47])
def test_moe_blocks_by_stage_and_block_matrices_count_layer_by_layer(dense_layers):
    """moe_layers_by_stage and param_counts' block matrices count whole ranges of layers; the definition walks
    every layer (ModelArchitecture.is_moe_layer)."""
    from ddplan.params import block_matrix_params_per_layer, param_counts
    from ddplan.pipeline import moe_layers_by_stage, stage_layers

    q = load_model("qwen3-30b-a3b").architecture
    arch = q.model_copy(update={"moe": q.moe.model_copy(update={"dense_layers": dense_layers, "shared_width": 512})})
    assert param_counts(arch)["block_matrices"] == sum(block_matrix_params_per_layer(arch, i) for i in range(48))
    for p in (1, 2, 3, 4, 5, 8):
        first, middle, last = stage_layers(48, p) if p > 1 else (48,) * 3
        sizes = [first] if p == 1 else [first, *([middle] * (p - 2)), last]
        starts = [sum(sizes[:k]) for k in range(p)]
        assert moe_layers_by_stage(arch, p) == [sum(arch.is_moe_layer(i) for i in range(s, s + n))
                                                for s, n in zip(starts, sizes)]


def test_whole_experts_on_one_data_parallel_rank_still_sync_their_gradients(capsys):
    """tp 8 x ep 4 with whole experts on 8 GPUs: dp 1, but each expert lives on 2 GPUs (expert-data-parallel 2)."""
    rows = csv_rows(run_ok(capsys, ["table", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "8",
                                    "--tp", "8", "--ep", "4", "--etp", "1", "--zero", "1", "--attention", "fa3",
                                    "--format", "csv"]))
    assert rows[0]["dp"] == "1" and float(rows[0]["dp_comm_total_s"]) > 0


def test_tp_pairs_are_not_charged_twice_on_moe_layers(mixtral):
    spec = load_model(mixtral)
    hw = load_hardware("h100-sxm")
    from ddplan.anatomy import for_tp

    lay = Layout(dp=4, tp=2, ep=4, sequence_parallel=True, zero=1, micro_batch=1, grad_accum=2)
    st = step_time(spec, hw, lay, for_tp(build_anatomy(spec, batch=1, ep=4, attention="flash_package"), 2, True),
                   rates(hw, "fa3"))
    timer = GroupTimer(hw, 2)
    fwd, bwd = comm.tp_comm_time_per_layer_s(1, 4096, 4096, 2, 2, timer, True)
    # every block an MoE block without shared experts: only the attention's pair (half the layer's) is left
    assert st.tp_comm_s == pytest.approx(2 * 32 * (fwd + bwd) / 2)


def test_sequence_parallelism_keeps_the_gathered_expert_input_whole(mixtral):
    from ddplan.anatomy import for_tp

    spec = load_model(mixtral)
    base = build_anatomy(spec, batch=1, seq_len=1024, ep=4)
    sp = for_tp(base, 2, sequence_parallel=True)
    saved = {s.name: s.bytes for op in sp.ops for s in op.saves}
    assert saved["h0.moe.permuted"] == 1024 * 2 * 4096 * 2  # all rows, bf16: the dispatcher gathered them over tp
    assert saved["h0.experts.g"] == 1024 * 2 * 14336 * 2 / 2  # the column-split activations: half


def test_moe_with_biases_is_one_line(capsys, tmp_path):
    cfg = {**QWEN3_30B, "model_type": "olmoe", "intermediate_size": 96, "attention_bias": True, "num_hidden_layers": 2,
           "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16}
    del cfg["moe_intermediate_size"]  # Qwen3's: OLMoE's experts are intermediate_size wide (else: an unread field)
    _, err = fails(capsys, ["table", "--model", _config(tmp_path, "olmoe-bias", cfg), "--gpus", "8"])
    assert "linear_bias" in err


def test_ep_search_takes_every_common_divisor():
    from ddplan.layout import expert_parallel_degrees

    q = load_model("qwen3-30b-a3b")
    sixty = q.model_copy(update={"architecture": q.architecture.model_copy(update={
        "moe": q.architecture.moe.model_copy(update={"num_experts": 60, "top_k": 4})})})
    assert expert_parallel_degrees(sixty, 24) == [1, 2, 3, 4, 6, 12]
    assert expert_parallel_degrees(load_model("llama-3-8b"), 24) == [1]


def test_memory_fixes_may_add_tp_and_change_ep(capsys):
    """What fits for a mixture of experts: tp > 1 runs with sequence parallelism (on by itself) and ep may change
    with dp; here (routing forced balanced) the fastest fix takes tp 2 (dp 8), which ep 8 still divides."""
    out = run_ok(capsys, ["memory", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "16", "--ep", "8",
                          "--zero", "1", "--device-batch-size", "8", "--moe-imbalance", "1", "--format", "markdown"])
    assert "Fastest way to fit" in out and "tp 2 x pp 1" in out


def test_a_table_of_several_ep_prices_each_eps_memory_as_alone(capsys, mixtral):
    """The model-states cache is keyed by the experts' split too: at ZeRO-1 on 64 H100, ep 8 holds 1/8 of the
    experts (118.8 GiB), whether or not ep 1 (490 GiB) is priced in the same table (it was 412.8 before)."""
    base = ["table", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "64", "--zero", "1", "--attention", "fa3",
            "--format", "csv"]
    both = {r["ep"]: float(r["memory_gib"]) for r in csv_rows(run_ok(capsys, base + ["--ep", "1,8"]))}
    (alone,) = csv_rows(run_ok(capsys, base + ["--ep", "8"]))
    assert both["8"] == pytest.approx(float(alone["memory_gib"]), rel=1e-12)
    assert both["8"] < both["1"] / 3


# --------------------------------------------------------------------------------------------
# Dropless routing: every rank waits for the busiest at each all-to-all


def _forced(spec):
    """The model with routing forced balanced (load imbalance 1)."""
    moe = spec.architecture.moe.model_copy(update={"load_imbalance": 1.0})
    return spec.model_copy(update={"architecture": spec.architecture.model_copy(update={"moe": moe})})


def test_imbalance_by_hand(mixtral):
    from pydantic import ValidationError

    moe = load_model(mixtral).architecture.moe
    assert moe.imbalance(1) == 1.0  # every expert local: the rows are the same whichever expert takes them
    assert moe.imbalance(8) == DROPLESS_IMBALANCE == moe.rows_factor(8)
    assert moe.model_copy(update={"load_imbalance": 1.0}).imbalance(8) == 1.0
    assert moe.model_copy(update={"load_imbalance": 2.0}).rows_factor(4) == 2.0
    padded = moe.model_copy(update={"capacity_factor": 1.25})
    assert padded.imbalance(8) == 1.0 and padded.rows_factor(8) == 1.25  # padded to capacity: no imbalance
    assert moe.routed_tokens(4096) == 4096 * 2  # the mean rank's rows: what memory and FLOPs count
    with pytest.raises(ValidationError, match="load_imbalance is for dropless"):
        type(moe).model_validate({**moe.model_dump(), "capacity_factor": 1.25, "load_imbalance": 1.5})
    with pytest.raises(ValidationError):
        type(moe).model_validate({**moe.model_dump(), "load_imbalance": 0.9})


def test_the_busiest_rank_sets_the_experts_time_not_the_memory(mixtral):
    from ddplan.roofline import op_time_s

    spec = load_model(mixtral)
    hw = load_hardware("h100-sxm")
    r = rates(hw, "fa3")
    dropless, forced = (build_anatomy(s, batch=1, ep=8, attention="flash_package") for s in (spec, _forced(spec)))
    for d, f in zip(dropless.ops, forced.ops):
        assert (d.shape, d.flops_fwd, d.bytes_fwd, d.saves) == (f.shape, f.flops_fwd, f.bytes_fwd, f.saves)
        # the experts' ops on the rows received wait for the busiest rank; permute and combine run on each
        # rank's own tokens, balanced
        assert d.wait == (DROPLESS_IMBALANCE if ".experts." in d.name else 1.0), d.name
        fd, bd = op_time_s(d, dropless, r)
        ff, bf = op_time_s(f, forced, r)
        assert (fd, bd) == pytest.approx((ff * d.wait, bf * d.wait))
    lay = Layout(dp=8, zero=1, ep=8, micro_batch=1, grad_accum=2)
    from ddplan.memory import memory_per_gpu

    mem = [memory_per_gpu(s, lay, an, hw.memory.usable_bytes).total for s, an in ((spec, dropless),
                                                                                  (_forced(spec), forced))]
    assert mem[0] == mem[1]
    # the step: the experts' part and the exchange scale, the rest does not
    st_d, st_f = (step_time(s, hw, lay, an, r) for s, an in ((spec, dropless), (_forced(spec), forced)))
    expert_s = sum(sum(op_time_s(o, forced, r)) for o in forced.ops if ".experts." in o.name)
    assert st_d.compute_s - st_f.compute_s == pytest.approx(2 * (DROPLESS_IMBALANCE - 1) * expert_s, rel=1e-6)
    rows = comm.moe_rows_bytes(4096, 2, 4096, 2)
    timer = GroupTimer(hw, 8)
    f1, b1 = comm.moe_layer_comm_s(rows * DROPLESS_IMBALANCE, 8, 1, timer, timer)
    assert st_d.ep_comm_s == pytest.approx(2 * 32 * (f1 + b1))
    # one expert-parallel rank: nothing to wait for
    one = build_anatomy(spec, batch=1, ep=1)
    assert all(o.wait == 1.0 for o in one.ops)


def test_moe_imbalance_flag(capsys, mixtral):
    base = ["table", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "64", "--ep", "1,8", "--zero", "1",
            "--attention", "fa3", "--format", "csv"]
    steps = {flag: {r["ep"]: float(r["step_s"]) for r in csv_rows(run_ok(capsys, base + list(flag)))}
             for flag in ((), ("--moe-imbalance", "1"), ("--moe-imbalance", "2"))}
    assert steps[()]["1"] == steps[("--moe-imbalance", "1")]["1"] == steps[("--moe-imbalance", "2")]["1"]
    assert steps[("--moe-imbalance", "1")]["8"] < steps[()]["8"] < steps[("--moe-imbalance", "2")]["8"]
    out = run_ok(capsys, ["table", "--model", mixtral, "--hardware", "h100-sxm", "--gpus", "8", "--ep", "8",
                          "--attention", "fa3", "--format", "markdown", "--explain"])
    assert f"{DROPLESS_IMBALANCE:g}x the mean" in out
    _, err = fails(capsys, ["table", "--model", "llama-3-8b", "--gpus", "8", "--moe-imbalance", "1.2"])
    assert "--moe-imbalance" in err and "dense" in err
    _, err = fails(capsys, base + ["--moe-imbalance", "0.5"])
    assert "--moe-imbalance" in err and "[1, 64]" in err


def test_the_wait_survives_tp_cp_and_recompute(mixtral):
    """Op.wait is kept through the tp, sequence-parallel and cp shares, and full recompute re-runs the experts'
    forward at the busiest rank's time too."""
    from ddplan.anatomy import for_cp, for_tp
    from ddplan.roofline import op_time_s

    spec = load_model(mixtral)
    an = build_anatomy(spec, batch=1, seq_len=4096, ep=8, attention="flash_package")
    short = build_anatomy(spec, batch=1, seq_len=2048, ep=8, attention="flash_package")
    for share in (for_tp(an, 2, sequence_parallel=True), for_cp(an, short, 2)):
        experts = [o for o in share.ops if ".experts." in o.name]
        assert experts and all(o.wait == DROPLESS_IMBALANCE for o in experts)
        assert all(o.wait == 1.0 for o in share.ops if ".experts." not in o.name)
    hw = load_hardware("h100-sxm")
    r = rates(hw, "fa3")
    lay = Layout(dp=8, zero=1, ep=8, micro_batch=1, grad_accum=2, recompute="full")
    forced = build_anatomy(_forced(spec), batch=1, ep=8, attention="flash_package")
    st_d, st_f = (step_time(s, hw, lay, replace(a, recompute="full"), r)
                  for s, a in ((spec, an), (_forced(spec), forced)))
    # each expert op: forward twice (once more in recompute) and backward once, all (I - 1) longer
    per_mb = sum(2 * op_time_s(o, forced, r)[0] + op_time_s(o, forced, r)[1] for o in forced.ops
                 if ".experts." in o.name)
    assert st_d.compute_s - st_f.compute_s == pytest.approx(2 * (DROPLESS_IMBALANCE - 1) * per_mb, rel=1e-6)


def test_the_flags_help_names_the_shipped_imbalance():
    """The CLI help states the default imbalance as text (the CLI does not import the specs at start-up): it must
    be DROPLESS_IMBALANCE."""
    from ddplan.runfields import BY_PARAM

    assert f"else {DROPLESS_IMBALANCE:g} (fitted" in BY_PARAM["moe_imbalance"].help


def test_a_balanced_run_keeps_its_capacity_factor(tmp_path):
    """model.routing balanced sets imbalance 1 on a dropless run; a run padded to capacity keeps its padding."""
    import yaml as _yaml

    from ddplan.runs import load_runs, run_spec

    moe = {"num_experts": 128, "top_k": 8, "expert_hidden_dim": 768, "capacity_factor": 1.25}
    run = {"id": "cf", "source": {"name": "a test", "ref": "a test", "where": "here"},
           "model": {"base": "qwen3-30b-a3b", "name": "Q", "seq_len": 4096, "routing": "balanced",
                     "architecture": {"moe": moe}},
           "hardware": "h100-sxm", "precision": "bf16",
           "layout": {"gpus": 8, "ep": 8, "micro_batch": 1, "global_batch_sequences": 8},
           "measured": {"step_time_s": 1.0}}
    p = tmp_path / "r.yaml"
    p.write_text(_yaml.safe_dump({"kind": "runs", "description": "a test", "runs": [run]}))
    padded = run_spec(load_runs(str(p)).runs[0], "t").architecture.moe
    assert (padded.capacity_factor, padded.load_imbalance) == (1.25, None)


def test_a_grouped_gemm_pays_the_fixed_cost_of_its_busiest_stream(mixtral):
    """Qwen3-30B-A3B at ep 4 holds 32 of its 128 experts: each grouped expert GEMM is 32 calls, 8 on each of the
    4 streams, so forward pays 8 call costs where one GEMM pays 1, backward (dX and dW) 16 where it pays 2. The
    work is priced once, at the op's FLOPs: the same op taken as one call differs by exactly 7 and 14 calls
    (times the dropless wait)."""
    from ddplan.roofline import gemm_call_s, op_time_s

    spec = load_model("qwen3-30b-a3b")
    an = build_anatomy(spec, batch=1, seq_len=4096, ep=4, attention="flash_package")
    r = rates(load_hardware("gb200"), "cudnn")
    experts = [o for o in an.ops if o.kind == "gemm" and ".experts." in o.name]
    assert experts and all(o.calls == 32 for o in experts)
    assert all(o.calls == 1 for o in an.ops if ".experts." not in o.name)
    call = gemm_call_s(r)
    assert call == pytest.approx(4.6e-6)  # gb200's fitted fixed cost of one call
    for o in experts:
        (f, b), (f1, b1) = op_time_s(o, an, r), op_time_s(replace(o, calls=1), an, r)
        # (dropless routing: every expert op, its calls included, waits for the busiest rank)
        assert o.wait == DROPLESS_IMBALANCE
        assert (f - f1, b - b1) == pytest.approx((7 * call * o.wait, 14 * call * o.wait), rel=1e-9)
    # one expert a rank (ep = number of experts): one call, as an ordinary GEMM
    mix = build_anatomy(load_model(mixtral), batch=1, ep=8, attention="flash_package")
    assert all(o.calls == 1 for o in mix.ops)
    mix1 = build_anatomy(load_model(mixtral), batch=1, ep=1, attention="flash_package")
    assert {o.calls for o in mix1.ops if o.kind == "gemm" and ".experts." in o.name} == {8}
    from ddplan.anatomy import for_cp, for_tp

    short = build_anatomy(load_model(mixtral), batch=1, seq_len=2048, ep=1, attention="flash_package")
    for share in (for_tp(mix1, 2, sequence_parallel=True), for_cp(mix1, short, 2)):
        assert {o.calls for o in share.ops if o.kind == "gemm" and ".experts." in o.name} == {8}
    # fp8 GEMMs: the same waves of the fp8 call cost (8 experts on 4 streams: 2, one more than a GEMM)
    r8 = rates(load_hardware("h100-sxm"), "fa3", fp8=True)
    call8 = gemm_call_s(r8, fp8=True)
    for o in (o for o in mix1.ops if o.kind == "gemm" and ".experts." in o.name):
        (f, b), (f1, b1) = op_time_s(o, mix1, r8), op_time_s(replace(o, calls=1), mix1, r8)
        assert (f - f1, b - b1) == pytest.approx((call8, 2 * call8), rel=1e-9)
