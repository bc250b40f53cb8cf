"""Activation offload to the host (layout.offload_activations: Megatron-Core's --cpu-offloading-num-layers, NeMo's
activation_offload_layers): the first N layers' saved activations leave the GPU, and their copies cost what exceeds
the pass they run under."""

from __future__ import annotations

import pytest
from cli_helpers import csv_rows, run, run_ok

from ddplan.layout import Layout, LayoutError, check_layout
from ddplan.memory import offloaded_bytes, resident_layer_share
from ddplan.offload import activation_offload_exposed_s
from ddplan.price import Pricer, RunPlan
from ddplan.registry import load_hardware, load_model
from ddplan.units import GiB


def test_resident_share_and_exposed_copies_by_hand():
    """Transformer Engine's schedule keeps (L - N) x T of saved activations at the end of forward (cpu_offload.py
    @00382b96): 126 layers, 95 offloaded, 31 / 126 on the GPU. A copy costs what exceeds its pass: 165 GiB at 200
    GB/s is 0.886 s, under a 2.6 s forward and a 5.2 s backward, free; at 50 GB/s 3.544 s: 0.944 s over the forward,
    nothing over the backward."""
    assert resident_layer_share(Layout(offload_activations=95), 126) == pytest.approx(31 / 126)
    assert resident_layer_share(Layout(), 126) == 1.0
    sent = 165 * GiB
    assert activation_offload_exposed_s(sent, 200e9, 2.6, 5.2) == 0.0
    assert activation_offload_exposed_s(sent, 50e9, 2.6, 5.2) == pytest.approx(sent / 50e9 - 2.6, rel=1e-12)
    assert sent / 50e9 - 2.6 == pytest.approx(0.944, abs=1e-3)
    with pytest.raises(ValueError):
        activation_offload_exposed_s(sent, 0.0, 2.6, 5.2)


def test_offload_needs_no_pipeline_and_fewer_layers_than_the_model():
    """Megatron-Core refuses CPU offloading with pp > 1 and for num_layers or more layers (transformer_config.py
    @d98e8a6 L1884-1893): the same two rules, each one line naming the flag."""
    with pytest.raises(LayoutError, match="pipeline") as e:
        Layout(pp=2, offload_activations=4)
    assert e.value.field == "--offload-activations"
    with pytest.raises(LayoutError):
        Layout(offload_activations=-1)
    spec = load_model("llama-3-8b")
    with pytest.raises(LayoutError, match="num_layers - 1 = 31"):
        check_layout(Layout(dp=8, offload_activations=32), spec)
    check_layout(Layout(dp=8, offload_activations=31), spec)


def test_offloaded_layers_leave_memory_and_their_copies_cost_what_the_link_cannot_hide():
    """Llama 3 8B on 8 H100s, micro-batch 2 x 8192: offloading 16 of 32 layers takes half the layers' saved bytes off
    the GPU (the embedding's and head's stay); each micro-batch sends those bytes over the 51 GB/s host link in
    forward and back in backward, costing accum x (max(0, copy - forward) + max(0, copy - backward))."""
    spec, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    pricer = Pricer(spec, hw, RunPlan(spec.recipe.budget, hw.price))
    base = dict(dp=8, zero=3, micro_batch=2, grad_accum=4, attention="fa3")
    plain, half = pricer.price(Layout(**base)), pricer.price(Layout(**base, offload_activations=16))
    an = pricer.anatomy(Layout(**base, offload_activations=16), "L")
    layers = an.saved_split[0] - an.weight_cast_split[0]  # ZeRO-3 holds no per-micro-batch weight casts
    assert plain.memory.terms["activations"] - half.memory.terms["activations"] == pytest.approx(layers / 2, rel=1e-9)
    sent = offloaded_bytes(an, Layout(**base, offload_activations=16), 32)
    assert sent == pytest.approx(layers / 2, rel=1e-12)
    copy = sent / 51e9
    hand = 4 * (max(0.0, copy - half.step.fwd_s) + max(0.0, copy - half.step.bwd_s))
    assert half.step.offload_s == pytest.approx(hand, rel=1e-9) and half.step.offload_s > 0
    assert half.step_s == pytest.approx(plain.step_s + half.step.offload_s, rel=1e-9)
    assert plain.step.offload_s == 0.0


def test_the_flag_prices_a_row_and_hardware_without_a_host_link_refuses_it(capsys):
    """--offload-activations N in table (the offload_s column, less memory) and in memory; on a GPU whose spec states
    no host link (mi355x) one line naming the flag; plan keeps it to the layouts without a pipeline."""
    argv = ["table", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--attention", "fa3",
            "--device-batch-size", "2", "--format", "csv"]
    (plain,) = csv_rows(run_ok(capsys, argv))
    (half,) = csv_rows(run_ok(capsys, argv + ["--offload-activations", "16"]))
    assert float(half["memory_gib"]) < float(plain["memory_gib"]) and float(half["offload_s"]) > 0
    mem = run_ok(capsys, ["memory", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--zero", "3",
                          "--attention", "fa3", "--device-batch-size", "2", "--offload-activations", "16",
                          "--format", "csv"])
    assert float(csv_rows(mem)[0]["total_gib"]) == pytest.approx(float(half["memory_gib"]), rel=1e-9)
    code, _, err = run(capsys, ["table", "-m", "llama-3-8b", "--hardware", "mi355x", "--gpus", "8",
                                "--offload-activations", "16"])
    assert code == 2 and err.strip().startswith("error: --offload-activations:") and "host link" in err
    # B200 takes the H200's measured PCIe Gen5 host link (assumed; hardware/b200.yaml), so offload prices there
    b200 = csv_rows(run_ok(capsys, ["table", "-m", "llama-3-8b", "--hardware", "b200", "--gpus", "8",
                                    "--attention", "cudnn", "--offload-activations", "16", "--format", "csv"]))
    assert len(b200) == 1 and float(b200[0]["offload_s"]) >= 0
    import json

    rows = json.loads(run_ok(capsys, ["plan", "-m", "llama-3-8b", "--hardware", "h100-sxm", "--gpus", "8",
                                      "--offload-activations", "8", "--format", "json", "--top", "500"]))["rows"]
    offloaded = [r for r in rows if r["offload_activations"]]
    assert offloaded and {r["offload_activations"] for r in offloaded} == {8}
    assert all(r["pp"] == 1 for r in offloaded) and any(r["pp"] > 1 for r in rows)


def test_megatron_s_cpu_offloading_imports_as_offload_activations(capsys, tmp_path):
    """--cpu-offloading-num-layers N (which turns --cpu-offloading on by itself: arguments.py@d98e8a6 L1950) imports
    as offload_activations N; without it nothing is written."""
    args, out = tmp_path / "args.sh", tmp_path / "run.yaml"
    base = "--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --nproc_per_node 8 --bf16"
    args.write_text(base + " --cpu-offloading-num-layers 5\n", encoding="utf-8")
    run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
    assert "offload_activations: 5" in out.read_text(encoding="utf-8")
    args.write_text(base + "\n", encoding="utf-8")
    run_ok(capsys, ["import", str(args), "-o", str(out), "--from", "megatron"])
    assert "offload_activations" not in out.read_text(encoding="utf-8")
