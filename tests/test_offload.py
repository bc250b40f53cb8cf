"""ddplan.offload: optimizer state offload to the host (ZeRO-Offload, Ren et al., arXiv 2101.06840): the step's
host copies and CPU Adam by hand, the memory it frees, where it is refused, and `table` through the CLI."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ddplan.errors import LayoutError
from ddplan.layout import Layout, Options
from ddplan.memory import model_states
from ddplan.offload import cpu_adam_bytes, offload_step_s, offload_time_s
from ddplan.price import Pricer, RunPlan
from ddplan.registry import load_hardware, load_model

from cli_helpers import csv_rows, fails, run_ok

GPT2_PSI = 124_439_808  # GPT-2 124M, tied (HF gpt2)


def test_offload_step_by_hand():
    """GPT-2 124M (fp32 params and grads, AdamW) on 8 H100 SXM, dp 8, ZeRO-2, offloaded.

    Owned partition: 124,439,808 / 8 = 15,554,976 elements.
    To the host: 15,554,976 x 4 B (fp32 grads) = 62,219,904 B; back: the same in fp32 params.
    Link 51 GB/s (Azure ND H100 v5 nvbandwidth, host to device): 62,219,904 / 51e9 = 1.21999 ms each way.
    CPU Adam: 15,554,976 x (24 + 4 + 4) B = 497,759,232 B at 430 GB/s / 8 GPUs = 53.75 GB/s: 9.26064 ms.
    With no backward to hide the gradients under: 1.21999 + 9.26064 + 1.21999 = 11.70063 ms; with 1 ms of
    backward, 1 ms of the gradient copy is hidden: 10.70063 ms; with 5 ms, all of it: 10.48064 ms.
    """
    assert cpu_adam_bytes(15_554_976, 4, 4) == 497_759_232
    assert offload_step_s(62_219_904, 62_219_904, 497_759_232, 51e9, 53.75e9, 0.0) == pytest.approx(11.70063e-3,
                                                                                                    rel=1e-6)
    spec, hw = load_model("gpt2-124m"), load_hardware("h100-sxm")
    lay = Layout(dp=8, zero=2, offload_optimizer=True)
    assert GPT2_PSI / 8 == 15_554_976
    assert offload_time_s(spec, hw, lay, 0.0) == pytest.approx(11.70063e-3, rel=1e-6)
    assert offload_time_s(spec, hw, lay, 1e-3) == pytest.approx(10.70063e-3, rel=1e-6)
    assert offload_time_s(spec, hw, lay, 5e-3) == pytest.approx(10.48064e-3, rel=1e-6)


def test_the_step_prices_the_offload_as_its_optimizer_term():
    spec, hw = load_model("gpt2-124m"), load_hardware("h100-sxm")
    pricer = Pricer(spec, hw, RunPlan(spec.recipe.budget, hw.price))
    base = Layout(dp=8, zero=1, micro_batch=4, grad_accum=15, attention="fa2")
    plain = pricer.step(base, "L")
    off = pricer.step(replace(base, offload_optimizer=True), "L")
    assert off.optimizer_s == pytest.approx(offload_time_s(spec, hw, base, off.bwd_s), rel=1e-12)
    assert off.total_s - plain.total_s == pytest.approx(off.optimizer_s - plain.optimizer_s, rel=1e-9)


@pytest.mark.parametrize("model, layout", [
    ("llama-3-8b", Layout(dp=8, zero=1)),  # fp32 params, fp32 m and v: 8 B a parameter, over 8
    ("gpt3-22b", Layout(dp=8, tp=8, zero=2)),  # fp16 params, fp32 masters + m + v: 12 B a parameter
])
def test_memory_falls_by_exactly_the_optimizer_states(model, layout):
    spec, hw = load_model(model), load_hardware("h100-sxm")
    states = model_states(spec, layout)
    freed = sum(states["optimizer"].values())
    assert freed > 0
    pricer = Pricer(spec, hw, RunPlan(spec.recipe.budget, hw.price))
    before = pricer.memory(layout, spec.architecture.window_pattern)
    after = pricer.memory(replace(layout, offload_optimizer=True), spec.architecture.window_pattern)
    assert after.terms["optimizer"] == 0.0
    assert before.total - after.total == pytest.approx(freed, rel=1e-12)
    assert {k: v for k, v in after.terms.items() if k != "optimizer"} == {
        k: v for k, v in before.terms.items() if k != "optimizer"}
    assert any("host memory" in n for n in after.notes)


def test_offload_is_a_zero_option_and_applies_only_there():
    with pytest.raises(LayoutError, match="needs ZeRO-1, 2 or 3"):
        Layout(dp=8, zero=0, offload_optimizer=True)
    Layout(dp=1, zero=0, offload_optimizer=True)  # one rank owns all of the state: the stages coincide
    o = Options(offload_optimizer=True)
    assert [o.for_layout(1, 8, z)["offload_optimizer"] for z in (0, 1, 2, 3)] == [False, True, True, True]
    assert o.for_layout(1, 1, 0)["offload_optimizer"]


@pytest.mark.parametrize("argv, says", [
    (["table", "-m", "gpt2", "--hardware", "mi355x", "--gpus", "8"], "mi355x's spec has no host figures"),
    (["table", "-m", "d24", "--hardware", "h100-sxm", "--gpus", "8"], "with Muon"),
    (["table", "-m", "gpt2", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "0"], "needs ZeRO-1, 2 or 3"),
    (["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "0"], "needs ZeRO-1, 2 or 3"),
    (["plan", "-m", "gpt2", "--hardware", "h100-sxm,mi355x", "--gpus", "8"], "mi355x's spec has no host figures"),
])
def test_offload_refused_where_it_cannot_apply(capsys, argv, says):
    code, line = fails(capsys, argv + ["--offload-optimizer"])
    assert code == 2
    assert line.startswith("error: --offload-optimizer: ") and says in line


def test_offload_reaches_table(capsys):
    base = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "2", "--attention", "fa2",
            "--device-batch-size", "1", "--format", "csv"]
    (plain,) = csv_rows(run_ok(capsys, base))
    (off,) = csv_rows(run_ok(capsys, base + ["--offload-optimizer"]))
    spec = load_model("llama-3-8b")
    freed = sum(model_states(spec, Layout(dp=8, zero=2))["optimizer"].values())
    assert float(plain["memory_gib"]) - float(off["memory_gib"]) == pytest.approx(freed / 2**30, rel=1e-6)
    assert float(off["optimizer_s"]) > float(plain["optimizer_s"])  # the host's CPU Adam is slower than the GPU's
    assert float(off["step_s"]) - float(plain["step_s"]) == pytest.approx(
        float(off["optimizer_s"]) - float(plain["optimizer_s"]), rel=1e-6)


def test_plan_and_memory_take_the_option(capsys):
    rows = csv_rows(run_ok(capsys, ["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8",
                                    "--offload-optimizer", "--format", "csv"]))
    assert [float(r["optimizer_gib"]) == 0.0 for r in rows] == [False, True, True, True]  # ZeRO-0 keeps its state
    assert csv_rows(run_ok(capsys, ["plan", "-m", "gpt2", "--hardware", "h100-sxm", "--gpus", "8",
                                    "--offload-optimizer", "--format", "csv"]))
