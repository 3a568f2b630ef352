"""docs/accuracy.md and the README's accuracy line against the cause-accuracy bench's stored results
(docs/accuracy.json): no bench run here (``python -m bench.causes_accuracy --update-docs`` makes them; it takes
about 18 minutes and is not part of the test suite)."""

from __future__ import annotations

import copy

import pytest

from bench import causes_doc
from bench.causes_accuracy import PATHS
from bench.causes_cases import CAUSES, waves


def test_the_document_and_the_readme_line_are_what_the_results_give() -> None:
    assert causes_doc.stale() == []


def test_the_results_hold_every_case_of_the_bench_judged_on_every_path() -> None:
    results = causes_doc.load()
    assert results["paths"] == list(PATHS) and results["causes"] == list(CAUSES)
    ran = {(c["wave"], c["uuid"]) for c in results["cases"]}
    planned = {(wave, case.uuid) for wave, jobs in waves(1.0).items() if wave in results["waves"]
               for job in jobs for case in job.cases}
    assert ran == planned
    for case in results["cases"]:
        assert set(case["named"]) == set(PATHS), case


def test_a_changed_result_makes_the_document_stale() -> None:
    """The check compares figures, not just the file's presence: one case named otherwise changes the document."""
    results = causes_doc.load()
    changed = copy.deepcopy(results)
    case = changed["cases"][0]
    case["named"]["diagnose --url"] = "healthy" if case["cause"] != "healthy" else "input_bound"
    assert causes_doc.render(changed) != causes_doc.render(results)
    assert causes_doc.right(changed)[0] == causes_doc.right(results)[0] - (
        causes_doc.named("diagnose --url", results["cases"][0]["named"]["diagnose --url"]) == {case["cause"]})
    assert any("docs/accuracy.md" in p for p in causes_doc.stale(changed))


def test_a_cause_below_the_goal_needs_a_note() -> None:
    results = copy.deepcopy(causes_doc.load())
    results["notes"] = {}
    for case in results["cases"]:
        if case["cause"] == "checkpoint":
            case["named"]["report"] = "metrics_bound"
    problems = causes_doc.stale(results)
    assert any(p.startswith("checkpoint is below 0.9") for p in problems), problems
    assert any(p.startswith("metrics_bound is below 0.9") for p in problems), problems


@pytest.mark.parametrize(("path", "named", "injected", "right"), [
    ("alerts", [], "healthy", True),
    ("alerts", ["input_bound"], "input_bound", True),
    ("alerts", ["allocator", "batch_too_small"], "allocator", False),
    ("report", "", "healthy", False),
    ("diagnose --url", "underutilized", "healthy", False),
])
def test_a_case_is_right_when_exactly_the_injected_cause_is_named(path: str, named: object, injected: str,
                                                                   right: bool) -> None:
    results = {"paths": [path], "causes": list(CAUSES), "cases": [{"cause": injected, "named": {path: named}}]}
    assert causes_doc.right(results) == (int(right), 1)
