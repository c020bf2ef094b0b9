"""Health reports: what each report carries (metrics, files, notice, hash), numbering and uptime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nstance import __version__
from nstance.agent.config import AgentConfig
from nstance.agent.files import Delivery, FileReceiver, FileState
from nstance.agent.health import ReportInputs, build_report, format_uptime
from nstance.agent.identity import nonce_config_hash
from nstance.agent.metrics import MetricsReader, Usage, cpu_usage, parse_meminfo, parse_proc_stat
from nstance.agent.state import AgentState, TerminationNotice
from nstance.agent.streams import HealthReporter
from nstance.core.clock import ManualClock
from nstance.pki.keys import generate_private_key
from nstance.pki.nonce import agent_nonce_claims, sign_nonce

STAT_1 = (
    "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0 0 0\ncpu1 50 0 50 400 0 0 0 0 0 0\nintr 1\n"
)
STAT_2 = "cpu  200 0 200 1000 0 0 0 0 0 0\ncpu0 150 0 100 450 0 0 0 0 0 0\ncpu1 50 0 100 550 0 0 0 0 0 0\n"
MEMINFO = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n"


def test_cpu_and_memory_from_proc_text() -> None:
    overall, cores = cpu_usage(parse_proc_stat(STAT_1), parse_proc_stat(STAT_2))
    assert overall == 50.0  # 200 busy of 400 jiffies
    assert cores == (75.0, 25.0)
    first, _ = cpu_usage(None, parse_proc_stat(STAT_1))
    assert first == 20.0  # since boot
    assert parse_meminfo(MEMINFO) == 75.0
    with pytest.raises(ValueError, match="MemAvailable"):
        parse_meminfo("MemTotal: 10 kB\n")


def test_metrics_reader_uses_the_previous_sample(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text(STAT_1)
    (tmp_path / "meminfo").write_text(MEMINFO)
    reader = MetricsReader(proc=tmp_path)
    reader.prime()
    (tmp_path / "stat").write_text(STAT_2)
    usage = reader.read()
    assert usage == Usage(cpu_usage=50.0, cpu_core_usage=(75.0, 25.0), memory_usage=75.0)
    assert MetricsReader(proc=tmp_path / "missing").read() == Usage()


def test_report_carries_everything() -> None:
    now = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    deadline = now + timedelta(minutes=2)
    report = build_report(
        ReportInputs(
            instance_id="web-1",
            now=now,
            count=7,
            uptime=timedelta(hours=1, minutes=2, seconds=3.9),
            usage=Usage(cpu_usage=12.5, cpu_core_usage=(10.0, 15.0), memory_usage=40.0),
            files={
                "a.crt": FileState(last_modified=now),
                "../x": FileState(error="bad name"),
                "gone.txt": FileState(),
            },
            termination_notice=TerminationNotice("terminate", deadline),
            config_hash="h9",
        )
    )
    assert (report.version, report.instance_id, report.count) == (__version__, "web-1", 7)
    assert report.timestamp.ToDatetime(tzinfo=UTC) == now
    assert report.uptime == "1h2m3s"
    assert report.metrics.cpu_usage == 12.5
    assert list(report.metrics.cpu_core_usage) == [10.0, 15.0]
    assert report.metrics.memory_usage == 40.0
    assert report.files["a.crt"].last_modified.ToDatetime(tzinfo=UTC) == now
    assert report.files["../x"].error == "bad name"
    assert report.files["gone.txt"].WhichOneof("status") is None
    assert report.termination_notice.action == "terminate"
    assert report.termination_notice.deadline.ToDatetime(tzinfo=UTC) == deadline
    assert report.config_hash == "h9"


def test_unmeasured_metrics_stay_unset() -> None:
    report = build_report(
        ReportInputs("i", datetime(2026, 1, 1, tzinfo=UTC), 1, timedelta(0), Usage(), {}, None, "")
    )
    assert report.HasField("metrics")
    assert not report.metrics.HasField("cpu_usage")
    assert not report.metrics.HasField("memory_usage")
    assert not report.HasField("termination_notice")
    assert format_uptime(timedelta(seconds=0.4)) == "0s"


def test_reporter_numbers_reports_and_switches_from_nonce_hash_to_committed_hash(tmp_path: Path) -> None:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    claims = agent_nonce_claims(
        instance_id="web-1",
        cluster_id="c",
        shard="s",
        group="g",
        tenant="t",
        config_hash="from-nonce",
        clock=clock,
    )
    nonce = sign_nonce(generate_private_key("ed25519"), claims)  # type: ignore[arg-type]
    assert nonce_config_hash(nonce) == "from-nonce"
    assert nonce_config_hash("not.a-jwt") == ""
    config = AgentConfig(
        instance_id="web-1",
        registration_addr="x:1",
        agent_addr="x:2",
        identity_dir=tmp_path / "identity",
        keys_dir=tmp_path / "keys",
        recv_dir=tmp_path / "recv",
    )
    state = AgentState()
    receiver = FileReceiver(config.recv_dir, config.config_hash_path)
    reporter = HealthReporter(
        config, state, receiver, clock=clock, nonce=nonce, metrics=MetricsReader(tmp_path)
    )

    first = reporter.next_report()
    clock.advance(65)
    receiver.receive(Delivery("a.txt", b"1"))
    receiver.receive(Delivery("", config_hash="committed"))
    state.termination_notice = TerminationNotice("stop")
    second = reporter.next_report()
    third = reporter.next_report()

    assert (first.count, second.count, third.count) == (1, 2, 3)
    assert first.config_hash == "from-nonce"
    assert second.config_hash == "committed"
    assert first.uptime == "0s"
    assert second.uptime == "1m5s"
    assert "a.txt" not in first.files
    assert second.files["a.txt"].HasField("last_modified")
    assert not first.HasField("termination_notice")
    assert second.termination_notice.action == third.termination_notice.action == "stop"
