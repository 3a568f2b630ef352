"""The state of a simulated node: simulated time, injected faults, and the GPUs' utilization history.

The fake C library (fake_nvml.py) reads everything it reports from here. Example:

>>> from gpu_exporter.simulate import load_scenario
>>> node = SimulatedNode(load_scenario(None), clock=lambda: 100.0)
>>> node.now()
0.0
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import NamedTuple

from gpu_exporter.simulate.channel import SETTLE_SECONDS, DeviceTrace, channel_path
from gpu_exporter.simulate.patterns import SLOT_SECONDS, Pattern, Timeline, integral, mean
from gpu_exporter.simulate.spec import GpuSpec, Scenario

RING_SLOTS = 120
"""How many 1/6 s samples the driver keeps per GPU (20 s), like NVML's ring buffer."""
TIMESTAMP_BASE_US = 1_700_000_000_000_000
"""Sample timestamp (microseconds) of simulated time 0; consumers must treat it as opaque."""
TRAINING_REFRESH_SECONDS = 0.02


class Profile(NamedTuple):
    """What the simulated GPM and the stand-in dcgm-exporter report for a window, as ratios 0-1: ``busy`` (NVML's
    utilization, DCGM's GR_ENGINE_ACTIVE), SM activity, SM occupancy, tensor pipe activity, DRAM bandwidth, and the
    fp32, fp16 and fp64 pipes' activity (DCGM's PIPE_FP*_ACTIVE)."""

    busy: float
    sm: float
    occupancy: float
    tensor: float
    dram: float
    fp32: float = 0.0
    fp16: float = 0.0
    fp64: float = 0.0


TrainingSource = Callable[[str], "Mapping[str, float] | str | None"]
"""``fn(uuid)``: the cumulative phase seconds of the newest live run on the GPU (or its current phase)."""


class SimulatedNode(AbstractContextManager["SimulatedNode"]):
    """A simulated GPU node; created by :func:`gpu_exporter.simulate.install`.

    Tests and demos use it to move through failure modes, e.g. ``node.lose_gpu(1)``. It reads the job side's
    devices only through their channel files (:class:`~gpu_exporter.simulate.channel.DeviceTrace`).
    """

    def __init__(self, scenario: Scenario, clock: Callable[[], float] | None = None, *,
                 channel_dir: str | Path | None = None, on_exit: Callable[[], None] | None = None) -> None:
        self.scenario = scenario
        self._on_exit = on_exit or self.close
        """What leaving ``with node:`` does: :func:`~gpu_exporter.simulate.install` passes ``uninstall``, so
        ``with install() as node:`` takes the simulation away at the end; a node nobody installed just closes."""
        self._clock = clock or time.monotonic
        self._start = self._clock()
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.call_counts: dict[str, int] = {}
        self._lost: set[int] = set()
        self._not_supported: set[tuple[int, str]] = set()
        self.driver_loaded = True
        self._training_source: TrainingSource | None = None
        self._timelines = {g.index: Timeline(g.idle_utilization) for g in scenario.gpus if g.follow_training}
        self._traces = {g.index: DeviceTrace(channel_path(g.uuid, channel_dir), origin=self._start)
                        for g in scenario.gpus if g.device}
        """Device GPUs: busy while the job's simulated device works (simulate/device.py, the channel)."""
        self._last_phases: dict[int, dict[str, float]] = {}
        self._refresher: threading.Thread | None = None
        self._closed = threading.Event()

    def __exit__(self, *exc_info: object) -> None:
        self._on_exit()

    # --- time -------------------------------------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since install, e.g. ``node.now() -> 12.5``."""
        return self._clock() - self._start

    # --- fault injection ----------------------------------------------------------------------

    def lose_gpu(self, index: int) -> None:
        """Make every call on GPU ``index`` (and its MIG devices) return NVML_ERROR_GPU_IS_LOST."""
        with self.lock:
            self._gpu(index)
            self._lost.add(index)

    def restore_gpu(self, index: int) -> None:
        """Undo :meth:`lose_gpu`."""
        with self.lock:
            self._gpu(index)
            self._lost.discard(index)

    def unload_driver(self) -> None:
        """Simulate an unloaded driver: nvmlInit and every other call fail with DRIVER_NOT_LOADED."""
        with self.changed:
            self.driver_loaded = False
            self.changed.notify_all()

    def reload_driver(self) -> None:
        """Undo :meth:`unload_driver`; callers must nvmlInit again."""
        with self.lock:
            self.driver_loaded = True

    def set_not_supported(self, index: int, function_name: str) -> None:
        """Make C function ``function_name`` return NVML_ERROR_NOT_SUPPORTED for GPU ``index``.

        >>> node.set_not_supported(0, "nvmlDeviceGetPowerUsage")  # doctest: +SKIP
        """
        with self.lock:
            self._gpu(index)
            self._not_supported.add((index, function_name))

    def is_lost(self, index: int, t: float) -> bool:
        """Whether GPU ``index`` is lost at simulated time ``t`` (by :meth:`lose_gpu` or a fault)."""
        return index in self._lost or any(
            f.kind == "lost" and f.active(t) for f in self.scenario.gpus[index].faults)

    def is_not_supported(self, index: int, function_name: str, t: float) -> bool:
        """Whether ``function_name`` is NOT_SUPPORTED on GPU ``index`` at time ``t``."""
        return (index, function_name) in self._not_supported or any(
            f.kind == "not_supported" and f.function == function_name and f.active(t)
            for f in self.scenario.gpus[index].faults)

    # --- training-driven utilization ---------------------------------------------------------

    def set_training_source(self, fn: TrainingSource) -> None:
        """Drive ``follow_training`` GPUs from the training runs pushed to the exporter (``fn``: the exporter passes
        ``TrainingStore.latest_phases``; None: no run is live; a phase name such as ``"compute"``, in tests, drives the
        GPU by phase). Each time the phases change (a new snapshot), the GPU runs from then on at the mean level of
        the snapshot interval: ``busy_utilization`` for its compute share, ``idle_utilization`` for the rest, so it
        follows the time the job really spent computing, not the phase seen at push time (which is biased toward
        phases that release the GIL). Polled every 20 ms and on every NVML call."""
        with self.lock:
            self._training_source = fn
            if self._timelines and self._refresher is None:
                self._refresher = threading.Thread(target=self._refresh_loop, name="gpu-sim-training",
                                                   daemon=True)
                self._refresher.start()
        self.refresh_training()

    def refresh_training(self) -> None:
        """Read what device GPUs' jobs did, and record the current training phase of ``follow_training`` GPUs."""
        for trace in self._traces.values():
            trace.refresh()
        source = self._training_source
        if source is None or not self._timelines:
            return
        t = self.now()
        for index, timeline in self._timelines.items():
            gpu = self.scenario.gpus[index]
            try:
                reported = source(gpu.uuid)
            except Exception:  # a broken source must not break NVML calls; it reads as "no job"
                reported = None
            if reported is None or isinstance(reported, str):
                self._last_phases.pop(index, None)
                timeline.record(t, gpu.busy_utilization if reported == "compute" else gpu.idle_utilization)
                continue
            share = self._interval_compute_share(index, reported)
            if share is not None:
                timeline.record(t, gpu.busy_utilization * share + gpu.idle_utilization * (1.0 - share))

    def _interval_compute_share(self, index: int, phases: Mapping[str, float]) -> float | None:
        """The compute share between the previous and this snapshot; None when nothing new was pushed."""
        previous = self._last_phases.get(index)
        current = dict(phases)
        if previous == current:
            return None
        self._last_phases[index] = current
        if previous is None or any(current.get(p, 0.0) < v for p, v in previous.items()):
            previous = {}  # the first snapshot seen, or a new run: its whole time so far
        deltas = {p: v - previous.get(p, 0.0) for p, v in current.items()}
        total = sum(v for v in deltas.values() if v > 0)
        return max(0.0, deltas.get("compute", 0.0)) / total if total > 0 else None

    def _refresh_loop(self) -> None:
        while not self._closed.wait(TRAINING_REFRESH_SECONDS):
            self.refresh_training()

    def close(self) -> None:
        """Stop the training refresher thread (called by uninstall)."""
        self._closed.set()
        if self._refresher is not None and self._refresher is not threading.current_thread():
            self._refresher.join(timeout=1.0)

    # --- utilization ground truth ------------------------------------------------------------

    def utilization_pattern(self, index: int) -> Pattern:
        """The pattern GPU ``index`` follows (its recorded timeline when it follows training)."""
        return self._traces.get(index) or self._timelines.get(index) or self._gpu(index).utilization

    def sample_time(self, index: int, t: float) -> float:
        """The time up to which GPU ``index``'s samples are taken: a device GPU's lag :data:`SETTLE_SECONDS`."""
        return max(0.0, t - SETTLE_SECONDS) if index in self._traces else t

    def true_busy_seconds(self, index: int, t0: float, t1: float) -> float:
        """Exact seconds GPU ``index`` was busy between simulated times t0 and t1.

        >>> node.true_busy_seconds(0, 0.0, 60.0)  # doctest: +SKIP
        51.0
        """
        self.refresh_training()
        return integral(self.utilization_pattern(index), t0, t1)

    def profile(self, index: int, t0: float, t1: float, mig_index: int | None = None) -> Profile:
        """GPU ``index``'s (or one MIG instance's) :class:`Profile` between simulated times t0 and t1.

        A device GPU's come from its job's kernels (the channel's SM/tensor/DRAM seconds over the window, taken
        :data:`SETTLE_SECONDS` behind like its samples); a pattern GPU's SM activity is its utilization pattern,
        tensor activity that times ``gpm.tensor_factor`` and DRAM its memory-utilization pattern, and no fp pipe
        activity (a pattern has no per-precision shares). Occupancy is SM activity times ``gpm.occupancy_factor`` on
        both.
        """
        gpu = self._gpu(index)
        trace = self._traces.get(index)
        if trace is not None and mig_index is None:
            a, b = self.sample_time(index, t0), self.sample_time(index, t1)
            act = trace.activity(a, b).ratios(b - a)
            return Profile(act.busy, act.sm, act.sm * gpu.gpm_occupancy_factor, act.tensor, act.dram, act.fp32,
                           act.fp16, act.fp64)
        pattern = self.utilization_pattern(index) if mig_index is None or gpu.mig_instances is None \
            else gpu.mig_instances[mig_index].utilization
        busy = sm = mean(pattern, t0, t1)
        tensor, dram = sm * gpu.gpm_tensor_factor, mean(gpu.memory_utilization, t0, t1)
        return Profile(busy, sm, sm * gpu.gpm_occupancy_factor, tensor, dram)

    def slot_count(self, t: float) -> int:
        """Number of complete 1/6 s sample slots at simulated time ``t``."""
        return max(0, math.floor(t / SLOT_SECONDS + 1e-9))

    @staticmethod
    def slot_timestamp(slot: int) -> int:
        """Timestamp (microseconds) of the sample covering slot ``slot`` (taken at its end)."""
        return TIMESTAMP_BASE_US + (slot + 1) * 1_000_000 // 6

    @staticmethod
    def slot_mean(pattern: Pattern, slot: int) -> float:
        """Exact mean of ``pattern`` over slot ``slot``."""
        return mean(pattern, slot * SLOT_SECONDS, (slot + 1) * SLOT_SECONDS)

    def recent_slots(self, t: float, after_us: int) -> list[int]:
        """Slots still in the ring buffer at time ``t`` whose timestamp is newer than ``after_us``."""
        end = self.slot_count(t)
        return [k for k in range(max(0, end - RING_SLOTS), end) if self.slot_timestamp(k) > after_us]

    def instant(self, pattern: Pattern, t: float) -> float:
        """The value NVML shows "now": the mean of the last complete slot (the value at t before one)."""
        end = self.slot_count(t)
        return self.slot_mean(pattern, end - 1) if end else pattern.value(t)

    def _gpu(self, index: int) -> GpuSpec:
        if not 0 <= index < len(self.scenario.gpus):
            raise IndexError(f"no simulated GPU {index}; this scenario has {len(self.scenario.gpus)}")
        return self.scenario.gpus[index]
