"""A simulated GPU fleet in one process, for a real Prometheus to scrape: ``/node/<i>/metrics`` per node.

Problem: measuring the shipped rules at 1,000 or 10,000 GPUs needs 125 to 1,250 exporters. One
``gpu-exporter --simulate`` process per node (bench/fleet.py) costs about 1.5% of a CPU each,
far too much on a small machine. Here each *kind* of node is rendered once by the exporter's own
code (the simulated NVML, every polling collector, the training ingest store fed with real pushes,
the self metrics, ``gpu_exporter.exposition``), twice, some simulated seconds apart. A line whose
value differs between the two renders moves at serve time: a counter goes on at the rate between
the two renders, a ``*_timestamp_seconds`` gauge follows the clock, any other gauge alternates
between its two values. Each node then gets its own GPU UUIDs and run names by plain string
substitution, so the payloads have the real renderer's shape, and counters move.

The mix repeats every :data:`CYCLE` nodes (8 GPUs each):

- ``shared``: the packaged ``eight_gpus`` scenario, 8 uninstrumented processes per GPU (20-90% busy);
- ``ddp-a`` + ``ddp-b``: one instrumented 16-rank run across two nodes (one process per GPU),
  a communication share that makes rank 11 the straggler, allocator and context fields
  (:data:`CONTEXTS`);
- ``solo``: eight single-GPU instrumented runs, one per GPU, with causes (input-bound,
  checkpoint, metrics, allocator retries) and some without.

Run ``python -m bench.fleet_sim --nodes 125`` to serve 1,000 GPUs on a free port (printed).
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "exporter") not in sys.path:
    sys.path.insert(0, str(REPO / "exporter"))

from gpu_exporter import simulate  # noqa: E402
from gpu_exporter.app import polling_collectors  # noqa: E402
from gpu_exporter.exposition import Source, exposition  # noqa: E402
from gpu_exporter.ingest import IngestSettings, TrainingStore  # noqa: E402
from gpu_exporter.nvml import Nvml  # noqa: E402
from gpu_exporter.poller import Poller  # noqa: E402
from gpu_exporter.selfmetrics import SelfMetrics  # noqa: E402

SCENARIOS = Path(simulate.__file__).parent / "scenarios"
GPUS_PER_NODE = 8
CYCLE = ("shared", "ddp-a", "ddp-b", "solo")
"""The kinds of consecutive nodes; the fleet repeats this cycle."""
RENDER_GAP = 30.0
"""Simulated seconds between a kind's two renders."""
RUN_PLACEHOLDER = "zzRUNzz"
_UUID_RE = re.compile(r"GPU-[0-9a-fA-F-]{8,}")
_COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")


class _Clock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def _one_process_scenario() -> dict[str, Any]:
    """8 H100s, one training process each, 35-95% busy: the nodes of instrumented jobs."""
    gpus = []
    for i in range(GPUS_PER_NODE):
        gpus.append({"name": "NVIDIA H100 80GB HBM3", "architecture": "hopper", "memory_gib": 80,
                     "utilization": {"constant": round(0.35 + 0.6 * i / (GPUS_PER_NODE - 1), 2), "noise": 0.03},
                     "memory_utilization": {"constant": 0.4, "noise": 0.03}, "power_limit_watts": 700,
                     "power_watts": {"idle": 72, "busy": 640},
                     "processes": [{"pid": 90000 + i, "name": f"python train.py --local-rank {i}", "memory_gib": 60}]})
    return {"gpus": gpus}


# Phase shares of the single-GPU runs of a ``solo`` node, one per GPU: causes and healthy runs.
_SOLO_SHARES: tuple[dict[str, float], ...] = (
    {"data": 0.6, "compute": 0.35, "other": 0.05},            # input-bound
    {"checkpoint": 0.4, "compute": 0.55, "other": 0.05},      # checkpoint
    {"metrics": 0.35, "compute": 0.6, "other": 0.05},         # metrics
    {"compute": 0.9, "data": 0.05, "other": 0.05},            # healthy
    {"data": 0.3, "compute": 0.65, "other": 0.05},
    {"compute": 0.95, "other": 0.05},
    {"data": 0.45, "compute": 0.5, "metrics": 0.05},
    {"compute": 0.85, "checkpoint": 0.1, "other": 0.05},
)


_LOADER: dict[str, Any] = {"num_workers": 4, "pin_memory": True, "prefetch_factor": 2, "persistent_workers": False}
CONTEXTS: dict[str, dict[str, Any]] = {
    "loader": _LOADER,
    "cuda": {**_LOADER, "loader_batch_size": 64, "cpu_cores": 12.0, "gpu_memory_used_bytes": 61 * 2**30,
             "gpu_memory_total_bytes": 80 * 2**30, "allocator_peak_bytes": 45 * 10**9},
}
"""The ``context`` each rank pushes (``--context``). ``cuda``, the default: every field gpu_exporter.training sends
from a CUDA job with a DataLoader (training/context.py: the loader's settings, the cores it may use, torch's GPU
memory and the allocator's peak), for a process using 60 GiB of an 80 GiB GPU with 12 cores. ``loader``: four of
the DataLoader's settings only, 5 series a rank fewer, what the measurements in docs/benchmarks.md before 2026-12-06
used."""


DEFAULT_CONTEXT = "cuda"


def _pushes(kind: str, uuids: Sequence[str], started: float, now: float, context: str) -> list[dict[str, Any]]:
    """The snapshots a kind's training processes push at ``now`` (cumulative since ``started``)."""
    elapsed = now - started
    docs = []
    for i, uuid in enumerate(uuids):
        if kind in ("ddp-a", "ddp-b"):
            rank = i + (GPUS_PER_NODE if kind == "ddp-b" else 0)
            comm = 0.45 if rank != 11 else 0.1  # rank 11 is slow: the others wait for it
            shares = {"data": 0.05, "compute": 0.9 - comm, "communication": comm, "other": 0.05}
            run, rank_label, world = RUN_PLACEHOLDER, str(rank), 2 * GPUS_PER_NODE
            retries = 0
        elif kind == "solo":
            shares = _SOLO_SHARES[i % len(_SOLO_SHARES)]
            run, rank_label, world = f"{RUN_PLACEHOLDER}{i}", "0", 1
            retries = int(elapsed * 0.5) if i == 4 else 0  # allocator retries on one GPU
        else:
            return []
        docs.append({
            "version": 1, "run": run, "rank": rank_label, "uuid": uuid, "started_at": started,
            "pid": 90000 + i, "phases": {p: s * elapsed for p, s in shares.items()}, "current_phase": "compute",
            "steps": int(elapsed * 4), "samples": int(elapsed * 4) * 64, "batch_size": 64, "finished": False,
            "world_size": world,
            "allocator": {"allocated_bytes": 40e9, "reserved_bytes": 60e9, "retries": retries, "ooms": 0},
            "context": CONTEXTS[context],
        })
    return docs


def render_kind(kind: str, start: float | None = None, gap: float = RENDER_GAP,
                context: str = DEFAULT_CONTEXT) -> tuple[str, str, float]:
    """Two /metrics bodies of one node of ``kind``, ``gap`` simulated seconds apart, as the exporter
    renders them (every polling collector, the training store, the self metrics); and the gap."""
    doc = yaml.safe_load((SCENARIOS / "eight_gpus.yaml").read_text()) if kind == "shared" else _one_process_scenario()
    doc["seed"] = 1
    t0 = (time.time() if start is None else start) - 2 * gap
    clock = _Clock(t0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{kind}.yaml"
        path.write_text(yaml.safe_dump(doc))
        simulate.install(path, clock=clock)
        nvml = Nvml()
        try:
            nvml.init()
            collectors = polling_collectors(simulated=True)
            poller = Poller(nvml, collectors, poll_interval=1.0, clock=clock)
            training = TrainingStore(IngestSettings(), clock=clock)
            health = SelfMetrics(poller)
            sources: list[Source] = [*collectors, training, health]
            poller.poll_once()
            uuids = [gpu.uuid for gpu in poller.discovery.gpus]
            started = t0 - 1200.0
            bodies = []
            for _ in range(2):
                for _ in range(int(gap)):
                    clock.t += 1.0
                    poller.poll_once()
                for push in _pushes(kind, uuids, started, clock.t, context):
                    status, reason = training.handle_push(json.dumps(push).encode(), "application/json", None)
                    if status != 202:
                        raise RuntimeError(f"{kind}: push refused: {status} {reason}")
                bodies.append(exposition(sources).decode())
        finally:
            nvml.shutdown()
            simulate.uninstall()
    return bodies[0], bodies[1], gap


@dataclass
class Template:
    """A kind's payload: static text and moving values (``render`` fills them for a time)."""

    kind: str
    rendered_at: float
    statics: list[str] = field(default_factory=list)
    """Text before each moving value; one more than ``slots`` (the tail)."""
    slots: list[tuple[int, float, float]] = field(default_factory=list)
    """(how: 0 counter, 1 clock, 2 alternate; value at the second render; rate or other value)."""
    uuids: list[str] = field(default_factory=list)

    @classmethod
    def build(cls, kind: str, first: str, second: str, gap: float, rendered_at: float) -> Template:
        a, b = first.splitlines(), second.splitlines()
        if len(a) != len(b):
            raise ValueError(f"{kind}: the two renders differ in shape ({len(a)} vs {len(b)} lines)")
        t = cls(kind, rendered_at)
        seen: dict[str, None] = {}
        for match in _UUID_RE.findall(second):
            seen.setdefault(match, None)
        t.uuids = list(seen)
        text: list[str] = []
        for la, lb in zip(a, b, strict=True):
            if la == lb or la.startswith("#"):
                text.append(lb + "\n")
                continue
            head, _, vb = lb.rpartition(" ")
            ha, _, va = la.rpartition(" ")
            if ha != head:
                raise ValueError(f"{kind}: series changed between renders: {la!r} vs {lb!r}")
            name = head.split("{", 1)[0]
            x, y = float(va), float(vb)
            if name.endswith("_timestamp_seconds"):
                slot = (1, y, 1.0)
            elif name.endswith(_COUNTER_SUFFIXES) or name.endswith("_seconds_total"):
                slot = (0, y, max(0.0, (y - x) / gap))
            else:
                slot = (2, y, x)
            text.append(head + " ")
            t.statics.append("".join(text))
            t.slots.append(slot)
            text = ["\n"]
        t.statics.append("".join(text))
        return t

    def for_node(self, index: int, run_names: dict[str, str]) -> Template:
        """This template with node ``index``'s own GPU UUIDs and run names substituted."""
        mapping = {u: f"GPU-{index:08x}-{j:04x}-4000-8000-{index * 16 + j:012x}" for j, u in enumerate(self.uuids)}
        mapping.update(run_names)
        pattern = re.compile("|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True)))
        statics = [pattern.sub(lambda m: mapping[m.group(0)], s) for s in self.statics]
        return Template(self.kind, self.rendered_at, statics, self.slots, list(mapping.values()))

    def _line(self, k: int) -> str:
        """The series text of slot ``k`` (its line up to the value)."""
        return self.statics[k].rpartition("\n")[2]

    def rate(self, metric: str, uuid: str) -> float:
        """The rate at which the counter ``metric`` of GPU ``uuid`` moves (0 when it does not)."""
        return next((other for k, (how, _, other) in enumerate(self.slots) if how == 0
                     and self._line(k).startswith(metric + "{") and f'uuid="{uuid}"' in self._line(k)), 0.0)

    def pinned(self, metric: str, value_of: Callable[[str], float]) -> Template:
        """This template with the whole-GPU (``mig_uuid=""``) gauge ``metric`` of each GPU held at
        ``value_of(uuid)``: a known SM activity per GPU (tests/test_fleet_funnel.py)."""
        line = re.compile(rf'^({re.escape(metric)}\{{[^}}\n]*mig_uuid=""[^}}\n]*\}}) (\S+)$', re.MULTILINE)

        def value(head: str) -> float:
            found = re.search(r'uuid="([^"]+)"', head.replace('mig_uuid=""', ""))
            return value_of(found.group(1) if found else "")

        statics = [line.sub(lambda m: f"{m.group(1)} {value(m.group(1))!r}", s) for s in self.statics]
        slots = [(2, value(self._line(k)), value(self._line(k))) if line.match(self._line(k).rstrip() + " 0") else slot
                 for k, slot in enumerate(self.slots)]
        return Template(self.kind, self.rendered_at, statics, slots, self.uuids)

    def render(self, now: float, tick: int) -> bytes:
        out = [self.statics[0]]
        dt = now - self.rendered_at
        for (how, value, other), static in zip(self.slots, self.statics[1:], strict=True):
            if how == 0:
                v = value + other * dt
            elif how == 1:
                v = value + dt
            else:
                v = value if tick % 2 else other
            out.append(repr(float(v)) if v != int(v) or abs(v) >= 1e15 else str(int(v)) + ".0")
            out.append(static)
        return "".join(out).encode()


def node_kind(index: int) -> str:
    return CYCLE[index % len(CYCLE)]


def node_name(index: int) -> str:
    return f"gpu-node-{index:05d}"


def run_names(index: int) -> dict[str, str]:
    """Placeholders -> run names of node ``index`` (a ddp job spans one ddp-a and the next ddp-b node)."""
    kind = node_kind(index)
    cycle = index // len(CYCLE)
    if kind in ("ddp-a", "ddp-b"):
        return {RUN_PLACEHOLDER: f"ddp-job-{cycle:04d}"}
    if kind == "solo":
        return {f"{RUN_PLACEHOLDER}{i}": f"solo-{cycle:04d}-{i}" for i in range(GPUS_PER_NODE)}
    return {}


class Fleet:
    """``nodes`` simulated nodes' templates; ``body(i)`` is node i's /metrics now."""

    def __init__(self, nodes: int, context: str = DEFAULT_CONTEXT) -> None:
        now = time.time()
        kinds = {}
        for kind in dict.fromkeys(node_kind(i) for i in range(nodes)):
            first, second, gap = render_kind(kind, start=now, context=context)
            kinds[kind] = Template.build(kind, first, second, gap, rendered_at=now)
        self.templates = [kinds[node_kind(i)].for_node(i, run_names(i)) for i in range(nodes)]
        self.ticks = [0] * nodes
        self.scrapes = 0

    def body(self, index: int) -> bytes:
        self.ticks[index] += 1
        self.scrapes += 1
        return self.templates[index].render(time.time(), self.ticks[index])

    def __len__(self) -> int:
        return len(self.templates)


_PATH_RE = re.compile(r"^/node/(\d+)/metrics$")


def serve(fleet: Fleet, host: str = "127.0.0.1", port: int = 0) -> http.server.ThreadingHTTPServer:
    """Serve ``fleet`` at ``/node/<i>/metrics`` in a daemon thread; return the server (its port:
    ``server.server_address[1]``)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            match = _PATH_RE.match(self.path)
            if not match or int(match.group(1)) >= len(fleet):
                self.send_error(404)
                return
            body = fleet.body(int(match.group(1)))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    http.server.ThreadingHTTPServer.daemon_threads = True
    server = http.server.ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def targets(nodes: int, hostport: str) -> Iterator[dict[str, Any]]:
    """Prometheus static_configs for ``nodes`` nodes served at ``hostport``: one target group per
    node, with its own ``__metrics_path__``, ``node`` and ``instance`` labels."""
    for i in range(nodes):
        yield {"targets": [hostport], "labels": {"__metrics_path__": f"/node/{i}/metrics", "node": node_name(i),
                                                "instance": f"{node_name(i)}:9445"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=125, help="simulated 8-GPU nodes (default 125)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--context", choices=sorted(CONTEXTS), default=DEFAULT_CONTEXT,
                        help=f"what each rank's context reports (CONTEXTS; default {DEFAULT_CONTEXT})")
    args = parser.parse_args(argv)
    fleet = Fleet(args.nodes, args.context)
    server = serve(fleet, port=args.port)
    print(f"http://127.0.0.1:{server.server_address[1]}/node/<0..{args.nodes - 1}>/metrics", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
