"""Fault-injection session processes for the tests (real processes, real signals).

python -m tests.procs.session sibling GPU [--child] [--forker] [--sleep] [--also-gpu G]
        [--slow-drain S] [--child-session]
    attach to GPU, optionally start a busy child (or keep forking children), then spin
    (or sleep); prints "ready" when registered. --also-gpu: a second session, on GPU G;
    --slow-drain: answer a drain S seconds late; --child-session: start a child that is a
    session of its own on GPU (sleeping, answering drains 0.3 s late) first.
python -m tests.procs.session holder GPU [--max-hold S] [--hold S] [--regions N] [--linger] [--cores N]
    attach, take a region, print "granted <json report>", hold for S seconds (forever if
    not given), release, print "released <json report>"; N regions back to back (then, with
    --linger, stay alive to be looked at).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import krex_lab
import krex_lab.client


def spin() -> None:
    while True:
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["sibling", "holder"])
    p.add_argument("gpu", type=int)
    p.add_argument("--child", action="store_true")
    p.add_argument("--forker", action="store_true")
    p.add_argument("--sleep", action="store_true")
    p.add_argument("--no-control", action="store_true")
    p.add_argument("--max-hold", type=float, default=None)
    p.add_argument("--hold", type=float, default=None)
    p.add_argument("--no-freeze", action="store_true")
    p.add_argument("--regions", type=int, default=1)
    p.add_argument("--linger", action="store_true")
    p.add_argument("--cores", type=int, default=None)
    p.add_argument("--also-gpu", type=int, default=None)
    p.add_argument("--slow-drain", type=float, default=0.0)
    p.add_argument("--child-session", action="store_true")
    args = p.parse_args()
    if args.no_control:
        krex_lab.client.Session(gpu=args.gpu, control=False)
    else:
        session = krex_lab.attach(gpu=args.gpu, name=f"test-{args.mode}")
        if args.slow_drain:
            session.drain_hooks.append(lambda: time.sleep(args.slow_drain))
        if args.also_gpu is not None:
            krex_lab.attach(gpu=args.also_gpu)
    if args.mode == "sibling":
        if args.child_session:
            again = [sys.executable, "-m", "tests.procs.session", "sibling", str(args.gpu), "--sleep"]
            child = subprocess.Popen(
                [*again, "--slow-drain", "0.3"],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert child.stdout is not None and child.stdout.readline().startswith("ready")
        if args.child:
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
        print("ready", flush=True)  # (once any child session is registered too)
        if args.forker:
            while True:
                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
                time.sleep(0.01)
        if args.sleep:
            while True:
                time.sleep(3600)
        spin()
    for _ in range(args.regions):
        region = krex_lab.exclusive(gpu=args.gpu, max_hold=args.max_hold, freeze=not args.no_freeze, cores=args.cores)
        try:
            with region:
                print("granted", json.dumps({**region.report.to_dict(), "t": time.time()}), flush=True)
                if args.hold is None:
                    while True:
                        time.sleep(3600)
                time.sleep(args.hold)
                t_end = time.time()
        except krex_lab.LeaseExpired as exc:
            print("expired", json.dumps({**region.report.to_dict(), "error": str(exc)}), flush=True)
            return
        print("released", json.dumps({**region.report.to_dict(), "t_end": t_end}), flush=True)
    while args.linger:
        time.sleep(3600)


if __name__ == "__main__":
    main()
