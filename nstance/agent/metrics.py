"""CPU and memory usage of the machine, read from ``/proc/stat`` and ``/proc/meminfo`` (Linux).

Responsible for parsing those files (pure functions over their text) and for turning two CPU samples
into percentages. ``MetricsReader`` keeps the previous sample so each report covers the time since the
last one. Off Linux the figures are simply absent. No third-party libraries (psutil is not used).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Jiffies spent busy and in total, for one CPU line of /proc/stat."""

    busy: int
    total: int


@dataclass(frozen=True, slots=True)
class CpuSample:
    overall: CpuTimes
    cores: tuple[CpuTimes, ...]


@dataclass(frozen=True, slots=True)
class Usage:
    """Usage figures for one report; None or empty means not measured."""

    cpu_usage: float | None = None
    cpu_core_usage: tuple[float, ...] = ()
    memory_usage: float | None = None


def _times(fields: list[str]) -> CpuTimes:
    values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
    values += [0] * (8 - len(values))
    idle = values[3] + values[4]
    total = sum(values)
    return CpuTimes(busy=total - idle, total=total)


def parse_proc_stat(text: str) -> CpuSample:
    """Parse /proc/stat; ValueError when it has no aggregate ``cpu`` line."""
    overall: CpuTimes | None = None
    cores: list[CpuTimes] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu"):
            continue
        if parts[0] == "cpu":
            overall = _times(parts[1:])
        else:
            cores.append(_times(parts[1:]))
    if overall is None:
        raise ValueError("/proc/stat has no 'cpu' line")
    return CpuSample(overall=overall, cores=tuple(cores))


def percent(before: CpuTimes | None, after: CpuTimes) -> float:
    """Busy percentage between two samples (since boot when ``before`` is None or equal)."""
    if before is not None and after.total > before.total:
        busy, total = after.busy - before.busy, after.total - before.total
    else:
        busy, total = after.busy, after.total
    if total <= 0:
        return 0.0
    return round(max(0.0, min(100.0, 100.0 * busy / total)), 2)


def cpu_usage(before: CpuSample | None, after: CpuSample) -> tuple[float, tuple[float, ...]]:
    """Overall and per-core busy percentages between two samples."""
    overall = percent(before.overall if before else None, after.overall)
    cores = tuple(
        percent(before.cores[i] if before and i < len(before.cores) else None, core)
        for i, core in enumerate(after.cores)
    )
    return overall, cores


def parse_meminfo(text: str) -> float:
    """Used memory in percent: ``(MemTotal - MemAvailable) / MemTotal``; ValueError if absent."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[name.strip()] = int(parts[0])
    total = values.get("MemTotal", 0)
    if total <= 0 or "MemAvailable" not in values:
        raise ValueError("/proc/meminfo lacks MemTotal or MemAvailable")
    return round(100.0 * (total - values["MemAvailable"]) / total, 2)


@dataclass(slots=True)
class MetricsReader:
    """Reads usage at report time; remembers the last CPU sample."""

    proc: Path = Path("/proc")
    _last: CpuSample | None = field(default=None, init=False)

    def prime(self) -> None:
        """Take a first CPU sample so the first report covers the time since now."""
        self._last = self._sample()

    def _sample(self) -> CpuSample | None:
        try:
            return parse_proc_stat((self.proc / "stat").read_text())
        except (OSError, ValueError):
            return None

    def read(self) -> Usage:
        sample = self._sample()
        overall: float | None = None
        cores: tuple[float, ...] = ()
        if sample is not None:
            overall, cores = cpu_usage(self._last, sample)
            self._last = sample
        try:
            memory: float | None = parse_meminfo((self.proc / "meminfo").read_text())
        except (OSError, ValueError):
            memory = None
        return Usage(cpu_usage=overall, cpu_core_usage=cores, memory_usage=memory)
