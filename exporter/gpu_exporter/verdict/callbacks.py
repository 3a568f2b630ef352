"""The job's own callback hooks in the cause table: a phase cause that names the hook behind it.

The Lightning and Hugging Face integrations time each callback hook of the job's own by name
(gpu_exporter.training.callbacks): a hook that writes a checkpoint is ``checkpoint`` as a whole, any
other is phase ``callbacks``. The snapshot carries the biggest hooks; the exporter exports the
biggest as ``gpu_training_callback_seconds_total{callback, phase}`` and the rules record its share of
the step (:data:`RECORD`). Two rows of the cause table use :class:`NamedCallback`: CB (``callback_bound``,
phase ``callbacks``: the job's own callbacks hold the GPU idle) and CK (``checkpoint``, when a hook's checkpoint
is what fills the phase). Both say ``"`SaveEvery.on_train_batch_end` takes 63% of the step"`` (:func:`hook_text`)
in diagnose (from :attr:`RunSignals.callback <gpu_exporter.verdict.signals.RunSignals>`) and in the alert's text (a
lookup of the recorded share). A mixin, not a subclass of ``kinds.Cause``: the cause kinds import this module, never
the other way round.

>>> hook_text("SaveEvery.on_train_batch_end", 0.634)
'`SaveEvery.on_train_batch_end` takes 63% of the step'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpu_exporter import catalog
from gpu_exporter.training.protocol import CALLBACK_PHASE
from gpu_exporter.verdict.promql import RUN_SEL, C
from gpu_exporter.verdict.samples import Labels, window_shares

SHARE = catalog.RUN_TRAINING_CALLBACK_SHARE5M.name
RECORD = (SHARE,
          f"rate({catalog.GPU_TRAINING_CALLBACK_SECONDS_TOTAL.name}[5m])\n"
          f"/ on ({C}, run, rank, uuid) group_left ()\n"
          f"sum by ({C}, run, rank, uuid) (rate({catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name}[5m]))\n",
          "The share of the step (0-1) the run's biggest callback hook of its own takes (labels callback, phase).")
"""The recording rule of the hook's share (name, expression, comment; :meth:`NamedCallback.records`)."""

def hook_text(name: str, share: float) -> str:
    """The hook in the verdict's words."""
    return f"`{name}` takes {share * 100:.0f}% of the step"


def hook_for(phase: str, hook: tuple[str, str, float] | None) -> str:
    """:func:`hook_text` of the run's biggest ``hook`` (name, phase, share) when it fills ``phase``, else "".

    >>> hook_for("checkpoint", ("Save.on_step_end", "checkpoint", 0.5)), hook_for("metrics", None)
    ('`Save.on_step_end` takes 50% of the step', '')
    """
    return hook_text(hook[0], hook[2]) if hook is not None and hook[1] == phase else ""


class NamedCallback:
    """Mixin for a phase cause (``kinds.Phase``) whose verdict names the callback hook that fills its phase."""

    phase: str

    def find(self, u: float, memory: float | None, run: Any, t: Any, lvl: str, window_seconds: float) -> Any:
        found = super().find(u, memory, run, t, lvl, window_seconds)  # type: ignore[misc]
        text = hook_for(self.phase, getattr(run, "callback", None))
        return replace(found, callback=text) if found is not None and text else found

    def alert_reason(self, table: Any) -> str:
        base: str = super().alert_reason(table)  # type: ignore[misc]
        sel, args = RUN_SEL
        query = f'printf "topk(1, {SHARE}{{phase=%q,{sel[1:]})" "{self.phase}" {args}'
        return (f"{base}{{{{ with {query} | query }}}} `{{{{ . | first | label \"callback\" }}}}` takes "
                "{{ . | first | value | humanizePercentage }} of the step.{{ end }}")

    def records(self) -> tuple[tuple[str, str, str], ...]:
        own: tuple[tuple[str, str, str], ...] = super().records()  # type: ignore[misc]
        return (*own, RECORD) if self.phase == CALLBACK_PHASE else own


def window_callbacks(run_key: Callable[[Labels], Any], prev: Iterable[tuple[Labels, float]],
                     cur: Iterable[tuple[Labels, float]], phase_window: Mapping[Any, Mapping[str, float]],
                     ) -> dict[Any, tuple[str, str, float]]:
    """Each run's biggest hook over a window between two readings of an exporter (``diagnose --url``, as
    gpu_exporter.verdict.samples.window_shares reads it): (name, phase, share of the window's phase seconds), from
    gpu_training_callback_seconds_total.

    >>> key = lambda labels: labels["run"]
    >>> hook = {"run": "r", "callback": "Save.on_step_end", "phase": "checkpoint"}
    >>> window_callbacks(key, [(hook, 10.0)], [(hook, 16.0)], {"r": {"checkpoint": 7.0, "compute": 3.0}})
    {'r': ('Save.on_step_end', 'checkpoint', 0.6)}
    """
    return {key: (labels.get("callback", ""), labels.get("phase", ""), min(share, 1.0))
            for key, labels, share in window_shares(run_key, "callback", prev, cur, phase_window)}
