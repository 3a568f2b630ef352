"""Scenario files: YAML descriptions of a simulated GPU node, parsed into validated dataclasses (``spec``).

Format (every key except ``gpus`` and each GPU's ``name``, ``architecture`` and ``memory_gib``
is optional)::

    driver_version: "550.54.15"      # nvmlSystemGetDriverVersion
    cuda_version: "12.4"             # nvmlSystemGetCudaDriverVersion (returned as 12040)
    driver_missing: false            # true: nvmlInit fails with LIBRARY_NOT_FOUND
    seed: 0                          # seeds the deterministic noise
    dcgm_pipe_fields: false          # true: the stand-in dcgm-exporter also serves DCGM_FI_PROF_PIPE_FP16/32/64_ACTIVE
                                     # (a counters file that enables them; a device GPU's come from its kernels'
                                     # fp32/fp16/fp64 shares, a pattern GPU's are 0)
    gpus:
      - name: "NVIDIA H100 80GB HBM3"
        architecture: hopper         # kepler maxwell pascal volta turing ampere ada hopper blackwell
        memory_gib: 80
        uuid: "GPU-..."              # default: deterministic from the index
        pci_bus_id: "00000000:19:00.0"
        utilization: {constant: 0.85, noise: 0.05}   # a pattern, see below
        memory_utilization: 0.4                      # a bare number is a constant pattern
        memory_used_gib: 70          # default: the processes' memory
        memory_reserved_gib: 0.5
        power_watts: {idle: 70, busy: 650}   # a level: a number, or linear in utilization
        power_limit_watts: 700
        temperature_celsius: {idle: 32, busy: 71}
        sm_clock_mhz: {idle: 345, busy: 1980}
        memory_clock_mhz: 2619
        fan_percent: null            # null: nvmlDeviceGetFanSpeed is NOT_SUPPORTED
        pcie: {tx_mib_s: 200, rx_mib_s: {idle: 5, busy: 900}}
        clock_event_reasons: [sw_power_cap]   # default: [gpu_idle] below 5% utilization
        processes: [{pid: 4242, name: python, memory_gib: 60, sm_utilization: 0.8,
                     memory_utilization: 0.3, type: compute, mig_instance: 0}]
        mig: {instances: [{profile: "3g.40gb", memory_gib: 40, memory_used_gib: 10,
                           gpu_instance_id: 1, compute_instance_id: 0, utilization: 0.5}]}
        device: false                # true: busy while a job's simulated device works (simulate/device.py)
        follow_training: false       # true (demos only): utilization follows the compute share of a live job
        busy_utilization: 0.95       # how busy the GPU is while the job computes (0.25: launch-bound)
        idle_utilization: 0.01       # ... while it does anything else, or no job is live
        gpm: {occupancy_factor: 0.5, tensor_factor: 0.7}   # occupancy (all GPUs) and tensor activity
                                     # (pattern GPUs; a device GPU's comes from its kernels) relative to SM activity
                                     # gpm: false: GPM unsupported (like an A100; default: hopper and newer support it)
        xid_events: [{at: 30, xid: 79}]
        faults: [{at: 5, until: 20, kind: lost}, {at: 0, kind: not_supported,
                  function: nvmlDeviceGetPowerUsage}]

Patterns (``utilization``, ``memory_utilization``, a MIG instance's ``utilization``; ratios 0-1):
``{constant: 0.85}``, ``{bursts: {period: 10, duty: 0.3, high: 0.95, low: 0.0}}`` or
``{steps: [{until: 60, value: 0.9}, {until: 120, value: 0.1}], repeat: true}`` (without
``repeat`` the last value holds), each with an optional ``noise`` amplitude.

>>> load_scenario(None).gpus[0].name
'NVIDIA H100 80GB HBM3'
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, TypeVar

from gpu_exporter import yamlfile
from gpu_exporter.catalog import CLOCK_EVENT_REASONS
from gpu_exporter.simulate.patterns import Bursts, Constant, Noisy, Pattern, Steps
from gpu_exporter.simulate.spec import ARCHITECTURES as ARCHITECTURES  # the node's dataclasses, re-exported
from gpu_exporter.simulate.spec import FAULT_KINDS as FAULT_KINDS
from gpu_exporter.simulate.spec import Fault as Fault
from gpu_exporter.simulate.spec import GpuSpec as GpuSpec
from gpu_exporter.simulate.spec import Level as Level
from gpu_exporter.simulate.spec import MigInstanceSpec as MigInstanceSpec
from gpu_exporter.simulate.spec import ProcessSpec as ProcessSpec
from gpu_exporter.simulate.spec import Scenario as Scenario
from gpu_exporter.simulate.spec import XidEvent as XidEvent

DEFAULT_SCENARIO = Path(__file__).with_name("scenarios") / "default.yaml"
_D = TypeVar("_D")


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message is one line naming file, key and problem."""


class _Reader:
    """Reads one mapping of the YAML tree, tracking the key path for error messages."""

    def __init__(self, source: str, path: str, data: Any) -> None:
        self.source, self.path = source, path
        if not isinstance(data, dict):
            raise self.fail(f"must be a mapping, got {_show(data)}")
        self.data: dict[str, Any] = data
        self.used: set[str] = set()

    def fail(self, message: str, key: str | None = None) -> ScenarioError:
        where = self.key_path(key) if key is not None else (self.path or "<top level>")
        return ScenarioError(f"{self.source}: {where}: {message}")

    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def child(self, key: str, data: Any) -> _Reader:
        return _Reader(self.source, self.key_path(key), data)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def required(self, key: str, default: Any = None) -> Any:
        value = self.raw(key, default)
        if value is None:
            raise self.fail("is required", key)
        return value

    def number(self, key: str, default: float | None = None, lo: float | None = 0.0,
               hi: float | None = None) -> float:
        value = self.required(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"must be a number, got {_show(value)}", key)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"between {lo:g} and {hi:g}" if hi is not None else f"at least {lo:g}"
            raise self.fail(f"must be {bounds}, got {value}", key)
        return float(value)

    def ratio(self, key: str, default: float | None = None) -> float:
        return self.number(key, default, 0.0, 1.0)

    def integer(self, key: str, default: int | None = None, lo: int = 0) -> int:
        value = self.required(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise self.fail(f"must be an integer >= {lo}, got {_show(value)}", key)
        return value

    def string(self, key: str, default: str | None = None) -> str:
        value = self.required(key, default)
        if not isinstance(value, str | int | float) or isinstance(value, bool) or str(value) == "":
            raise self.fail(f"must be a non-empty string, got {_show(value)}", key)
        return str(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"must be true or false, got {_show(value)}", key)
        return value

    def items(self, key: str) -> list[_Reader]:
        value = self.raw(key, [])
        if not isinstance(value, list):
            raise self.fail(f"must be a list, got {_show(value)}", key)
        return [_Reader(self.source, f"{self.key_path(key)}[{i}]", item) for i, item in enumerate(value)]

    def level(self, key: str, default: _D) -> Level | _D:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, dict):
            sub = self.child(key, value)
            return sub.done(Level(sub.number("idle"), sub.number("busy")))
        number = self.number(key)
        return Level(number, number)

    def pattern(self, key: str, default: Pattern, seed: str) -> Pattern:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, dict):
            return Constant(self.ratio(key))
        sub = self.child(key, value)
        kinds = [kind for kind in ("constant", "bursts", "steps") if kind in value]
        if len(kinds) != 1:
            raise sub.fail("needs exactly one of constant, bursts, steps")
        base: Pattern
        if kinds[0] == "constant":
            base = Constant(sub.ratio("constant"))
        elif kinds[0] == "bursts":
            b = sub.child("bursts", sub.raw("bursts"))
            period = b.number("period")
            if period <= 0:
                raise b.fail("must be greater than 0", "period")
            base = b.done(Bursts(period, b.ratio("duty"), b.ratio("high"), b.ratio("low", 0.0)))
        else:
            steps = sub.items("steps")
            if not steps:
                raise sub.fail("must list at least one step", "steps")
            untils: list[float] = []
            for step in steps:
                until = step.number("until")
                if until <= 0 or (untils and until <= untils[-1]):
                    raise step.fail("must be greater than 0 and than the previous step's until", "until")
                untils.append(until)
            values = [step.ratio("value") for step in steps]
            for step in steps:
                step.finish()
            base = Steps(untils, values, sub.boolean("repeat", False))
        if kinds[0] != "steps" and "repeat" in value:
            raise sub.fail("only applies to steps", "repeat")
        noise = sub.ratio("noise", 0.0)
        return sub.done(Noisy(base, noise, seed) if noise > 0 else base)

    def finish(self, *expected: str) -> None:
        """Fail on the first unknown key: one not read so far, or, given ``expected`` (before reading), not in it."""
        unknown = sorted(set(self.data) - (set(expected) if expected else self.used))
        if unknown:
            raise self.fail("unknown key", str(unknown[0]))

    def done(self, result: _D) -> _D:
        """``result``, once :meth:`finish` found no unknown key."""
        self.finish()
        return result


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _uuid(*parts: object) -> str:
    h = hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _parse_gpu(r: _Reader, index: int, seed: int) -> GpuSpec:
    name = r.string("name")
    architecture = r.string("architecture").lower()
    if architecture not in ARCHITECTURES:
        raise r.fail(f"must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}", "architecture")
    memory_gib = r.number("memory_gib")
    if memory_gib <= 0:
        raise r.fail("must be greater than 0", "memory_gib")
    uuid = r.string("uuid", f"GPU-{_uuid('gpu', seed, index)}")
    # 15 buses per PCI domain (0x18, 0x28, ... 0xF8); later GPUs go to the next domain.
    pci_bus_id = r.string("pci_bus_id", f"{index // 15:08X}:{0x18 + 0x10 * (index % 15):02X}:00.0")
    if not re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", pci_bus_id):
        raise r.fail(f"must look like 00000000:18:00.0, got {pci_bus_id!r}", "pci_bus_id")

    utilization = r.pattern("utilization", Constant(0.0), f"{seed}:{index}:utilization")
    memory_utilization = r.pattern("memory_utilization", Constant(0.0), f"{seed}:{index}:memory")

    mig_instances: tuple[MigInstanceSpec, ...] | None = None
    if r.has("mig"):
        mig = r.child("mig", r.raw("mig"))
        if ARCHITECTURES[architecture] < ARCHITECTURES["ampere"]:
            raise mig.fail(f"MIG needs ampere or newer, this GPU is {architecture}")
        instances = []
        for i, inst in enumerate(mig.items("instances")):
            profile = inst.string("profile")
            if not re.fullmatch(r"\d+g\.\d+gb(\+me)?", profile):
                raise inst.fail(f"must look like 1g.10gb, got {profile!r}", "profile")
            inst_memory = inst.number("memory_gib")
            used = inst.number("memory_used_gib", 0.0)
            if used > inst_memory:
                raise inst.fail(f"{used:g} GiB exceeds the instance's memory_gib {inst_memory:g}",
                                "memory_used_gib")
            instances.append(inst.done(MigInstanceSpec(
                profile=profile, memory_gib=inst_memory, memory_used_gib=used,
                gpu_instance_id=inst.integer("gpu_instance_id", i + 1),
                compute_instance_id=inst.integer("compute_instance_id", 0),
                uuid=inst.string("uuid", f"MIG-{_uuid('mig', seed, index, i)}"),
                utilization=inst.pattern("utilization", utilization, f"{seed}:{index}:mig{i}"),
            )))
        mig.finish()
        if not instances:
            raise mig.fail("must list at least one instance", "instances")
        if sum(inst.memory_gib for inst in instances) > memory_gib:
            raise mig.fail(f"instances' memory exceeds the GPU's memory_gib {memory_gib:g}", "instances")
        if len({inst.gpu_instance_id for inst in instances}) != len(instances):
            raise mig.fail("gpu_instance_id values must be distinct", "instances")
        mig_instances = tuple(instances)

    processes = []
    for p in r.items("processes"):
        mig_instance: int | None = None
        if p.has("mig_instance"):
            mig_instance = p.integer("mig_instance")
            if mig_instances is None or mig_instance >= len(mig_instances):
                raise p.fail("names no MIG instance of this GPU", "mig_instance")
        kind = p.string("type", "compute")
        if kind not in ("compute", "graphics"):
            raise p.fail(f"must be compute or graphics, got {kind!r}", "type")
        processes.append(p.done(ProcessSpec(
            pid=p.integer("pid", lo=1), name=p.string("name"), memory_gib=p.number("memory_gib", 0.0),
            sm_utilization=p.ratio("sm_utilization") if p.has("sm_utilization") else None,
            memory_utilization=p.ratio("memory_utilization") if p.has("memory_utilization") else None,
            graphics=kind == "graphics", mig_instance=mig_instance,
        )))
    if mig_instances is not None and any(p.mig_instance is None for p in processes):
        raise r.fail("on a MIG GPU every process needs mig_instance", "processes")

    reserved = r.number("memory_reserved_gib", 0.5)
    used = r.number("memory_used_gib", sum(p.memory_gib for p in processes) if mig_instances is None
                    else sum(inst.memory_used_gib for inst in mig_instances))
    if used + reserved > memory_gib:
        raise r.fail(f"{used:g} GiB plus {reserved:g} GiB reserved exceeds memory_gib {memory_gib:g}",
                     "memory_used_gib")
    if mig_instances is None and sum(p.memory_gib for p in processes) > used:
        raise r.fail("the processes' memory_gib add up to more than memory_used_gib", "processes")

    reasons: tuple[str, ...] | None = None
    if r.has("clock_event_reasons"):
        raw = r.raw("clock_event_reasons")
        if not isinstance(raw, list) or any(x not in CLOCK_EVENT_REASONS for x in raw):
            raise r.fail(f"must be a list of {', '.join(CLOCK_EVENT_REASONS)}, got {_show(raw)}",
                         "clock_event_reasons")
        reasons = tuple(raw)

    pcie = r.child("pcie", r.raw("pcie", {}))
    pcie_tx = pcie.level("tx_mib_s", Level(5.0, 400.0))
    pcie_rx = pcie.level("rx_mib_s", Level(5.0, 1200.0))
    pcie.finish()

    gpm_value = r.raw("gpm", {})
    gpm_supported = ARCHITECTURES[architecture] >= ARCHITECTURES["hopper"]
    if isinstance(gpm_value, bool):
        if gpm_value and not gpm_supported:
            raise r.fail(f"GPM needs hopper or newer, this GPU is {architecture}", "gpm")
        gpm_supported, gpm_value = gpm_value, {}
    if not isinstance(gpm_value, dict):
        raise r.fail(f"must be false, true or a mapping {{occupancy_factor, tensor_factor}}, got {_show(gpm_value)}",
                     "gpm")
    gpm = r.child("gpm", gpm_value)
    occupancy_factor = gpm.ratio("occupancy_factor", 0.5)
    tensor_factor = gpm.ratio("tensor_factor", 0.7)
    gpm.finish()

    xids = [x.done(XidEvent(at=x.number("at"), xid=x.integer("xid", lo=1))) for x in r.items("xid_events")]
    faults = []
    for f in r.items("faults"):
        kind = f.string("kind")
        if kind not in FAULT_KINDS:
            raise f.fail(f"must be one of {', '.join(FAULT_KINDS)}, got {kind!r}", "kind")
        function = f.string("function") if kind == "not_supported" else None
        if kind == "lost" and f.has("function"):
            raise f.fail("only applies to kind not_supported", "function")
        if function is not None and not function.startswith("nvml"):
            raise f.fail(f"must be an NVML C function name such as nvmlDeviceGetPowerUsage, got {function!r}",
                         "function")
        at = f.number("at", 0.0)
        until = f.number("until") if f.has("until") else None
        if until is not None and until <= at:
            raise f.fail("must be later than at", "until")
        faults.append(f.done(Fault(at=at, until=until, kind=kind, function=function)))

    limit = r.number("power_limit_watts", 400.0)
    return r.done(GpuSpec(
        index=index, name=name, architecture=architecture, memory_gib=memory_gib, uuid=uuid,
        pci_bus_id=pci_bus_id.upper().replace("X", "x"), utilization=utilization,
        memory_utilization=memory_utilization, memory_used_gib=used, memory_reserved_gib=reserved,
        power_watts=r.level("power_watts", Level(0.15 * limit, 0.9 * limit)), power_limit_watts=limit,
        temperature_celsius=r.level("temperature_celsius", Level(33.0, 72.0)),
        sm_clock_mhz=r.level("sm_clock_mhz", Level(345.0, 1755.0)),
        memory_clock_mhz=r.level("memory_clock_mhz", Level(1593.0, 1593.0)),
        fan_percent=r.level("fan_percent", None),
        pcie_tx_mib_s=pcie_tx, pcie_rx_mib_s=pcie_rx,
        clock_event_reasons=reasons, processes=tuple(processes), mig_instances=mig_instances,
        device=r.boolean("device", False), follow_training=r.boolean("follow_training", False),
        busy_utilization=r.ratio("busy_utilization", 0.95), idle_utilization=r.ratio("idle_utilization", 0.01),
        gpm=gpm_supported, gpm_occupancy_factor=occupancy_factor, gpm_tensor_factor=tensor_factor,
        xid_events=tuple(xids), faults=tuple(faults),
    ))


def parse_scenario(data: Any, source: str) -> Scenario:
    """Validate a parsed YAML document; ``source`` names it in error messages.

    >>> parse_scenario({"gpus": [{"name": "T4", "architecture": "turing", "memory_gib": 16}]}, "x").gpus[0].uuid[:4]
    'GPU-'
    """
    top = _Reader(source, "", {} if data is None else data)
    top.finish("seed", "driver_missing", "gpus", "cuda_version", "driver_version", "dcgm_pipe_fields")
    seed = top.integer("seed", 0)
    driver_missing = top.boolean("driver_missing", False)
    gpus = tuple(_parse_gpu(g, i, seed) for i, g in enumerate(top.items("gpus")))
    if not gpus and not driver_missing:
        raise top.fail("must list at least one GPU (or set driver_missing: true)", "gpus")
    for key in ("uuid", "pci_bus_id"):
        seen = [getattr(g, key) for g in gpus]
        if len(set(seen)) != len(seen):
            raise top.fail(f"two GPUs share the same {key}", "gpus")
    names: dict[int, str] = {}
    for g in gpus:
        for p in g.processes:
            if names.setdefault(p.pid, p.name) != p.name:
                raise top.fail(f"pid {p.pid} has two different names", "gpus")
    cuda = top.string("cuda_version", "12.4")
    if not re.fullmatch(r"\d+\.\d+", cuda):
        raise top.fail(f"must look like 12.4, got {cuda!r}", "cuda_version")
    return top.done(Scenario(source=source, gpus=gpus, driver_version=top.string("driver_version", "550.54.15"),
                             cuda_version=cuda, driver_missing=driver_missing,
                             dcgm_pipe_fields=top.boolean("dcgm_pipe_fields", False)))


def packaged_scenarios() -> list[str]:
    """The names of the scenarios shipped in the package (the ``scenarios`` directory), sorted.

    >>> "default" in packaged_scenarios() and "launch-bound" in packaged_scenarios()
    True
    """
    return sorted(p.stem for p in DEFAULT_SCENARIO.parent.glob("*.yaml"))


def load_scenario(path: str | Path | None) -> Scenario:
    """Load and validate a scenario file; None loads the packaged default (4 GPUs).

    A bare name that is not an existing file ("bursty" or "bursty.yaml") names a packaged scenario.

    >>> len(load_scenario(None).gpus)
    4
    >>> len(load_scenario("eight_gpus").gpus)
    8
    """
    file = DEFAULT_SCENARIO if path is None else Path(path)
    if not file.exists() and file.parent == Path("."):
        packaged = DEFAULT_SCENARIO.parent / (file.name if file.suffix == ".yaml" else f"{file.name}.yaml")
        if packaged.is_file():
            file = packaged
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        hint = (f"; packaged scenarios: {', '.join(packaged_scenarios())}"
                if path is not None and Path(path).parent == Path(".") else "")
        raise ScenarioError(f"{file}: cannot read the scenario file: {exc.strerror or exc}{hint}") from None
    try:
        data = yamlfile.parse(text, str(file))
    except yamlfile.YamlError as exc:
        raise ScenarioError(str(exc)) from None
    return parse_scenario(data, str(file))
