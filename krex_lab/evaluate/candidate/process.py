"""The candidate's process: thin, one-shot, and believed in nothing.

Forked from the zygote (:mod:`.zygote`) as a *spare*: it makes its CUDA context while idle, says
``ready``, and then serves exactly one candidate, message by message (:mod:`..channel`):

* ``calibrate``: a round of the timing harness on a no-op, in a spare no candidate code has run in
  (the judge's calibration twin): what the harness itself costs, which the judge subtracts;
* ``load``: limits set (host memory, output file size), fd 1 and 2 into the candidate's output
  file, the candidate compiled and imported, its model built;
* ``call``: the candidate once on the judge's shared inputs, its return value copied into the
  output buffers the judge handed with them (:mod:`.outputs`);
* ``round``: a round of timed calls, one per input set; the sets come with the round, each in
  memory of its own that the candidate had never seen; each call is timed in-process by the
  format's method (an event pair on a GPU, after KernelBench's and GPU MODE's L2 thrash; the host
  clock on a CPU), and its value lands in the judge's buffers for that set before the round ends;
* ``quit``.

Nothing here is trusted: the candidate may patch any of it in its own process. The judge checks
what arrives (outputs against its reference, times against its own clock) and kills this process,
and everything it started, when the evaluation ends.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import threading
import time
import traceback
import types
from typing import Any

from ..channel import Channel, ChannelError, decode_tree, open_arrays, spans
from ..messages import (
    REQUESTS,
    Calibrate,
    Calibrated,
    Call,
    CallAgain,
    CallEntry,
    Confine,
    Confined,
    Drop,
    Failed,
    Load,
    Loaded,
    Ok,
    Ready,
    Release,
    Returned,
    Round,
    Timed,
)
from .outputs import deliver

#: what KernelBench's and GPU MODE's timing write before every timed call to thrash the L2 cache
#: (their ``clear_l2_cache``: 32 x 1024 x 1024 int64, 256 MiB)
L2_FLUSH_SHAPE = (32, 1024, 1024)

__all__ = ["serve"]


def _sync() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


_PAGE = os.sysconf("SC_PAGE_SIZE")
_byte = ctypes.c_char.from_address


def _read_pages(addr: int, size: int) -> None:
    """A byte of every page of ``[addr, addr + size)``: one a page from ``addr`` on, and the last
    (a span that starts inside a page ends inside one that the stride steps over)."""
    if size <= 16 * _PAGE:  # a few pages: a byte each (a buffer object costs more)
        for a in range(addr, addr + size, _PAGE):
            _byte(a).value  # noqa: B018 (the read is the point)
    else:
        bytes(memoryview((ctypes.c_char * size).from_address(addr)).cast("B")[::_PAGE])
    _byte(addr + size - 1).value  # noqa: B018


def _fit_threads() -> None:
    """On a CPU, torch's work in one thread while timed: the judge's figure there is the CPU time
    of every thread of the candidate's (threads only add to it), and the reference is timed in one
    thread too. The candidate may set its own; it is its CPU time that counts."""
    torch = sys.modules.get("torch")
    if torch is None or torch.cuda.is_available():
        return
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def _cuda() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


class Candidate:
    def __init__(self, chan: Channel, device: str) -> None:
        self.chan = chan
        self.device = device
        self.fn: Any = None
        #: the calibration's no-op value, by the output's shapes (the twin's only)
        self.outputs: tuple[list[Any], list[Any]] | None = None
        #: the input sets of the round: (arguments, output buffers, spans of the inputs' memory)
        self.sets: dict[int, tuple[Any, list[Any], list[tuple[int, int, int]]]] = {}
        self.call: tuple[Any, list[Any], list[tuple[int, int, int]]] = ((), [], [])
        self.threads_before = set(threading.enumerate())
        self.filename = ""

    # -- the messages ----------------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            try:
                env, fds = self.chan.recv()
            except ChannelError:
                return
            try:
                kind = REQUESTS.get(env.op)
                if kind is None:
                    self.chan.send(Failed(kind="protocol", message=f"unknown op {env.op[:64]!r}"))
                    continue
                body = env.read(kind)  # a malformed body: the ChannelError is this op's failure
                if env.op == "quit":
                    return
                arrays = open_arrays(env.arrays, fds)
                getattr(self, f"op_{env.op}")(body, arrays)
            except BaseException as exc:  # the candidate's failure is a message, never this loop's end
                self._failed(exc)
                if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                    continue
            finally:
                for fd in fds:
                    os.close(fd)

    def _failed(self, exc: BaseException) -> None:
        from ...cuda_errors import sticky_cuda_error

        body = Failed(
            kind=type(exc).__name__,
            message=str(exc)[:4000],
            traceback="".join(traceback.format_exception(exc))[-6000:],
            sticky=sticky_cuda_error(exc),
            oom=isinstance(exc, MemoryError),
        )
        try:
            self.chan.send(body)
        except Exception:
            os._exit(3)

    def op_confine(self, body: Confine, arrays: list[Any]) -> None:
        """The sandbox's file part, before any candidate code (:mod:`.sandbox`)."""
        from .sandbox import confine_files

        self.chan.send(Confined(sandbox=confine_files(body.build_dir, body.scratch, body.readable, body.files)))

    def op_calibrate(self, body: Calibrate, arrays: list[Any]) -> None:
        """The harness alone, on sets shaped as a round's (taken over as a round takes them): a
        no-op that reads its inputs and returns arrays like the expected output (made at its first
        call), which land in the set's buffers as a real call's value does. The judge sends this
        to a clean spare (its calibration twin), never to the candidate's process."""

        # a call reads its inputs: a fresh set's pages fault in the call's time. The pages are read
        # from the spans that mapping the set measured, as the candidate's process measures them
        # too: the no-op's own cost is then a loop, not a walk of the arguments (which cost more
        # than a small candidate's whole call, and the judge would subtract more than the harness
        # costs). On a GPU it reads none: a device array faults nothing on the host, and a rare
        # host input's faults are then left in the candidate's figure, the safe side.
        host = not _cuda()
        value: list[list[Any]] = []  # this round's value, taken at its first call

        def noop(given: Any) -> Any:
            bufs, where = given
            if host:
                for lo, hi, _ in where:
                    if hi > lo:
                        _read_pages(lo, hi - lo)
            if not value:
                # a value like the expected output, made once and returned at every call: copying
                # it into the judge's buffers is the harness's cost, but making it is the call's
                # (the reference's time has its own allocation in it), so the twin does not count it
                key = [None if b is None else (tuple(b.shape), str(b.dtype)) for b in bufs]
                if self.outputs is None or self.outputs[0] != key:
                    made = [b if b is None else (b.clone() if hasattr(b, "clone") else b.copy()) for b in bufs]
                    self.outputs = (key, made)
                value.append(self.outputs[1])
            return list(value[0])

        if body.sets is not None:
            sets = [self._set(entry, arrays) for entry in body.sets]
            self.sets = {k: ((bufs, where), bufs, where) for k, (_, bufs, where) in enumerate(sets)}
        else:  # the judge's shared sample is the output buffer
            sample = arrays[0] if arrays else None
            self.sets = {k: (([sample], []), [sample], []) for k in range(body.calls)}
        self._round(Round(order=list(range(body.calls)), method=body.method), noop)
        if not body.keep:
            self.sets = {}

    def op_calibrated(self, body: Calibrated, arrays: list[Any]) -> None:
        """The judge's calibration is over: its outputs let go and, on a GPU, their memory given
        back to the device (a spare waits for its candidate holding none)."""
        import gc

        self.outputs = None
        gc.collect()
        if _cuda():
            sys.modules["torch"].cuda.empty_cache()
        self.chan.send(Ok())

    def op_load(self, body: Load, arrays: list[Any]) -> None:
        self._limits(body)
        os.chdir(body.build_dir)
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(body.build_dir, "torch_extensions")
        for d in body.path:
            if d not in sys.path:
                sys.path.insert(0, d)
        from ..numerics import apply

        apply(body.numerics)  # the format's runner's switches, before the candidate's code
        module = types.ModuleType(body.module)
        module.__file__ = self.filename = body.filename
        sys.modules[body.module] = module
        exec(compile(body.source, body.filename, "exec"), module.__dict__)
        if body.format == "kernelbench":
            if not hasattr(module, "ModelNew"):
                raise LookupError("the candidate defines no 'ModelNew' (KernelBench: candidate needs it)")
            import torch

            init = decode_tree(body.init, arrays)
            torch.manual_seed(body.init_seed)
            model = module.ModelNew(*init)
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device)
            self.fn = lambda args: model(*args)
        else:
            if not hasattr(module, "custom_kernel"):
                raise LookupError("the candidate defines no 'custom_kernel' (GPU MODE: a submission needs it)")
            kernel = module.custom_kernel
            self.fn = kernel
        self.chan.send(Loaded())

    def _limits(self, body: Load) -> None:
        fd = os.open(body.output_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        # hard limits as low as the soft ones: a process may raise its soft limit up to the hard
        # one, and the candidate (with no CAP_SYS_RESOURCE) can raise neither again
        resource.setrlimit(resource.RLIMIT_FSIZE, (body.load_file_limit, body.load_file_limit))
        allowance = body.memory_limit_mb << 20
        if allowance > 0:
            with open("/proc/self/status") as f:
                data = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmData:")), 0)
            resource.setrlimit(resource.RLIMIT_DATA, (data + allowance, data + allowance))

    def op_call(self, body: Call, arrays: list[Any]) -> None:
        self.call = self._set(body.set, arrays)
        self.op_call_again(CallAgain(), [])

    @staticmethod
    def _set(entry: CallEntry, arrays: list[Any]) -> tuple[Any, list[Any], list[tuple[int, int, int]]]:
        """One call's (arguments, output buffers, spans of its inputs) from the judge's message."""
        args = decode_tree(entry.args, arrays)
        bufs = [decode_tree(t, arrays) if t[0] == "a" else None for t in entry.outs]
        return args, bufs, spans([arrays[i] for i in entry.ins])

    def op_call_again(self, body: CallAgain, arrays: list[Any]) -> None:
        """The last call's inputs again: the judge has refilled their memory with new values."""
        args, bufs, where = self.call
        out = self.fn(args)
        values, aliased = deliver(out, bufs, where)
        del out
        _sync()
        self.chan.send(Returned(values=values, aliased=aliased, threads=self._threads()))

    def op_drop(self, body: Drop, arrays: list[Any]) -> None:
        self.sets = {}
        self.chan.send(Ok())

    def op_release(self, body: Release, arrays: list[Any]) -> None:
        """Let go of every array the judge shared (before this process is killed): CUDA IPC
        memory is freed in the judge only once each receiver has released it."""
        import gc

        self.sets, self.call = {}, ((), [], [])
        gc.collect()
        self.chan.send(Ok())

    def op_round(self, body: Round, arrays: list[Any]) -> None:
        _fit_threads()
        if body.sets is not None:  # a round's own sets: the last round's memory is let go here
            self.sets = {}
            self.sets = {k: self._set(entry, arrays) for k, entry in enumerate(body.sets)}
        self._round(body, self.fn)

    def _round(self, body: Round, fn: Any) -> None:
        """Calls on the sets in ``order``, each timed in-process; each call's value lands in its
        set's output buffers (after the in-process end mark, as the formats time only the call,
        and before this round's answer, which ends the call as the judge's clock sees it)."""
        method = body.method
        samples: list[float] = []
        values: list[Any] = []
        aliased: list[list[int]] = []
        parts: dict[str, float] = {}
        # the thread's own CPU time and its preemptions over the calls: a part slower here than in
        # the twin's process, with as much CPU time, waited for something; with less, was not run
        used0 = resource.getrusage(resource.RUSAGE_THREAD)
        if _cuda() and method != "host":
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush = torch.empty(L2_FLUSH_SHAPE, dtype=torch.int64, device="cuda") if method != "warmup" else None
            clock = time.perf_counter
            for k in body.order:
                args, bufs, where = self.sets[k]
                t0 = clock()
                if flush is not None:
                    flush.fill_(42)  # outside the event pair, as upstream
                start.record()
                t1 = clock()
                out = fn(args)
                t2 = clock()
                end.record()
                got, alias = deliver(out, bufs, where)
                del out
                t3 = clock()
                torch.cuda.synchronize()
                t4 = clock()
                for part, took in (("launch", t1 - t0), ("call", t2 - t1), ("deliver", t3 - t2), ("sync", t4 - t3)):
                    parts[part] = parts.get(part, 0.0) + took * 1e6
                samples.append(float(start.elapsed_time(end)) * 1e3)
                values.append(got)
                aliased.append(alias)
            del flush
        else:
            for k in body.order:
                args, bufs, where = self.sets[k]
                _sync()
                t0 = time.perf_counter()
                out = fn(args)
                _sync()
                t1 = time.perf_counter()
                samples.append((t1 - t0) * 1e6)
                got, alias = deliver(out, bufs, where)
                del out
                parts["call"] = parts.get("call", 0.0) + (t1 - t0) * 1e6
                parts["deliver"] = parts.get("deliver", 0.0) + (time.perf_counter() - t1) * 1e6
                values.append(got)
                aliased.append(alias)
        used1 = resource.getrusage(resource.RUSAGE_THREAD)
        parts["cpu"] = (used1.ru_utime + used1.ru_stime - used0.ru_utime - used0.ru_stime) * 1e6
        parts["preempted"] = float(used1.ru_nivcsw - used0.ru_nivcsw)
        timed = method != "warmup"
        self.chan.send(
            Timed(
                samples=samples if timed else [],
                values=values,
                aliased=aliased,
                threads=self._threads(),
                parts_us={k: round(v, 1) for k, v in parts.items()},
            )
        )

    def _threads(self) -> list[str]:
        """Threads started since the load that are running the candidate's own code now (a
        framework's pool threads, torch.compile's among them, run the framework's)."""
        # this thread's own frame left out: held in ``frames`` it would make a cycle (frame ->
        # locals -> frame) that keeps the op's frame, and the output it returned, until the
        # collector runs: a large output per call then runs the process out of its allowance
        frames = sys._current_frames()
        frames.pop(threading.get_ident(), None)
        out = []
        try:
            for t in threading.enumerate():
                if t in self.threads_before or not t.is_alive() or t.ident not in frames:
                    continue
                f: Any = frames[t.ident]
                while f is not None:
                    if f.f_code.co_filename == self.filename:
                        out.append(t.name)
                        break
                    f = f.f_back
        finally:
            frames.clear()
        return out[:8]


def serve(sock_fd: int, device: str, sandbox: dict[str, str] | None = None) -> None:
    """The spare's life: its context, ``ready`` (with what its sandbox held), one candidate, exit."""
    import socket

    sock = socket.socket(fileno=sock_fd)
    chan = Channel(sock)
    if device == "cuda":
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    chan.send(Ready(pid=os.getpid(), device=device, sandbox=sandbox or {}))
    Candidate(chan, device).serve()
    sys.stdout.flush()
    os._exit(0)
