"""The shipped rules' cost on one Prometheus at 100, 1,000 and 10,000 GPUs (issue 30, items 1-3).

Problem: every GPU costs its Prometheus series, rule evaluation, memory and query time, and a
rule group that takes longer than its interval misses evaluations (its alerts go quiet). This
bench measures those costs on a real Prometheus with the shipped rules (prometheus/rules), scraping
a simulated fleet (bench/fleet_sim.py: one process, one ``/node/<i>/metrics`` target per 8-GPU node,
payloads from the exporter's own renderer, counters moving, instrumented single- and multi-node
training runs with causes), and checks the budgets of docs/fleet.md::

    python -m bench.fleet_scale                          # 96 and 992 GPUs measured, 10,000 extrapolated
    python -m bench.fleet_scale --nodes 12 124 248 --seconds 300
    python -m bench.fleet_scale --update-docs            # and write its section of docs/benchmarks.md
    python -m bench.fleet_scale --annotations-ab --nodes 124 --seconds 180   # what the alert templates cost
    python -m bench.fleet_scale --ab-revision HEAD~1 --nodes 124 --seconds 180  # these rules against older ones
    python -m bench.fleet_scale --victoriametrics --nodes 124 --seconds 180      # in VictoriaMetrics + vmalert
    python -m bench.fleet_scale --victoriametrics --ab-revision HEAD~1 --nodes 124   # the same, side by side
    python -m bench.fleet_scale --diagnose-ab HEAD~1                 # fleet-wide diagnose against an older one
    python -m bench.fleet_scale --panels-ab HEAD~1 --nodes 250 --scrape-interval 15 --warmup 300  # changed panels

Each size runs its own Prometheus (Debian's 2.42), scraping every ``--scrape-interval`` (5 s by
default, so the rate windows fill fast: a 5m window then holds 3x the samples of a 15 s scrape,
which can only overstate the rules' cost) and evaluating each group at its shipped ``interval``
(``rule_interval`` in thresholds.yml: every minute). After the first rule results appear and
``--warmup`` seconds more, it samples ``prometheus_rule_group_last_duration_seconds`` of each group
once per evaluation for ``--seconds``, then reads the series counts, Prometheus' memory, runs every
panel query of the dashboards (instant, and as a range over the last 5 minutes at a 15 s step unless Grafana
asks it only as an instant query, as a table's) and
``gpu-exporter diagnose --prometheus-url`` over the whole fleet. The 10,000-GPU column is extrapolated: a straight line
through the two largest measured sizes (the measured slope), marked ``~``.

The code: bench/fleet_measure.py (a fleet and a Prometheus measured; the budgets), bench/fleet_vm.py
(VictoriaMetrics + vmalert), bench/fleet_ab.py (the A/B runs), bench/fleet_doc.py (the table and its
region of docs/benchmarks.md); this module is the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "exporter") not in sys.path:  # a plain checkout: the package's sources
    sys.path.insert(0, str(REPO / "exporter"))

from bench import fleet_sim  # noqa: E402
from bench.fleet_ab import diagnose_ab, panels_ab, rules_ab, rules_at, rules_without_annotations, victoriametrics_ab  # noqa: E402
from bench.fleet_doc import DOC, budget_misses, report, section, update_docs  # noqa: E402
from bench.fleet_measure import ROUNDS, Figures, measure  # noqa: E402
from bench.fleet_vm import measure_victoriametrics  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, nargs="+", default=[12, 124],
                        help="fleet sizes in 8-GPU nodes (default 12 124: 96 and 992 GPUs)")
    parser.add_argument("--seconds", type=float, default=180,
                        help="rule evaluations sampled for (default 180: three of a group at rule_interval 1m)")
    parser.add_argument("--warmup", type=float, default=660,
                        help="seconds after the first rule results before sampling (default 660: the 10m "
                             "windows of the alerts' hysteresis fill, and the low rates of the start leave them)")
    parser.add_argument("--scrape-interval", type=float, default=5.0, help="scrape interval, s (default 5)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"fresh diagnose processes per figure, their median (default {ROUNDS})")
    parser.add_argument("--context", choices=sorted(fleet_sim.CONTEXTS), default=fleet_sim.DEFAULT_CONTEXT,
                        help="what each simulated rank's context reports (bench/fleet_sim.py CONTEXTS; default "
                             f"{fleet_sim.DEFAULT_CONTEXT}: all a CUDA job sends; loader: the four DataLoader settings "
                             "the runs in the docs before 2026-12-06 sent)")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--annotations-ab", action="store_true",
                        help="instead: compare the shipped rules with the same rules without annotations, side by "
                             "side on one fleet (the first --nodes), for --seconds")
    parser.add_argument("--ab-revision", metavar="REV",
                        help="instead: compare the shipped rules with the rules committed at git REV, side by side "
                             "on one fleet (the first --nodes), for --seconds")
    parser.add_argument("--victoriametrics", action="store_true",
                        help="instead: the same fleet (the first --nodes) in VictoriaMetrics + vmalert, for --seconds; "
                             "with --ab-revision or --annotations-ab, two VictoriaMetrics + vmalert pairs side by side")
    parser.add_argument("--diagnose-ab", metavar="REV",
                        help="instead: fleet-wide diagnose of this tree and of git REV, side by side at each --nodes")
    parser.add_argument("--panels-ab", metavar="REV",
                        help="instead: the dashboards' panel queries that differ from git REV's, timed side by side "
                             "on one Prometheus (the first --nodes) with this tree's rules")
    parser.add_argument("--from-json", type=Path, help="print the report of figures --json wrote, measure nothing")
    parser.add_argument("--update-docs", action="store_true",
                        help=f"replace the fleet-scale section of {DOC.relative_to(REPO)}")
    args = parser.parse_args(argv)
    if args.annotations_ab or args.ab_revision:
        other, name = ((rules_at(args.ab_revision), f"rules at {args.ab_revision}") if args.ab_revision else
                       (rules_without_annotations(), "without annotations"))
        if args.victoriametrics:
            print(victoriametrics_ab(args.nodes[0], args.seconds, other, name, args.scrape_interval))
        else:
            print(rules_ab(args.nodes[0], args.seconds, other, name, args.scrape_interval))
        return 0
    if args.diagnose_ab:
        print(diagnose_ab(args.nodes, args.diagnose_ab, args.rounds, args.scrape_interval))
        return 0
    if args.panels_ab:
        print(panels_ab(args.nodes[0], args.panels_ab, args.rounds, args.scrape_interval, args.warmup))
        return 0
    if args.victoriametrics:
        print(measure_victoriametrics(args.nodes[0], args.seconds, args.scrape_interval))
        return 0
    figs = []
    if args.from_json:
        figs = [Figures(**{**d, "load": tuple(d["load"])}) for d in json.loads(args.from_json.read_text())]
    for nodes in [] if args.from_json else args.nodes:
        print(f"fleet_scale: {nodes} nodes ({nodes * fleet_sim.GPUS_PER_NODE} GPUs)...", file=sys.stderr, flush=True)
        figs.append(measure(nodes, args.seconds, args.scrape_interval, args.warmup, args.rounds, args.context))
        if args.json:
            args.json.write_text(json.dumps([f.__dict__ for f in figs], indent=1, default=str))
    if args.from_json:
        command = f"python -m bench.fleet_scale --nodes {' '.join(str(f.nodes) for f in figs)} --seconds " \
                  f"{figs[0].seconds:g} --warmup {figs[0].warmup:g} --scrape-interval {figs[0].scrape_interval:g}"
    else:
        command = "python -m bench.fleet_scale " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(figs, command.strip())
    print(text)
    if args.update_docs:
        DOC.write_text(update_docs(DOC.read_text(), section(text)))
    return 1 if budget_misses(figs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
