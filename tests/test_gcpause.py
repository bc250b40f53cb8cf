"""ddplan.gcpause: the collector is paused inside, restored by the outermost use, also on an error."""

from __future__ import annotations

import gc

import pytest

from ddplan import cli
from ddplan.gcpause import no_cycle_collection


def test_paused_inside_restored_after_nesting_and_errors():
    assert gc.isenabled()
    with no_cycle_collection():
        assert not gc.isenabled()
        with no_cycle_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner use leaves it paused
    assert gc.isenabled()
    with pytest.raises(RuntimeError), no_cycle_collection():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_failing_command_leaves_the_collector_on(capsys):
    assert cli.main(["table", "--model", "no-such-model"]) != 0
    assert gc.isenabled()
