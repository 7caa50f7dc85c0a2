"""Quotas reload on SIGHUP: an edited config file applies without restarting the arbiter (which
would end every region and session); a broken edit is reported and the earlier quotas stay."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from krex_lab import protocol
from krex_lab.client import Session
from krex_lab.node_status import format_table
from krex_lab.pytest_plugin import ArbiterProc, wait_for


def test_sighup_reloads_the_quotas_without_a_restart(tmp_path: Path) -> None:
    config = tmp_path / "krex_config.py"
    config.write_text("c = get_config()  # noqa\nc.Quotas.max_hold = 20.0\n")
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    arb = ArbiterProc(runtime, gpus=1, extra=("--config", str(config))).start()
    try:
        assert arb.proc is not None
        session = Session(gpu=0, name="kept", endpoint=arb.endpoint)
        try:
            started = arb.status()["arbiter"]["started"]
            assert arb.status()["arbiter"]["quotas"] == ""
            config.write_text("c = get_config()  # noqa\nc.Quotas.max_hold = 30.0\nc.Quotas.queued_per_user = 2\n")
            os.kill(arb.proc.pid, signal.SIGHUP)
            wait_for(lambda: arb.status()["arbiter"]["quotas"] != "", 10, 0.05)
            note = arb.status()["arbiter"]["quotas"]
            assert note.startswith(f"reloaded from {config} at ") and "max_hold, queued_per_user" in note, note
            assert f"  quotas: {note}" in format_table(arb.status()).splitlines()
            assert "quotas reloaded from" in arb.output(), "and the log says it"
            # the same arbiter, and its sessions are still registered
            assert arb.status()["arbiter"]["started"] == started and arb.proc.poll() is None
            assert session.id in [s["id"] for s in arb.status()["gpus"][0]["sessions"]]
            if os.geteuid() != 0:  # root is exempt from quotas; another user's lease is capped at 30 s
                report = session.call(protocol.Acquire(gpu=0, max_hold=60, freeze=False, isolate=False))
                assert report.report["max_hold_s"] == 30 and report.report["max_hold_asked_s"] == 60
                session.call(protocol.Release(region=report.region))
            # a broken edit: said so, nothing changes, the arbiter serves on
            config.write_text("c = get_config()  # noqa\nc.Quotas.max_hold = \n")
            os.kill(arb.proc.pid, signal.SIGHUP)
            wait_for(lambda: "failed" in arb.status()["arbiter"]["quotas"], 10, 0.05)
            assert "the earlier quotas stay" in arb.status()["arbiter"]["quotas"]
            assert arb.proc.poll() is None
        finally:
            session.close()
    finally:
        arb.stop()
