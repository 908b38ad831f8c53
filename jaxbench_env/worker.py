"""The judge's worker: a reusable process that verifies, checks, compiles and prices.

It runs only this project's code (``judge.py``) on data: the XLA reference, and the
programs a candidate's sandboxed process exported (``sandbox.py`` runs candidate code;
this process never does). The parent talks to ``python -m jaxbench_env.worker`` over
pipes (pickled, length-prefixed frames: both ends are trusted). Every call has a
wall-clock timeout and a resident-memory limit, since a hostile program can still make
the compiler or the interpreter run long; a worker that overruns, crashes or dies is
killed and replaced, and the call returns an error result. Starting jax costs seconds,
so one worker serves many calls.
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

_HEADER = struct.Struct("!Q")
STAGE_FRAME = "stage_started"  # a frame {STAGE_FRAME: name} before the answer: progress, not the answer
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MEMORY_BYTES = 16 * 2**30
# Warnings libtpu prints at start-up on a machine without TPU metadata: harmless.
_LIBTPU_NOISE = ("TPU worker hostnames", "host bounds for accelerator", "Source Location Trace",
                 "libtpu_init_utils", "InitGoogle", "TPU_WORKER_HOSTNAMES")


def deterministic_xla_flags(flags: str | None) -> str:
    """``flags`` with XLA:CPU's multi-threaded Eigen off. The judge's check must give one answer:
    with Eigen's thread pool a contraction can be summed in an order that depends on thread
    timing, and one run of sparse_attention's check on a loaded machine moved an output by a
    bf16 ulp (max error 0.0078 against 0.0156 in others), enough to flip a value at the
    tolerance's edge. A flag the user set explicitly is kept."""
    flags = flags or ""
    if "xla_cpu_multi_thread_eigen" in flags:
        return flags
    return (flags + " --xla_cpu_multi_thread_eigen=false").strip()


class WorkerError(RuntimeError):
    """The worker could not answer: timeout, memory limit, crash. The message says which."""


def _write_frame(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    os.write(fd, _HEADER.pack(len(data)))
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError("worker pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> Any:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return pickle.loads(_read_exact(fd, size))


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Worker:
    """Parent-side handle of one sandbox process."""

    def __init__(self, backend: str = "sim", timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_bytes: int = DEFAULT_MEMORY_BYTES):
        self.backend = backend
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self._proc: subprocess.Popen | None = None
        self._log = None
        self._dump_dir: str | None = None

    def _start(self) -> None:
        # The compiler's bundle dumps go to a directory this side removes, however the worker ends.
        self._dump_dir = tempfile.mkdtemp(prefix="jaxbench-bundles-")
        env = dict(os.environ, JAXBENCH_WORKER_BACKEND=self.backend, PYTHONUNBUFFERED="1",
                   JAXBENCH_BUNDLE_DIR=self._dump_dir, XLA_FLAGS=deterministic_xla_flags(os.environ.get("XLA_FLAGS")))
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "jaxbench_env.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=env, cwd=os.getcwd(),
        )

    def _stderr_tail(self, n: int = 1500) -> str:
        """The end of the worker's stderr, without libtpu's start-up chatter."""
        if self._log is None:
            return ""
        self._log.seek(0, os.SEEK_END)
        size = self._log.tell()
        self._log.seek(max(0, size - 20 * n))
        lines = self._log.read().decode(errors="replace").splitlines()
        kept = [ln for ln in lines if not any(noise in ln for noise in _LIBTPU_NOISE)]
        return "\n".join(kept)[-n:]

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                pipe.close()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dump_dir is not None:
            shutil.rmtree(self._dump_dir, ignore_errors=True)
            self._dump_dir = None

    close = kill

    def call(self, request: dict, timeout_s: float | None = None,
             on_stage: Callable[[str], None] | None = None) -> dict:
        """Send one request; returns the worker's answer or raises WorkerError. ``on_stage``
        is told the name of each stage the judge starts (compile, check, time, ...)."""
        if self._proc is None or self._proc.poll() is not None:
            self.kill()
            self._start()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        proc = self._proc
        try:
            _write_frame(proc.stdin.fileno(), request)
        except OSError as e:
            tail = self._stderr_tail()
            self.kill()
            raise WorkerError(f"worker died before the request was sent ({e}); its last output:\n{tail}") from None
        deadline = time.monotonic() + timeout
        while True:
            frame = self._next_frame(proc, deadline, timeout)
            if isinstance(frame, dict) and set(frame) == {STAGE_FRAME}:
                if on_stage is not None:
                    on_stage(frame[STAGE_FRAME])
                continue
            return frame

    def _next_frame(self, proc: subprocess.Popen, deadline: float, timeout: float) -> Any:
        out_fd = proc.stdout.fileno()
        while True:
            ready, _, _ = select.select([out_fd], [], [], 0.1)
            if ready:
                break
            if proc.poll() is not None:
                tail = self._stderr_tail()
                code = proc.returncode
                self.kill()
                raise WorkerError(f"worker crashed (exit code {code}); its last output:\n{tail}")
            if time.monotonic() > deadline:
                self.kill()
                raise WorkerError(f"timed out after {timeout:.0f} s (infinite loop or runaway compilation?)")
            rss = _rss_bytes(proc.pid)
            if rss > self.memory_bytes:
                self.kill()
                raise WorkerError(f"memory limit exceeded: {rss / 2**30:.1f} GiB resident, limit "
                                  f"{self.memory_bytes / 2**30:.1f} GiB")
        try:
            return _read_frame(out_fd)
        except (EOFError, pickle.UnpicklingError, OSError) as e:
            try:  # a closed pipe usually means the process is exiting: report how
                code = proc.wait(timeout=5)
                what = f"exit code {code}"
            except subprocess.TimeoutExpired:
                what = str(e)
            tail = self._stderr_tail()
            self.kill()
            raise WorkerError(f"worker crashed ({what}); its last output:\n{tail}") from None

    def __getstate__(self):
        # A copy (pickled to an RLlib env runner, say) starts its own process when first used.
        return {**self.__dict__, "_proc": None, "_log": None, "_dump_dir": None}

    def __del__(self):
        try:
            self.kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _serve() -> None:
    # Keep the protocol pipe private; anything the candidate prints goes to stderr.
    proto_out = os.dup(1)
    os.dup2(2, 1)
    proto_in = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)

    from jaxbench_env.aot import prepare_process

    prepare_process(os.environ.get("JAXBENCH_WORKER_BACKEND", "sim"))
    from jaxbench_env import judge

    handlers = {"baseline": judge.baseline, "judge": judge.judge}
    judge.on_stage = lambda stage: _write_frame(proto_out, {STAGE_FRAME: stage})

    while True:
        try:
            request = _read_frame(proto_in)
        except EOFError:
            return
        op = request.get("op")
        answer = {"ok": True, "pid": os.getpid()} if op == "ping" else handlers[op](request)
        sys.stdout.flush()
        _write_frame(proto_out, answer)


if __name__ == "__main__":
    _serve()
