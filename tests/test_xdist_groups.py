"""The suite's xdist groups hold: tests marked ``xdist_group`` run on one worker (pyproject's ``--dist loadgroup``),
so the fixtures they share (the real offline model, the docs' examples) are built once."""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("smollm2")
def test_a_grouped_test_carries_its_group_to_the_scheduler(request):
    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("not run under pytest-xdist")
    assert request.config.getoption("dist", None) in (None, "no")  # a worker: the controller schedules
    assert request.node.nodeid.endswith("@smollm2"), request.node.nodeid
