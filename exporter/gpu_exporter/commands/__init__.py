"""Client-side sub-commands: ``query`` (nvidia-smi style CSV) and ``diagnose`` (a verdict per GPU).

Both read GPUs through :mod:`gpu_exporter.commands.metrics_client`, from NVML, a running exporter
or Prometheus. Nothing here is imported by ``serve``.
"""
