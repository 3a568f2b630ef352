"""Client-side sub-commands: ``query`` (nvidia-smi style CSV) and ``diagnose`` (a verdict per GPU).

Both read GPUs from NVML or a running exporter (:mod:`gpu_exporter.commands.client_sources`) or from
Prometheus (:mod:`gpu_exporter.commands.client_prometheus`). Nothing here is imported by ``serve``.

Project imports: gpu_exporter.catalog, gpu_exporter.collectors, gpu_exporter.config, gpu_exporter.nvml,
gpu_exporter.simulate, gpu_exporter.thresholds, gpu_exporter.training.protocol, gpu_exporter.verdict,
gpu_exporter.yamlfile (collectors, config, nvml and simulate only inside functions, loaded when a source is used).
"""
