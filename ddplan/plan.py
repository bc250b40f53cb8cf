"""Decision tables: scenarios (GPU count x attention x window) -> rows with time, cost, MFU, memory, band.

Pure: builds rows (dicts, units in the keys), the verdict and the warnings; never prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ddplan import run
from ddplan.anatomy import build_anatomy
from ddplan.calibration import CalibrationSpec, StepMeasurement, fit_factor, steps_for_model
from ddplan.errors import UsageError
from ddplan.fit import Setup, breakdown
from ddplan.flops import mfu, nanochat_flops_per_token
from ddplan.layout import NATIVE_ZERO, Layout
from ddplan.roofline import FIT_SCENARIOS, SCENARIOS, Rates, comm_end, rates
from ddplan.specs import Budget, HardwareSpec, ModelSpec, Price
from ddplan.step import StepTime, step_time
from ddplan.units import GiB

CRITICAL_BATCH_WARN = 2.0  # warn when a layout forces the global batch past 2x the recipe's
MFU_CONVENTION = "6N + 12 h q min(window, T) per layer (nanochat / PaLM App. B), dense bf16 peak"


@dataclass(frozen=True)
class TableRequest:
    model: ModelSpec
    hardware: HardwareSpec
    gpus: tuple[int, ...]
    attentions: tuple[str, ...] = ()  # () = every implementation on the hardware
    windows: tuple[str, ...] = ()  # () = the model's pattern, and L when it differs
    device_batch_size: int | None = None
    total_batch_tokens: int | None = None
    budget: Budget | None = None
    price: Price | None = None
    overheads: run.RunOverheads = run.RunOverheads()
    compiled: bool | None = None
    recompute: str = "none"
    measurement: StepMeasurement | None = None
    knob: str = "auto"
    calibration: CalibrationSpec | None = None
    fp8: bool = False  # eligible GEMMs in fp8 (MFU stays against the bf16 peak, nanochat's convention)


@dataclass
class Table:
    rows: list[dict]
    verdict: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Scenario:
    gpus: int
    attention: str
    window: str


def build_table(req: TableRequest) -> Table:
    spec, hw = req.model, req.hardware
    seq = spec.recipe.seq_len
    total_batch = req.total_batch_tokens or spec.recipe.total_batch_tokens
    if total_batch % seq:
        raise UsageError(f"{total_batch} is not a multiple of the sequence length {seq}", field="--total-batch-size")
    mb = req.device_batch_size or spec.recipe.device_batch_size
    budget = req.budget or spec.recipe.budget
    steps = run.steps_for(spec, budget, total_batch)
    compiled = spec.recipe.compiled if req.compiled is None else req.compiled
    attentions = req.attentions or tuple(a.name for a in hw.attention)
    for name in attentions:
        if name not in {a.name for a in hw.attention}:
            raise UsageError(f"{name!r} is not available on {hw.name}; allowed: "
                             f"{', '.join(a.name for a in hw.attention)}", field="--attention")
    pattern = spec.architecture.window_pattern
    windows = req.windows or ((pattern, "L") if pattern != "L" else ("L",))
    price = req.price or hw.price
    if req.fp8:
        check_fp8(spec, hw)
    table = Table(rows=[])
    factors, knob = _fit(req, spec, hw, compiled, total_batch, mb, table)
    for g in req.gpus:
        for att in attentions:
            for win in windows:
                table.rows.append(_row(req, _Scenario(g, att, win), total_batch, mb, steps, compiled, price,
                                       factors, knob, table))
    _verdict(req, table, price)
    small = [g for g in req.gpus if g % hw.gpus_per_node]
    if price.billing == "per_node" and small:
        table.warnings.append(f"the price ({price.provider}) bills whole {hw.gpus_per_node}-GPU nodes: rows with "
                              f"{', '.join(map(str, small))} GPU(s) pay for full nodes; give --price for a per-GPU offer")
    table.assumptions += _assumptions(req, hw, compiled, steps, total_batch, budget, price, knob, factors)
    return table


def check_fp8(spec: ModelSpec, hw: HardwareSpec) -> None:
    """Raise UsageError when the model's fp8 training path cannot run on this hardware, saying why."""
    if hw.peak.fp8_tflops is None or not hw.fp8_formats:
        raise UsageError(f"{hw.name} has no fp8 tensor units; drop --fp8", field="--fp8")
    need = spec.recipe.fp8_formats
    if need and not set(need) <= set(hw.fp8_formats):
        raise UsageError(f"{spec.name}'s fp8 path needs {'/'.join(need)}, but {hw.name}'s tensor units take "
                         f"{'/'.join(hw.fp8_formats)} (e.g. nanochat's torch._scaled_mm with float8_e4m3fn does "
                         f"not run on MI300X, which has the fnuz formats)", field="--fp8")


def _layout(spec: ModelSpec, gpus: int, mb: int, total_batch: int, table: Table | None) -> tuple[int, int, int, str]:
    """(micro_batch, accum, global batch tokens, note) for pure data parallelism over `gpus`.

    When gpus x micro-batch x seq exceeds the total batch, accumulation would fall below 1: the way
    out that keeps the recipe's batch (and loss curve) is a smaller micro-batch, slower per GPU; the
    other is a larger global batch, past the critical batch size eventually (McCandlish et al.,
    arXiv 1812.06162). ddplan takes the first and names the second.
    """
    seq = spec.recipe.seq_len
    per_step = gpus * mb * seq
    if total_batch % per_step == 0:
        return mb, total_batch // per_step, total_batch, ""
    if per_step > total_batch and total_batch % (gpus * seq) == 0:
        small = total_batch // (gpus * seq)
        bigger = per_step
        note = (f"{gpus} GPUs x device batch {mb} x {seq} = {per_step:,} tokens > total batch {total_batch:,}: "
                f"device batch {small} keeps the batch (slower per GPU); keeping device batch {mb} means a "
                f"{bigger / total_batch:.0f}x global batch ({bigger:,} tokens)")
        if bigger > CRITICAL_BATCH_WARN * total_batch:
            note += ", past the recipe's batch: beware the critical batch size (McCandlish et al. 2018)"
        return small, 1, total_batch, note
    if per_step > total_batch:  # even one sequence per GPU overshoots: the smallest device batch that covers it
        mb = max(1, -(-total_batch // (gpus * seq)))
        per_step = gpus * mb * seq
    accum = -(-total_batch // per_step)
    note = (f"total batch {total_batch:,} does not split over {gpus} GPUs x {mb} x {seq}: rounded up to "
            f"{accum * per_step:,} tokens (a token budget then takes fewer steps)")
    if accum * per_step > CRITICAL_BATCH_WARN * total_batch:
        note += "; far past the recipe's batch: beware the critical batch size (McCandlish et al. 2018)"
    return mb, accum, accum * per_step, note


def _config_rates(hw: HardwareSpec, attention: str, scenario: str, calibration: CalibrationSpec | None,
                  fp8: bool = False) -> Rates:
    """Rates for a scenario, with calibrated measurements replacing the spec's assumptions."""
    return calibrated_rates(rates(hw, attention, scenario, fp8=fp8), attention, calibration)


def calibrated_rates(r: Rates, attention: str, calibration: CalibrationSpec | None) -> Rates:
    """Rates with every measured figure in a calibration file replacing its assumption.

    GEMMs: each op takes the efficiency of the nearest measured shape (log distance over m, n, k);
    attention: the nearest measured (batch x heads, seq, window, head_dim) of the same implementation;
    HBM: the measured copy bandwidth; kernel overhead: the measured launch time. A measured figure has
    no range: in every scenario it is the same.
    """
    if calibration is None:
        return r
    if calibration.hbm_tbyte_per_s:
        r = replace(r, hbm=calibration.hbm_tbyte_per_s * 1e12 / r.hbm_bytes_per_s)
    if calibration.kernel_overhead_us:
        r = replace(r, kernel_overhead_s=calibration.kernel_overhead_us * 1e-6)
    if calibration.pointwise_tbyte_per_s:
        r = replace(r, pointwise_bytes_per_s=calibration.pointwise_tbyte_per_s * 1e12)
    if calibration.optimizer_tbyte_per_s:
        r = replace(r, optimizer_bytes_per_s=calibration.optimizer_tbyte_per_s * 1e12)
    gemm = [p for p in calibration.gemm if p.dtype in ("bf16", "fp16", "fp32")]
    if gemm:
        r = replace(r, gemm_points=tuple((p.m, p.n, p.k, p.tflops * 1e12 / r.peak_flops_per_s) for p in gemm))
    if calibration.peak_gemm_tflops:
        r = replace(r, gemm_best=calibration.peak_gemm_tflops * 1e12 / r.peak_flops_per_s)
    attn = [p for p in calibration.attention if p.implementation == attention]
    if attn:
        r = replace(r, attention_points=tuple(
            (p.batch * p.heads, p.seq_len, p.window, p.head_dim, p.fwd_tflops * 1e12 / r.peak_flops_per_s,
             p.bwd_tflops * 1e12 / r.peak_flops_per_s) for p in attn))
    return r


def _step(req: TableRequest, sc: _Scenario, mb: int, accum: int, compiled: bool, scenario: str,
          factor: float | None, knob: str | None, measured_attention: str | None,
          seq_len: int | None = None) -> tuple[StepTime, Layout]:
    """One scenario's step time; the fitted knob applies to the GEMMs everywhere and to attention only
    in rows that use the measured implementation."""
    r = _config_rates(req.hardware, sc.attention, scenario, req.calibration, req.fp8)
    if factor is not None and knob is not None:
        if knob == "gemm" or sc.attention == measured_attention:
            r = r.scaled(knob, factor)
        elif knob == "compute":
            r = r.scaled("gemm", factor)
    return _step_with_rates(req, sc, mb, accum, compiled, r, seq_len, comm_end(scenario))


def _measurement(req: TableRequest) -> StepMeasurement | None:
    if req.measurement is not None:
        return req.measurement
    if req.calibration is None:
        return None
    found = steps_for_model(req.calibration, {req.model.name, *req.model.aliases})
    return found[0] if found else None


def _fit(req: TableRequest, spec: ModelSpec, hw: HardwareSpec, compiled: bool, total_batch: int, mb: int,
         table: Table) -> tuple[dict[str, float], str | None]:
    """Fit one knob to a measured step, separately in each scenario, so the band carries the other terms.

    In the 'low' scenario every other efficiency sits at its slow end, so the fitted knob comes out
    faster, and vice versa: each derived row's band is the spread of its predictions over scenarios.
    """
    m = _measurement(req)
    if m is None:
        return {}, None
    if m.total_batch_tokens != total_batch:
        table.warnings.append(f"the measurement used total batch {m.total_batch_tokens:,}, the table "
                              f"{total_batch:,}: rows are derived at the table's batch")
    sc = _Scenario(m.gpus, m.attention, m.window_pattern or spec.architecture.window_pattern)
    if m.attention not in {a.name for a in hw.attention}:
        raise UsageError(f"measured attention {m.attention!r} is not available on {hw.name}",
                         field="--measured-attention")
    mmb, accum, _, _ = _layout(spec, m.gpus, m.device_batch_size, m.total_batch_tokens, None)
    knob = req.knob
    if knob == "auto":
        widths = {}
        for k in ("gemm", "attention"):
            lo, hi = (_config_rates(hw, m.attention, s, req.calibration, req.fp8) for s in ("low", "high"))
            base = _config_rates(hw, m.attention, "value", req.calibration, req.fp8)
            times = []
            for end in (lo, hi):
                r = replace(base, gemm_best=end.gemm_best) if k == "gemm" else replace(
                    base, attn_fwd=end.attn_fwd, attn_bwd=end.attn_bwd)
                times.append(_step_with_rates(req, sc, mmb, accum, m.compiled, r, m.seq_len)[0].total_s)
            widths[k] = max(times) - min(times)
        knob = max(widths, key=widths.get)
    factors = {}
    for scen in FIT_SCENARIOS:
        def predict(f: float, scen: str = scen) -> float:
            return _step(req, sc, mmb, accum, m.compiled, scen, f, knob, m.attention, m.seq_len)[0].total_s
        try:
            factors[scen] = fit_factor(predict, m.step_time_s)
        except ValueError as e:
            raise UsageError(f"cannot fit {knob} efficiency to the measured {m.step_time_s} s: {e}",
                             field="--measured-step-time") from None
    # a fit that needs a kernel faster than the device's best measured GEMM is not a plausible world
    ceiling = hw.efficiency.gemm.best.range[1]
    dropped: list[str] = []
    for scen in list(factors):
        r = _config_rates(hw, m.attention, scen, req.calibration, req.fp8).scaled(knob, factors[scen])
        implied = max(r.gemm_best, r.attn_fwd, r.attn_bwd) if knob == "compute" else (
            r.gemm_best if knob == "gemm" else max(r.attn_fwd, r.attn_bwd))
        if implied > ceiling and scen != "value":
            dropped.append(f"{scen:g}")
            del factors[scen]
        elif implied > ceiling:
            table.warnings.append(f"fit: the measured {m.step_time_s:g} s needs {knob} efficiency {implied:.2f} of "
                                  f"peak, above the best measured GEMM ({ceiling:.2f}): check the stated configuration")
    if dropped:
        table.warnings.append(
            f"fit: with the other efficiencies at {', '.join(dropped)} of their ranges (0 = slow end), the measured "
            f"step would need {knob} efficiency above the best measured GEMM ({ceiling:.2f} of peak): those worlds are "
            f"ruled out, and the bands use the rest")
    return factors, knob


def _step_with_rates(req: TableRequest, sc: _Scenario, mb: int, accum: int, compiled: bool, r: Rates,
                     seq_len: int | None, comm_eff: str = "value") -> tuple[StepTime, Layout]:
    """Step time of a row's pure data-parallel layout at the given rates."""
    spec, hw = req.model, req.hardware
    impl = hw.attention_impl(sc.attention)
    layout = Layout(dp=sc.gpus, zero=NATIVE_ZERO[spec.recipe.distribution], micro_batch=mb, grad_accum=accum,
                    attention=sc.attention, recompute=req.recompute, compiled=compiled)
    anatomy = build_anatomy(spec, batch=mb, seq_len=seq_len, attention=impl.kind, windows=impl.windows,
                            recompute=req.recompute, compiled=compiled, window_pattern=sc.window)
    return step_time(spec, hw, layout, anatomy, r, comm_efficiency=comm_eff,
                     comm_points=comm_points(req.calibration)), layout


def comm_points(calibration: CalibrationSpec | None) -> dict[tuple[str, int], list[tuple[float, float]]] | None:
    """Measured collective times by (collective, group size), for ddplan.step.collective_s."""
    if calibration is None or not calibration.collectives:
        return None
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for p in calibration.collectives:
        out.setdefault((p.collective, p.group_size), []).append((p.size_bytes, p.time_s))
    return {k: sorted(v) for k, v in out.items()}


def _row(req: TableRequest, sc: _Scenario, total_batch: int, mb0: int, steps: int, compiled: bool, price: Price,
         factors: dict[str, float], knob: str | None, table: Table) -> dict:
    spec, hw = req.model, req.hardware
    mb, accum, batch, note = _layout(spec, sc.gpus, mb0, total_batch, table)
    flags = []
    if note:
        table.warnings.append(note)
    budget = req.budget or spec.recipe.budget
    if batch != total_batch and budget.steps is None:  # a token budget: a larger batch means fewer steps
        steps = run.steps_for(spec, budget, batch)
    if req.device_batch_size is None:  # not pinned by the user: the largest device batch that fits
        fitted = _largest_fitting_micro_batch(req, sc, mb, compiled)
        if fitted != mb:
            table.warnings.append(f"{sc.gpus}x {hw.name}, {sc.attention}, {sc.window}: device batch {mb} does not fit "
                                  f"in {hw.memory.usable_gib.value:g} GiB; using {fitted} (accumulation x{mb // fitted}"
                                  f", same total batch). Pin it with --device-batch-size.")
            accum, mb = accum * (mb // fitted), fitted
    if spec.recipe.world_size_rule == "power_of_two" and sc.gpus & (sc.gpus - 1):
        flags.append("world size not a power of two (nanochat needs one)")
    measured = _measurement(req)
    m_att = measured.attention if measured else None
    scenarios = list(factors) if factors else list(SCENARIOS)
    times = {s: _step(req, sc, mb, accum, compiled, s, factors.get(s), knob, m_att) for s in scenarios}
    st, layout = times["value"]
    step_s = st.total_s
    lo_s, hi_s = min(t[0].total_s for t in times.values()), max(t[0].total_s for t in times.values())
    basis = "model"
    if factors:
        basis = "fitted"
        if (measured and sc.gpus == measured.gpus and sc.attention == measured.attention
                and sc.window == (measured.window_pattern or spec.architecture.window_pattern)
                and mb == measured.device_batch_size and batch == measured.total_batch_tokens):
            basis, step_s, lo_s, hi_s = "measured", measured.step_time_s, measured.step_time_s, measured.step_time_s
    mem = breakdown(spec, hw, Setup(layout=layout, window_pattern=sc.window))
    if not mem.fits:
        flags.append(f"does not fit: {mem.total / GiB:.0f} of {mem.capacity / GiB:.0f} GiB")
    # implausible: the whole step sustaining more than the device's best measured GEMM rate
    impl = hw.attention_impl(sc.attention)
    anatomy = build_anatomy(spec, batch=mb, attention=impl.kind, windows=impl.windows, recompute=req.recompute,
                            compiled=compiled, window_pattern=sc.window)
    executed = accum * (anatomy.flops_fwd() + anatomy.flops_bwd())
    best = hw.efficiency.gemm.best.range[1] * hw.peak.flops_per_s(spec.dtypes.compute)
    if req.fp8:
        best = (hw.efficiency.gemm.best_fp8 or hw.efficiency.gemm.best).range[1] * hw.peak.flops_per_s("fp8")
    if executed / step_s > best:
        flags.append(f"implausible: sustains {executed / step_s / 1e12:.0f} TFLOP/s, above the best measured "
                     f"GEMM rate {best / 1e12:.0f}")
    arch = spec.architecture.model_copy(update={"window_pattern": sc.window})
    fpt = nanochat_flops_per_token(arch, spec.recipe.seq_len)
    peak = hw.peak.flops_per_s(spec.dtypes.compute)
    every, eval_tokens = _eval_cadence(spec, req.overheads)
    outside = run.outside_steps_s(req.overheads, steps=steps, eval_every=every, eval_tokens=eval_tokens,
                                  tokens_per_forward=sc.gpus * mb * spec.recipe.seq_len, forward_s=st.fwd_s,
                                  checkpoint_bytes=(mem.terms["params"] + mem.terms["optimizer"]) * sc.gpus,
                                  nodes=-(-sc.gpus // hw.gpus_per_node))
    wall = {k: steps * v + outside for k, v in (("value", step_s), ("low", lo_s), ("high", hi_s))}  # low: fast end
    cost = {k: run.cost_usd(price, sc.gpus, hw.gpus_per_node, run.hours(v)) for k, v in wall.items()}
    return {
        "config": f"{sc.gpus}x {hw.name}, {sc.attention}, {sc.window}",
        "gpus": sc.gpus, "attention": sc.attention, "window": sc.window,
        "device_batch": mb, "accum": accum, "global_batch_tokens": batch,
        "step_s": step_s, "step_low_s": lo_s, "step_high_s": hi_s,
        "compute_s": st.compute_s, "dp_comm_exposed_s": st.dp_comm_exposed_s, "tp_comm_s": st.tp_comm_s,
        "bubble_s": st.bubble_s, "optimizer_s": st.optimizer_s,
        "attention_s": st.by_kind_s.get("attention", 0.0), "gemm_s": st.by_kind_s.get("gemm", 0.0),
        "mfu_pct": 100 * mfu(fpt, batch / step_s, peak, sc.gpus),
        "tokens_per_s": batch / step_s, "steps": steps,
        "train_h": run.hours(steps * step_s), "outside_steps_h": run.hours(outside),
        "wall_clock_h": run.hours(wall["value"]), "wall_low_h": run.hours(wall["low"]),
        "wall_high_h": run.hours(wall["high"]),
        "cost_usd": cost["value"], "cost_low_usd": cost["low"], "cost_high_usd": cost["high"],
        "memory_gib": mem.total / GiB, "fits": mem.fits, "basis": basis, "flags": "; ".join(flags),
    }


def _eval_cadence(spec: ModelSpec, o: run.RunOverheads) -> tuple[int, int]:
    """(every N steps, tokens per evaluation): the flags' values, else the recipe's."""
    ev = spec.recipe.evaluation
    every = o.eval_every_steps if o.eval_every_steps is not None else (ev.every_steps if ev else 0)
    tokens = o.eval_tokens if o.eval_tokens is not None else (ev.tokens if ev else 0)
    return every, tokens


def _largest_fitting_micro_batch(req: TableRequest, sc: _Scenario, mb: int, compiled: bool) -> int:
    """Halve the micro-batch until memory fits (down to 1); the total batch is kept by accumulation."""
    spec, hw = req.model, req.hardware
    while mb > 1:
        layout = Layout(dp=sc.gpus, zero=NATIVE_ZERO[spec.recipe.distribution], micro_batch=mb,
                        attention=sc.attention, recompute=req.recompute, compiled=compiled)
        if breakdown(spec, hw, Setup(layout=layout, window_pattern=sc.window)).fits:
            return mb
        if mb % 2:
            return mb
        mb //= 2
    return mb


def _verdict(req: TableRequest, table: Table, price: Price) -> None:
    for r in table.rows:
        if r["flags"]:
            table.warnings.append(f"{r['config']}: {r['flags']}")
    rows = [r for r in table.rows if r["fits"] and "implausible" not in r["flags"]
            and "power of two" not in r["flags"]]
    if not rows:
        why = []
        if any("power of two" in r["flags"] for r in table.rows):
            why.append(f"{req.model.name} needs a power-of-two world size")
        if any(not r["fits"] for r in table.rows):
            why.append("some rows do not fit in memory (see `ddplan memory`)")
        if any("implausible" in r["flags"] for r in table.rows):
            why.append("some rows are implausible")
        table.verdict.append("No row can run as given: " + "; ".join(why or ["see the warnings"]) + ".")
        return
    g0 = min(r["gpus"] for r in rows)
    base = _baseline(req, rows, g0)
    one = [r for r in rows if r["gpus"] == g0]
    best_kernel = min(one, key=lambda r: r["wall_clock_h"])
    fastest = min(rows, key=lambda r: r["wall_clock_h"])
    cheapest = min(rows, key=lambda r: r["cost_usd"])
    v = table.verdict
    v.append(f"Baseline: {base['config']}: {base['step_s']:.2f} s/step, MFU {base['mfu_pct']:.1f}%, "
             f"{base['wall_clock_h']:.1f} h, ${base['cost_usd']:,.0f} ({base['basis']}).")
    if best_kernel is not base and best_kernel["wall_clock_h"] < 0.95 * base["wall_clock_h"]:
        gain = 1 - best_kernel["wall_clock_h"] / base["wall_clock_h"]
        v.append(f"Fix the kernel first: {best_kernel['attention']} with window {best_kernel['window']} on the same "
                 f"{g0} GPU(s) cuts wall-clock by {100 * gain:.0f}% ({best_kernel['wall_clock_h']:.1f} h) and cost "
                 f"by the same share (${best_kernel['cost_usd']:,.0f}): per-FLOP efficiency is a kernel problem "
                 f"that more GPUs cannot fix.")
    else:
        v.append(f"No attention implementation on {req.hardware.name} beats the baseline by 5% or more: the step is "
                 f"dominated by GEMMs ({base['gemm_s']:.2f} of {base['step_s']:.2f} s).")
    more = [r for r in rows if r["gpus"] > g0 and r["attention"] == base["attention"]
            and r["window"] == base["window"]]
    if more:
        r8 = max(more, key=lambda r: r["gpus"])
        speedup = base["wall_clock_h"] / r8["wall_clock_h"]
        v.append(f"Then add GPUs: {r8['gpus']} GPUs run {speedup:.1f}x faster ({r8['wall_clock_h']:.1f} h) for "
                 f"{r8['cost_usd'] / base['cost_usd']:.2f}x the cost: data parallelism removes the serial "
                 f"accumulation ({base['accum']} -> {r8['accum']} micro-batches) but multiplies whatever per-GPU "
                 f"efficiency you have (exposed communication {1000 * r8['dp_comm_exposed_s']:.0f} ms/step).")
    v.append(f"Fastest: {fastest['config']} ({fastest['wall_clock_h']:.1f} h, ${fastest['cost_usd']:,.0f}). "
             f"Cheapest: {cheapest['config']} (${cheapest['cost_usd']:,.0f}, {cheapest['wall_clock_h']:.1f} h).")
    worst_mem = max(table.rows, key=lambda r: r["memory_gib"] if r["fits"] else 0)
    cap = req.hardware.memory.usable_gib.value
    if all(r["fits"] for r in table.rows if r["attention"] == base["attention"]):
        v.append(f"TP/PP and higher ZeRO stages are not needed: the largest fitting row uses "
                 f"{worst_mem['memory_gib']:.0f} of {cap:.0f} GiB per GPU; they would only add communication.")
    else:
        v.append("Some rows do not fit in memory: run `ddplan memory` for the setup that would (ZeRO, recompute, "
                 "TP/PP).")


def _baseline(req: TableRequest, rows: list[dict], g0: int) -> dict:
    measured = [r for r in rows if r["basis"] == "measured"]
    if measured:
        return measured[0]
    default = req.hardware.default_attention
    pattern = req.model.architecture.window_pattern
    cands = [r for r in rows if r["gpus"] == g0 and r["attention"] == default and r["window"] == pattern]
    return cands[0] if cands else min((r for r in rows if r["gpus"] == g0), key=lambda r: -r["wall_clock_h"])


def _assumptions(req: TableRequest, hw: HardwareSpec, compiled: bool, steps: int, total_batch: int,
                 budget: Budget, price: Price, knob: str | None, factors: dict[str, float]) -> list[str]:
    spec, o = req.model, req.overheads
    how = ("given" if req.budget and req.budget.steps else "the recipe's step budget" if budget.steps
           else f"{budget.tokens:,} tokens" if budget.tokens
           else f"param:data ratio {budget.param_data_ratio:g} x {budget.ratio_params} params")
    every, tokens = _eval_cadence(spec, o)
    evals = f"evaluation every {every:,} steps of {tokens:,} tokens (forward only)" if every and tokens else \
        "no evaluation"
    out = [
        f"Model {spec.name}: recipe from {spec.recipe.source}.",
        f"Run: {steps:,} steps ({how}) of {total_batch:,} tokens; {'compiled' if compiled else 'eager'}; "
        f"recompute {req.recompute}; native data-parallel setup: {spec.recipe.distribution}.",
        f"Hardware {hw.name}: dense bf16 peak {hw.peak.bf16_tflops.value:g} TFLOP/s; best GEMM efficiency "
        f"{hw.efficiency.gemm.best.value:.3f} ({hw.efficiency.gemm.best.basis}, range "
        f"{hw.efficiency.gemm.best.range[0]:.3f}-{hw.efficiency.gemm.best.range[1]:.3f}); HBM efficiency "
        f"{hw.efficiency.hbm.value:.2f} ({hw.efficiency.hbm.basis}). `ddplan specs show {hw.name}` lists every figure "
        f"and its source.",
        f"Price: ${price.usd_per_gpu_hour:g}/GPU-h, billed {price.billing.replace('_', ' ')} ({price.provider}, "
        f"{price.date}).",
        f"Outside steps: start-up {o.startup_s:g} s, {evals}, checkpoints "
        f"{'at the end' if not o.checkpoint_every_steps else f'every {o.checkpoint_every_steps} steps'} "
        f"at {o.checkpoint_gbyte_per_s:g} GB/s.",
        f"MFU convention: {MFU_CONVENTION}, at each row's window pattern.",
        *(["fp8: GEMMs with every dim a multiple of 16 and min(k, n) >= 128 at the dense fp8 peak x "
           f"{(hw.efficiency.gemm.best_fp8 or hw.efficiency.gemm.best).value:.3f}"
           f"{'' if hw.efficiency.gemm.best_fp8 else ' (the bf16 fraction: no fp8 measurement)'}, plus "
           "quantisation casts; attention stays bf16; MFU still against the bf16 peak."] if req.fp8 else []),
        "Band (low-high): every efficiency at the fast and slow ends of its range in the hardware spec.",
    ]
    cal = req.calibration
    if cal is not None:
        measured = [name for name, present in (
            (f"GEMM efficiency at {len(cal.gemm)} shapes (nearest shape per op)", cal.gemm),
            (f"attention at {len(cal.attention)} points", cal.attention),
            (f"HBM {cal.hbm_tbyte_per_s} TB/s", cal.hbm_tbyte_per_s),
            (f"kernel overhead {cal.kernel_overhead_us} us", cal.kernel_overhead_us),
            (f"elementwise {cal.pointwise_tbyte_per_s} TB/s", cal.pointwise_tbyte_per_s),
            (f"AdamW {cal.optimizer_tbyte_per_s} TB/s", cal.optimizer_tbyte_per_s),
            (f"collectives at {len(cal.collectives)} points (interpolated t(S))", cal.collectives)) if present]
        where = cal.provenance.device_name if cal.provenance else "no provenance"
        out.append(f"Calibration ({where}): measured {'; '.join(measured) or 'nothing but step times'}; "
                   f"everything else assumed from the hardware spec.")
        if cal.failures:
            out.append("Calibration failures: " + "; ".join(cal.failures))
    m = _measurement(req)
    if m is not None:
        out.append(f"Measured: {m.step_time_s:g} s/step on {m.gpus} GPU(s), {m.attention}, window "
                   f"{m.window_pattern or spec.architecture.window_pattern}, device batch {m.device_batch_size} "
                   f"({m.source}). Fitted knob: {knob} efficiency x{factors['value']:.3f} (x{min(factors.values()):.3f}-"
                   f"x{max(factors.values()):.3f} as the other efficiencies sweep their ranges); other rows derive from "
                   f"it, the other terms stay assumptions with their ranges.")
    return out
