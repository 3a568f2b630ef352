"""The node detail dashboard (grafana/dashboards/gpu-node-detail.json, uid ``gpu-node``): everything one
node's GPUs report, from busy-time utilization to memory, power, clocks, XID errors, processes and pods;
the effective-utilization panels come from monitoring.funnel.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.models import common as cm

from monitoring import funnel
from monitoring import panels as p
from monitoring.dashboards.shared import NODE_UID, PanelKey

UTILIZATION = PanelKey(NODE_UID, "GPU utilization (busy-time counter)")
"""Each GPU's busy-time utilization (GpuIdleButAllocated's and the efficiency alerts' Grafana mirrors point at
it)."""
PROCESSES = PanelKey(NODE_UID, "Processes")
"""The compute processes of the GPUs (GpuUninstrumentedInputBound's Grafana mirror points at it)."""


def node_detail(cfg: p.Config) -> dash.Dashboard:
    """Everything one node's GPUs report."""
    pct = cfg.percent("utilization_low_threshold")

    def sel(metric: str, **fixed: str) -> str:
        return cfg.sel(metric, "node", "gpu", **fixed)

    def series(metric: str, legend: str = "GPU {{gpu}}") -> list[prometheus.Dataquery]:
        return [p.query(sel(metric), legend)]

    board = p.dashboard(cfg, NODE_UID, "GPU node detail", "Everything one node's GPUs report: utilization from "
                        "busy-time counters, memory, power, temperature, clocks and throttling, GPM activity, MIG, "
                        "processes, pods and XID errors.", "3h", [
                          p.variable(cfg, "node", "Node", m.GPU_INFO.name, multi=False),
                          p.variable(cfg, "gpu", "GPU", m.GPU_INFO.name, "node"),
                        ])
    identity = cfg.by("node", "gpu", "uuid", "name", "driver_version", "cuda_version", "architecture", "mig_mode")
    gpm = [(m.GPU_SM_ACTIVE_RATIO.name, "SM active"), (m.GPU_SM_OCCUPANCY_RATIO.name, "SM occupancy"),
           (m.GPU_TENSOR_ACTIVE_RATIO.name, "tensor active"), (m.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO.name, "DRAM BW")]
    board = (board.with_row(dash.Row("Utilization"))
             .with_panel(p.utilization_timeseries(
                 cfg, UTILIZATION.title,
                 f"rate({m.GPU_BUSY_SECONDS_TOTAL.name}): the true mean share of time a kernel ran, integrated "
                 "from NVML "
                 f"samples polled faster than the scrape, so it does not alias. The line is {pct}.",
                 [p.query(f"rate({sel(m.GPU_BUSY_SECONDS_TOTAL.name)}[$__rate_interval])", "GPU {{gpu}}"),
                  p.query(sel(m.GPU_UTILIZATION_AVG5M.name), "GPU {{gpu}} (5m mean)")], w=16))
             .with_panel(p.stat_panel("Utilization, last hour",
                                      f"rate({m.GPU_BUSY_SECONDS_TOTAL.name}[1h]): mean utilization per GPU over the "
                                      "last hour, computed for this node's GPUs only when the dashboard asks.",
                                      p.query(f"rate({sel(m.GPU_BUSY_SECONDS_TOTAL.name)}[1h])", "GPU {{gpu}}"),
                                      unit="percentunit",
                                      thresholds=cfg.utilization_steps(), w=8, h=8))
             .with_panel(p.timeseries(
                 "Memory-controller utilization",
                 f"rate({m.GPU_MEMORY_BUSY_SECONDS_TOTAL.name}): share of time the memory controller was busy.",
                 [p.query(f"rate({sel(m.GPU_MEMORY_BUSY_SECONDS_TOTAL.name)}[$__rate_interval])", "GPU {{gpu}}")],
                 unit="percentunit", h=7))
             .with_panel(p.timeseries(
                 "SM and tensor activity (GPM, Hopper and newer)",
                 "GPM metrics of the whole GPU (mig_uuid empty) or of each MIG instance: SM active, SM occupancy, "
                 "tensor pipes active, DRAM bandwidth. Empty on GPUs older than Hopper.",
                 [p.query(sel(metric), f"GPU {{{{gpu}}}} {{{{mig_uuid}}}} {name}") for metric, name in gpm],
                 unit="percentunit", h=7)))
    return (funnel.node_panels(cfg, board)
            .with_row(dash.Row("Memory"))
            .with_panel(p.timeseries(
                "Memory used vs total", "Framebuffer memory used, reserved by the driver, and installed.",
                [p.query(sel(f"gpu_memory_{kind}_bytes"), f"GPU {{{{gpu}}}} {kind}")
                 for kind in ("used", "reserved", "total")], unit="bytes", w=16, dashed=".*total"))
            .with_panel(p.bar_gauge(
                "Memory used", "Used share of each GPU's memory.",
                p.query(sel(m.GPU_MEMORY_USED_RATIO.name), "GPU {{gpu}}", instant=True),
                thresholds=p.steps(("green", None), ("orange", cfg.num("dashboard_memory_warn_ratio")),
                                   ("red", cfg.num("memory_nearly_full_ratio")))))
            .with_panel(p.timeseries(
                "MIG instances: memory used", "Memory used by each MIG instance against its size "
                f"(profile from {m.GPU_MIG_INFO.name}).",
                [p.query(f"{sel(m.GPU_MIG_MEMORY_USED_BYTES.name)} * {cfg.on('mig_uuid')} group_left (profile) "
                         f"max {cfg.by('mig_uuid', 'profile')} ({cfg.sel(m.GPU_MIG_INFO.name)})",
                         "GPU {{gpu}} {{profile}} GI {{gpu_instance}} used"),
                 p.query(sel(m.GPU_MIG_MEMORY_TOTAL_BYTES.name), "GPU {{gpu}} GI {{gpu_instance}} total")],
                unit="bytes", w=24, h=7, dashed=".*total"))
            .with_row(dash.Row("Power, temperature, clocks"))
            .with_panel(p.timeseries("Power vs limit", "Power draw and the enforced power limit.",
                                     [p.query(sel(m.GPU_POWER_WATTS.name), "GPU {{gpu}} draw"),
                                      p.query(sel(m.GPU_POWER_LIMIT_WATTS.name), "GPU {{gpu}} limit")],
                                     unit="watt", w=8, dashed=".*limit"))
            .with_panel(p.timeseries(
                "Temperature", "GPU die temperature.", series(m.GPU_TEMPERATURE_CELSIUS.name), unit="celsius", w=8,
                thresholds=p.steps(("green", None), ("orange", cfg.num("dashboard_temperature_warn_celsius")),
                                   ("red", cfg.num("dashboard_temperature_critical_celsius"))),
                threshold_style=cm.GraphThresholdsStyleMode.DASHED))
            .with_panel(p.timeseries("Energy per hour", "Energy drawn, from the energy counter (kWh per hour).",
                                     [p.query(f"increase({sel(m.GPU_ENERGY_JOULES_TOTAL.name)}[1h]) / 3.6e6",
                                              "GPU {{gpu}}")],
                                     unit="kwatth", w=8))
            .with_panel(p.timeseries("Clocks", "Current SM and memory clocks.",
                                     [p.query(sel(m.GPU_SM_CLOCK_HERTZ.name), "GPU {{gpu}} SM"),
                                      p.query(sel(m.GPU_MEMORY_CLOCK_HERTZ.name), "GPU {{gpu}} memory")],
                                     unit="hertz", w=8))
            .with_panel(p.state_timeline(
                "Clock event (throttle) reasons",
                "Which clock event reasons were active: power, thermal and hardware slowdowns make a busy GPU "
                "slower than rated (the exporter's device.clock_event_reasons adds others, e.g. gpu_idle).",
                p.query(sel(m.GPU_CLOCK_EVENT_ACTIVE.name), "GPU {{gpu}} {{reason}}"),
                unit="bool_on_off", thresholds=p.steps(("transparent", None), ("orange", 1)), w=8))
            .with_panel(p.timeseries("Fan speed", "Fan speed as a share of its maximum (absent on passively "
                                     "cooled GPUs).", series(m.GPU_FAN_SPEED_RATIO.name), unit="percentunit", w=8))
            .with_panel(p.timeseries("PCIe throughput", "PCIe transmit (up) and receive (down).",
                                     [p.query(sel(m.GPU_PCIE_TX_BYTES_PER_SECOND.name), "GPU {{gpu}} tx"),
                                      p.query(f"-{sel(m.GPU_PCIE_RX_BYTES_PER_SECOND.name)}", "GPU {{gpu}} rx")],
                                     unit="Bps", h=7))
            .with_panel(p.timeseries(
                "XID errors", "XID errors reported through the NVML event API, by code; see NVIDIA's XID table. "
                "Any non-zero value deserves a look.",
                [p.query(f"sum {cfg.by('gpu', 'xid')} "
                         f"(increase({sel(m.GPU_XID_ERRORS_TOTAL.name)}[$__rate_interval]))",
                         "GPU {{gpu}} XID {{xid}}")], unit="none", bars=True, h=7))
            .with_row(dash.Row("Who uses the GPU"))
            .with_panel(p.table_panel(
                PROCESSES.title, "Compute processes on the selected GPUs: memory and SM share.",
                [sel(m.GPU_PROCESS_MEMORY_USED_BYTES.name), sel(m.GPU_PROCESS_SM_UTILIZATION_RATIO.name)],
                unit="bytes", hide=("uuid",), order=("node", "gpu", "pid", "process_name", "Value #A", "Value #B"),
                rename={"Value #A": "Memory used", "Value #B": "SM share"},
                overrides={"SM share": {"unit": "percentunit"}}))
            .with_panel(p.table_panel(
                "Kubernetes pods and GPU identity",
                "The pod holding each GPU (kubelet pod-resources) and the GPU's static attributes.",
                [f"max {identity} ({sel(m.GPU_INFO.name)})",
                 f"max {cfg.by('uuid', 'namespace', 'pod', 'container')} ({sel(m.GPU_POD_INFO.name, mig_uuid='')})"],
                hide=("Value #A", "Value #B"), order=("node", "gpu", "name", "namespace", "pod", "container"),
                rename={"name": "Model"})))
