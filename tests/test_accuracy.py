"""The busy-time counter matches the true mean utilization within 1 percentage point on a bursty
GPU, where the instant gauge peers export is off by tens of points."""

from __future__ import annotations

import random

import pynvml
import pytest
from harness import Harness


@pytest.mark.parametrize("window", [60.0, 300.0])
def test_busy_counter_mean_matches_truth_within_one_point(window: float) -> None:
    rng = random.Random(7)
    with Harness("bursty.yaml") as h:
        h.advance(3.0)
        for offset in (0.0, 3.7, 11.1):  # windows starting at different phases of the burst
            h.advance(offset or 0.5)
            t0, busy0 = h.node.now(), h.value("gpu_busy_seconds_total", gpu="0")
            elapsed = 0.0
            while elapsed < window:  # irregular polls, as on a loaded machine
                step = min(rng.uniform(0.6, 1.4), window - elapsed)
                h.advance(step)
                elapsed += step
            t1, busy1 = h.node.now(), h.value("gpu_busy_seconds_total", gpu="0")
            measured = (busy1 - busy0) / (t1 - t0)
            truth = h.node.true_busy_seconds(0, t0, t1) / (t1 - t0)
            assert abs(measured - truth) < 0.01, (window, offset, measured, truth)


def test_instant_sample_is_far_off_on_the_same_pattern() -> None:
    """What a peer exporter shows at scrape time: one nvmlDeviceGetUtilizationRates reading."""
    with Harness("bursty.yaml") as h:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        errors = []
        for _ in range(20):  # scrapes every 15 s
            h.advance(15.0)
            instant = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            truth = h.node.true_busy_seconds(0, h.node.now() - 15.0, h.node.now()) / 15.0
            errors.append(abs(instant - truth))
        assert max(errors) > 0.25  # a single instant sample is off by >25 points at times
        assert sum(errors) / len(errors) > 0.1
