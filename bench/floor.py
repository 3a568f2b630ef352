"""The scrape at the floor: gpu-exporter against a bare Python HTTP server with the same bytes, side by side.

A scrape that Prometheus makes arrives once per interval, on a new connection, asking for gzip,
at a server that has sat idle (or polled) since the previous one. What such a scrape costs has
a floor that has nothing to do with metrics: waking a Python server up, accepting, parsing a
request, writing a response. This bench measures that floor with a bare ``ThreadingHTTPServer``
(standard library only, in its own process) that serves gpu-exporter's own gzip body, and
scrapes both at the same pace, interleaved in one run, so that both see the same machine:

- gpu-exporter runs ``--simulate SCENARIO --poll-interval 1`` (the packaged scenario's
  simulation runs inside it, as it does for anyone trying the exporter);
- every ``SPACING`` s one scrape of gpu-exporter (so each follows a fresh poll), and half a
  spacing later one scrape of the bare server; each a new connection with Prometheus's headers;
- the bare server's body is a gzip body gpu-exporter served in the warm-up, refreshed every
  few scrapes so the sizes stay alike.

Example::

    PYTHONPATH=exporter python -m bench.floor                     # every packaged scenario, ~4 min
    PYTHONPATH=exporter python -m bench.floor --scenarios eight_gpus --scrapes 40
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import scrape

SCENARIO_DIR = scrape.EXPORTER_SRC / "gpu_exporter" / "simulate" / "scenarios"
GOAL = 1.2
"""Goal: gpu-exporter's p50 at most this many times the bare server's, on every packaged scenario."""
REFRESH = 5
"""The bare server's body is refreshed from gpu-exporter's every this many scrapes."""

BARE_SERVER = r"""
# A bare ThreadingHTTPServer: the body of a file, gzip, to every GET (the file is re-read when it changes).
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

path = sys.argv[1]
state = {"mtime": None, "body": b""}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        mtime = os.stat(path).st_mtime_ns
        if mtime != state["mtime"]:
            with open(path, "rb") as f:
                state["body"], state["mtime"] = f.read(), mtime
        body = state["body"]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@dataclass(frozen=True)
class FloorResult:
    """One scenario: the spaced scrapes of gpu-exporter and of the bare server, interleaved."""

    scenario: str
    wire_bytes: int
    ours_ms: tuple[float, ...]
    bare_ms: tuple[float, ...]

    @property
    def ours_p50(self) -> float:
        return statistics.median(self.ours_ms)

    @property
    def bare_p50(self) -> float:
        return statistics.median(self.bare_ms)

    @property
    def ratio(self) -> float:
        return self.ours_p50 / self.bare_p50 if self.bare_p50 > 0 else math.inf


def packaged_scenarios() -> list[str]:
    """Names of the scenarios packaged with the exporter (``--simulate NAME``)."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def exporter_spec(scenario: str, extra: Sequence[str] = ()) -> scrape.ExporterSpec:
    """gpu-exporter on the packaged ``scenario`` (``--simulate``), polling every second."""
    argv = (sys.executable, "-m", "gpu_exporter", "--simulate", scenario, "--web.listen-address",
            "127.0.0.1:{port}", "--poll-interval", "1", *extra)
    env = scrape._python_env(str(scrape.EXPORTER_SRC))
    return scrape.ExporterSpec("gpu-exporter", argv, env, Path(os.devnull))


@contextlib.contextmanager
def bare_server(body_file: Path) -> Iterator[int]:
    """A bare ThreadingHTTPServer in its own process serving ``body_file`` (gzip); yields its port."""
    proc = subprocess.Popen([sys.executable, "-c", BARE_SERVER, str(body_file)], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError("bench: the bare server did not start")
        yield int(line)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _gzip_body(port: int) -> bytes:
    _, status, body, encoding = scrape.scrape_once(port)
    if status != 200 or encoding != "gzip":
        raise RuntimeError(f"bench: gpu-exporter answered HTTP {status} ({encoding or 'not gzip'})")
    gzip.decompress(body)  # a whole member
    return body


def measure(scenario: str, scrapes: int, spacing: float = scrape.SPACING, extra: Sequence[str] = ()) -> FloorResult:
    """``scrapes`` spaced scrapes of gpu-exporter on ``scenario`` and of a bare server, interleaved."""
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-floor-") as tmp, \
            scrape.started(exporter_spec(scenario, extra)) as running:
        body_file = Path(tmp) / "body.gz"
        scrape.spaced(running.port, 4, spacing)  # the scraper's interval becomes known (scrapes are prepared)
        body = _gzip_body(running.port)
        body_file.write_bytes(body)
        ours: list[float] = []
        bare: list[float] = []
        with bare_server(body_file) as bare_port:
            scrape.back_to_back(bare_port, 3)
            start = time.perf_counter() + spacing
            for n in range(scrapes):
                for port, out, offset in ((running.port, ours, 0.0), (bare_port, bare, spacing / 2)):
                    pause = start + n * spacing + offset - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                    elapsed, status, got, _ = scrape.scrape_once(port)
                    if status != 200:
                        raise RuntimeError(f"bench: scrape of 127.0.0.1:{port} answered HTTP {status}")
                    out.append(elapsed * 1000)
                    if port == running.port and n % REFRESH == REFRESH - 1:
                        body_file.write_bytes(got)
        running.check_alive("during the floor scrapes")
    return FloorResult(scenario, len(body), tuple(ours), tuple(bare))


def measure_all(scenarios: Sequence[str], scrapes: int, rounds: int = 1,
                say: Callable[[str], None] = lambda _: None) -> list[FloorResult]:
    """Every scenario ``rounds`` times (the order reversed every other round)."""
    results = []
    for r in range(rounds):
        for scenario in scenarios if r % 2 == 0 else scenarios[::-1]:
            say(f"round {r + 1}: {scenario}")
            results.append(measure(scenario, scrapes))
    return results


def _ms(x: float) -> str:
    return f"{x:.3g}"


def table(results: Sequence[FloorResult]) -> list[str]:
    """Markdown rows: per scenario (and round), both p50s, both p90s, the ratio."""
    rows = ["| scenario | bytes on the wire (gzip) | gpu-exporter p50 ms | bare server p50 ms | gpu-exporter p90 ms | "
            "bare server p90 ms | p50 ratio | scrapes each |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r.scenario} | {r.wire_bytes} | {_ms(r.ours_p50)} | {_ms(r.bare_p50)} | "
                    f"{_ms(scrape.percentile(list(r.ours_ms), 90))} | {_ms(scrape.percentile(list(r.bare_ms), 90))} | "
                    f"{r.ratio:.2f}x | {len(r.ours_ms)} |")
    return rows


def worst(results: Sequence[FloorResult]) -> FloorResult:
    """The scenario run farthest from the bare server."""
    return max(results, key=lambda r: r.ratio)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scenarios", default=",".join(packaged_scenarios()),
                        help="packaged scenarios, comma-separated (default: all)")
    parser.add_argument("--scrapes", type=int, default=30, help="spaced scrapes of each server per scenario")
    parser.add_argument("--rounds", type=int, default=1, help="times each scenario is measured")
    args = parser.parse_args(argv)
    names = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(names) - set(packaged_scenarios()))
    if unknown:
        parser.error(f"not a packaged scenario: {', '.join(unknown)}")
    if args.scrapes < 2 or args.rounds < 1:
        parser.error("--scrapes must be at least 2 and --rounds at least 1")
    before = os.getloadavg()
    results = measure_all(names, args.scrapes, args.rounds, lambda m: print(f"bench: {m}", file=sys.stderr, flush=True))
    after = os.getloadavg()
    print("\n".join(table(results)))
    w = worst(results)
    met = w.ratio <= GOAL
    print(f"\nGoal: gpu-exporter's p50 within {GOAL:g}x of the bare server's on every packaged scenario: worst "
          f"{w.ratio:.2f}x ({w.scenario}): {'met' if met else 'missed'}.")
    print(f"Load average before / after: {' '.join(f'{x:.2f}' for x in before)} / "
          f"{' '.join(f'{x:.2f}' for x in after)}.")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
