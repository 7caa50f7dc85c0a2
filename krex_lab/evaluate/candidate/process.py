"""The candidate's process: thin, one-shot, and believed in nothing.

Forked from the zygote (:mod:`.zygote`) as a *spare*: it makes its CUDA context while idle, says
``ready``, and then serves exactly one candidate, message by message (:mod:`..channel`):

* ``calibrate``: a round of the timing harness on a no-op, in a spare no candidate code has run in
  (the judge's calibration twin): what the harness itself costs, which the judge subtracts;
* ``load``: limits set (host memory, output file size), fd 1 and 2 into the candidate's output
  file, the candidate compiled and imported, its model built;
* ``call``: the candidate once on the judge's shared inputs, its outputs shared back;
* ``sets`` / ``round``: input sets registered once, then rounds of timed calls, one per set, each
  timed in-process by the format's method (an event pair on a GPU, the host clock on a CPU); the
  round's outputs shared back for the judge to re-check;
* ``quit``.

Nothing here is trusted: the candidate may patch any of it in its own process. The judge checks
what arrives (outputs against its reference, times against its own clock) and kills this process,
and everything it started, when the evaluation ends.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import threading
import time
import traceback
import types
from typing import Any

from ..channel import Channel, ChannelError, Shared, decode_tree, encode_tree, open_arrays, spans

__all__ = ["serve"]


def _sync() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _plain(out: Any) -> Any:
    """A tensor subclass's values made now, inside the timed call (a lazy result's work is the
    call's), as a plain tensor; anything else as it is."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor) and type(out) is not torch.Tensor:
        return torch.Tensor.clone(out).as_subclass(torch.Tensor)
    if isinstance(out, (tuple, list)):
        return type(out)(_plain(o) for o in out)
    return out


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
        #: the input sets of the case being timed, and the arrays they were made of (in order)
        self.sets: dict[int, Any] = {}
        self.set_arrays: list[Any] = []
        self.kept: Shared | None = None
        self.call: tuple[Any, list[Any]] = ((), [])
        self.warm: list[Any] | None = None
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
                arrays = open_arrays(env.arrays, fds)
                if env.op == "quit":
                    return
                handler = getattr(self, f"op_{env.op}", None)
                if handler is None:
                    self.chan.send("failed", {"kind": "protocol", "message": f"unknown op {env.op!r}"})
                    continue
                handler(env.body, arrays)
            except BaseException as exc:  # the candidate's failure is a message, never this loop's end
                self._failed(exc)
                if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                    continue
            finally:
                for fd in fds:
                    os.close(fd)

    def _failed(self, exc: BaseException) -> None:
        from ...workers.context.runner import sticky_cuda_error

        body = {
            "kind": type(exc).__name__,
            "message": str(exc)[:4000],
            "traceback": "".join(traceback.format_exception(exc))[-6000:],
            "sticky": sticky_cuda_error(exc),
            "oom": isinstance(exc, MemoryError),
        }
        try:
            self.chan.send("failed", body)
        except Exception:
            os._exit(3)

    def op_calibrate(self, body: dict[str, Any], arrays: list[Any]) -> None:
        """The harness alone, on a no-op that returns a new array like the expected output. The
        harness keeps a round's outputs to its end, so a real call's output takes fresh memory:
        on a host the no-op touches one byte a page of its own (the page faults, not the write,
        which is the call's work). The judge sends this to a clean spare (its calibration twin),
        never to the candidate's process."""
        sample = arrays[0] if arrays else None

        def noop(*_: Any) -> Any:
            if sample is None:
                return None
            if hasattr(sample, "new_empty"):  # torch
                out = sample.new_empty(sample.shape)
                if out.is_cuda:  # the caching allocator's memory: no page to fault
                    return out
                flat, size = out.view(-1), out.element_size()
            else:
                import numpy as np

                out = np.empty_like(sample)
                flat, size = out.reshape(-1), out.itemsize
            flat[:: max(1, 4096 // size)] = 0
            return out

        self.sets = {k: () for k in range(int(body["calls"]))}
        self._round({"order": list(range(int(body["calls"]))), "method": body["method"]}, noop)
        self.sets = {}

    def op_calibrated(self, body: dict[str, Any], arrays: list[Any]) -> None:
        """The judge's calibration is over: its outputs let go and, on a GPU, their memory given
        back to the device (a spare waits for its candidate holding none)."""
        import gc

        self.kept = self.warm = None
        gc.collect()
        if _cuda():
            sys.modules["torch"].cuda.empty_cache()
        self.chan.send("ok", {})

    def op_load(self, body: dict[str, Any], arrays: list[Any]) -> None:
        self._limits(body)
        os.chdir(body["build_dir"])
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(body["build_dir"], "torch_extensions")
        for d in body.get("path", []):
            if d not in sys.path:
                sys.path.insert(0, d)
        module = types.ModuleType(body["module"])
        module.__file__ = self.filename = body["filename"]
        sys.modules[body["module"]] = module
        exec(compile(body["source"], body["filename"], "exec"), module.__dict__)
        if body["format"] == "kernelbench":
            if not hasattr(module, "ModelNew"):
                raise LookupError("the candidate defines no 'ModelNew' (KernelBench: candidate needs it)")
            import torch

            init = decode_tree(body["init"], arrays)
            torch.manual_seed(int(body["init_seed"]))
            model = module.ModelNew(*init)
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device)
            self.fn = lambda args: model(*args)
        else:
            if not hasattr(module, "custom_kernel"):
                raise LookupError("the candidate defines no 'custom_kernel' (GPU MODE: a submission needs it)")
            kernel = module.custom_kernel
            self.fn = kernel
        self.chan.send("loaded", {})

    def _limits(self, body: dict[str, Any]) -> None:
        fd = os.open(body["output_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(body["load_file_limit"]), resource.RLIM_INFINITY))
        allowance = int(body["memory_limit_mb"]) << 20
        if allowance > 0:
            with open("/proc/self/status") as f:
                data = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmData:")), 0)
            resource.setrlimit(resource.RLIMIT_DATA, (data + allowance, resource.RLIM_INFINITY))

    def op_call(self, body: dict[str, Any], arrays: list[Any]) -> None:
        self.call = (decode_tree(body["args"], arrays), arrays)
        self.op_call_again(body, [])

    def op_call_again(self, body: dict[str, Any], arrays: list[Any]) -> None:
        """The last call's inputs again: the judge has refilled their memory with new values."""
        args, inputs = self.call
        self.kept = None  # the judge has read the last answer: its memory goes back now
        out = _plain(self.fn(args))
        _sync()
        self._reply_outputs("returned", [out], inputs, {"threads": self._threads()})

    def op_sets(self, body: dict[str, Any], arrays: list[Any]) -> None:
        self.sets = {int(key): decode_tree(tree, arrays) for key, tree in zip(body["ids"], body["trees"])}
        self.set_arrays = arrays
        self.chan.send("ok", {})

    def op_drop(self, body: dict[str, Any], arrays: list[Any]) -> None:
        self.sets, self.set_arrays = {}, []
        self.kept = None
        self.chan.send("ok", {})

    def op_release(self, body: dict[str, Any], arrays: list[Any]) -> None:
        """Let go of every array the judge shared (before this process is killed): CUDA IPC
        memory is freed in the judge only once each receiver has released it."""
        import gc

        self.sets, self.set_arrays, self.call, self.kept, self.warm = {}, [], ((), []), None, None
        gc.collect()
        self.chan.send("ok", {})

    def op_round(self, body: dict[str, Any], arrays: list[Any]) -> None:
        _fit_threads()
        self._round(body, self.fn)

    def _round(self, body: dict[str, Any], fn: Any) -> None:
        """Calls on the sets in ``order``, each timed in-process; the outputs of the timed calls
        go back (``keep``) for the judge's re-check."""
        method = body["method"]
        timed = method != "warmup"
        # the judge has read the last round's outputs: their memory goes back to the allocator
        # now, so this round's calls reuse it instead of allocating inside their timed interval
        self.kept = self.warm = None
        samples: list[float] = []
        outs: list[Any] = []
        if _cuda() and method != "host":
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for k in body["order"]:
                args = self.sets[int(k)]
                start.record()
                out = _plain(fn(args))
                end.record()
                torch.cuda.synchronize()
                samples.append(float(start.elapsed_time(end)) * 1e3)
                if timed or len(outs) < len(self.sets):  # a warm-up keeps one output a set
                    outs.append(out)
                del out
        else:
            for k in body["order"]:
                args = self.sets[int(k)]
                _sync()
                t0 = time.perf_counter()
                out = _plain(fn(args))
                _sync()
                samples.append((time.perf_counter() - t0) * 1e6)
                if timed or len(outs) < len(self.sets):  # a warm-up keeps one output a set
                    outs.append(out)
                del out
        if not timed:  # held until the next round starts: its outputs then find cached memory
            self.warm, outs = outs, []
        elif not body.get("keep", True):
            outs = []
        self._reply_outputs("timed", outs, self.set_arrays, {"samples": samples if timed else []})

    def _reply_outputs(self, op: str, outs: list[Any], inputs: list[Any], extra: dict[str, Any]) -> None:
        shared = Shared()
        # an output written into the memory of an input (GPU MODE's output buffers) is said as a
        # view of that input: the judge reads it there
        where = spans(inputs)
        extra["outputs"] = [encode_tree(o, shared, where) for o in outs]
        self.chan.send(op, extra, shared)
        shared.close()
        self.kept = shared  # the memory stays ours until the judge has read it (the next message)

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


def serve(sock_fd: int, device: str) -> None:
    """The spare's life: its context, ``ready``, one candidate, exit."""
    import socket

    sock = socket.socket(fileno=sock_fd)
    chan = Channel(sock)
    if device == "cuda":
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    chan.send("ready", {"pid": os.getpid(), "device": device})
    Candidate(chan, device).serve()
    sys.stdout.flush()
    os._exit(0)
