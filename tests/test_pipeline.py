"""ddplan.pipeline: the bubble under both conventions (fraction of step, Megatron's over-ideal) and p2p bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddplan import pipeline

degree = st.integers(1, 512)


def test_bubble_hand_cases():
    """p=4, m=8: fraction of step 3/11, over ideal 3/8; interleaved v=2: 3/19 and 3/16."""
    assert pipeline.bubble_fraction_of_step(4, 8) == pytest.approx(3 / 11)
    assert pipeline.bubble_over_ideal(4, 8) == pytest.approx(3 / 8)
    assert pipeline.bubble_fraction_of_step(4, 8, 2) == pytest.approx(3 / 19)
    assert pipeline.bubble_over_ideal(4, 8, 2) == pytest.approx(3 / 16)
    assert pipeline.bubble_fraction_of_step(1, 1) == 0.0
    assert pipeline.bubble_over_ideal(1, 7, 3) == 0.0


def test_gpipe_fraction_of_step():
    """GPipe (arXiv 1811.06965 sec. 2.3): bubble (K-1)/(M+K-1); with M >= 4K it is small (K=4, M=16: 3/19)."""
    assert pipeline.bubble_fraction_of_step(4, 16) == pytest.approx(3 / 19)
    assert pipeline.bubble_fraction_of_step(4, 16) < 0.16


def test_megatron_over_ideal():
    """Narayanan et al. arXiv 2104.04473 sec. 2.2: (p-1)/m, and (1/v)(p-1)/m interleaved.
    p=8, m=8: 7/8 of the ideal time; v=4: 7/32."""
    assert pipeline.bubble_over_ideal(8, 8) == pytest.approx(0.875)
    assert pipeline.bubble_over_ideal(8, 8, 4) == pytest.approx(7 / 32)


def test_bubble_time_hand():
    """ideal 8 s, p=4, m=8: 3 s of bubble; the step is 11 s, of which 3/11 idle."""
    t = pipeline.bubble_time_s(8.0, 4, 8)
    assert t == pytest.approx(3.0)
    assert t / (8.0 + t) == pytest.approx(pipeline.bubble_fraction_of_step(4, 8))
    assert pipeline.bubble_time_s(0.0, 4, 8) == 0.0


def test_p2p_bytes_hand():
    """b=1, s=2048, h=4096, bf16: 16,777,216 B each direction per micro-batch."""
    assert pipeline.p2p_bytes_per_microbatch(1, 2048, 4096, 2) == 16_777_216


@given(p=degree, m=degree, v=st.integers(1, 16))
def test_bubble_in_unit_interval_and_conventions_agree(p, m, v):
    frac = pipeline.bubble_fraction_of_step(p, m, v)
    ratio = pipeline.bubble_over_ideal(p, m, v)
    assert 0 <= frac < 1
    assert frac == pytest.approx(ratio / (1 + ratio), rel=1e-12, abs=1e-15)


@given(p=degree, m=degree, v=st.integers(1, 16))
def test_bubble_non_increasing_in_microbatches(p, m, v):
    assert pipeline.bubble_fraction_of_step(p, m + 1, v) <= pipeline.bubble_fraction_of_step(p, m, v)
    assert pipeline.bubble_over_ideal(p, m + 1, v) <= pipeline.bubble_over_ideal(p, m, v)


@given(p=degree, m=degree, v=st.integers(1, 16))
def test_interleaving_never_increases_bubble(p, m, v):
    assert pipeline.bubble_fraction_of_step(p, m, v + 1) <= pipeline.bubble_fraction_of_step(p, m, v)
    assert pipeline.bubble_over_ideal(p, m, v + 1) <= pipeline.bubble_over_ideal(p, m, v)


@given(p=degree, m=degree)
def test_bubble_non_decreasing_in_stages(p, m):
    assert pipeline.bubble_fraction_of_step(p + 1, m) >= pipeline.bubble_fraction_of_step(p, m)


@pytest.mark.parametrize("args, named", [
    ((0, 8, 1), "p=0"),
    ((4, 0, 1), "m=0"),
    ((4, 8, 0), "v=0"),
    ((4, 8.0, 1), "m=8.0"),
    ((True, 8, 1), "p=True"),
    ((-1, -2, 1), "p=-1, m=-2"),
])
def test_rejects_bad_degrees(args, named):
    for fn in (pipeline.bubble_fraction_of_step, pipeline.bubble_over_ideal):
        with pytest.raises(ValueError) as e:
            fn(*args)
        assert named in str(e.value)
    with pytest.raises(ValueError, match=named.split(",")[0]):
        pipeline.bubble_time_s(1.0, *args)


def test_rejects_bad_times_and_shapes():
    with pytest.raises(ValueError, match="ideal_compute_s"):
        pipeline.bubble_time_s(-1.0, 4, 8)
    with pytest.raises(ValueError, match="hidden=0"):
        pipeline.p2p_bytes_per_microbatch(1, 2048, 0, 2)


def test_p2p_time_by_hand():
    """16.78 MB at 100 GB/s and 5 us, 8 micro-batches: 8 x 2 x (1.678e-4 + 5e-6) = 2.765e-3 s; interleaving
    v = 2 crosses twice the boundaries (Narayanan et al. 2021 sec. 2.2.2)."""
    sent = pipeline.p2p_bytes_per_microbatch(1, 2048, 4096, 2)
    assert sent == 16_777_216
    t = pipeline.p2p_time_s(sent, 100e9, 5e-6, 8)
    assert t == pytest.approx(8 * 2 * (16_777_216 / 100e9 + 5e-6), rel=1e-12)
    assert round(t, 6) == 0.002764
    assert pipeline.p2p_time_s(sent, 100e9, 5e-6, 8, v=2) == pytest.approx(2 * t)
    with pytest.raises(ValueError):
        pipeline.p2p_time_s(sent, 0.0, 5e-6, 8)


def test_stage_layers_even_and_uneven_by_hand():
    """Llama 3 405B: 126 layers over 16 stages, one fewer on the first and last (arXiv 2407.21783 sec. 3.3.2):
    7 + 14 x 8 + 7 = 126. BLOOM: 70 over 12 as 5 + 10 x 6 + 5 (DeepSpeed's transformer|embedding partition)."""
    from ddplan.pipeline import stage_layers

    assert stage_layers(126, 16) == (7, 8, 7)
    assert stage_layers(70, 12) == (5, 6, 5)
    assert stage_layers(24, 4) == (6, 6, 6)
    assert stage_layers(9, 2) == (5, 5, 4)  # the odd layer to the first stage: the last also holds the head
    assert stage_layers(7, 1) == (7, 7, 7)
    for L, p in ((126, 16), (70, 12), (17, 4), (100, 7)):
        first, middle, last = stage_layers(L, p)
        assert first + middle * (p - 2) + last == L and first <= middle and last <= middle
    with pytest.raises(ValueError):
        stage_layers(5, 4)  # 2 + 2 + 1 + 0: the last stage would hold no layer


def test_uneven_stages_price_the_busiest_stage(capsys):
    """gpt3-22b (48 layers) over pp 5: stages 9, 10, 10, 10, 9 (pp 5 does not divide 48): the table prices it
    instead of skipping it, and its busiest stage (10 layers + head, the last one at 9 + head or a middle one)
    is slower than pp 6's 8 layers and faster than pp 4's 12, per micro-batch."""
    from cli_helpers import csv_rows, run_ok

    def stage_s(pp: int) -> float:
        (r,) = csv_rows(run_ok(capsys, ["table", "-m", "gpt3-22b", "--hardware", "a100-sxm-80gb", "--gpus",
                                        str(8 * pp), "--tp", "8", "--pp", str(pp), "--device-batch-size", "1",
                                        "--total-batch-size", str(2048 * 120), "--attention", "megatron-unfused",
                                        "--format", "csv"]))
        assert r["pp"] == str(pp)
        return float(r["compute_s"]) / int(r["accum"])

    assert stage_s(6) < stage_s(5) < stage_s(4)


# The zero-bubble paper's Table 9 (profiled T_F, T_B, T_W, T_comm in ms, its ZB-2p runs) and Table 5 (the bubble
# rates its authors computed from them, communication included): 1F1B, ZB-H1, ZB-H2 (arXiv 2401.10241, paper.pdf
# in sail-sg/zero-bubble-pipeline-parallelism @6574e0ea, pages 8 and 16)
ZB_TABLE9 = {("1.5B", 8, 24): (18.522, 18.086, 9.337), ("1.5B", 8, 32): (18.513, 18.086, 9.331),
             ("1.5B", 8, 64): (18.546, 18.097, 9.321), ("6.2B", 8, 24): (29.718, 29.444, 19.927),
             ("6.2B", 8, 32): (29.802, 29.428, 19.530), ("6.2B", 8, 64): (29.935, 29.621, 19.388),
             ("14.6B", 16, 48): (11.347, 11.248, 8.132), ("14.6B", 16, 64): (11.307, 11.254, 8.101),
             ("14.6B", 16, 128): (11.325, 11.308, 8.109), ("28.3B", 32, 96): (10.419, 10.207, 7.715),
             ("28.3B", 32, 128): (10.408, 10.204, 7.703), ("28.3B", 32, 256): (10.402, 10.248, 7.698)}
ZB_TABLE5 = {("1.5B", 8, 24): (0.2431, 0.1585, 0.1083), ("1.5B", 8, 32): (0.1985, 0.1242, 0.0837),
             ("1.5B", 8, 64): (0.1240, 0.0674, 0.0444), ("6.2B", 8, 24): (0.2347, 0.1323, 0.0698),
             ("6.2B", 8, 32): (0.1898, 0.1045, 0.0559), ("6.2B", 8, 64): (0.1091, 0.0554, 0.0294),
             ("14.6B", 16, 48): (0.2552, 0.1397, 0.0672), ("14.6B", 16, 64): (0.2082, 0.1088, 0.0516),
             ("14.6B", 16, 128): (0.1251, 0.0576, 0.0266), ("28.3B", 32, 96): (0.2646, 0.1421, 0.0641),
             ("28.3B", 32, 128): (0.2168, 0.1106, 0.0490), ("28.3B", 32, 256): (0.1352, 0.0594, 0.0257)}


def test_zero_bubble_by_hand():
    """Table 2's closed forms on Table 9's 1.5B row (p 8, m 24): ZB-H1 7 x (18.522 + 18.086 - 9.337) = 190.897 ms,
    ZB-H2 7 x (18.522 + 18.086 - 2 x 9.337) = 125.538 ms; ZB-V priced as ZB-H2; at m 4 <= p Appendix H's
    (p-1)(T_F + T_B) - (m-1) T_W = 7 x 36.608 - 3 x 9.337 = 228.245 ms for both; W never past T_F + T_B: no bubble
    below 0."""
    f, b, w = 18.522, 18.086, 9.337
    z = pipeline.zero_bubble_time_s
    assert z("zb_h1", 8, 24, f + b + w, w) == pytest.approx(190.897)
    assert z("zb_h2", 8, 24, f + b + w, w) == pytest.approx(125.538)
    assert z("zb_v", 8, 24, f + b + w, w) == z("zb_h2", 8, 24, f + b + w, w)
    assert z("zb_h1", 8, 4, f + b + w, w) == z("zb_h2", 8, 4, f + b + w, w) == pytest.approx(228.245)
    # between p and 2p - 1 ZB-H2 fills one more W a micro-batch: m 10 is 2 W under m 8's
    assert z("zb_h2", 8, 8, f + b + w, w) - z("zb_h2", 8, 10, f + b + w, w) == pytest.approx(2 * w)
    assert z("zb_h1", 8, 8, f + b + w, w) == z("zb_h1", 8, 64, f + b + w, w)  # ZB-H1 fills p - 1 at most
    assert z("zb_h2", 4, 64, 3.0, 1.0) == 0.0 and z("zb_h2", 4, 64, 3.0, 1.5) == 0.0  # T_F = T_B = T_W: zero bubble
    assert z("zb_h1", 1, 8, 3.0, 1.0) == 0.0  # one stage: no pipeline
    # the 1F1B bubble the same terms give: (p-1)(T_F + T_B + T_W), m micro-batches of T_F + T_B + T_W
    assert pipeline.bubble_time_s(24 * (f + b + w), 8, 24) == pytest.approx(7 * (f + b + w))


def test_zero_bubble_against_the_papers_computed_bubble_rates():
    """Table 5's bubble rates, computed by the paper's authors from Table 9's profiled times with communication:
    the closed forms (which leave communication to ddplan's stage-to-stage sends) come out under each, by at most 1.4
    points for ZB-H1 and ZB-H2 (and 2.8 for 1F1B, ddplan's older formula, the same way)."""
    for key, (f, b, w) in ZB_TABLE9.items():
        _, p, m = key
        ideal = m * (f + b + w)

        def rate(bubble: float) -> float:
            return bubble / (ideal + bubble)

        one_f_one_b, h1, h2 = ZB_TABLE5[key]
        assert -0.028 <= rate(pipeline.bubble_time_s(ideal, p, m)) - one_f_one_b <= 0, key
        assert -0.014 <= rate(pipeline.zero_bubble_time_s("zb_h1", p, m, f + b + w, w)) - h1 <= 0, key
        assert -0.014 <= rate(pipeline.zero_bubble_time_s("zb_h2", p, m, f + b + w, w)) - h2 <= 0, key


@given(degree, degree, st.floats(0.0, 1.0), st.sampled_from(pipeline.ZERO_BUBBLE))
def test_zero_bubble_never_above_1f1b_and_h2_never_above_h1(p, m, w_share, schedule):
    """Each schedule moves W passes into 1F1B's bubble, never more bubble: 0 <= ZB-H2 <= ZB-H1 <= 1F1B's."""
    pass_s = 1.0
    w = w_share * pass_s
    t = pipeline.zero_bubble_time_s(schedule, p, m, pass_s, w)
    assert 0.0 <= t <= pipeline.bubble_time_s(m * pass_s, p, m) + 1e-12
    assert (pipeline.zero_bubble_time_s("zb_h2", p, m, pass_s, w)
            <= pipeline.zero_bubble_time_s("zb_h1", p, m, pass_s, w) + 1e-12)


def test_zero_bubble_rejects_what_it_cannot_price():
    with pytest.raises(ValueError, match="not a zero-bubble schedule"):
        pipeline.zero_bubble_time_s("interleaved", 4, 8, 1.0, 0.3)
    with pytest.raises(ValueError, match="w_s <= pass_s"):
        pipeline.zero_bubble_time_s("zb_h1", 4, 8, 1.0, 1.5)
    with pytest.raises(ValueError, match="pipeline degrees"):
        pipeline.zero_bubble_time_s("zb_h1", 0, 8, 1.0, 0.3)


def test_zb_v_chunks_and_stages_by_hand():
    """ZB-V's 2p chunks (pipeline.v_chunks: ceil(L / 2p) in the middle, the ends sharing the rest and possibly empty,
    as the paper's fork pads 30 layers over 32 chunks: 0, 1 x 30, 0) and each stage's two, d and 2p - 1 - d
    (pipeline.v_stages: sec. 6, 'layers 1-2 and layers 15-16 to worker 1' of 16 layers on 4 workers)."""
    assert pipeline.v_chunks(16, 4) == [2] * 8
    starts = [sum(pipeline.v_chunks(16, 4)[:c]) for c in range(8)]
    assert (starts[0], starts[7]) == (0, 14)
    assert pipeline.v_chunks(30, 16) == [0] + [1] * 30 + [0]
    assert pipeline.v_chunks(31, 4) == [4] + [4] * 6 + [3]
    assert pipeline.v_stages(30, 16)[:2] == [(0, 0), (2, 0)]
    # 48 layers, the first 12 dense, p 4: chunks of 6; stage 0 holds layers 0-5 (dense) and 42-47 (MoE)
    assert pipeline.v_stages(48, 4, 12) == [(12, 6), (12, 6), (12, 12), (12, 12)]
    assert pipeline.v_chunks(32, 17)[0] == 0
    with pytest.raises(ValueError, match="the nearest pp below that splits: 17"):
        pipeline.v_chunks(32, 18)
    # ceil(L / p) on every stage but the first: Llama 3 70B's 80 layers at pp 16 are 5 a stage, in chunks of 3 and 2;
    # Llama 3.1 405B's 126 at pp 16, 8 a stage and 6 on the first (chunks 3 and 3); 36 at pp 16 does not split (3 on
    # each other stage is 45), nor at 14 or 15, and 13 does (3 x 12 = 36, none on the first)
    assert pipeline.v_stages(80, 16) == [(5, 0)] * 16 and pipeline.v_chunks(80, 16)[:2] == [3, 3]
    assert pipeline.v_stages(126, 16)[:2] == [(6, 0), (8, 0)]
    with pytest.raises(ValueError, match="the nearest pp below that splits: 13"):
        pipeline.v_chunks(36, 16)
