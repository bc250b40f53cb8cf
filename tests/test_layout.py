"""ddplan.layout: the one batch-split rule, and the world-size rule a priced row flags."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddplan.errors import LayoutError
from ddplan.layout import Layout, breaks_world_size_rule, check_layout, split_batch
from ddplan.registry import load_model


@pytest.mark.parametrize("total, dp, mb, expected", [
    (512, 8, 32, (32, 2, 512, "")),  # 64 per rank: 32 x 2
    (512, 8, 48, (32, 2, 512, "micro_batch")),  # 48 does not divide 64: the largest divisor below it
    (512, 32, 32, (16, 1, 512, "micro_batch")),  # 16 per rank: the micro-batch shrinks, the batch stays
    (1536, 1024, 1, (1, 2, 2048, "rounded_up")),  # GPT-3's 1,536 over dp 1,024: 2 per rank, 2,048 sequences
    (1536, 16, 1, (1, 96, 1536, "")),  # Megatron's tp 8 x pp 8 on 1,024 GPUs: dp 16
    (61, 1, 32, (1, 61, 61, "micro_batch")),  # a prime: micro-batch 1
])
def test_split_batch_by_hand(total, dp, mb, expected):
    s = split_batch(total, dp, mb)
    assert (s.micro_batch, s.accum, s.sequences, s.change) == expected


@given(total=st.integers(1, 4096), dp=st.integers(1, 512), mb=st.integers(1, 64))
def test_split_batch_properties(total, dp, mb):
    """dp x micro-batch x accum is the step's sequences; the batch only grows when dp does not divide it,
    and then by less than one sequence per rank; the micro-batch never exceeds the one asked."""
    s = split_batch(total, dp, mb)
    assert s.sequences == dp * s.micro_batch * s.accum
    assert 1 <= s.micro_batch <= mb
    if total % dp == 0:
        assert s.sequences == total and s.change in ("", "micro_batch")
    else:
        assert total < s.sequences < total + dp and s.change == "rounded_up"


def test_split_batch_refuses_zero():
    with pytest.raises(LayoutError):
        split_batch(0, 8, 1)


def test_world_size_rule_is_flagged_not_refused_when_asked():
    spec = load_model("d24")
    six = Layout(dp=6, zero=1, micro_batch=1)
    assert breaks_world_size_rule(six, spec)
    check_layout(six, spec, world_size_rule=False)  # the table prices it and flags it
    with pytest.raises(LayoutError, match="power-of-two"):
        check_layout(six, spec)
    assert not breaks_world_size_rule(Layout(dp=8, zero=1), spec)


@given(micro_batch=st.integers(1, 64), grad_accum=st.integers(1, 64),
       recompute=st.sampled_from(["none", "selective", "full", "selective:mlp"]))
def test_at_batch_is_replace_without_the_checks(micro_batch, grad_accum, recompute):
    """Layout.at_batch gives the layout replace() gives: equal, same hash, same fields (the search derives its
    layouts so); the original keeps its own."""
    from dataclasses import replace

    base = Layout(dp=4, tp=2, pp=2, zero=3, micro_batch=2, grad_accum=8, attention="fa3", recompute="full",
                  pp_schedule="interleaved", pp_virtual_stages=2, sequence_parallel=True)
    hash(base)  # a cached hash must not travel to the derived layout
    derived = base.at_batch(micro_batch, grad_accum, recompute)
    expected = replace(base, micro_batch=micro_batch, grad_accum=grad_accum, recompute=recompute)
    assert derived == expected and hash(derived) == hash(expected) and repr(derived) == repr(expected)
    assert (base.micro_batch, base.grad_accum, base.recompute) == (2, 8, "full")


def test_at_batch_refuses_a_zero_batch():
    with pytest.raises(AssertionError):
        Layout().at_batch(0, 1, "none")


def test_with_attention_is_replace_without_the_checks():
    """Layout.with_attention gives the layout replace() gives, its cached hash and parallel key not carried over."""
    from dataclasses import replace

    base = Layout(dp=4, tp=2, pp=2, zero=3, micro_batch=2, grad_accum=8, attention="fa3", recompute="full")
    hash(base), base.parallel_key  # cached on the original: must not travel
    other = base.with_attention("sdpa-fused")
    expected = replace(base, attention="sdpa-fused")
    assert other == expected and hash(other) == hash(expected) and other.parallel_key == expected.parallel_key
    assert base.attention == "fa3" and other.parallel_key != base.parallel_key


def test_pipeline_schedules_and_their_chunks():
    """schedule_for reads a run's schedule (None: 1F1B, interleaved with vp > 1; ZB-V two chunks a stage, so an
    unstated vp is 2 there); Layout refuses a schedule with the wrong chunks or without a pipeline, naming the flag."""
    from ddplan.layout import schedule_for

    assert schedule_for(None, 1) == ("1f1b", 1) and schedule_for(None, 4) == ("interleaved", 4)
    assert schedule_for("zb-v", 1) == ("zb_v", 2) and schedule_for("zb-h1", 1) == ("zb_h1", 1)
    assert schedule_for("interleaved", 1) == ("interleaved", 2) and schedule_for("interleaved", 4) == ("interleaved", 4)
    assert Layout(pp=4, pp_schedule="zb_v", pp_virtual_stages=2).pp_virtual_stages == 2
    for schedule, vp, words in (("zb_v", 1, "two chunks"), ("zb_v", 4, "two chunks"), ("zb_h1", 2, "one chunk"),
                                ("zb_h2", 3, "one chunk"), ("1f1b", 2, "one chunk"),
                                ("interleaved", 1, "more than one chunk")):
        with pytest.raises(LayoutError, match=words) as e:
            Layout(pp=4, pp_schedule=schedule, pp_virtual_stages=vp)
        assert e.value.field == "--vp"
    with pytest.raises(LayoutError, match="needs pipeline parallelism") as e:
        Layout(pp=1, pp_schedule="zb_h1")
    assert e.value.field == "--schedule"
    with pytest.raises(LayoutError, match="must be one of"):
        Layout(pp=4, pp_schedule="zb_h3")


def test_one_list_of_schedules_in_both_spellings():
    """The run file's schedule names (runfields.SCHEDULES, 'zb-v') are Layout's (pipeline.SCHEDULES, 'zb_v'), in
    order, and Layout.schedule spells a layout's back ('-' without a pipeline)."""
    from ddplan import pipeline, runfields

    assert tuple(s.replace("-", "_") for s in runfields.SCHEDULES) == pipeline.SCHEDULES
    assert Layout(pp=4, pp_schedule="zb_v", pp_virtual_stages=2).schedule == "zb-v" and Layout().schedule == "-"
