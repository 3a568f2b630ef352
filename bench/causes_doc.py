"""docs/accuracy.md and the README's accuracy line, generated from the cause-accuracy bench's raw results
(docs/accuracy.json, written by ``python -m bench.causes_accuracy --update-docs``; never kept by hand).

``python -m bench.causes_doc`` rewrites both from the JSON; ``--check`` only says whether they are current (exit 1
when not). tests/test_accuracy_doc.py runs the check. Scoring, per path and cause: a case *names* a cause when the
path's verdict for its GPU is that cause (the alerts may name several on one GPU, each counts; no cause alert firing
names ``healthy``). Recall = cases of the cause whose path named it / cases of the cause; precision = cases where
the path named it and it was injected / cases where the path named it. A case is *right* on a path when the path
named exactly the injected cause.

The JSON's ``notes`` ({cause: why}) explain each cause whose recall or precision is below 0.9 on some path; they are
written after reading the cases, and the check fails while such a cause has none (``_run``: a note on the run as a
whole, printed above the tables).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "accuracy.json"
DOC = REPO / "docs" / "accuracy.md"
README = REPO / "README.md"
BEGIN, END = "<!-- bench.causes_accuracy: begin -->\n", "<!-- bench.causes_accuracy: end -->\n"
GOAL = 0.9
CODES = {"input_bound": "M1", "metrics_bound": "M2", "batch_too_small": "M3 launch", "sm_batch_too_small": "M3 SM",
         "tensor_cores_idle": "TC", "memory_bound": "MB", "allocator": "M4", "checkpoint": "CK", "callback_bound": "CB",
         "framework_overhead": "FO", "host_work": "HW", "straggler": "ST", "communication_bound": "CM",
         "healthy": "none"}
NOT_COVERED = ("callback-bound (CB) and framework overhead (FO) only under Lightning and the Trainer, where a job has "
               "callbacks of its own and a framework's loop (a plain loop has neither; the bench has no DDP job under "
               "a framework). Host work in the step (HW) not in DDP: the DDP jobs are the tests' gloo and async "
               "loops, none with an augmentation of its own. The allocator (M4) only in the plain async loop: the "
               "ops-mode jobs run on the CPU, whose allocator never retries. The launch-bound form of M3 only in "
               "plain loops (the Lightning and Trainer jobs have no launch-bound plan). ST and CM only in DDP, where "
               "they apply. The fallback \"busy but ineffective\" (SM activity low, no cause found) is no injected "
               "cause: a case named it counts as a miss.")


def load(path: Path = RESULTS) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def named(path: str, value: Any) -> set[str]:
    """The causes a path named for one case: the alerts' causes (none: healthy), else the one verdict.

    >>> sorted(named("alerts", [])), sorted(named("alerts", ["input_bound", "metrics_bound"]))
    (['healthy'], ['input_bound', 'metrics_bound'])
    >>> named("report", ""), named("diagnose --url", "below_target")
    ({'no answer'}, {'below_target'})
    """
    if path == "alerts":
        return set(value) or {"healthy"}
    return {str(value) or "no answer"}


@dataclass
class Score:
    """One cause on one path."""

    cases: int = 0
    hit: int = 0
    named: int = 0
    right_when_named: int = 0

    @property
    def recall(self) -> float | None:
        return self.hit / self.cases if self.cases else None

    @property
    def precision(self) -> float | None:
        return self.right_when_named / self.named if self.named else None


def scores(results: dict[str, Any]) -> dict[str, dict[str, Score]]:
    """path -> cause -> Score over every case.

    >>> r = {"paths": ["alerts"], "causes": ["input_bound", "healthy"], "cases": [
    ...     {"cause": "input_bound", "named": {"alerts": ["input_bound", "metrics_bound"]}},
    ...     {"cause": "healthy", "named": {"alerts": ["input_bound"]}},
    ...     {"cause": "healthy", "named": {"alerts": []}}]}
    >>> s = scores(r)["alerts"]
    >>> (s["input_bound"].recall, s["input_bound"].precision, s["healthy"].recall, s["healthy"].precision)
    (1.0, 0.5, 0.5, 1.0)
    """
    out: dict[str, dict[str, Score]] = {p: {c: Score() for c in results["causes"]} for p in results["paths"]}
    for case in results["cases"]:
        for path in results["paths"]:
            names = named(path, case["named"][path])
            for cause, score in out[path].items():
                if case["cause"] == cause:
                    score.cases += 1
                    score.hit += cause in names
                if cause in names:
                    score.named += 1
                    score.right_when_named += case["cause"] == cause
    return out


def right(results: dict[str, Any]) -> tuple[int, int]:
    """(judgements that named exactly the injected cause, judgements): every case on every path."""
    n = sum(named(p, c["named"][p]) == {c["cause"]} for c in results["cases"] for p in results["paths"])
    return n, len(results["cases"]) * len(results["paths"])


def _cell(value: float | None, num: int, den: int, none: str) -> str:
    return none if value is None else f"{value:.2f} ({num}/{den})"


def below_goal(results: dict[str, Any]) -> dict[str, list[str]]:
    """cause -> ["recall 0.67 on alerts", ...] for each figure under :data:`GOAL`."""
    out: dict[str, list[str]] = {}
    for path, by_cause in scores(results).items():
        for cause, s in by_cause.items():
            for what, value in (("recall", s.recall), ("precision", s.precision)):
                if value is not None and value < GOAL:
                    out.setdefault(cause, []).append(f"{what} {value:.2f} on {path}")
    return out


def summary_table(results: dict[str, Any]) -> str:
    """Recall / precision per cause (rows) and path (columns), as markdown."""
    s = scores(results)
    paths = results["paths"]
    lines = ["| cause | cases | " + " | ".join(f"`{p}` recall | precision" for p in paths) + " |",
             "|---|---|" + "---|---|" * len(paths)]
    for cause in results["causes"]:
        row = [f"{cause} ({CODES.get(cause, '')})", str(s[paths[0]][cause].cases)]
        for p in paths:
            x = s[p][cause]
            row += [_cell(x.recall, x.hit, x.cases, "no case"),
                    _cell(x.precision, x.right_when_named, x.named, "never named")]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _named_text(path: str, case: dict[str, Any]) -> str:
    names = named(path, case["named"][path])
    text = "right" if names == {case["cause"]} else ", ".join(sorted(names))
    if path == "alerts" and case.get("alerts_pending"):
        text += f" (pending: {', '.join(case['alerts_pending'])})"
    return text


def render(results: dict[str, Any]) -> str:
    """The whole of docs/accuracy.md."""
    n, m = right(results)
    cases = results["cases"]
    shapes: dict[str, list[str]] = {}
    for c in cases:
        if c["shape"] not in shapes.setdefault(c["cause"], []):
            shapes[c["cause"]].append(c["shape"])
    missing = [w for w in results["all_waves"] if w not in results["waves"]]
    scale = int(results.get("scale", 60))
    step = max(1, 300 // scale // 4)
    out = [
        "# How often the named cause is right\n\n",
        "Generated by `python -m bench.causes_doc` from [accuracy.json](accuracy.json), the raw results of\n",
        f"`{results['command']}`, run on {results['date']} at commit {results['commit']}"
        + (f" (the working tree had uncommitted changes to {', '.join(results['uncommitted'])})"
           if results.get("uncommitted") else "")
        + ". Do not edit by hand.\n\n",
        BEGIN,
        f"**Right in {n} of {m} cases**: {len(cases)} jobs, each on its own simulated GPU with one injected "
        "bottleneck (or none), each judged once by each of the four paths below.\n\n",
        "Each job is one of the tests' training loops on a simulated GPU that does its own work: busy only while the "
        "job's kernels run on an asynchronous device, or while a real CPU PyTorch, Lightning or Transformers job is "
        "inside torch operators ([simulation.md](simulation.md#gpus-that-do-their-own-work-device-true)); what the "
        "job reports has no say in it. One simulated node (a GPU per job), one exporter and one real Prometheus "
        f"with the shipped rules, their windows shrunk {scale}-fold (`[5m]` -> `[{300 // scale}s]`, `for: 10m` -> "
        f"`{600 // scale}s`), serve every "
        "job; the jobs run in waves of similar cost, each wave's at once, and are judged together once every job "
        f"of the wave has pushed and {results['settle_s']:g} s more have passed. The cases and how each bottleneck "
        "is injected: bench/causes_cases.py. The GPU-level causes (TC, MB, the SM form of M3) run a GPU-bound loop "
        "whose kernels use the GPU so (`GPU_SIM_KERNEL`); the ops-mode GPU-bound jobs compute 1 s a step on "
        "384x384 matrices (bench/causes_loops.py), since the tests' healthy plan left its GPU 83-86% busy in a "
        "trial at this load, on the 85% target line rather than clearly above it. The causes of the job's own code "
        "and the framework's run in a wave of their own (`own-code`; `--wave own-code` runs it alone): a callback of "
        "the job's own spending 50 ms a step in Python that is neither a metric nor a checkpoint (CB), a one-weight "
        "model in batches of 4 under Lightning or the Trainer (FO), 50 ms of numpy and Python augmentation in the "
        "model's forward (HW), and the Trainer's callback that saves and then works on the file (CK). The paths:\n\n",
        "- `alerts`: the cause alerts firing for the GPU in Prometheus (several may fire on one GPU, each counts; "
        "none firing names `healthy`);\n",
        f"- `diagnose --url`: diagnose reading the exporter over a {300 // scale} s window (`--window`);\n",
        "- `diagnose --prometheus-url`: diagnose reading the recording rules;\n",
        f"- `report`: `gpu-exporter report --run RUN --step {step}s` (a {4 * step} s window), the verdict the GPU "
        "held longest "
        "over its run, warm-up included.\n\n",
        "Recall: of the cases with the cause injected, the share the path named it for. Precision: of the cases "
        "the path named the cause for, the share that had it injected (\"never named\": the path named it for no "
        "case; \"no case\": no case had it injected). `healthy` is the cause \"none\": named when the path names no "
        "cause.\n\n",
        f"Ran on {results['cpus']} CPUs shared with other work: load average {results['load_before'][0]:.1f} "
        f"before, {results['load_after'][0]:.1f} after (per wave: "
        + ", ".join(f"{w} {v:.1f}" for w, v in results["load_per_wave"].items())
        + f"); {results['elapsed_s'] / 60:.1f} minutes in all.\n\n",
        *([results["notes"]["_run"] + "\n\n"] if results["notes"].get("_run") else []),
        "## Recall and precision per cause and path\n\n",
        summary_table(results), "\n",
    ]
    low = below_goal(results)
    out.append(f"## Below {GOAL}\n\n")
    if not low:
        out.append(f"Every cause's recall and precision is at least {GOAL} on every path.\n\n")
    for cause, figures in low.items():
        note = results["notes"].get(cause, "(not explained yet)")
        out.append(f"- **{cause}** ({'; '.join(figures)}): {note}\n")
    out += ["\n## Every case\n\n",
            "\"right\": the path named exactly the injected cause; else what it named (`no answer`: the path gave "
            "no verdict for the GPU); the alerts column adds the cause alerts that were pending (their condition "
            "held, their `for:` not yet over) at the judgement, which do not count. *Device*: what the simulated "
            "GPU's device itself did over the "
            f"{results['truth_s']:g} s before the judgement, read from its channel file, not through the exporter: "
            "busy share (NVML's utilization), SM, tensor-pipe and DRAM activity; *read*: the utilization the two "
            "diagnose paths read for the GPU (`--url` / `--prometheus-url`).\n\n",
            "| wave | shape | injected | run | device: busy / SM / tensor / DRAM | read | "
            + " | ".join(f"`{p}`" for p in results["paths"]) + " |\n",
            "|---|---|---|---|---|---|" + "---|" * len(results["paths"]) + "\n"]
    for c in cases:
        flags = ("" if c["pushing"] else " (never pushed)") + (" (exited early)" if c["job_exited_early"] else "")
        d = c["device"]
        device = "none" if d is None else " / ".join(f"{d[k]:.0%}" for k in ("busy", "sm", "tensor", "dram"))
        read = " / ".join("-" if (u := c.get("utilization", {}).get(p)) is None else f"{u:.0%}"
                          for p in ("diagnose --url", "diagnose --prometheus-url"))
        out.append(f"| {c['wave']} | {c['shape']} | {c['cause']} | {c['run']}{flags} | {device} | {read} | "
                   + " | ".join(_named_text(p, c) for p in results["paths"]) + " |\n")
    out.append("\n## Coverage\n\n")
    out.append("| cause | shapes |\n|---|---|\n")
    for cause in results["causes"]:
        out.append(f"| {cause} | {', '.join(shapes.get(cause, [])) or 'none'} |\n")
    out.append("\n")
    if missing:
        out.append(f"Waves not run: {', '.join(missing)}.\n\n")
    out.append(f"Not covered: {NOT_COVERED}\n")
    out.append(END)
    return "".join(out)


def readme_line(results: dict[str, Any]) -> str:
    n, m = right(results)
    return (f"**Cause accuracy.** The named cause is right in {n} of {m} cases ({len(results['cases'])} jobs with "
            "injected bottlenecks on simulated GPUs, each judged by the alerts, both diagnose paths and the report; "
            "precision and recall per cause: [docs/accuracy.md](docs/accuracy.md)).\n")


def readme(text: str, results: dict[str, Any]) -> str:
    """``text`` (the README) with the line between the markers regenerated."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + readme_line(results) + text[end:]


def write(results: dict[str, Any] | None = None) -> None:
    results = results or load()
    DOC.write_text(render(results))
    README.write_text(readme(README.read_text(), results))


def stale(results: dict[str, Any] | None = None) -> list[str]:
    """What disagrees with the results: the document, the README line, causes below the goal without a note."""
    results = results or load()
    out = []
    if DOC.read_text() != render(results):
        out.append(f"{DOC.relative_to(REPO)} is not what the results give: python -m bench.causes_doc")
    if readme(README.read_text(), results) != README.read_text():
        out.append("README.md's accuracy line is not what the results give: python -m bench.causes_doc")
    out += [f"{cause} is below {GOAL} ({'; '.join(f)}) and the results' notes do not say why"
            for cause, f in below_goal(results).items() if not results["notes"].get(cause)]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.causes_doc", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="only say whether the document is current (exit 1)")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
        for p in problems:
            print(f"causes_doc: {p}", file=sys.stderr)
        return 1 if problems else 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
