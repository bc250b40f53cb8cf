"""ddplan against a published large-scale run: GPT-3 175B on 64 A100-80GB (Korthikanti et al. 2022).

Published (arXiv 2205.05198): Table 5, iteration time with full recompute 18.13 s (sequence parallel +
selective: 13.75 s); Figure 1, memory per GPU without recompute: parameters + optimizer 45.56 GiB,
activations 66.84 GiB. Layout (as Calculon's validation files reproduce it): tensor parallel 8,
pipeline 8 with 3 interleaved stages, data parallel 1, global batch 64 sequences of 2048, micro-batch 1,
fp16, unfused attention.

    python benchmarks/published_gpt3_175b.py
"""

from __future__ import annotations

from ddplan.anatomy import build_anatomy
from ddplan.layout import Layout, check_layout
from ddplan.memory import memory_per_gpu
from ddplan.registry import load_hardware, load_model
from ddplan.roofline import rates
from ddplan.step import step_time
from ddplan.units import GiB


def main() -> None:
    spec, hw = load_model("gpt3-175b"), load_hardware("a100-sxm-80gb")
    impl = hw.attention_impl("sdpa-math")
    print(f"{'figure':44s} {'published':>10s} {'ddplan (low-high)':>24s}")
    for recompute, published in (("full", 18.13), ("none", None)):
        layout = Layout(dp=1, tp=8, pp=8, zero=0, micro_batch=1, grad_accum=64, attention="sdpa-math",
                        recompute=recompute, compiled=False, pp_schedule="interleaved", pp_virtual_stages=3)
        check_layout(layout, spec, total_batch_tokens=64 * 2048)
        an = build_anatomy(spec, batch=1, attention=impl.kind, windows=impl.windows, recompute=recompute, tp=8)
        t = {s: step_time(spec, hw, layout, an, rates(hw, "sdpa-math", s), comm_efficiency=s).total_s
             for s in ("value", "low", "high")}
        if published:
            print(f"{'iteration time, full recompute (s)':44s} {published:10.2f} "
                  f"{t['value']:10.2f} ({min(t.values()):.2f}-{max(t.values()):.2f})")
        if recompute == "none":
            mem = memory_per_gpu(spec, layout, an, hw.memory.usable_bytes)
            states = (mem.terms["params"] + mem.terms["gradients"] + mem.terms["optimizer"]) / GiB
            print(f"{'params + grads + optimizer per GPU (GiB)':44s} {45.56:10.2f} {states:10.2f}")
            print(f"{'activations per GPU, no recompute (GiB)':44s} {66.84:10.2f} "
                  f"{mem.terms['activations'] / GiB:10.2f}")
    st = step_time(spec, hw, layout, an, rates(hw, "sdpa-math"))
    print(f"(no-recompute step, for reference: {st.total_s:.2f} s: compute {st.compute_s:.2f}, TP {st.tp_comm_s:.2f},"
          f" bubble {st.bubble_s:.2f}, optimizer {st.optimizer_s:.2f})")


if __name__ == "__main__":
    main()
