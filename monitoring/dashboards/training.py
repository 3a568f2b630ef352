"""The training run dashboard (grafana/dashboards/gpu-training-run.json, uid ``gpu-training-run``): one
instrumented run's phases, causes and remedies, its ranks side by side, throughput, memory and allocator;
the run's effective-utilization queries and table come from monitoring.funnel.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict.alerts import TRAINING_BELOW_TARGET
from grafana_foundation_sdk.builders import dashboard as dash

from monitoring import funnel
from monitoring import panels as p
from monitoring.dashboards.shared import RUN_UID, PanelKey, cause_runbooks, gpu_link

LIKELY_CAUSES = PanelKey(RUN_UID, "Likely causes")
"""The run's causes from the cause engine (the cause alerts' and GpuTrainingBelowTarget's Grafana mirrors point
at it)."""


def training_run(cfg: p.Config) -> dash.Dashboard:
    """One instrumented training run: where each step's time goes and which cause to fix."""
    pct = cfg.percent("utilization_low_threshold")

    def sel(metric: str, **fixed: str) -> str:
        return cfg.sel(metric, "run", "rank", **fixed)

    def rate(metric: str) -> str:
        return f"rate({sel(metric)}[$__rate_interval])"

    run_gpus = f"group {cfg.by('uuid', 'run', 'rank')} ({sel(m.GPU_TRAINING_STEPS_TOTAL.name)})"
    board = p.dashboard(cfg, RUN_UID, "GPU training run",
                        "One instrumented training run: where each step's time goes, throughput, memory, and the "
                        "causes (M1-M4, CK, ST, CM) that hold GPU utilization down; a distributed run's ranks side by "
                        "side.",
                        "3h", [
                          p.variable(cfg, "run", "Run", m.GPU_TRAINING_STEPS_TOTAL.name, multi=False),
                          p.variable(cfg, "rank", "Rank", m.GPU_TRAINING_STEPS_TOTAL.name, "run"),
                        ])
    phase_share = (f"sum {cfg.by('phase')} (increase({sel(m.GPU_TRAINING_PHASE_SECONDS_TOTAL.name)}[$__range])) "
                   f"/ ignoring (phase) group_left "
                   f"sum {cfg.by()} (increase({sel(m.GPU_TRAINING_PHASE_SECONDS_TOTAL.name)}[$__range]))")
    causes = cfg.sel(m.RUN_TRAINING_CAUSE_SHARE.name, "run")
    projected = cfg.sel(m.RUN_TRAINING_CAUSE_PROJECTED_UTILIZATION.name, "run")
    cause_labels = cfg.by("uuid", "code", "cause", "remedy", "level", "straggler_rank")
    return (board.with_row(dash.Row("Where the time goes"))
            .with_panel(p.timeseries(
                "Phase shares (5m)",
                "Share of the run's wall time spent in each phase (data, compute, metrics, checkpoint, other, "
                "custom), averaged over the selected ranks, stacked to 100%. Much data time calls for M1, much "
                "metrics time (CPU work in the step) for M2.",
                [p.query(f"avg {cfg.by('phase')} ({sel(m.RUN_TRAINING_PHASE_SHARE5M.name)})", "{{phase}}")],
                unit="percentunit", h=9, stacked=True, fill=70))
            .with_panel(p.utilization_timeseries(
                cfg, "GPU utilization of the run's GPUs",
                "Utilization (busy-time counter, 5m mean) of the GPUs this run pushes from (joined on uuid), "
                "beside each rank's useful utilization (what the level is judged at: min(utilization, 1 - its "
                "communication share), since an NCCL kernel spins on the GPU while its rank waits in a collective) "
                f"and the compute-phase share, and its effective utilization (SM activity, from GPM or dcgm-exporter: "
                f"busy time in which most SMs idle does not count). The line is {pct}.",
                [p.query(f"{cfg.sel(m.GPU_UTILIZATION_AVG5M.name)} * {cfg.on('uuid')} group_right (node, gpu) "
                         f"{run_gpus}", "GPU utilization rank {{rank}}"),
                 p.query(sel(m.RUN_USEFUL_UTILIZATION_AVG5M.name), "useful utilization rank {{rank}}"),
                 p.query(f"avg {cfg.by('rank')} ({sel(m.RUN_TRAINING_PHASE_SHARE5M.name, phase='compute')})",
                         "compute share rank {{rank}}"), *funnel.run_queries(cfg, run_gpus)], h=9, links=[gpu_link()]))
            .with_panel(p.bar_gauge("Phase shares over the selected range",
                                    "Share of each phase over the whole time range shown.",
                                    p.query(phase_share, "{{phase}}", instant=True)))
            .with_panel(p.table_panel(
                LIKELY_CAUSES.title,
                f"The causes the cause engine finds for this run now ({m.RUN_TRAINING_CAUSE_SHARE.name}, from the "
                "same cause table as diagnose and the cause alerts): the share of time that explains it, and the "
                "utilization the GPU could reach without it (an upper bound). Level low: the GPU is below "
                f"{pct}; target: below the {cfg.percent('utilization_target')} target. "
                "Runbooks: docs/runbooks.md.",
                [f"max {cause_labels} ({causes})", f"max {cause_labels} ({projected})"],
                unit="percentunit", w=16,
                order=("code", "remedy", "Value #A", "Value #B", "straggler_rank", "level", "cause", "uuid"),
                rename={"code": "Cause", "remedy": "Likely remedy", "Value #A": "Share of time",
                        "Value #B": "Could reach", "uuid": "GPU uuid", "cause": "Signal", "level": "Level",
                        "straggler_rank": "Waits for rank"},
                panel_links=cause_runbooks(cfg, TRAINING_BELOW_TARGET)))
            .with_panel(p.table_panel(
                "Concrete remedies",
                "What the run reports about itself (DataLoader workers, CPU cores, batch size) and the numbers "
                "the formulas of docs/runbooks.md (Concrete remedies) suggest: M1 workers that keep up with "
                f"compute ({m.RUN_TRAINING_REMEDY_NUM_WORKERS.name}), M3 the batch its memory and GPU allow "
                f"({m.RUN_TRAINING_REMEDY_BATCH_SIZE.name}). Empty where the run reports no DataLoader or memory.",
                [f"max {cfg.by('rank')} ({sel(metric)})"
                 for metric in (m.GPU_TRAINING_LOADER_WORKERS.name, m.GPU_TRAINING_CPU_CORES.name,
                                m.RUN_TRAINING_REMEDY_NUM_WORKERS.name, m.GPU_TRAINING_BATCH_SIZE.name,
                                m.RUN_TRAINING_REMEDY_BATCH_SIZE.name)],
                w=8, order=("rank", "Value #A", "Value #B", "Value #C", "Value #D", "Value #E"),
                rename={"rank": "Rank", "Value #A": "Workers", "Value #B": "Cores", "Value #C": "Try workers",
                        "Value #D": "Batch", "Value #E": "Try batch"}))
            .with_panel(funnel.run_table(cfg, run_gpus))
            .with_row(dash.Row("Ranks"))
            .with_panel(p.bar_gauge(
                "Phases by rank", "Each rank's phase shares (5m) side by side. In a distributed run a rank with "
                "much communication waits in collectives for the rank with little (the straggler, cause ST); "
                "the straggler's own large phase is what to fix.",
                p.query(f"max {cfg.by('rank', 'phase')} ({sel(m.RUN_TRAINING_PHASE_SHARE5M.name)} > 0)",
                        "rank {{rank}} {{phase}}", instant=True), w=8, h=9))
            .with_panel(p.timeseries(
                "Communication by rank", "Share of each rank's time in collectives (phase communication). "
                "Ranks far above the lowest one wait for it (straggler, ST); all of them high together is "
                "communication-bound (CM): the lowest line is what every rank pays.",
                [p.query(f"max {cfg.by('rank')} ({sel(m.RUN_TRAINING_PHASE_SHARE5M.name, phase='communication')})",
                         "rank {{rank}}")], unit="percentunit", w=8, h=9))
            .with_panel(p.table_panel(
                "Ranks", f"The run's ranks across nodes ({m.RUN_TRAINING_RANK_WORLD_SIZE.name}): node, GPU index and "
                "uuid, the job's world size, and each rank's step time (5m).",
                [f"max {cfg.by('rank', 'node', 'gpu', 'uuid')} ({sel(m.RUN_TRAINING_RANK_WORLD_SIZE.name)})",
                 f"max {cfg.by('rank', 'uuid')} ({sel(m.RUN_TRAINING_STEP_SECONDS_AVG5M.name)})"],
                w=8, h=9, order=("rank", "node", "gpu", "uuid", "Value #A", "Value #B"),
                rename={"rank": "Rank", "node": "Node", "gpu": "GPU", "uuid": "GPU uuid", "Value #A": "World size",
                        "Value #B": "Step time"}, overrides={"Value #B": {"unit": "s"}}))
            .with_row(dash.Row("Throughput"))
            .with_panel(p.timeseries(
                "Step time", "Mean wall time per training step, per rank.",
                [p.query(f"sum {cfg.by('rank')} ({rate(m.GPU_TRAINING_PHASE_SECONDS_TOTAL.name)}) "
                         f"/ sum {cfg.by('rank')} ({rate(m.GPU_TRAINING_STEPS_TOTAL.name)})", "rank {{rank}}")],
                unit="s", w=8))
            .with_panel(p.timeseries(
                "Samples per second", "Training throughput, per rank and in total.",
                [p.query(f"sum {cfg.by('rank')} ({rate(m.GPU_TRAINING_SAMPLES_TOTAL.name)})", "rank {{rank}}"),
                 p.query(f"sum({rate(m.GPU_TRAINING_SAMPLES_TOTAL.name)})", "total")], unit="suffix: samples/s", w=8))
            .with_panel(p.timeseries("Batch size", "Batch size reported by each rank (M3: raise it while memory "
                                     "allows).", [p.query(sel(m.GPU_TRAINING_BATCH_SIZE.name), "rank {{rank}}")],
                                     unit="suffix: samples", w=8))
            .with_row(dash.Row("Memory and allocator"))
            .with_panel(p.timeseries(
                "Allocator memory vs GPU memory",
                "PyTorch caching-allocator allocated and reserved bytes, against the GPU's total memory. Reserved "
                "far above allocated hints at fragmentation (M4).",
                [p.query(sel(m.GPU_TRAINING_ALLOCATOR_ALLOCATED_BYTES.name), "rank {{rank}} allocated"),
                 p.query(sel(m.GPU_TRAINING_ALLOCATOR_RESERVED_BYTES.name), "rank {{rank}} reserved"),
                 p.query(f"{cfg.sel(m.GPU_MEMORY_TOTAL_BYTES.name)} * {cfg.on('uuid')} "
                         f"group_right (node, gpu) {run_gpus}",
                         "rank {{rank}} GPU total")], unit="bytes", dashed=".*GPU total"))
            .with_panel(p.timeseries(
                "Allocator retries and OOMs", "cudaMalloc retries after freeing cached blocks, and out-of-memory "
                "errors, per interval. Any of these calls for M4.",
                [p.query(f"sum {cfg.by('rank')} (increase({sel(f'gpu_training_allocator_{kind}_total')}"
                         f"[$__rate_interval]))", f"rank {{{{rank}}}} {name}")
                 for kind, name in (("retries", "retries"), ("ooms", "OOMs"))], unit="none", bars=True, w=6))
            .with_panel(p.stat_panel(
                "Seconds since last push", "Age of each rank's newest snapshot; a stalled or finished run stops "
                "pushing (the exporter drops it after ingest.stale_after_seconds).",
                p.query(f"time() - {sel(m.GPU_TRAINING_LAST_PUSH_TIMESTAMP_SECONDS.name)}", "rank {{rank}}"), unit="s",
                w=6, h=8, thresholds=p.steps(("green", None), ("orange", cfg.num("dashboard_push_age_warn_seconds")),
                                             ("red", cfg.default("ingest.stale_after_seconds"))))))
