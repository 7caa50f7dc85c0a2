"""CUDA child processes for the arbiter-level GPU tests (torch). One line of output per event.

    python -m tests.gpu.procs_cuda victim [--attach GPU] [--autostart] [--duration S] [--prefix P]
    python -m tests.gpu.procs_cuda holder GPU [--max-hold S] [--spawn-child S]

Every timestamp is ``time.time()``: one clock for every process of the machine.

**victim** creates a CUDA context and prints ``ctx T``. With ``--autostart`` it starts its loop
at once; otherwise it warms up (8192² fp32 matmuls), attaches as a KREX session if
``--attach`` is given, prints ``ready ONE_MATMUL_S SESSION_ID|-`` and waits for one command:

* ``work S``: enqueue about S seconds of matmuls between two timing events, *without*
  synchronising, and print ``queued T0 TQ REPS``. T0 is taken on an idle GPU (synchronised just
  before) immediately before the start event is recorded, so ``T0 + elapsed`` (``elapsed`` being
  the events' own GPU measurement) is when the queued work finished, to within the launch
  latency of one event (microseconds), and no host stall (lock, SIGSTOP) can bias it.
* ``loop``: start the loop directly.

The loop: a tiny CUDA op plus a synchronize, then ``tick TB TA`` (time before the op, time
after the synchronize), then about 10 ms of waiting for commands: ``report`` prints
``elapsed E`` (seconds between the two events of ``work``, ``nan`` without work), ``quit``
ends. The first tick after ``work`` waits for the queued matmuls. While the process is locked
by the driver, the op blocks (holding the GIL: torch does not release it around launches), so
no tick can be printed. With ``--duration S`` the loop ignores stdin, ends after S seconds and
prints ``done T``. ``--prefix`` is put before every word (``child-tick``...).

**holder** attaches (no CUDA of its own), prints ``ready PID``, waits for ``acquire``, takes a
region and prints ``granted {json}`` (the report plus ``t_req``, just before the request, and
``t``, when the grant arrived). With ``--spawn-child S`` it then starts a CUDA victim of its
own (``--autostart --duration S --prefix child-``, printing through this process's stdout) and
prints ``child PID``. It waits for ``release`` and prints ``released {json}`` (the final report
plus ``t_rel0``, just before the release request, and ``t_rel1``, when it returned), then
waits for ``quit`` or EOF.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time

PERIOD_S = 0.01
N = 8192


def out(*fields: object) -> None:
    print(*fields, flush=True)


class Commands:
    """Lines from stdin, read with select + os.read (a buffered reader could hide lines from select)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.buf = b""
        self.eof = False
        self.waiting: list[str] = []  # read by poll() but not yet taken by wait_line()

    def poll(self, timeout: float) -> list[str]:
        """Complete lines that arrived within ``timeout`` (``quit`` at EOF)."""
        lines, self.waiting = self.waiting, []
        if lines:
            return lines
        if not self.enabled or self.eof:
            time.sleep(timeout)
            return ["quit"] if self.eof else []
        r, _, _ = select.select([0], [], [], timeout)
        if r:
            data = os.read(0, 4096)
            if not data:
                self.eof = True
            self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if line.strip():
                lines.append(line.decode().strip())
        if self.eof and not lines:
            lines.append("quit")
        return lines

    def wait_line(self) -> str:
        while True:
            lines = self.poll(1.0)
            if lines:
                self.waiting = lines[1:]
                return lines[0]


def victim(args: argparse.Namespace) -> None:
    import torch

    p = args.prefix
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    out(f"{p}ctx", f"{time.time():.6f}")
    cmds = Commands(enabled=args.duration is None)
    start = end = None
    if not args.autostart:
        session_id = "-"
        if args.attach is not None:
            import krex_lab

            session_id = krex_lab.attach(gpu=args.attach, name="gpu-test-victim").id
        a = torch.randn(N, N, device="cuda")
        b = torch.randn_like(a)
        c = torch.empty_like(a)
        torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(3):
            torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        one = (time.perf_counter() - t) / 3
        out(f"{p}ready", f"{one:.6f}", session_id)
        cmd = cmds.wait_line().split()
        if cmd[0] == "quit":
            return
        if cmd[0] == "work":
            reps = max(1, round(float(cmd[1]) / one))
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()  # the GPU is idle: the start event runs as soon as it is recorded
            t0 = time.time()
            start.record()
            for _ in range(reps):
                torch.mm(a, b, out=c)
            end.record()
            tq = time.time()
            out(f"{p}queued", f"{t0:.6f}", f"{tq:.6f}", reps)
    deadline = None if args.duration is None else time.monotonic() + args.duration
    while True:
        tb = time.time()
        x.add_(1)
        torch.cuda.synchronize()
        ta = time.time()
        out(f"{p}tick", f"{tb:.6f}", f"{ta:.6f}")
        if deadline is not None and time.monotonic() >= deadline:
            out(f"{p}done", f"{time.time():.6f}")
            return
        for line in cmds.poll(PERIOD_S):
            if line == "report":
                if start is None or end is None:
                    out(f"{p}elapsed", "nan")
                else:
                    end.synchronize()
                    out(f"{p}elapsed", f"{start.elapsed_time(end) / 1e3:.6f}")
            elif line == "quit":
                return


def holder(args: argparse.Namespace) -> None:
    import krex_lab

    krex_lab.attach(gpu=args.gpu, name="gpu-test-holder")
    out("ready", os.getpid())
    cmds = Commands()
    while (line := cmds.wait_line()) != "acquire":
        if line == "quit":
            return
    region = krex_lab.exclusive(gpu=args.gpu, max_hold=args.max_hold)
    t_req = time.time()
    region.acquire()
    t = time.time()
    out("granted", json.dumps({**region.report.to_dict(), "t_req": t_req, "t": t}))
    child = None
    if args.spawn_child is not None:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.gpu.procs_cuda",
                "victim",
                "--autostart",
                "--duration",
                str(args.spawn_child),
                "--prefix",
                "child-",
            ],
            stdin=subprocess.DEVNULL,
        )
        out("child", child.pid)
    while cmds.wait_line() not in ("release", "quit"):
        pass
    t_rel0 = time.time()
    report = region.release()
    t_rel1 = time.time()
    out("released", json.dumps({**report.to_dict(), "t_rel0": t_rel0, "t_rel1": t_rel1}))
    cmds.wait_line()
    if child is not None and child.poll() is None:
        child.kill()


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    v = sub.add_parser("victim")
    v.add_argument("--attach", type=int, default=None, help="register as a KREX session on this GPU")
    v.add_argument("--autostart", action="store_true", help="loop right after the context exists")
    v.add_argument("--duration", type=float, default=None, help="loop this long, ignoring stdin")
    v.add_argument("--prefix", default="")
    h = sub.add_parser("holder")
    h.add_argument("gpu", type=int)
    h.add_argument("--max-hold", type=float, default=None)
    h.add_argument("--spawn-child", type=float, default=None, metavar="S")
    args = ap.parse_args()
    victim(args) if args.mode == "victim" else holder(args)


if __name__ == "__main__":
    main()
