"""The one catalog of metric names: every family the exporter emits, and the recorded series.

The problem: metric names were string literals in every module that emits or reads them
(``gpu_busy_seconds_total`` in eight files), so a rename or a typo in one of them went
unnoticed until a query came back empty. Here each family is one constant with its name,
type, unit, help text and labels; collectors, ingest, the self-metrics, the query commands
and the monitoring generators refer to these constants, and ``tests/test_catalog.py`` fails
when a catalogued name appears as a string literal anywhere else in the Python source.

- :class:`MetricFamily`: one family. ``name`` is the name a query uses (counters end in
  ``_total``); ``base`` is the name prometheus_client's family objects and
  ``collectors.base.Families.counter`` take (without ``_total``). ``help`` is the HELP text
  the exporter writes, byte for byte (docs/metrics.md explains each family at more length).
- :class:`RecordedSeries`: a series the shipped recording rules produce: written by hand in
  prometheus/templates/gpu-recording.rules.yml.in, or ``generated`` by ``monitoring/`` (the
  cause, projection, straggler, evidence, remedy and cost groups). The generators name the series
  they record through these constants, and the Python that queries them does too. They, and the
  dcgm-exporter series the rules read (``DCGM``), are written in the sibling module
  :mod:`gpu_exporter.catalog_records` and re-exported here: code imports this module only.
- :func:`family` / :func:`recorded` look a name up; :meth:`MetricFamily.new` builds the
  prometheus_client family object for sources that yield those.

Standard library only and nothing of the exporter, so anything may import it cheaply.

>>> GPU_BUSY_SECONDS_TOTAL.name, GPU_BUSY_SECONDS_TOTAL.base, GPU_BUSY_SECONDS_TOTAL.kind
('gpu_busy_seconds_total', 'gpu_busy_seconds', 'counter')
>>> family("gpu_utilization_ratio") is GPU_UTILIZATION_RATIO
True
>>> family("gpu_busy_seconds") is GPU_BUSY_SECONDS_TOTAL  # a counter's base name finds it too
True
>>> GPU_UTILIZATION_AVG5M.name
'gpu:gpu_utilization:avg5m'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

# The rules' series (recorded, and dcgm-exporter's), written in catalog_records.py: every public name of that
# module is re-exported here, so code imports this module only.
from gpu_exporter.catalog_records import *  # noqa: F403
from gpu_exporter.catalog_records import RECORDED, RecordedSeries

if TYPE_CHECKING:
    from collections.abc import Sequence

    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

Kind = Literal["gauge", "counter"]

GAUGE: Kind = "gauge"
COUNTER: Kind = "counter"


@dataclass(frozen=True)
class MetricFamily:
    """One metric family: ``name`` as queried (counters end in ``_total``), type, unit, HELP text, labels.

    ``optional_labels`` are added to ``labels`` only on some series (see the family's comment).
    """

    name: str
    kind: Kind
    unit: str
    help: str
    labels: tuple[str, ...]
    optional_labels: tuple[str, ...] = ()

    @property
    def base(self) -> str:
        """The family name prometheus_client's family objects take: a counter's without ``_total``."""
        return self.name[:-len("_total")] if self.kind == COUNTER else self.name

    def new(self, value: float | None = None, labels: Sequence[str] | None = None
            ) -> GaugeMetricFamily | CounterMetricFamily:
        """A prometheus_client family object of this family: with one unlabelled sample when ``value``
        is given, else empty with ``labels`` (default: the family's labels, without the optional ones).

        prometheus_client is imported here, not at module import, so the catalog stays cheap to import.
        """
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        kind = CounterMetricFamily if self.kind == COUNTER else GaugeMetricFamily
        if value is not None:
            return kind(self.base, self.help, value=value)
        return kind(self.base, self.help, labels=list(self.labels if labels is None else labels))



# Label sets shared by many families.
GPU = ("gpu", "uuid")
PROCESS = ("gpu", "uuid", "pid")
MIG = ("gpu", "uuid", "mig_uuid", "gpu_instance", "compute_instance")
GPM = ("gpu", "uuid", "mig_uuid")
RUN = ("run", "rank", "uuid")

_FAMILIES: list[MetricFamily] = []


def _define(name: str, kind: Kind, unit: str, help: str, labels: tuple[str, ...],
            optional_labels: tuple[str, ...] = ()) -> MetricFamily:
    entry = MetricFamily(name, kind, unit, help, labels, optional_labels)
    _FAMILIES.append(entry)
    return entry


# -- device (collectors/device.py, utilization.py, pcie.py, xid.py) -------------------------------

GPU_INFO = _define(
    "gpu_info", GAUGE, "1", "Static attributes of the GPU; always 1.",
    (*GPU, "name", "pci_bus_id", "driver_version", "cuda_version", "mig_mode", "architecture"))
GPU_BUSY_SECONDS_TOTAL = _define(
    "gpu_busy_seconds_total", COUNTER, "seconds",
    "Seconds a kernel was running on the GPU (integrated from NVML samples).", GPU)
GPU_UTILIZATION_RATIO = _define(
    "gpu_utilization_ratio", GAUGE, "ratio", "Mean GPU utilization over the last poll interval (0-1).", GPU)
GPU_MEMORY_BUSY_SECONDS_TOTAL = _define(
    "gpu_memory_busy_seconds_total", COUNTER, "seconds",
    "Seconds the memory controller was busy reading or writing (integrated from NVML samples).", GPU)
GPU_MEMORY_UTILIZATION_RATIO = _define(
    "gpu_memory_utilization_ratio", GAUGE, "ratio",
    "Mean memory-controller utilization over the last poll interval (0-1).", GPU)
GPU_MEMORY_USED_BYTES = _define("gpu_memory_used_bytes", GAUGE, "bytes", "Framebuffer memory in use.", GPU)
GPU_MEMORY_FREE_BYTES = _define("gpu_memory_free_bytes", GAUGE, "bytes", "Framebuffer memory free.", GPU)
GPU_MEMORY_TOTAL_BYTES = _define("gpu_memory_total_bytes", GAUGE, "bytes", "Framebuffer memory installed.", GPU)
GPU_MEMORY_RESERVED_BYTES = _define(
    "gpu_memory_reserved_bytes", GAUGE, "bytes", "Framebuffer memory reserved by the driver and firmware.", GPU)
GPU_POWER_WATTS = _define("gpu_power_watts", GAUGE, "watts", "Power draw in watts.", GPU)
GPU_POWER_LIMIT_WATTS = _define("gpu_power_limit_watts", GAUGE, "watts", "Enforced power limit in watts.", GPU)
GPU_ENERGY_JOULES_TOTAL = _define(
    "gpu_energy_joules_total", COUNTER, "joules", "Energy consumed since the driver loaded, in joules.", GPU)
GPU_TEMPERATURE_CELSIUS = _define(
    "gpu_temperature_celsius", GAUGE, "celsius", "GPU die temperature in degrees Celsius.", GPU)
GPU_SM_CLOCK_HERTZ = _define("gpu_sm_clock_hertz", GAUGE, "hertz", "Current SM clock in hertz.", GPU)
GPU_MEMORY_CLOCK_HERTZ = _define("gpu_memory_clock_hertz", GAUGE, "hertz", "Current memory clock in hertz.", GPU)
GPU_CLOCK_EVENT_ACTIVE = _define(
    "gpu_clock_event_active", GAUGE, "1", "1 while the clock event (throttle) reason is active, else 0.",
    (*GPU, "reason"))
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}
"""NVML's clock event (throttle) reason bits, by the ``reason`` label value of gpu_clock_event_active."""
SLOWDOWN_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown")
"""The reasons gpu_clock_event_active has by default (setting ``device.clock_event_reasons``): the power, thermal
and hardware slowdowns that make a busy GPU slower than rated. The other four (gpu_idle: clocks drop on an idle
GPU, which gpu_busy_seconds_total already shows; applications_clocks_setting, sync_boost, display_clock_setting:
clocks an administrator set) cost 4 series a GPU that no rule, alert or verdict reads."""
GPU_FAN_SPEED_RATIO = _define("gpu_fan_speed_ratio", GAUGE, "ratio", "Fan speed as a share of its maximum (0-1).", GPU)
GPU_PCIE_TX_BYTES_PER_SECOND = _define(
    "gpu_pcie_tx_bytes_per_second", GAUGE, "bytes/s", "PCIe TX throughput in bytes per second.", GPU)
GPU_PCIE_RX_BYTES_PER_SECOND = _define(
    "gpu_pcie_rx_bytes_per_second", GAUGE, "bytes/s", "PCIe RX throughput in bytes per second.", GPU)
GPU_XID_ERRORS_TOTAL = _define(
    "gpu_xid_errors_total", COUNTER, "1", "XID errors reported by the driver, by XID code.", (*GPU, "xid"))

# -- processes (collectors/processes.py, evidence.py) --------------------------------------------

GPU_PROCESS_MEMORY_USED_BYTES = _define(
    "gpu_process_memory_used_bytes", GAUGE, "bytes", "GPU memory used by the process.",
    (*PROCESS, "process_name"))
GPU_PROCESS_SM_UTILIZATION_RATIO = _define(
    "gpu_process_sm_utilization_ratio", GAUGE, "ratio",
    "Share of the last sampling window in which the process ran a kernel (0-1).", (*PROCESS, "process_name"))
GPU_PROCESS_CPU_SECONDS_TOTAL = _define(
    "gpu_process_cpu_seconds_total", COUNTER, "seconds",
    "User and system CPU seconds of the GPU process (all its threads), from /proc.", PROCESS)
GPU_PROCESS_CHILDREN_CPU_SECONDS_TOTAL = _define(
    "gpu_process_children_cpu_seconds_total", COUNTER, "seconds",
    "CPU seconds of the GPU process's child processes (DataLoader workers), live and exited, from /proc.",
    PROCESS)
GPU_PROCESS_CHILD_PROCESSES = _define(
    "gpu_process_child_processes", GAUGE, "1",
    "Live child processes of the GPU process (DataLoader workers and the like).", PROCESS)
GPU_PROCESS_READ_BYTES_TOTAL = _define(
    "gpu_process_read_bytes_total", COUNTER, "bytes",
    "Bytes the GPU process and its live children read from storage (/proc/PID/io read_bytes).", PROCESS)
GPU_PROCESS_MAIN_THREAD_STATE_SECONDS_TOTAL = _define(
    "gpu_process_main_thread_state_seconds_total", COUNTER, "seconds",
    "Seconds the GPU process's main thread was seen in each state (running, sleeping, disk, other), "
    "sampled every poll.", (*PROCESS, "state"))

# -- MIG and GPM (collectors/mig.py, gpm.py) ------------------------------------------------------

GPU_MIG_INFO = _define(
    "gpu_mig_info", GAUGE, "1", "A MIG device (GPU instance + compute instance); always 1.", (*MIG, "profile"))
GPU_MIG_MEMORY_USED_BYTES = _define(
    "gpu_mig_memory_used_bytes", GAUGE, "bytes", "Memory in use on the MIG device.", MIG)
GPU_MIG_MEMORY_TOTAL_BYTES = _define("gpu_mig_memory_total_bytes", GAUGE, "bytes", "Memory of the MIG device.", MIG)
GPU_SM_ACTIVE_RATIO = _define("gpu_sm_active_ratio", GAUGE, "ratio", "Share of SMs that were busy (0-1, GPM).", GPM)
GPU_SM_OCCUPANCY_RATIO = _define(
    "gpu_sm_occupancy_ratio", GAUGE, "ratio", "Active warps as a share of the theoretical maximum (0-1, GPM).",
    GPM)
GPU_TENSOR_ACTIVE_RATIO = _define(
    "gpu_tensor_active_ratio", GAUGE, "ratio", "Share of time the SMs ran any tensor-core operation (0-1, GPM).",
    GPM)
GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO = _define(
    "gpu_dram_bandwidth_utilization_ratio", GAUGE, "ratio",
    "DRAM bandwidth used as a share of the theoretical maximum (0-1, GPM).", GPM)

# -- Kubernetes (kubernetes.py) -------------------------------------------------------------------

GPU_POD_INFO = _define(
    "gpu_pod_info", GAUGE, "1", "Kubernetes container a GPU or MIG device is allocated to (value is always 1).",
    (*GPM, "pod", "namespace", "container"))

# -- training runs (ingest.py, verdict/remedies.py) -----------------------------------------------
# ``source`` is added to the phase families when some run's phases were sampled (collectors/stacks.py).

GPU_TRAINING_PHASE_SECONDS_TOTAL = _define(
    "gpu_training_phase_seconds_total", COUNTER, "seconds",
    "Seconds the training loop spent in each phase; the phases add up to wall time.", (*RUN, "phase"),
    ("source",))
GPU_TRAINING_CURRENT_PHASE = _define(
    "gpu_training_current_phase", GAUGE, "1", "1 for the phase the training loop is in now, 0 for the others.",
    (*RUN, "phase"), ("source",))
GPU_TRAINING_STEPS_TOTAL = _define("gpu_training_steps_total", COUNTER, "1", "Training steps finished.", RUN)
GPU_TRAINING_SAMPLES_TOTAL = _define("gpu_training_samples_total", COUNTER, "1", "Training samples processed.", RUN)
GPU_TRAINING_BATCH_SIZE = _define(
    "gpu_training_batch_size", GAUGE, "1", "Samples in the most recent training step.", RUN)
GPU_TRAINING_WORLD_SIZE = _define(
    "gpu_training_world_size", GAUGE, "1", "Ranks in the run's distributed job (1 when it is not distributed).",
    RUN)
GPU_TRAINING_LAST_PUSH_TIMESTAMP_SECONDS = _define(
    "gpu_training_last_push_timestamp_seconds", GAUGE, "seconds",
    "Unix time the exporter received the run's latest snapshot.", RUN)
GPU_TRAINING_CALLBACK_SECONDS_TOTAL = _define(
    "gpu_training_callback_seconds_total", COUNTER, "seconds",
    "Seconds in the run's biggest callback hook of its own (callback: Class.hook) and the phase they count as.",
    (*RUN, "callback", "phase"))
GPU_TRAINING_CODE_SECONDS_TOTAL = _define(
    "gpu_training_code_seconds_total", COUNTER, "seconds",
    "Seconds the training thread ran the framework's own code (part=framework: in compute or between the phases) "
    "or the job's own code inside compute (part=host), by the library's stack sampler.",
    (*RUN, "part"))
GPU_TRAINING_HOST_FUNCTION_SECONDS_TOTAL = _define(
    "gpu_training_host_function_seconds_total", COUNTER, "seconds",
    "Seconds inside compute in the run's biggest function of its own code (function: file.py:line:name), by the "
    "library's stack sampler.", (*RUN, "function"))
GPU_TRAINING_RUN_INFO = _define(
    "gpu_training_run_info", GAUGE, "1",
    "The run's launch (run_id, shared by the job's ranks) and the user's tags as tag_<key> labels; always 1.",
    (*RUN, "run_id"), ("tag_*",))
GPU_TRAINING_RUN_START_TIMESTAMP_SECONDS = _define(
    "gpu_training_run_start_timestamp_seconds", GAUGE, "seconds",
    "Unix time the run's process started timing (snapshot started_at), by launch.", (*RUN, "run_id"))
GPU_TRAINING_ALLOCATOR_ALLOCATED_BYTES = _define(
    "gpu_training_allocator_allocated_bytes", GAUGE, "bytes",
    "Bytes allocated through torch's CUDA caching allocator.", RUN)
GPU_TRAINING_ALLOCATOR_RESERVED_BYTES = _define(
    "gpu_training_allocator_reserved_bytes", GAUGE, "bytes", "Bytes reserved by torch's CUDA caching allocator.",
    RUN)
GPU_TRAINING_ALLOCATOR_RETRIES_TOTAL = _define(
    "gpu_training_allocator_retries_total", COUNTER, "1",
    "cudaMalloc retries after torch's caching allocator freed its cache.", RUN)
GPU_TRAINING_ALLOCATOR_OOMS_TOTAL = _define(
    "gpu_training_allocator_ooms_total", COUNTER, "1", "Out-of-memory errors raised by torch's CUDA caching allocator.",
    RUN)
# The snapshot's ``context`` (training/context.py), one gauge per field (verdict.remedies.GAUGES).
GPU_TRAINING_LOADER_WORKERS = _define(
    "gpu_training_loader_workers", GAUGE, "1", "DataLoader num_workers of the run's latest run.data() loader.",
    RUN)
GPU_TRAINING_LOADER_PIN_MEMORY = _define(
    "gpu_training_loader_pin_memory", GAUGE, "1", "1 when the run's DataLoader pins memory, else 0.", RUN)
GPU_TRAINING_LOADER_PREFETCH_FACTOR = _define(
    "gpu_training_loader_prefetch_factor", GAUGE, "1", "DataLoader prefetch_factor (batches per worker).", RUN)
GPU_TRAINING_LOADER_PERSISTENT_WORKERS = _define(
    "gpu_training_loader_persistent_workers", GAUGE, "1",
    "1 when the run's DataLoader keeps its workers between epochs, else 0.", RUN)
GPU_TRAINING_LOADER_BATCH_SIZE = _define(
    "gpu_training_loader_batch_size", GAUGE, "1", "DataLoader batch_size of the run's loader.", RUN)
GPU_TRAINING_CPU_CORES = _define(
    "gpu_training_cpu_cores", GAUGE, "1", "CPU cores the training process may use (affinity, cgroup quota).", RUN)
GPU_TRAINING_MEMORY_USED_BYTES = _define(
    "gpu_training_memory_used_bytes", GAUGE, "bytes",
    "GPU memory used on the run's device, as the job sees it (torch.cuda.mem_get_info).", RUN)
GPU_TRAINING_MEMORY_TOTAL_BYTES = _define(
    "gpu_training_memory_total_bytes", GAUGE, "bytes",
    "GPU memory of the run's device (a MIG instance's own), as the job sees it.", RUN)
GPU_TRAINING_ALLOCATOR_PEAK_BYTES = _define(
    "gpu_training_allocator_peak_bytes", GAUGE, "bytes",
    "Peak bytes allocated by torch's CUDA caching allocator (max_memory_allocated).", RUN)

# -- exporter health (selfmetrics.py, ingest.py, server.py) ---------------------------------------

GPU_EXPORTER_BUILD_INFO = _define(
    "gpu_exporter_build_info", GAUGE, "1", "Version of the exporter and its NVML binding; always 1.",
    ("version", "python_version", "pynvml_version"))
GPU_EXPORTER_COLLECTOR_SUCCESS = _define(
    "gpu_exporter_collector_success", GAUGE, "1", "1 when the collector's latest run succeeded for every GPU, else 0.",
    ("collector",))
GPU_EXPORTER_COLLECTOR_DURATION_SECONDS = _define(
    "gpu_exporter_collector_duration_seconds", GAUGE, "seconds", "Duration of the collector's latest poll in seconds.",
    ("collector",))
GPU_EXPORTER_NVML_ERRORS_TOTAL = _define(
    "gpu_exporter_nvml_errors_total", COUNTER, "1", "Failed NVML calls by function and error.",
    ("function", "error"))
GPU_EXPORTER_LAST_SAMPLE_AGE_SECONDS = _define(
    "gpu_exporter_last_sample_age_seconds", GAUGE, "seconds", "Seconds since the newest complete NVML poll.", ())
GPU_EXPORTER_POLL_INTERVAL_SECONDS = _define(
    "gpu_exporter_poll_interval_seconds", GAUGE, "seconds",
    "Seconds between the exporter's NVML polls (poll_interval).", ())
GPU_EXPORTER_GPUS = _define("gpu_exporter_gpus", GAUGE, "1", "GPUs visible to the exporter now.", ())
GPU_EXPORTER_HTTP_AUTH_FAILURES_TOTAL = _define(
    "gpu_exporter_http_auth_failures_total", COUNTER, "1", "HTTP requests rejected for missing or wrong credentials.",
    ())
GPU_EXPORTER_HTTP_REJECTED_TOTAL = _define(
    "gpu_exporter_http_rejected_total", COUNTER, "1", "HTTP requests and connections refused, by reason.",
    ("reason",))
GPU_EXPORTER_HTTP_CONNECTIONS = _define(
    "gpu_exporter_http_connections", GAUGE, "1", "HTTP connections open now (each holds a thread).", ())
GPU_EXPORTER_INGEST_REQUESTS_TOTAL = _define(
    "gpu_exporter_ingest_requests_total", COUNTER, "1",
    "Training snapshot pushes, by outcome (accepted or the rejection reason).", ("outcome",))
GPU_EXPORTER_TRAINING_RUNS = _define(
    "gpu_exporter_training_runs", GAUGE, "1", "Training runs (distinct run, rank, uuid) currently reporting.", ())
GPU_EXPORTER_INGEST_EVICTIONS_TOTAL = _define(
    "gpu_exporter_ingest_evictions_total", COUNTER, "1",
    "Training runs dropped at ingest.max_runs to make room for a new one (finished or unconfirmed runs).", ())

# -- the exporter process (prometheus_client's process collector; its texts, not ours) ------------

PROCESS_CPU_SECONDS_TOTAL = _define(
    "process_cpu_seconds_total", COUNTER, "seconds", "Total user and system CPU time spent in seconds.", ())
PROCESS_RESIDENT_MEMORY_BYTES = _define(
    "process_resident_memory_bytes", GAUGE, "bytes", "Resident memory size in bytes.", ())
PROCESS_VIRTUAL_MEMORY_BYTES = _define(
    "process_virtual_memory_bytes", GAUGE, "bytes", "Virtual memory size in bytes.", ())
PROCESS_OPEN_FDS = _define("process_open_fds", GAUGE, "1", "Number of open file descriptors.", ())
PROCESS_MAX_FDS = _define("process_max_fds", GAUGE, "1", "Maximum number of open file descriptors.", ())
PROCESS_START_TIME_SECONDS = _define(
    "process_start_time_seconds", GAUGE, "seconds", "Start time of the process since unix epoch in seconds.", ())

FAMILIES: tuple[MetricFamily, ...] = tuple(_FAMILIES)
"""Every family, in the order of docs/metrics.md's sections."""

_BY_NAME: dict[str, MetricFamily] = {f.name: f for f in FAMILIES} | {f.base: f for f in FAMILIES}
_RECORDED_BY_NAME: dict[str, RecordedSeries] = {r.name: r for r in RECORDED}


def family(name: str) -> MetricFamily:
    """The family called ``name`` (a counter also by its name without ``_total``); KeyError names it.

    >>> family("gpu_no_such_metric")
    Traceback (most recent call last):
    ...
    KeyError: 'no metric family gpu_no_such_metric in gpu_exporter.catalog'
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no metric family {name} in gpu_exporter.catalog") from None


def recorded(name: str) -> RecordedSeries:
    """The recorded series called ``name``; KeyError names it."""
    try:
        return _RECORDED_BY_NAME[name]
    except KeyError:
        raise KeyError(f"no recorded series {name} in gpu_exporter.catalog") from None


def names() -> frozenset[str]:
    """Every catalogued name: families (counters with and without ``_total``) and recorded series."""
    return frozenset(_BY_NAME) | frozenset(_RECORDED_BY_NAME)
