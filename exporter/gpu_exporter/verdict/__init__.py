"""The verdict: why a GPU is below its utilization target, defined once for every reader.

The package is pure (no HTTP, no CLI, no NVML) so that ``diagnose``, the status page, the report
and the rule generators (monitoring/) all use the same definitions:

* :mod:`~gpu_exporter.verdict.levels`: the levels ``low`` and ``target`` and their thresholds keys;
* :mod:`~gpu_exporter.verdict.causes`: the cause table (M1, M2, CK, CB, M3, M4, ST, CM) and its judge,
  :func:`~gpu_exporter.verdict.causes.find_causes`; :mod:`~gpu_exporter.verdict.kinds`: the kinds of cause (a
  class each: its condition, words and alert text) and their findings; :mod:`~gpu_exporter.verdict.signals`: what a
  run reports that they read; :mod:`~gpu_exporter.verdict.hints`: the evidence hints for uninstrumented jobs;
  :mod:`~gpu_exporter.verdict.format`: figures in words (``pct``, ``seconds``, ``cores``);
* :mod:`~gpu_exporter.verdict.ladder`: the whole ladder of verdicts as one table, and the judge;
* :mod:`~gpu_exporter.verdict.samples`, :mod:`~gpu_exporter.verdict.readings`: a node's samples and the
  readings made of them; :mod:`~gpu_exporter.verdict.views`: readings, views and the verdict;
* :mod:`~gpu_exporter.verdict.join`: readings -> one view per GPU with its runs and their causes;
* :mod:`~gpu_exporter.verdict.evidence`, :mod:`~gpu_exporter.verdict.ranks`: the /proc evidence of
  uninstrumented processes, the ranks of a distributed run.
* :mod:`~gpu_exporter.verdict.timeline`: a range judged point by point (the run report).
* :mod:`~gpu_exporter.verdict.remedies`: the concrete remedies (M1's workers, M3's batch), each formula
  in Python and in PromQL, and the job's reported context.

Data flow: source (Snapshot pair, or Prometheus in commands/diagnose_sources.py) -> Readings ->
build_views -> judge -> render (commands/diagnose_render.py, status page).

Project imports: gpu_exporter.catalog, gpu_exporter.thresholds, gpu_exporter.training.protocol.
"""
