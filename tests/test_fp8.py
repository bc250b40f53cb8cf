"""fp8 as it runs (ddplan.fp8: fp8_eligible, fp8_cast_bytes, fp8_weight_fractions; ddplan.roofline: an fp8
GEMM's time; ddplan.step and ddplan.memory: the fp8 all-gather of ZeRO-3 weights), against hand computations.

Hand cases use hardware/h100-sxm.yaml: dense fp8 peak 1978.9 TFLOP/s, HBM 3.35 TB/s at its efficiency, the fp8
GEMM best fraction 0.709 (stas00 MAMF table) times the fitted sustained fraction, kernel overhead from the spec.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ddplan.anatomy import Op, build_anatomy
from ddplan.layout import Layout, LayoutError, Options
from ddplan.memory import memory_per_gpu, model_states
from ddplan.params import param_counts
from ddplan.registry import load_hardware, load_model
from ddplan.fp8 import (FP8_CAST_BYTES, FP8_STACK_KEPT, fp8_cast_bytes, fp8_cast_launches, fp8_eligible,
                        fp8_stack_factor, fp8_weight_fractions)
from ddplan.roofline import gemm_efficiency, gemm_fraction, op_time_s, rates, roofline_s
from ddplan.step import grad_sync_buffers

from cli_helpers import csv_rows, fails, run, run_ok


def _gemm(name: str, m: int = 4096, n: int = 1024, k: int = 1024) -> Op:
    return Op(name=name, kind="gemm", layer=None if name == "lm_head" else 0, shape=(m, n, k),
              flops_fwd=2.0 * m * n * k, flops_bwd=4.0 * m * n * k, bytes_fwd=2.0 * (m * k + k * n + m * n),
              bytes_bwd=4.0 * (m * k + k * n + m * n))


def test_which_gemms_run_fp8():
    """The shape rule (dims % 16, min(n, k) >= 128: nanochat's fp8_module_filter); the LM head only where the
    recipe converts it (nanochat's does, torchtitan's filter_fqns=["output"] does not); never the router."""
    assert fp8_eligible(_gemm("h0.attn.c_q"))
    assert not fp8_eligible(_gemm("lm_head"))
    assert fp8_eligible(_gemm("lm_head"), lm_head=True)
    assert not fp8_eligible(_gemm("h0.moe.router", n=128))
    assert not fp8_eligible(_gemm("h0.moe.router", n=128), lm_head=True)
    assert not fp8_eligible(_gemm("h0.attn.ve_gate", n=12, k=32))
    assert not fp8_eligible(_gemm("h0.mlp.c_fc", n=1000))  # 1000 % 16 != 0


def test_cast_bytes_by_hand():
    """m 4096, n = k 1024: x and dY are 4,194,304 elements, W 1,048,576.
    tensorwise: forward 5 x (4,194,304 + 1,048,576) = 26,214,400; backward 6 x 4,194,304 + 5 x 4,194,304
    + 5 x 1,048,576 = 51,380,224. delayed: forward 4 x 5,242,880 = 20,971,520, backward 4 x 4,194,304 =
    16,777,216. nanochat: forward 26,214,400; backward 7 x 4,194,304 + 2 x 4,194,304 + 2 x 1,048,576 =
    39,845,888."""
    assert fp8_cast_bytes(4096, 1024, 1024, "tensorwise") == (26_214_400, 51_380_224)
    assert fp8_cast_bytes(4096, 1024, 1024, "delayed") == (20_971_520, 16_777_216)
    assert fp8_cast_bytes(4096, 1024, 1024, "nanochat") == (26_214_400, 39_845_888)
    # Transformer Engine current scaling: delayed's casts plus an amax read (2 B) of each operand it casts:
    # forward 6 x 5,242,880 = 31,457,280, backward 6 x 4,194,304 = 25,165,824
    assert fp8_cast_bytes(4096, 1024, 1024, "current") == (31_457_280, 25_165_824)
    # MXFP8 (Transformer Engine docs mxfp8.rst@495739c): delayed's two copies from the 16-bit tensor and a 1-byte
    # E8M0 scale per 32 elements for each, 2 / 32 B: forward 4.0625 x 5,242,880 = 21,299,200, backward
    # 4.0625 x 4,194,304 = 17,039,360
    assert fp8_cast_bytes(4096, 1024, 1024, "mxfp8") == (21_299_200, 17_039_360)
    assert fp8_cast_launches("mxfp8") == fp8_cast_launches("delayed") == (2, 1)
    # torchao's rowwise recipe (float8_linear.py@36027d8): tensorwise's forward; backward dY cast along each axis from
    # the 16-bit tensor (5 + 5 B), W and x recast (5 B each): 10 x 4,194,304 + 5 x 4,194,304 + 5 x 1,048,576
    # = 68,157,440
    assert fp8_cast_bytes(4096, 1024, 1024, "rowwise") == (26_214_400, 68_157_440)
    assert fp8_cast_launches("rowwise") == (4, 8)
    # rowwise_with_gw_hp (torchao config.py@36027d8 L353-378): rowwise's forward; backward dY cast along one axis for
    # grad_input (5 B) and W recast tensorwise (5 B), grad_weight in bf16 (no cast of x):
    # 5 x 4,194,304 + 5 x 1,048,576 = 26,214,400
    assert fp8_cast_bytes(4096, 1024, 1024, "rowwise_with_gw_hp") == (26_214_400, 26_214_400)
    assert fp8_cast_launches("rowwise_with_gw_hp") == (4, 4)
    # torchao's MXFP8Linear (mxfp8_linear.py@36027d8 L108-244): each cast from the 16-bit tensor, 2 + 1 + 1/32 B:
    # forward 3.03125 x 5,242,880 = 15,892,480; backward dY twice (6.0625 x 4,194,304 = 25,427,968), x and W once
    # (3.03125 x 5,242,880 = 15,892,480): 41,320,448
    assert fp8_cast_bytes(4096, 1024, 1024, "mxfp8_torchao") == (15_892_480, 41_320_448)
    assert fp8_cast_launches("mxfp8_torchao") == (2, 4)


def test_a_weight_cast_once_a_step_spreads_over_its_micro_batches_by_hand():
    """Megatron-Core's Transformer Engine modules cast an fp8 weight once a step (fp8_weight_casts "step"): GPT-3
    175B's QKV at tp 4 (k 12288, n 9216) on a 2,048-token micro-batch, current scaling, 16 micro-batches a step:
    forward 6 x 2048 x 12288 = 150,994,944 for the input plus 6 x 12288 x 9216 / 16 = 42,467,328 for the weight,
    193,462,272 B (cast every micro-batch the weight alone would be 679,477,248 B, 4.5 times the input's); backward
    6 x 2048 x 9216 = 113,246,208 (dY only). Launches: 3 + 3 / 16 forward, 3 backward; tensorwise with no reuse
    keeps its 4 and 6."""
    assert fp8_cast_bytes(2048, 9216, 12288, "current", weight_reuse=16) == (193_462_272, 113_246_208)
    assert fp8_cast_bytes(2048, 9216, 12288, "current")[0] == 150_994_944 + 679_477_248
    assert fp8_cast_launches("current", 16) == (3 + 3 / 16, 3)
    assert fp8_cast_launches("tensorwise") == (4, 6) and fp8_cast_launches("delayed") == (2, 1)
    with pytest.raises(ValueError, match="weight_reuse"):
        fp8_cast_bytes(2048, 9216, 12288, "current", weight_reuse=0)


def test_megatron_core_s_weight_casts_once_a_step_shorten_its_fp8_step(capsys):
    """A Megatron-Core fp8 run with 8 micro-batches a step: its weights cast once a step (the profile's
    fp8_weight_casts step) give a shorter step than the same run casting every micro-batch; with one micro-batch a
    step the two are the same step."""
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--fp8", "--fp8-recipe",
            "current", "--attention", "fa3", "--zero", "1", "--format", "csv"]
    for batch, shorter in (("524288", True), ("65536", False)):  # 8 x 8192 x 8 (accum 8), then accum 1
        argv = base + ["--total-batch-size", batch, "--device-batch-size", "1"]
        (each,) = csv_rows(run_ok(capsys, argv + ["--fp8-weight-casts", "micro-batch"]))
        (step,) = csv_rows(run_ok(capsys, argv + ["--fp8-weight-casts", "step"]))
        assert (float(step["step_s"]) < float(each["step_s"])) == shorter, batch
        assert float(step["step_s"]) <= float(each["step_s"])
    # the Megatron-Core and NeMo profiles state it (frameworks/*.yaml, with its source)
    from ddplan.registry import load_framework

    for stack in ("megatron-core", "nemo"):
        assert load_framework(stack).fields()[("fp8_weight_casts",)] == "step", stack


def test_cast_bytes_with_the_weights_gathered_in_fp8_by_hand():
    """Over 8 shards, gathered twice a micro-batch: the weight's forward cost is its shard's cast, 3 / 8 B an
    element (393,216 B), and backward an fp8 transpose (2 B) plus the shard's cast again (3 / 8):
    forward 5 x 4,194,304 + 393,216 = 21,364,736; backward 6 x 4,194,304 + 5 x 4,194,304 + 2.375 x 1,048,576
    = 48,627,712. Gathered once (no resharding after forward): backward 6 x ... + 5 x ... + 2 x 1,048,576
    = 48,234,496."""
    assert fp8_cast_bytes(4096, 1024, 1024, "tensorwise", weight_shards=8) == (21_364_736, 48_627_712)
    assert fp8_cast_bytes(4096, 1024, 1024, "tensorwise", weight_shards=8, gathers=1)[1] == 48_234_496
    with pytest.raises(ValueError, match="tensorwise"):
        fp8_cast_bytes(4096, 1024, 1024, "delayed", weight_shards=8)
    with pytest.raises(ValueError, match="recipe"):
        fp8_cast_bytes(4096, 1024, 1024, "blockwise")


def test_every_recipe_casts_less_in_backward_than_it_would_recasting_everything():
    """Sanity of the table: forward, no operand costs more than an amax read + a cast + a second order (2 + 3 + 1);
    backward, none more than two casts from the 16-bit tensor with their amax reads (2 x (2 + 3): rowwise's dY)."""
    for fwd, bwd in FP8_CAST_BYTES.values():
        assert all(0 <= b <= 6 for b in fwd) and all(0 <= b <= 10 for b in bwd)


def test_an_fp8_gemm_time_by_hand():
    """The GEMM at the fp8 rate (roofline of its FLOPs and own bytes), then the casts as memory-bound kernels of
    their own (bytes / (HBM x efficiency)) and one launch per cast kernel: tensorwise 4 forward, 6 backward,
    besides the GEMMs' own 1 and 2."""
    hw = load_hardware("h100-sxm")
    r = rates(hw, "fa2", fp8=True)
    op = _gemm("h0.mlp.c_fc")
    m, n, k = op.shape
    rate = r.fp8_flops_per_s * gemm_efficiency(m, n, k, r.gemm_best_fp8, r.gemm_half_dim)
    bw = r.hbm_bytes_per_s * r.hbm
    call = r.gemm_overhead_s  # a GEMM call's fixed cost (h100-sxm efficiency.gemm.fixed_us, 5.8 us)
    assert call == pytest.approx(5.8e-6)
    fwd = roofline_s(op.flops_fwd, op.bytes_fwd, rate, bw) + 26_214_400 / bw + call + 4 * r.kernel_overhead_s
    bwd = roofline_s(op.flops_bwd, op.bytes_bwd, rate, bw) + 51_380_224 / bw + 2 * call + 6 * r.kernel_overhead_s
    an = build_anatomy(load_model("llama-3-8b"), batch=1)
    assert op_time_s(op, an, r) == pytest.approx((fwd, bwd), rel=1e-12)
    # rowwise_with_gw_hp: dX at the fp8 rate, dW (k x m @ m x n) at the 16-bit GEMM rate, at its own shape; its casts
    # 5 x (m n + n k) B in 2 + 2 launches
    gw = replace(r, fp8_recipe="rowwise_with_gw_hp")
    half = op.flops_bwd / 2
    dw_rate = r.peak_flops_per_s * gemm_fraction(k, n, m, r)
    bwd_gw = (max(half / rate + half / dw_rate, op.bytes_bwd / bw) + 5 * (m * n + n * k) / bw + 2 * call
              + 4 * r.kernel_overhead_s)
    assert op_time_s(op, an, gw)[1] == pytest.approx(bwd_gw, rel=1e-12)
    assert op_time_s(op, an, gw)[1] > roofline_s(op.flops_bwd, op.bytes_bwd, rate, bw)  # slower GEMMs than all-fp8
    # the LM head stays at the bf16 rate and casts nothing
    head = _gemm("lm_head")
    assert op_time_s(head, an, r) == op_time_s(head, an, replace(r, fp8_flops_per_s=None))



def test_the_fp8_fraction_a_stack_keeps_by_hand():
    """An fp8 GEMM's best rate: the fp8 best fraction x sustained_fp8 (fitted on NeMo's tuned recipes) x what the stack
    keeps of it. h100-sxm: 0.709 x 0.861 = 0.610449 under --framework nemo; a stack not stated or another one keeps
    FP8_STACK_KEPT of it, 0.610449 x 0.748 = 0.456616. A GPU without an fp8 fit (MI300X) takes its 16-bit fraction,
    0.443 x 0.783 = 0.346869, whatever the stack (the factor is relative to a tuned fit it does not have)."""
    assert fp8_stack_factor("nemo") == 1.0 and FP8_STACK_KEPT == 0.748
    assert fp8_stack_factor(None) == fp8_stack_factor("composer") == fp8_stack_factor("torchtitan") == 0.748
    assert fp8_stack_factor("olmo-core", kept=0.7) == 0.7 and fp8_stack_factor("nemo", kept=0.7) == 1.0
    hw = load_hardware("h100-sxm")
    assert rates(hw, "fa2", fp8=True).gemm_best_fp8 == pytest.approx(0.610449, rel=1e-9)
    assert rates(hw, "fa2", fp8=True, fp8_stack=0.748).gemm_best_fp8 == pytest.approx(0.456616, rel=1e-6)
    mi = load_hardware("mi300x")
    assert rates(mi, mi.default_attention, fp8=True, fp8_stack=0.748).gemm_best_fp8 == pytest.approx(0.346869, rel=1e-9)


def test_a_stack_not_tuned_prices_fp8_slower_and_says_why(capsys):
    """The same fp8 table under --framework nemo (the tuned fraction) and under torchtitan: torchtitan's step is
    longer (its GEMMs at 0.748 of the rate), its 16-bit twin is not, and --explain states the product."""
    argv = ["table", "-m", "llama-3-8b", "--hardware", "h100", "--gpus", "8", "--attention", "fa3", "--zero", "3",
            "--device-batch-size", "1", "--format", "csv"]
    nemo, titan = (csv_rows(run_ok(capsys, argv + ["--fp8", "--framework", f]))[0] for f in ("nemo", "torchtitan"))
    assert float(titan["gemm_s"]) > float(nemo["gemm_s"]) * 1.2
    text = " ".join(run_ok(capsys, argv[:-2] + ["--fp8", "--framework", "torchtitan", "--explain"]).split())
    assert "keeps 0.861 x 0.748 = 0.644" in text and "the torchtitan stack" in text
    text = " ".join(run_ok(capsys, argv[:-2] + ["--fp8", "--framework", "nemo", "--explain"]).split())
    assert "keeps 0.861 (fitted, on NeMo's tuned recipes)" in text

def test_fp8_weight_fractions():
    """Which parameter groups an fp8 all-gather sends at 1 byte: the block matrices (every one eligible at these
    widths), the LM head only for nanochat (whose fp8 path converts it), never embeddings or the router."""
    llama = fp8_weight_fractions(load_model("llama-3-8b"))
    assert llama["block_matrices"] == pytest.approx(1.0)
    assert llama["lm_head"] == 0.0 and llama["wte"] == 0.0
    d24 = fp8_weight_fractions(load_model("d24"))
    assert d24["block_matrices"] == pytest.approx(1.0) and d24["lm_head"] == pytest.approx(1.0)
    assert d24["ve_gates"] == 0.0 and d24["wte"] == 0.0
    moe = fp8_weight_fractions(load_model("qwen3-30b-a3b"))
    assert moe["experts"] == pytest.approx(1.0) and moe["router"] == 0.0


def test_fp8_all_gather_buffers_by_hand():
    """llama-3-8b at ZeRO-3 over 8 ranks: the parameter all-gather carries the block matrices at 1 byte an element
    and the embeddings and LM head at bf16's 2; the gradient reduce-scatter is unchanged."""
    spec = load_model("llama-3-8b")
    counts = param_counts(spec.architecture)
    plain = dict((c, 0.0) for c in ("all_gather", "reduce_scatter"))
    fp8 = dict(plain)
    for c, b in grad_sync_buffers(spec, Layout(dp=8, zero=3)):
        plain[c] += b
    for c, b in grad_sync_buffers(spec, Layout(dp=8, zero=3, fp8_all_gather=True)):
        fp8[c] += b
    assert fp8["reduce_scatter"] == plain["reduce_scatter"]
    assert plain["all_gather"] - fp8["all_gather"] == pytest.approx(counts["block_matrices"] * 1.0)


def test_fp8_all_gather_halves_the_gathered_block_weights_in_memory():
    """ZeRO-3 keeps two gathered layers (current and prefetched): with fp8 all-gather the block matrices among
    them take 1 byte an element instead of 2."""
    spec = load_model("llama-3-8b")
    lay = Layout(dp=8, zero=3, micro_batch=1, attention="fa2")
    an = build_anatomy(spec, batch=1)
    cap = 80e9
    plain = memory_per_gpu(spec, lay, an, cap, states=model_states(spec, lay)).terms["comm_buffers"]
    fp8 = memory_per_gpu(spec, replace(lay, fp8_all_gather=True), an, cap,
                         states=model_states(spec, lay)).terms["comm_buffers"]
    saved = 2 * counts_per_layer(spec)
    assert plain - fp8 == pytest.approx(saved, rel=1e-9)


def counts_per_layer(spec) -> float:
    """Block-matrix elements of one layer: what one gathered layer saves at 1 byte instead of 2."""
    return param_counts(spec.architecture)["block_matrices"] / spec.architecture.num_layers


def test_fp8_all_gather_is_a_zero3_option():
    with pytest.raises(LayoutError, match="ZeRO-3"):
        Layout(dp=8, zero=2, fp8_all_gather=True)
    assert Options(fp8_all_gather=True).for_layout(1, 8, 3)["fp8_all_gather"]
    assert not Options(fp8_all_gather=True).for_layout(1, 8, 2)["fp8_all_gather"]


def test_fp8_all_gather_shortens_a_zero3_step(capsys):
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "3", "--fp8",
            "--attention", "fa2", "--format", "csv"]
    (plain,) = csv_rows(run_ok(capsys, base))
    (fp8,) = csv_rows(run_ok(capsys, base + ["--fp8-all-gather"]))
    assert float(fp8["dp_comm_total_s"]) < float(plain["dp_comm_total_s"])
    assert float(fp8["step_s"]) <= float(plain["step_s"])


def test_the_recipe_moves_the_step(capsys):
    """Delayed scaling casts less than current scaling (no amax pass), which casts less than tensorwise (no recast
    in backward): shorter steps in that order."""
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--fp8", "--attention", "fa2",
            "--format", "csv"]
    (tw,) = csv_rows(run_ok(capsys, base))
    (delayed,) = csv_rows(run_ok(capsys, base + ["--fp8-recipe", "delayed"]))
    (current,) = csv_rows(run_ok(capsys, base + ["--fp8-recipe", "current"]))
    assert float(delayed["step_s"]) < float(current["step_s"]) < float(tw["step_s"])


@pytest.mark.parametrize("argv, says", [
    (["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "3", "--fp8-all-gather"],
     "needs --fp8"),
    (["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "2", "--fp8",
      "--fp8-all-gather"], "needs ZeRO-3"),
    (["table", "-m", "d24", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "3", "--fp8", "--fp8-all-gather"],
     "tensorwise"),
    (["plan", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--fp8-all-gather"], "needs --fp8"),
    (["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "1", "--fp8-all-gather"],
     "needs ZeRO-3"),
    (["memory", "-m", "llama-3-8b", "--hardware", "a100-sxm-80gb", "--gpus", "8", "--fp8-all-gather"],
     "no fp8 tensor units"),
])
def test_fp8_all_gather_errors_are_one_line(capsys, argv, says):
    _, line = fails(capsys, argv)
    assert line.startswith("error: --f") and says in line


def test_mxfp8_runs_on_blackwell_only(capsys):
    """MXFP8 needs Blackwell's tensor cores (SM 10.0+): refused in one line on H100 by each planning command; on
    B200 it prices a little slower than delayed scaling (its scales), far faster than current scaling."""
    for command in ("table", "memory", "plan"):
        _, line = fails(capsys, [command, "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--fp8",
                                 "--fp8-recipe", "mxfp8"])
        assert line.startswith("error: --fp8-recipe: h100-sxm's spec states no MXFP8 support")
    base = ["table", "-m", "llama-3-8b", "--hardware", "b200", "--gpus", "8", "--fp8", "--attention", "fa2",
            "--zero", "1", "--format", "csv"]
    (mx,) = csv_rows(run_ok(capsys, base + ["--fp8-recipe", "mxfp8"]))
    (delayed,) = csv_rows(run_ok(capsys, base + ["--fp8-recipe", "delayed"]))
    (current,) = csv_rows(run_ok(capsys, base + ["--fp8-recipe", "current"]))
    assert float(delayed["step_s"]) < float(mx["step_s"]) < float(current["step_s"])


def test_torchtitan_s_mxfp8_is_torchao_s_and_runs_on_blackwell_only(capsys, tmp_path):
    """torchtitan has no Transformer Engine: its MXFP8 converter builds torchao's MXFP8Linear (quantization/mx.py
    @b5bcd76), so --fp8-recipe mxfp8 under --framework torchtitan prices mxfp8_torchao (the profile's
    fp8_recipe_names), said in one line; it casts more than Transformer Engine's MXFP8 (everything again in
    backward from the 16-bit tensors), so it prices slower; H100 refuses it as it refuses mxfp8; a TOML-era job with
    the quantize.linear.mx converter imports as it, with a warning, and one asking for rowwise_with_gw_hp keeps it."""
    base = ["table", "-m", "llama-3-8b", "--hardware", "b200", "--gpus", "8", "--fp8", "--attention", "cudnn",
            "--zero", "3", "--format", "csv"]
    code, out, err = run(capsys, base + ["--framework", "torchtitan", "--fp8-recipe", "mxfp8"])
    assert code == 0 and "--fp8-recipe mxfp8 under torchtitan is torchtitan's own: priced as mxfp8_torchao" in err
    (titan,) = csv_rows(out)
    (titan_ao,) = csv_rows(run_ok(capsys, base + ["--framework", "torchtitan", "--fp8-recipe", "mxfp8_torchao"]))
    assert titan["step_s"] == titan_ao["step_s"]
    (te,) = csv_rows(run_ok(capsys, base + ["--fp8-recipe", "mxfp8"]))
    (ao,) = csv_rows(run_ok(capsys, base + ["--fp8-recipe", "mxfp8_torchao"]))
    assert float(te["step_s"]) < float(ao["step_s"])
    _, line = fails(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--fp8",
                             "--fp8-recipe", "mxfp8_torchao"])
    assert line.startswith("error: --fp8-recipe: h100-sxm's spec states no MXFP8 support")
    toml, runfile = tmp_path / "job.toml", tmp_path / "run.yaml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["quantize.linear.mx"]\n[parallelism]\n'
                    'data_parallel_shard_degree = 8\n[quantize.linear.mx]\nrecipe_name = "mxfp8_cublas"\n',
                    encoding="utf-8")
    code, _, err = run(capsys, ["import", str(toml), "-o", str(runfile)])
    text = runfile.read_text(encoding="utf-8")
    assert code == 0 and "fp8_recipe: mxfp8_torchao" in text and "fp8: true" in text
    assert "mx recipe_name 'mxfp8_cublas'" in err
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n[parallelism]\n'
                    'data_parallel_shard_degree = 8\n[float8]\nrecipe_name = "rowwise_with_gw_hp"\n', encoding="utf-8")
    run_ok(capsys, ["import", str(toml), "-o", str(runfile)])
    assert "fp8_recipe: rowwise_with_gw_hp" in runfile.read_text(encoding="utf-8")


def test_fp8_recipe_needs_fp8(capsys):
    _, line = fails(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--fp8-recipe", "delayed"])
    assert line.startswith("error: --fp8-recipe: needs --fp8")
    _, line = fails(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--fp8", "--fp8-recipe", "x"])
    assert line.startswith("error: --fp8-recipe: must be one of")


def test_memory_with_fp8_all_gather_lowers_only_zero3(capsys):
    base = ["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--format", "csv"]
    plain = {r["zero"]: r for r in csv_rows(run_ok(capsys, base))}
    fp8 = {r["zero"]: r for r in csv_rows(run_ok(capsys, base + ["--fp8-all-gather"]))}
    assert float(fp8["3"]["buffers_gib"]) < float(plain["3"]["buffers_gib"])
    assert fp8["2"] == plain["2"]


def test_fp8_params_keep_the_weights_in_fp8_by_hand():
    """Megatron-Core's --fp8-param-gather (Layout.fp8_params, ZeRO-1/2), with Megatron's 16-bit weights and fp32
    masters (--weights master): Llama 3 8B's block matrices are all fp8 GEMM weights, gathered by the distributed
    optimizer at 1 B an element instead of 2; in memory each is its fp8 data and the transpose Hopper's backward
    GEMMs read, 1 + 1 B (FP8_PARAM_BYTES), as much as the 16-bit copy; the fp32 masters stay. Casts: no weight
    cast, only its transpose once a step (2 B an element over the step's micro-batches): current scaling, m 2048,
    k 12288, n 9216, 16 micro-batches:
    forward 6 x 2048 x 12288 + 2 x 12288 x 9216 / 16 = 165,150,720 B, backward 6 x 2048 x 9216 = 113,246,208 B;
    launches 3 + 1/16 forward, 3 backward."""
    from ddplan.specs import run_variant

    spec = run_variant(load_model("llama-3-8b"), dtype="bf16", weights="master")
    plain, kept = (Layout(dp=8, zero=1, micro_batch=1, grad_accum=16, fp8_params=f) for f in (False, True))
    a, b = model_states(spec, plain), model_states(spec, kept)
    assert b == a  # 1 + 1 B in fp8 for 2 B in 16 bits; masters and gradients unchanged
    gathered = [sum(size for c, size in grad_sync_buffers(spec, lay) if c == "all_gather") for lay in (plain, kept)]
    blocks = a["params"]["block_matrices"] / 2  # the block matrices' elements: 2 B each in 16 bits
    assert gathered[0] - gathered[1] == pytest.approx(blocks, rel=1e-12)  # one byte less each
    assert fp8_cast_bytes(2048, 9216, 12288, "current", weight_reuse=16, weights_fp8=True) == (165_150_720, 113_246_208)
    assert fp8_cast_launches("current", 16, weights_fp8=True) == (3 + 1 / 16, 3)
    with pytest.raises(LayoutError, match="fp8-param-gather"):
        Layout(dp=8, zero=0, fp8_params=True)
    with pytest.raises(LayoutError, match="two stacks' ways"):
        Layout(dp=8, zero=3, fp8_params=True, fp8_all_gather=True)


def test_fp8_weights_on_blackwell_keep_no_transpose_by_hand(capsys):
    """Transformer Engine keeps no transpose of a per-tensor fp8 weight where fp8 GEMMs take any layout (compute
    capability 10.x: transformer_engine/pytorch/utils.py@d0067d0 L658-663, tensor/storage/float8_tensor_storage.py
    L292-299): on B200 an fp8 weight of delayed or current scaling is 1 byte, on H100 2 (its transpose for backward);
    MXFP8 keeps two copies, each scaled along its own axis, 2 bytes anywhere (memory.fp8_param_bytes). Llama 3 8B's
    block matrices (every one an fp8 GEMM weight) under ZeRO-1 over 8 with --fp8-params: 2 -> 1 byte each on B200."""
    from ddplan.memory import fp8_param_bytes, kept_param_bytes
    from ddplan.specs import run_variant

    assert [fp8_param_bytes(r, True) for r in ("delayed", "current", "mxfp8")] == [1.0, 1.0, 2.0]
    # a bf16 group all fp8 weights at 1 byte; a quarter of it: 2 - 1/4 = 1.75; none: its own 2
    assert [kept_param_bytes(2, f, 1.0) for f in (1.0, 0.25, 0.0)] == [1.0, 1.75, 2.0]
    assert [fp8_param_bytes(r, False) for r in ("delayed", "current")] == [2.0, 2.0]
    spec = run_variant(load_model("llama-3-8b"), dtype="bf16", weights="master")
    lay = Layout(dp=8, zero=1, micro_batch=1, grad_accum=16, fp8_params=True)
    hopper, blackwell = model_states(spec, lay), model_states(spec, lay, fp8_bytes=1.0)
    assert blackwell["params"]["block_matrices"] == pytest.approx(hopper["params"]["block_matrices"] / 2, rel=1e-12)
    assert blackwell["params"]["wte"] == hopper["params"]["wte"] and blackwell["optimizer"] == hopper["optimizer"]
    argv = ["memory", "-m", "llama-3-8b", "--gpus", "8", "--zero", "1", "--weights", "master", "--fp8", "--fp8-params",
            "--format", "json"]
    got = {(hw, recipe): json.loads(run_ok(capsys, [*argv, "--hardware", hw, "--fp8-recipe", recipe]))["rows"][0][
        "params_gib"] for hw, recipe in (("h100-sxm", "current"), ("b200", "current"), ("b200", "mxfp8"))}
    blocks = hopper["params"]["block_matrices"] / 2**30  # GiB at 2 bytes
    assert got["h100-sxm", "current"] - got["b200", "current"] == pytest.approx(blocks / 2, rel=1e-9)
    assert got["b200", "mxfp8"] == pytest.approx(got["h100-sxm", "current"], rel=1e-12)


def test_megatron_fsdp_keeps_fp8_weights_in_one_byte_by_hand():
    """Megatron-FSDP with --fp8-param-gather (ZeRO-3, fp8_params): its weight buffers, sharded and gathered, are
    uint8, a transpose buffer for MXFP8 only (megatron_fsdp/param_and_grad_buffer.py@d98e8a64 L2630-2642). Llama 3 8B
    (32 layers; block matrices all fp8 GEMM weights) over 8 ranks, current scaling on H100: each block matrix element
    keeps 1 byte / 8 ranks of shard (2 in bf16), and the two gathered units 1 byte an element; all-gathers at 1 byte.
    MXFP8 on B200 keeps 2 (its column-wise copy)."""
    from ddplan.memory import comm_buffer_bytes, fp8_param_bytes
    from ddplan.params import param_counts
    from ddplan.specs import run_variant

    spec = run_variant(load_model("llama-3-8b"), dtype="bf16", weights="master")
    blocks = param_counts(spec.architecture)["block_matrices"]
    plain, fp8 = (Layout(dp=8, zero=3, micro_batch=1, fp8_params=f) for f in (False, True))
    one = fp8_param_bytes("current", False, zero=3)  # Megatron-FSDP on H100: no transpose kept, per-tensor
    assert (one, fp8_param_bytes("mxfp8", False, zero=3), fp8_param_bytes("current", False, zero=1)) == (1.0, 2.0, 2.0)
    a, b = model_states(spec, plain), model_states(spec, fp8, fp8_bytes=one)
    assert a["params"]["block_matrices"] == pytest.approx(2 * blocks / 8, rel=1e-12)
    assert b["params"]["block_matrices"] == pytest.approx(1 * blocks / 8, rel=1e-12)
    assert b["params"]["wte"] == a["params"]["wte"] and b["optimizer"] == a["optimizer"]
    # two gathered units of one layer each: the block matrices of 2 of 32 layers at 1 byte instead of 2
    saved = comm_buffer_bytes(spec, plain, a) - comm_buffer_bytes(spec, fp8, b, fp8_bytes=one)
    assert saved == pytest.approx(2 * blocks / 32 * (2 - 1), rel=1e-9)
    gathered = [sum(size for c, size in grad_sync_buffers(spec, lay) if c == "all_gather") for lay in (plain, fp8)]
    assert gathered[0] - gathered[1] == pytest.approx(blocks, rel=1e-12)


@pytest.mark.parametrize("extra, says", [
    ([], "needs --fp8"),
    (["--fp8"], "add --weights master"),
    (["--fp8", "--weights", "master"], "add --fp8-recipe delayed or current"),
    (["--fp8", "--weights", "master", "--fp8-recipe", "current", "--zero", "0"], "or Megatron-FSDP (ZeRO-3)"),
    (["--fp8", "--weights", "master", "--fp8-recipe", "current", "--zero", "3", "--fp8-all-gather"],
     "two stacks' ways"),
])
def test_fp8_params_errors_are_one_line(capsys, extra, says):
    code, err = fails(capsys, ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--fp8-params",
                               *extra])
    assert says in err and "--fp8-params" in err


def test_fp8_params_gather_less_and_cast_nothing(capsys):
    """The same Megatron-style fp8 run with its weights kept in fp8: the same memory per GPU (fp8 data and its
    transpose), less all-gather traffic (1 B a weight), no weight casts: a shorter step. memory takes the flags too and
    prices the same memory as table (what the fp8 GEMMs save is the recipe's: without a Transformer Engine recipe,
    the same one line as table's)."""
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--fp8", "--fp8-recipe", "current",
            "--weights", "master", "--zero", "1", "--attention", "fa3", "--device-batch-size", "1", "--format", "csv"]
    (plain,) = csv_rows(run_ok(capsys, base))
    (kept,) = csv_rows(run_ok(capsys, base + ["--fp8-params"]))
    assert kept["memory_gib"] == plain["memory_gib"]
    assert float(kept["dp_comm_total_s"]) < float(plain["dp_comm_total_s"])
    assert float(kept["gemm_s"]) < float(plain["gemm_s"]) and float(kept["step_s"]) < float(plain["step_s"])
    mem = ["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "1", "--weights", "master",
           "--attention", "fa3", "--device-batch-size", "1", "--fp8-params", "--format", "csv"]
    (row,) = csv_rows(run_ok(capsys, mem + ["--fp8-recipe", "current"]))
    assert float(row["total_gib"]) == pytest.approx(float(kept["memory_gib"]), rel=1e-9)
    code, line = fails(capsys, mem)
    assert code == 2 and line.startswith("error: --fp8-params:") and "--fp8-recipe delayed or current" in line


def test_memory_prices_what_the_fp8_gemms_save_as_table_does(capsys):
    """memory --fp8 (issue 35's memory audit): the fp8 GEMMs' saved inputs as the recipe keeps them (delayed: fp8
    copies, 1 byte an element), the same total as table's row for that layout, and below the 16-bit run's. Before,
    memory had no --fp8 and priced every saved input at 2 bytes."""
    shape = ["-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "1", "--attention", "fa3",
             "--device-batch-size", "1", "--format", "csv"]
    fp8 = ["--fp8", "--fp8-recipe", "delayed"]
    (with_fp8,) = csv_rows(run_ok(capsys, ["memory", *shape, *fp8]))
    (without,) = csv_rows(run_ok(capsys, ["memory", *shape]))
    (row,) = csv_rows(run_ok(capsys, ["table", *shape, *fp8]))
    assert float(with_fp8["total_gib"]) == pytest.approx(float(row["memory_gib"]), rel=1e-9)
    assert float(with_fp8["activations_gib"]) < float(without["activations_gib"])
    assert float(with_fp8["params_gib"]) == float(without["params_gib"])


def test_torchtitan_s_rowwise_float8_is_its_profiles_recipe(capsys, tmp_path):
    """torchtitan @b5bcd76 converts with torchao's rowwise recipe by default (quantization/float8.py L57-59): its
    profile states it (with --fp8 only), it prices slower than tensorwise (each axis of dY cast apart), and a TOML
    asking for recipe_name rowwise imports as rowwise."""
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--attention", "fa3", "--fp8",
            "--framework", "torchtitan", "--format", "csv"]
    (row,) = csv_rows(run_ok(capsys, base))
    (tw,) = csv_rows(run_ok(capsys, base + ["--fp8-recipe", "tensorwise"]))
    assert float(row["step_s"]) > float(tw["step_s"])
    toml, out = tmp_path / "job.toml", tmp_path / "run.yaml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n[parallelism]\n'
                    'data_parallel_shard_degree = 8\n[float8]\nrecipe_name = "rowwise"\n', encoding="utf-8")
    run_ok(capsys, ["import", str(toml), "-o", str(out)])
    assert "fp8_recipe: rowwise" in out.read_text(encoding="utf-8")


def test_the_table_title_says_the_gemms_run_in_fp8(capsys):
    """A reader of the table sees fp8 where every row has it, as memory's title says it: the compute dtype with fp8
    GEMMs and the recipe (it was only in --explain's Assumptions)."""
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--attention", "fa3"]
    out = run_ok(capsys, [*base, "--fp8", "--fp8-recipe", "delayed"])
    assert "sequence 8192, bf16 with fp8 GEMMs (delayed))" in " ".join(out.split())
    assert "fp8 GEMMs" not in run_ok(capsys, base)
