"""The tables of the real-GPU check (bench/real_gpu.py) for its cause variants: one row per variant and rank, the
verdict of the default (GPU-truthful) run and of the sync_every=1 run beside the exporter's and nvidia-smi's
utilization and the phase shares, printed and as markdown for docs/real-gpu.md; and whether the check passed.
The variants that NVML's utilization cannot tell apart print their own table (bench/real_gpu_loops.py).
"""

from __future__ import annotations

from typing import Any

from bench import real_gpu_loops as loops
from bench.real_gpu_causes import PLANS


def _verdict(variant: str, mode: dict[str, Any], rank: str) -> str:
    """The variant's verdict: the GPU's for a single-rank loop, the rank's own first cause for DDP."""
    return str(mode["ranks"][rank]["cause"] if PLANS[variant].kind == "ddp" else mode["verdict"])


def _fmt_shares(shares: dict[str, float] | None) -> str:
    if not shares:
        return "-"
    return ", ".join(f"{p} {s * 100:.0f}%" for p, s in sorted(shares.items(), key=lambda kv: -kv[1]) if s >= 0.01)


def _pct(value: float | None) -> str:
    """A share as the package prints it (gpu_exporter.verdict's ``pct``), ``n/a`` when not measured."""
    from gpu_exporter.verdict.format import pct  # imported when used: bench.real_gpu puts exporter/ on the path

    return "n/a" if value is None else pct(value)


def rows(results: dict[str, Any]) -> list[dict[str, str]]:
    """One row per variant and rank: what the table shows."""
    out: list[dict[str, str]] = []
    for variant, r in results["variants"].items():
        if "skipped" in r:
            out.append({"variant": variant, "rank": "-", "expected": "-", "default": f"skipped: {r['skipped']}"})
            continue
        for rank, expected in r["expected"].items():
            d, s = r["default"], r["sync_every_1"]
            own_d, own_s = d["ranks"][rank].get("own", {}), s["ranks"][rank].get("own", {})
            syncs = own_d.get("synchronize", {})
            out.append({
                "variant": variant, "rank": rank, "expected": expected,
                "default": _verdict(variant, d, rank), "sync1": _verdict(variant, s, rank),
                "util": _pct(d["utilization"]), "smi": _pct(d["nvidia_smi_utilization"]),
                "util_sync1": _pct(s["utilization"]), "smi_sync1": _pct(s["nvidia_smi_utilization"]),
                "syncs": f"{syncs.get('library', '?')}/{syncs.get('all', '?')}",
                "syncs_sync1": f"{own_s.get('synchronize', {}).get('library', '?')}",
                "shares": _fmt_shares(d["ranks"][rank]["shares"]),
                "shares_sync1": _fmt_shares(s["ranks"][rank]["shares"]),
                "cpu_clock": _fmt_shares(own_d.get("cpu_clock_shares")),
                "truth": _fmt_shares(own_d.get("truth_shares")),
            })
    return out


def print_table(results: dict[str, Any]) -> None:
    table = rows(results)
    if not table:
        return
    print(f"{'variant':<12} {'rank':<4} {'expected':<16} {'default':<16} {'sync_every=1':<16} {'util':>5} "
          f"{'smi':>5} {'sync':>5}  default shares (GPU-truthful)")
    for r in table:
        if "util" not in r:
            print(f"{r['variant']:<12} {r['rank']:<4} {r['default']}")
            continue
        print(f"{r['variant']:<12} {r['rank']:<4} {r['expected']:<16} {r['default']:<16} {r['sync1']:<16} "
              f"{r['util']:>5} {r['smi']:>5} {r['syncs']:>5}  {r['shares']}")
    print()
    print(f"{'variant':<12} {'rank':<4} {'shares with sync_every=1':<44} {'sync':>5}  {'CPU clock (default run)':<44} "
          "device truth (default run)")
    for r in table:
        if "util" in r:
            print(f"{r['variant']:<12} {r['rank']:<4} {r['shares_sync1']:<44} {r['syncs_sync1']:>5}  "
                  f"{r['cpu_clock']:<44} {r['truth']}")
    events = [own["event_record_us"] for r in results["variants"].values() for own in r.get("loop", {}).values()
              if own.get("event_record_us") is not None]
    if events:
        print(f"\ntorch.cuda.Event.record(): {min(events):.1f}-{max(events):.1f} µs per phase change")


def markdown(results: dict[str, Any]) -> str:
    """The results as a markdown table for docs/real-gpu.md."""
    head = ("| variant | rank | expected | default (GPU-truthful) | sync_every=1 | utilization: exporter / nvidia-smi "
            "(sync_every=1) | synchronize on the default path (library/all) | default shares | sync_every=1 shares "
            "| CPU clock shares | device truth |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows(results):
        if "util" not in r:
            lines.append(f"| {r['variant']} | - | - | {r['default']} | | | | | | | |")
            continue
        lines.append(f"| {r['variant']} | {r['rank']} | {r['expected']} | {r['default']} | {r['sync1']} | "
                     f"{r['util']} / {r['smi']} ({r['util_sync1']} / {r['smi_sync1']}) | {r['syncs']} | "
                     f"{r['shares']} | {r['shares_sync1']} | {r['cpu_clock']} | {r['truth']} |")
    return head + "\n".join(lines) + "\n"


def passed(results: dict[str, Any]) -> bool:
    """Every default run (and every run of real_gpu_loops) got its expected verdict, and the library never
    synchronized on the default path."""
    ok = loops.passed(results)
    for variant, r in results["variants"].items():
        if "skipped" in r:
            continue
        for rank, expected in r["expected"].items():
            own = r["default"]["ranks"][rank].get("own", {})
            ok = ok and _verdict(variant, r["default"], rank) == expected
            ok = ok and own.get("synchronize", {}).get("library", 1) == 0 and bool(own.get("gpu_truthful"))
    return ok
