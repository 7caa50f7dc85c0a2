"""A field added to the region report is added in one file: in a scratch copy of the package,
one new line in ``region_report.py`` carries the field over the wire, into the history
database (an existing file gets its column), into what other users may see (it is marked
public) and into the field reference; every other file of the copy is unchanged."""

from __future__ import annotations

import difflib
import filecmp
import shutil
import subprocess
import sys
from pathlib import Path

import krex_lab

PACKAGE = Path(krex_lab.__file__).parent
ANCHOR = "    # -- wall-clock times, set when the region ends"
NEW_FIELD = '    gpu_model: Annotated[str, Meta(description="the GPU\'s model name", extra=_PUB)] = ""\n'

CHECK = r"""
import sys, time
from pathlib import Path
import krex_lab
assert krex_lab.__file__.startswith(sys.argv[1]), krex_lab.__file__
from krex_lab import protocol
from krex_lab.arbiter.history import RegionHistory
from krex_lab.arbiter.privacy import report_view
from krex_lab.region_report import RegionReport, reference

report = RegionReport(region="r1", gpu=0, uid=1000, user="alice", holder_pid=42, acquire_s=0.001,
                      hold_s=1.0, released_at=time.time(), gpu_model="H200")
# the wire: a Granted reply and a Release reply, encoded and decoded as the client does
for request, result in ((protocol.Acquire(), protocol.Granted(region="r1", gpu=0, report=report)),
                        (protocol.Release(region="r1"), report)):
    reply = protocol.decode_incoming(protocol.encode(protocol.Reply(id=1, result=result)))
    got = protocol.result_as(request, reply.result)
    assert (got.report if isinstance(got, protocol.Granted) else got).gpu_model == "H200", got
# the history: a new file, and the previous release's file (its column is added when opened)
for path in (Path(sys.argv[2]) / "new.sqlite", Path(sys.argv[2]) / "history.sqlite"):
    db = RegionHistory(path).open()
    assert db.add(report) and db.flush()
    assert db.recent(1)[0]["gpu_model"] == "H200", db.recent(1)
    db.close()
# privacy: public, so another user sees it (and still not the pid)
other = report_view(report, 1001)
assert other["gpu_model"] == "H200" and "holder_pid" not in other, other
assert "| `gpu_model` | `str` |  | yes | the GPU's model name |" in reference()
print("ok")
"""


def test_a_new_report_field_flows_through_wire_history_and_privacy(tmp_path: Path) -> None:
    scratch = tmp_path / "src"
    shutil.copytree(PACKAGE, scratch / "krex_lab", ignore=shutil.ignore_patterns("__pycache__"))
    module = scratch / "krex_lab" / "region_report.py"
    before = module.read_text()
    assert before.count(ANCHOR) == 1
    module.write_text(before.replace(ANCHOR, NEW_FIELD + ANCHOR))

    diff = list(difflib.unified_diff(before.splitlines(), module.read_text().splitlines(), lineterm="", n=0))
    added = [d for d in diff if d.startswith("+") and not d.startswith("+++")]
    removed = [d for d in diff if d.startswith("-") and not d.startswith("---")]
    assert (len(added), len(removed)) == (1, 0), diff
    changed = _changed_files(PACKAGE, scratch / "krex_lab")
    assert changed == ["region_report.py"], changed

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    old = state / "history.sqlite"
    shutil.copyfile(Path(__file__).parent / "arbiter" / "data" / "history-v1.sqlite", old)
    old.chmod(0o600)
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(scratch), str(state)],
        env={"PYTHONPATH": str(scratch), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def _changed_files(a: Path, b: Path) -> list[str]:
    """Files that differ between two package trees (byte for byte), relative to their roots."""
    changed = []
    for path in sorted(a.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        other = b / path.relative_to(a)
        if not other.is_file() or not filecmp.cmp(path, other, shallow=False):
            changed.append(str(path.relative_to(a)))
    return changed
