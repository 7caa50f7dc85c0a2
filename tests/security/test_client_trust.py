"""A fake arbiter of another user's: the client asks the kernel who listens before it sends.

bob binds a UNIX socket where an arbiter's would be (a shared, sticky directory) and records
every byte; root's client must refuse it, naming bob's uid, and send nothing.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from krex_lab.client import Connection
from krex_lab.connection import fetch_ticket
from krex_lab.errors import PermissionDenied

from .users import User

LISTENER = r"""
import os, socket, sys
path, log = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o777)
s.listen(16)
open(log + ".ready", "w").close()
while True:
    c, _ = s.accept()
    c.settimeout(0.5)
    try:
        data = c.recv(65536)
    except OSError:
        data = b""
    with open(log, "ab") as f:
        f.write(data)
    c.close()
"""


def test_a_fake_arbiter_of_another_user_gets_nothing(bob: User) -> None:
    shared = Path(tempfile.mkdtemp(prefix="krex-shared-"))
    os.chmod(shared, 0o1777)
    sock, log = shared / "arbiter.sock", shared / "bob.log"
    log.touch()
    os.chown(log, bob.uid, bob.gid)
    proc = subprocess.Popen(
        ["/usr/bin/python3", "-c", LISTENER, str(sock), str(log)], user=bob.uid, group=bob.gid, extra_groups=[], cwd="/"
    )
    try:
        deadline = time.monotonic() + 10
        while not Path(str(log) + ".ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "bob's listener did not start"
            time.sleep(0.02)
        with pytest.raises(PermissionDenied, match=f"served by uid {bob.uid}"):
            Connection(f"ipc://{sock}")
        with pytest.raises(PermissionDenied, match=f"served by uid {bob.uid}"):
            fetch_ticket(str(sock))
        time.sleep(0.6)  # bob's listener reads for 0.5 s per connection: give it its chance
        assert log.read_bytes() == b"", "nothing reaches another user's listener"
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["rm", "-rf", str(shared)], check=False)
