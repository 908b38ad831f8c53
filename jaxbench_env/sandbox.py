"""One fresh, isolated process per candidate job, forked from a pre-warmed zygote.

``Sandbox`` starts ``python -m jaxbench_env.sandbox`` (the *zygote*) with a scrubbed
environment (``PATH``, locale, jax/libtpu settings, ``PYTHONPATH``; ``HOME`` and ``TMPDIR``
are a private directory). The zygote probes which kernel protections it can use, runs a
preload function once (import jax, load the v6e topology) and then, per job, forks:

- a *supervisor* (trusted code): it unshares new mount, network, PID, IPC and UTS
  namespaces (and a user namespace when not root), hides the user's home directory (a tmpfs
  over it, with only the Python installation bound back) and the ``hidden_paths``, gives the
  job a minimal ``/dev``, makes the whole file system read-only and nosuid (a recursive
  ``mount_setattr``), mounts fresh size-capped tmpfs on ``/tmp`` (the job's working
  directory), ``/dev/shm`` and ``/run`` (where the job writes its result), becomes a child
  subreaper and forks
- the *job process*: PID 1 of the new PID namespace, so every process the job starts
  (``setsid``, double-forked, ...) dies with it. It mounts its own ``/proc``, starts a new
  session, closes every inherited descriptor (stdin is ``/dev/null``, stdout and stderr are
  a pipe the supervisor drains, keeping the head and the tail), sets rlimits (core 0, file
  size, open files, processes, data segment), drops to a uid of its own (gid 65534) with an empty
  capability bounding set (in a user namespace: every capability, with the root securebits
  locked), sets ``no_new_privs`` and calls ``module:function`` with the request. It writes
  the result as files: ``result.json`` (the manifest and the blob index) and ``blobs.bin``
  (the blobs, concatenated).

The supervisor enforces the wall-clock timeout and the memory limit (private memory summed
over all the job's processes, polled; plus RLIMIT_DATA per process), copies the bounded
result files to the job's directory on the parent's side and writes its own
``status.json`` there. The parent reads and validates these files (JSON, sizes, types;
never pickle) and answers a ``SandboxResult``. Parent and zygote exchange length-prefixed
JSON frames only. The request itself is a file in the job's directory that the job's
supervisor reads after the fork: the zygote, whose memory every job inherits, never holds
one (a job could otherwise find earlier candidates' sources in its heap).

Protections the kernel refuses (no root and no user namespaces, say) are skipped: what
held is in ``Sandbox.protections`` and one warning names what is missing. Without a PID
namespace the supervisor, a child subreaper, still kills every descendant of the job.

The zygote must stay single-purpose: a fork after jax *lowered or compiled* something in
the zygote hangs in the child (XLA's thread pools), so the preload only imports and loads.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import json
import os
import pwd
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MEMORY_BYTES = 16 * 2**30
DEFAULT_DISK_BYTES = 512 * 2**20  # the job's /tmp, and the largest file it may write
DEFAULT_PRELOAD = "jaxbench_env.candidate_process:preload"
UNPRIVILEGED_ID = 65534  # nobody / nogroup
# With uid=None each job runs as JOB_UID_BASE + its supervisor's pid (unique among live
# processes): RLIMIT_NPROC counts per uid, so a fork bomb in one job cannot leave a job
# running beside it (another worker's, another sandbox's) unable to start a thread.
JOB_UID_BASE = 1 << 30
MAX_FRAME_BYTES = 256 * 2**20
MAX_RESULT_JSON_BYTES = 16 * 2**20
MAX_STATUS_BYTES = 1 * 2**20
LOG_KEEP_BYTES = 64 * 2**10  # of the job's output: this much of the head and of the tail
MAX_OUTPUT_BYTES = 64 * 2**20  # a job writing more to stdout/stderr is stopped (a flood would run to its timeout)
STARTUP_TIMEOUT_S = 300.0
SUPERVISOR_GRACE_S = 30.0  # past the job's timeout, before the parent stops waiting
MEMORY_POLL_S = 0.05
RESULT_DIR = "/run"  # in the job's mount namespace (its own tmpfs there; /tmp where there is no /run)
SETUP_FAILED, RESULT_UNWRITABLE = 111, 112  # the job process's own exit codes
RESULT_FILE, BLOBS_FILE, STATUS_FILE, LOG_FILE, PID_FILE, REQUEST_FILE = (
    "result.json", "blobs.bin", "status.json", "log.txt", "init.pid", "request.json")
ROOT = Path(__file__).resolve().parent.parent
# Environment variables the zygote keeps from its parent: what Python and jax/libtpu need.
_ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "JAX_PLATFORMS", "JAX_ENABLE_X64",
             "XLA_FLAGS", "LIBTPU_INIT_ARGS", "TPU_SKIP_MDS_QUERY", "ALLOW_MULTIPLE_LIBTPU_LOAD",
             "TF_CPP_MIN_LOG_LEVEL", "TPU_STDERR_LOG_LEVEL", "TPU_MIN_LOG_LEVEL", "TPU_ACCELERATOR_TYPE")
_LIBTPU_NOISE = ("TPU worker hostnames", "host bounds for accelerator", "Source Location Trace",
                 "libtpu_init_utils", "InitGoogle", "TPU_WORKER_HOSTNAMES")
_HEADER = struct.Struct("!I")

# Linux constants (uapi).
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE = 442, -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 4, 24, 28
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
SECURE_NOROOT_ALL = 0xEF  # noroot, no_setuid_fixup, no_cap_ambient_raise and keep_caps off, all locked
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
_NAMESPACES = (("mount_namespace", CLONE_NEWNS), ("network_namespace", CLONE_NEWNET),
               ("pid_namespace", CLONE_NEWPID), ("ipc_namespace", CLONE_NEWIPC),
               ("uts_namespace", CLONE_NEWUTS))

_warned: set = set()


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the job)."""


@dataclass
class SandboxResult:
    manifest: dict | None
    blobs: dict[str, bytes] = field(default_factory=dict)
    error: str | None = None
    wall_s: float = 0.0
    stderr_tail: str = ""
    timings: dict = field(default_factory=dict)  # the supervisor's: setup_s, ready_s, job_s, copy_s


# ---------------------------------------------------------------------------------------
# JSON frames (parent <-> zygote)

def _write_frame(fd: int, obj: Any) -> None:
    data = json.dumps(obj, allow_nan=False).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(data)} bytes is too large")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("pipe closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> dict:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes is too large")
    obj = json.loads(_read_exact(fd, size))
    if not isinstance(obj, dict):
        raise ValueError("frame is not a JSON object")
    return obj


# ---------------------------------------------------------------------------------------
# System calls

_libc = None


def _lib():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _libc.unshare.argtypes = [ctypes.c_int]
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return _libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _enc(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_lib().mount(_enc(src), _enc(target), _enc(fstype), flags, _enc(data)), f"mount {target}")


def _unshare(flags: int) -> None:
    _check(_lib().unshare(flags), "unshare")


def _prctl(option: int, arg: int) -> None:
    _check(_lib().prctl(option, arg, 0, 0, 0), f"prctl {option}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _readonly_tree(path: str = "/") -> None:
    """Every mount at and under ``path`` read-only and nosuid (Linux >= 5.12)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    ret = _lib().syscall(SYS_MOUNT_SETATTR, AT_FDCWD, _enc(path), AT_RECURSIVE, ctypes.byref(attr),
                         ctypes.sizeof(attr))
    _check(0 if ret == 0 else -1, f"mount_setattr {path}")


def _drop_capabilities() -> None:
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    data = (ctypes.c_uint32 * 6)()  # two (effective, permitted, inheritable) triples, all zero
    _check(_lib().capset(ctypes.byref(Header(0x20080522, 0)), data), "capset")


# ---------------------------------------------------------------------------------------
# The zygote's side

def _resolve(spec: str):
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"expected 'module:function', got {spec!r}")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise TypeError(f"{spec} is not callable")
    return fn


def _short(exc: BaseException, limit: int = 2000) -> str:
    msg = f"{type(exc).__name__}: {exc}"
    return msg if len(msg) <= limit else msg[: limit // 2] + " ... " + msg[-limit // 2:]


def _needed_paths() -> list[str]:
    """Directories the job's Python reads: the installation, ``sys.path`` and the project."""
    paths = {sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             str(ROOT)}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    paths.update(p for p in sys.path if p)
    out = set()
    for p in paths:
        try:
            real = os.path.realpath(p)
        except OSError:
            continue
        if os.path.isdir(real) and real != "/":
            out.add(real)
    # drop paths under another kept path
    return sorted(p for p in out if not any(p != q and p.startswith(q + "/") for q in out))


def _mask_plan(home: str | None, drop_uid: bool) -> list[tuple[str, list[str]]]:
    """[(directory to hide under a tmpfs, paths inside it to bind back)]: the user's home,
    and (when the job drops to another uid) every directory it could not traverse on the way
    to the Python installation."""
    needed = _needed_paths()
    masks: set[str] = set()
    if home and os.path.isdir(home) and os.path.realpath(home) != "/":
        masks.add(os.path.realpath(home))
    if drop_uid:
        for p in needed:
            parts = Path(p).parts
            for i in range(2, len(parts) + 1):
                d = str(Path(*parts[:i]))
                try:
                    if not os.stat(d).st_mode & stat.S_IXOTH:
                        masks.add(d)
                        break
                except OSError:
                    break
    masks = {m for m in masks if not any(m != o and m.startswith(o + "/") for o in masks)}
    return [(m, [p for p in needed if p.startswith(m + "/")]) for m in sorted(masks)]


def _enter_namespaces(cfg: dict, want: dict, strict: bool) -> dict:
    """In the supervisor: unshare what ``want`` asks, set up the mounts. Returns what held
    (name -> True or the error). ``strict``: raise on the first failure instead."""
    got: dict[str, Any] = {}

    def attempt(name, fn):
        if want.get(name) is not True:
            got[name] = want.get(name) or "not attempted"
            return False
        try:
            fn()
            got[name] = True
            return True
        except OSError as e:
            if strict:
                raise SandboxError(f"{name}: {e}") from None
            got[name] = str(e)
            return False

    userns = want.get("user_namespace") is True
    if userns:
        uid, gid = os.geteuid(), os.getegid()

        def user():
            _unshare(CLONE_NEWUSER)
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"0 {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"0 {gid} 1")

        userns = attempt("user_namespace", user)
    for name, flag in _NAMESPACES:
        attempt(name, lambda flag=flag: _unshare(flag))
    if got.get("mount_namespace") is not True:
        for name in ("readonly_fs", "hidden_home", "hidden_paths", "minimal_dev", "private_tmp"):
            got[name] = "no mount namespace"
        return got
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount leaks to the parent's namespace
    os.umask(0o022)

    def hide():
        for directory, keep in cfg["masks"]:
            fds = [(p, os.open(p, os.O_PATH)) for p in keep]
            _mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            for p, fd in fds:
                os.makedirs(p, exist_ok=True)
                _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
                os.close(fd)

    def readonly():
        try:
            _readonly_tree("/")
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EINVAL):
                raise
            for p in cfg["readonly_paths"]:  # older kernels: at least these, not recursively
                if os.path.exists(p):
                    _mount(p, p, None, MS_BIND | MS_REC)
                    _mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
            raise OSError(e.errno, f"no mount_setattr: only {cfg['readonly_paths']} read-only") from None

    job_uid = 0 if userns else cfg["uid"]
    job_gid = 0 if userns else cfg["gid"]

    def private_tmp():
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
               f"size={cfg['disk_bytes']},nr_inodes=65536,mode=0700,uid={job_uid},gid={job_gid}")
        if os.path.isdir("/dev/shm"):
            _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,nr_inodes=4096,mode=01777")
        # The result files go to a tmpfs of their own (a job that fills /tmp can still answer),
        # over /run, which also hides the host's sockets there.
        if os.path.isdir(RESULT_DIR):
            _mount("tmpfs", RESULT_DIR, "tmpfs", MS_NOSUID | MS_NODEV,
                   f"size={cfg['disk_bytes'] + MAX_RESULT_JSON_BYTES + 2**20},nr_inodes=64,mode=0700,"
                   f"uid={job_uid},gid={job_gid}")

    def hide_paths():
        for p in cfg["hidden_paths"]:
            if os.path.isdir(p):
                _mount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=0555")
            elif os.path.exists(p):
                _mount("/dev/null", p, None, MS_BIND)

    def minimal_dev():
        fds = [(name, os.open(f"/dev/{name}", os.O_PATH)) for name in _DEV_NODES if os.path.exists(f"/dev/{name}")]
        _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
        for name, fd in fds:
            os.close(os.open(f"/dev/{name}", os.O_WRONLY | os.O_CREAT, 0o644))
            _mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
            os.close(fd)
        os.mkdir("/dev/shm", 0o1777)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2")):
            os.symlink(target, f"/dev/{name}")

    attempt("hidden_home", hide)
    attempt("hidden_paths", hide_paths)
    attempt("minimal_dev", minimal_dev)
    attempt("readonly_fs", readonly)
    attempt("private_tmp", private_tmp)
    return got


def _confine(cfg: dict, want: dict, got: dict, sync_fd: int, log_fd: int, workdir: str, limits: dict,
             strict: bool) -> None:
    """In the job process, before anything of the job's runs."""
    import resource

    def attempt(name, fn):
        if want.get(name) is not True:
            got[name] = want.get(name) or "not attempted"
            return
        try:
            fn()
            got[name] = True
        except OSError as e:
            if strict:
                raise SandboxError(f"{name}: {e}") from None
            got[name] = str(e)

    def proc():
        if got.get("pid_namespace") is not True or got.get("mount_namespace") is not True:
            raise OSError(errno.ENOSYS, "needs PID and mount namespaces")
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)

    attempt("private_proc", proc)
    os.setsid()  # our own process group: killpg(0) reaches no one outside
    # descriptors: 0 /dev/null, 1 and 2 the log pipe, 3 the sync pipe, nothing else
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.dup2(sync_fd, 3)
    os.closerange(4, max(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
    os.chdir(workdir)
    os.environ.update(HOME=workdir, TMPDIR=workdir, PWD=workdir)

    def rlimits():
        for res, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, limits["file_bytes"]),
                           (resource.RLIMIT_NOFILE, limits["open_files"]), (resource.RLIMIT_NPROC, limits["processes"]),
                           (resource.RLIMIT_DATA, limits["data_bytes"])):
            resource.setrlimit(res, (value, value))

    def drop():
        for cap in range(64):  # no capability can come back through an exec either
            if _lib().prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                break  # past the last capability the kernel knows
        if got.get("user_namespace") is True:  # uid 0 of our own user namespace: root by name only
            _prctl(PR_SET_SECUREBITS, SECURE_NOROOT_ALL)
            _drop_capabilities()
        elif os.geteuid() != 0:
            raise OSError(errno.EPERM, "the job runs as the parent's own user (no root, no user namespace)")
        else:
            os.setgroups([])
            os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        _prctl(PR_SET_DUMPABLE, 1)  # the job may read its own /proc/self; others of its uid are in its namespace

    attempt("rlimits", rlimits)
    attempt("unprivileged", drop)
    attempt("no_new_privs", lambda: _prctl(PR_SET_NO_NEW_PRIVS, 1))
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
    except OSError:
        pass


class _LogTail:
    """The head and tail of a stream, the middle counted but dropped."""

    def __init__(self, keep: int):
        self.keep, self.head, self.tail, self.total = keep, bytearray(), bytearray(), 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.keep:
                del self.tail[: len(self.tail) - self.keep]

    def render(self) -> bytes:
        tail = bytes(self.tail[-self.keep:])
        skipped = self.total - len(self.head) - len(tail)
        middle = f"\n[... {skipped} bytes of output dropped ...]\n".encode() if skipped > 0 else b""
        return bytes(self.head) + middle + tail


def _job_pids(pidns: bool) -> list[int]:
    """The job's processes. With a PID namespace, /proc is the job's own: all of it. Without
    one, the supervisor's descendants (it is a child subreaper: orphans come back to it)."""
    if pidns:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    state, ppid = f.read().rsplit(b")", 1)[1].split()[:2]
            except (OSError, IndexError, ValueError):
                continue
            if state != b"Z":  # zombies hold nothing; they are reaped later
                parents.setdefault(int(ppid), []).append(int(name))
    out, todo = [], [os.getpid()]
    while todo:
        for child in parents.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def _reap(pids: list[int], keep: int) -> None:
    """Reap those of ``pids`` that are our zombie children, except ``keep`` (the job's own
    status is read by the caller)."""
    for p in pids:
        if p != keep:
            try:
                os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                pass


def _kill_all(pid: int, pidns: bool) -> None:
    """Kill the job: its PID 1 takes its namespace with it; without a PID namespace, every
    descendant of the supervisor, until none is left."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if pidns:
        return
    for _ in range(200):
        victims = _job_pids(False)
        if not victims:
            return
        for v in victims:
            try:
                os.kill(v, signal.SIGKILL)
            except OSError:
                pass
        _reap(victims, pid)
        time.sleep(0.002)


def _memory(pids: list[int], limit: int) -> int:
    """Memory of the job's processes: resident pages summed (cheap); when that is over the
    limit, private pages only (pages shared with the zygote are not the job's)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    if total <= limit:
        return total
    private = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Swap:")):
                        private += int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            pass
    return private


def _write_at(dirfd: int, name: str, data: bytes) -> None:
    try:
        os.unlink(name, dir_fd=dirfd)
    except FileNotFoundError:
        pass
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dirfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _copy_out(src_dir: str, dst_fd: int, name: str, cap: int) -> str | None:
    """Copy a regular file the job wrote (at most ``cap`` bytes); an error message or None."""
    try:
        fd = os.open(os.path.join(src_dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{name}: {e.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is not a regular file"
        if st.st_size > cap:
            return f"{name} is {st.st_size} bytes, over the {cap}-byte limit"
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst_fd)
        try:
            left = st.st_size
            while left > 0:
                n = os.sendfile(out, fd, None, min(left, 1 << 24))
                if n == 0:
                    break
                left -= n
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return None


def _with_job_uid(cfg: dict) -> dict:
    """In a supervisor: the config with the uid its job runs as."""
    return cfg if cfg["uid"] is not None else dict(cfg, uid=JOB_UID_BASE + os.getpid())


def _supervise(fn, msg: dict, cfg: dict, want: dict) -> None:
    """The forked supervisor of one job; never returns."""
    status: dict[str, Any] = {"exit_code": None, "signal": None, "killed_for": None, "setup_error": None,
                              "copy_errors": [], "peak_memory": 0, "timings": {}}
    dirfd, pid, got = -1, 0, {}
    t0 = time.monotonic()
    try:
        cfg = _with_job_uid(cfg)
        dirfd = os.open(msg["dir"], os.O_RDONLY | os.O_DIRECTORY)
        request = json.loads(_read_bounded(os.path.join(msg["dir"], REQUEST_FILE), MAX_FRAME_BYTES))
        os.unlink(REQUEST_FILE, dir_fd=dirfd)
        workfd = os.open("work", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dirfd)
        got = _enter_namespaces(cfg, want, strict=True)
        private = got.get("mount_namespace") is True and got.get("private_tmp") is True
        workdir = "/tmp" if private else os.path.join(msg["dir"], "work")
        result_dir = (RESULT_DIR if os.path.isdir(RESULT_DIR) else workdir) if private else workdir
        if not private and os.geteuid() == 0 and want.get("unprivileged"):
            os.chown(workdir, cfg["uid"], cfg["gid"])
        limits = dict(cfg["limits"])
        limits["data_bytes"] = int(msg["memory_bytes"]) + cfg["baseline_data"]
        status["timings"]["setup_s"] = time.monotonic() - t0
        log_r, log_w = os.pipe()
        sync_r, sync_w = os.pipe()
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        pid = os.fork()
        if pid == 0:  # the job process
            try:
                os.close(log_r)
                os.close(sync_r)
                _confine(cfg, want, got, sync_w, log_w, workdir, limits, strict=True)
                os.write(3, b"ok")
                os.close(3)
            except BaseException as e:  # noqa: BLE001
                for fd in (sync_w, 3):  # the sync pipe, moved to 3 if _confine got that far
                    try:
                        os.write(fd, b"E" + _short(e).encode()[:4000])
                        break
                    except OSError:
                        pass
                os._exit(SETUP_FAILED)
            _run_job(fn, request, result_dir)  # never returns
        t_fork = time.monotonic()
        os.close(log_w)
        os.close(sync_w)
        _write_at(dirfd, PID_FILE, str(pid).encode())
        status.update(_watch(pid, log_r, sync_r, got, float(msg["timeout_s"]), int(msg["memory_bytes"]),
                             status["timings"], t_fork, bool(want.get("memory_watch"))))
        t_copy = time.monotonic()
        log = status.pop("log")
        if private:
            for name, cap in ((RESULT_FILE, MAX_RESULT_JSON_BYTES), (BLOBS_FILE, cfg["disk_bytes"])):
                err = _copy_out(result_dir, workfd, name, cap)
                if err:
                    status["copy_errors"].append(err)
        status["timings"]["copy_s"] = time.monotonic() - t_copy
        _write_at(dirfd, LOG_FILE, log)
        status["protections"] = got
    except BaseException as e:  # noqa: BLE001
        status["supervisor_error"] = _short(e) + "\n" + traceback.format_exc()[-2000:]
        if pid:
            try:
                _kill_all(pid, got.get("pid_namespace") is True)
            except BaseException:  # noqa: BLE001
                pass
    try:
        status["timings"]["total_s"] = time.monotonic() - t0
        _write_at(dirfd, STATUS_FILE, json.dumps(status, default=str).encode())
    finally:
        os._exit(0)


def _watch(pid: int, log_r: int, sync_r: int, got: dict, timeout: float, memory_limit: int,
           timings: dict, t_fork: float, watch_memory: bool = True) -> dict:
    out: dict[str, Any] = {"killed_for": None, "setup_error": None, "peak_memory": 0}
    log = _LogTail(LOG_KEEP_BYTES)
    pidns = got.get("pid_namespace") is True
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    deadline = t_fork + timeout
    ready, next_poll, sync_buf = False, 0.0, b""
    fds = [log_r, sync_r] + ([pidfd] if pidfd is not None else [])
    exited = None
    while exited is None:
        now = time.monotonic()
        if now >= deadline:
            out["killed_for"] = "timeout"
            break
        wait = deadline - now
        if ready:
            wait = min(wait, max(0.0, next_poll - now))
        if pidfd is None:
            wait = min(wait, 0.02)
        readable, _, _ = select.select(fds, [], [], wait)
        for fd in readable:
            if fd == log_r:
                data = os.read(log_r, 1 << 16)
                if data:
                    log.feed(data)
                    if log.total > MAX_OUTPUT_BYTES:
                        out["killed_for"] = "output"
                else:
                    fds.remove(log_r)
            elif fd == sync_r:
                data = os.read(sync_r, 8192)
                if data:
                    sync_buf += data
                    if sync_buf.startswith(b"ok") and not ready:
                        ready = True
                        timings["ready_s"] = time.monotonic() - t_fork
                else:
                    fds.remove(sync_r)
        if out["killed_for"]:
            break
        if pidfd is None or pidfd in readable or sync_r not in fds:
            wpid, st = os.waitpid(pid, os.WNOHANG)
            if wpid:
                exited = st
                break
        if ready and watch_memory and time.monotonic() >= next_poll:
            t = time.monotonic()
            mem = _memory(_job_pids(pidns), memory_limit)
            out["peak_memory"] = max(out["peak_memory"], mem)
            if mem > memory_limit:
                out["killed_for"] = "memory"
                break
            next_poll = time.monotonic() + max(MEMORY_POLL_S, 5 * (time.monotonic() - t))
    if exited is None:
        _kill_all(pid, pidns)
        _, exited = os.waitpid(pid, 0)
    if not pidns:  # what the job left behind, setsid() or not
        _kill_all(pid, pidns)
    timings["job_s"] = time.monotonic() - t_fork - timings.get("ready_s", 0.0)
    # the rest of the output: every writer is gone (or, without a PID namespace, killed)
    os.set_blocking(log_r, False)
    end = time.monotonic() + 1.0
    while log_r in fds and time.monotonic() < end:
        try:
            data = os.read(log_r, 1 << 16)
        except BlockingIOError:
            select.select([log_r], [], [], 0.05)
            continue
        if not data:
            break
        log.feed(data)
    if sync_buf.startswith(b"E"):
        out["setup_error"] = sync_buf[1:].decode(errors="replace")
    elif not ready and out["killed_for"] is None:
        out["setup_error"] = "the job process ended during its set-up"
    if os.WIFEXITED(exited):
        out["exit_code"], out["signal"] = os.WEXITSTATUS(exited), None
    elif os.WIFSIGNALED(exited):
        out["exit_code"], out["signal"] = None, os.WTERMSIG(exited)
    out["log"] = log.render()
    out["output_bytes"] = log.total
    return out


def _run_job(fn, request, result_dir: str) -> None:
    """In the job process: call the job, write its result files, exit. Never returns."""
    code = 0
    try:
        try:
            out = fn(request)
            if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict)
                    and isinstance(out[1], dict)):
                raise TypeError(f"the job returned {type(out).__name__}, not (manifest dict, blobs dict)")
            manifest, blobs = out
            index = []
            for name, blob in blobs.items():
                if not isinstance(name, str) or not isinstance(blob, (bytes, bytearray, memoryview)):
                    raise TypeError(f"blob {name!r}: names are str and blobs bytes")
                index.append([name, len(blob)])
            header = json.dumps({"manifest": manifest, "blobs": index}).encode()
        except BaseException as e:  # noqa: BLE001 - whatever the job raised, answer
            blobs, code = {}, 0
            header = json.dumps({"error": _short(e), "traceback": traceback.format_exc()[-3000:]}).encode()
        with open(os.path.join(result_dir, BLOBS_FILE), "wb") as f:
            for blob in blobs.values():
                f.write(blob)
        with open(os.path.join(result_dir, RESULT_FILE), "wb") as f:
            f.write(header)
    except BaseException:  # noqa: BLE001
        code = RESULT_UNWRITABLE
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


def _probe(cfg: dict) -> dict:
    """Which protections work here: a throwaway supervisor and job process try them all."""
    want = {name: True for name, _ in _NAMESPACES}
    want.update(readonly_fs=True, hidden_home=True, hidden_paths=True, minimal_dev=True, private_tmp=True,
                private_proc=True, rlimits=True, unprivileged=True, no_new_privs=True, user_namespace=_use_userns(cfg))
    for name in cfg.get("disable", ()):
        want[name] = "disabled"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            cfg = _with_job_uid(cfg)
            got = _enter_namespaces(cfg, want, strict=False)
            r2, w2 = os.pipe()
            job = os.fork()
            if job == 0:
                os.close(r2)
                limits = dict(cfg["limits"], data_bytes=DEFAULT_MEMORY_BYTES)
                workdir = "/tmp" if got.get("private_tmp") is True else tempfile.gettempdir()
                null = os.open(os.devnull, os.O_WRONLY)
                _confine(cfg, want, got, w2, null, workdir, limits, strict=False)
                got["unprivileged"] = got.get("unprivileged") is True and (
                    os.getuid() != 0 or got.get("user_namespace") is True)
                os.write(3, json.dumps(got).encode())
                os._exit(0)
            os.close(w2)
            data = b""
            while chunk := os.read(r2, 65536):
                data += chunk
            os.waitpid(job, 0)
            got = json.loads(data) if data else dict(got, private_proc="the probe's job process failed")
            os.write(w, json.dumps(got).encode())
        except BaseException as e:  # noqa: BLE001
            os.write(w, json.dumps({"probe_error": _short(e)}).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    got = json.loads(data) if data else {"probe_error": "the probe died"}
    got["memory_watch"] = "disabled" if "memory_watch" in cfg.get("disable", ()) else True
    if not _use_userns(cfg):
        got.pop("user_namespace", None)
    return got


def _use_userns(cfg: dict) -> bool:
    return os.geteuid() != 0 if cfg.get("user_namespace") is None else bool(cfg["user_namespace"])


def _vm_data() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def _zygote_main(cfg: dict) -> None:
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # prints go to the zygote's log, never into the protocol
    os.close(null)
    t0 = time.perf_counter()
    cfg["masks"] = _mask_plan(cfg.get("home"), os.geteuid() == 0 and not _use_userns(cfg))
    cfg["readonly_paths"] = sorted(set(cfg.get("readonly_paths", [])) | set(_needed_paths()))
    protections = _probe(cfg)
    want = {k: v is True for k, v in protections.items()}
    t1 = time.perf_counter()
    try:
        if cfg.get("preload"):  # it must start no thread pool work: a fork after jax lowered hangs
            _resolve(cfg["preload"])()
    except BaseException as e:  # noqa: BLE001
        _write_frame(proto_out, {"op": "failed", "error": f"preload failed: {_short(e)}"})
        os._exit(1)
    _write_frame(proto_out, {"op": "ready", "pid": os.getpid(), "protections": protections,
                             "probe_s": t1 - t0, "preload_s": time.perf_counter() - t1})
    jobs: dict[str, Any] = {}
    while True:
        try:
            msg = _read_frame(proto_in)
        except (EOFError, OSError, ValueError):
            os._exit(0)
        if msg.get("op") != "run":
            _write_frame(proto_out, {"op": "pong", "pid": os.getpid()})
            continue
        try:
            if msg["job"] not in jobs:
                jobs[msg["job"]] = _resolve(msg["job"])
            fn = jobs[msg["job"]]
        except BaseException as e:  # noqa: BLE001
            _write_frame(proto_out, {"op": "done", "error": f"cannot load job {msg.get('job')!r}: {_short(e)}"})
            continue
        cfg["baseline_data"] = _vm_data()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(proto_in)
            os.close(proto_out)
            _supervise(fn, msg, cfg, want)
        _, st = os.waitpid(pid, 0)
        _write_frame(proto_out, {"op": "done", "status": st})


# ---------------------------------------------------------------------------------------
# The parent's side

def _scrubbed_env(base: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update(HOME=base, TMPDIR=base, PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1",
               JAXBENCH_BUNDLE_DIR=os.path.join(base, "bundles"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                                       if os.environ.get("PYTHONPATH") else []))
    return env


def _read_bounded(path: str, cap: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{os.path.basename(path)} is not a regular file")
        if st.st_size > cap:
            raise ValueError(f"{os.path.basename(path)} is {st.st_size} bytes, over the {cap}-byte limit")
        data = _read_exact(fd, st.st_size) if st.st_size else b""
        if os.read(fd, 1):
            raise ValueError(f"{os.path.basename(path)} grew while read")
        return data
    finally:
        os.close(fd)


def _signal_name(sig: int) -> str:
    try:
        return f"{signal.Signals(sig).name} ({sig})"
    except ValueError:
        return f"signal {sig}"


def _filter_noise(text: str, n: int = 4000) -> str:
    lines = [ln for ln in text.splitlines() if not any(noise in ln for noise in _LIBTPU_NOISE)]
    return "\n".join(lines)[-n:]


class Sandbox:
    """Runs ``module:function`` jobs, each in a fresh isolated process forked from a zygote.

    ``timeout_s``: wall clock per job; ``memory_bytes``: private memory of all the job's
    processes together (and its data segment, per process); ``readonly_paths``: made
    read-only even where the kernel cannot make the whole tree read-only; ``preload``:
    ``module:function`` the zygote runs once before forking (importing and tracing are
    fine; lowering or compiling with jax there makes every forked job hang);
    ``hidden_paths``: an empty directory (``/dev/null`` for a file) in the job's view;
    ``disk_bytes``: the job's private ``/tmp`` and its largest file; ``processes``,
    ``open_files``: its RLIMIT_NPROC (per uid, threads included) and RLIMIT_NOFILE;
    ``uid``/``gid``: what the job runs as when the sandbox is root (``uid=None``: a uid of
    its own per job, see ``JOB_UID_BASE``); ``user_namespace``:
    None (when not root), True or False; ``disable``: protections not to use (tests of the
    degraded mode).

    ``run`` is serialized by a lock (threads may share a sandbox); a pickled copy or a
    forked child starts its own zygote when first used. Jobs are resolved (imported) in the
    zygote, so a job module must not start jax lowering at import either."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 readonly_paths=(), preload: str | None = DEFAULT_PRELOAD, *, hidden_paths=(),
                 disk_bytes: int = DEFAULT_DISK_BYTES, processes: int = 256, open_files: int = 1024,
                 uid: int | None = None, gid: int = UNPRIVILEGED_ID, user_namespace: bool | None = None,
                 disable=()):
        self.timeout_s = float(timeout_s)
        self.memory_bytes = int(memory_bytes)
        self.readonly_paths = tuple(str(p) for p in readonly_paths)
        self.hidden_paths = tuple(str(p) for p in hidden_paths)
        self.preload = preload
        self.disk_bytes = int(disk_bytes)
        self.processes = int(processes)
        self.open_files = int(open_files)
        self.uid, self.gid = (None if uid is None else int(uid)), int(gid)
        self.user_namespace = user_namespace
        self.disable = tuple(disable)
        self.protections: dict[str, Any] = {}
        self.startup_s: float | None = None
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._base: str | None = None
        self._log = None
        self._jobs = 0
        self._owner = os.getpid()

    # -- the zygote --------------------------------------------------------------------
    def _config(self) -> dict:
        home = os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
        return {"preload": self.preload, "home": home, "uid": self.uid,
                "user_namespace": self.user_namespace, "disable": list(self.disable),
                "gid": self.gid, "disk_bytes": self.disk_bytes,
                "readonly_paths": [os.path.realpath(p) for p in self.readonly_paths],
                "hidden_paths": [os.path.realpath(p) for p in self.hidden_paths],
                "limits": {"file_bytes": self.disk_bytes, "open_files": self.open_files,
                           "processes": self.processes}}

    def _start(self) -> None:
        t0 = time.monotonic()
        self._base = tempfile.mkdtemp(prefix="jaxbench-sandbox-")
        os.chmod(self._base, 0o711)
        os.mkdir(os.path.join(self._base, "bundles"), 0o700)
        log_fd = os.open(os.path.join(self._base, "zygote.log"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._log = os.fdopen(log_fd, "w+b")
        self._owner = os.getpid()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "jaxbench_env.sandbox", json.dumps(self._config())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=_scrubbed_env(self._base),
            cwd=self._base, start_new_session=True, close_fds=True,
        )
        try:
            msg = self._await_frame(t0 + STARTUP_TIMEOUT_S)
        except SandboxError as e:
            tail = self._zygote_tail()
            self._stop()
            raise SandboxError(f"the sandbox's zygote did not start: {e}\n{tail}") from None
        if msg.get("op") != "ready":
            tail = self._zygote_tail()
            self._stop()
            raise SandboxError(f"the sandbox's zygote did not start: {msg.get('error')}\n{tail}")
        self.protections = msg["protections"]
        self.startup_s = time.monotonic() - t0
        missing = {k: v for k, v in self.protections.items() if v is not True}
        key = tuple(sorted(missing))
        if missing and key not in _warned:
            _warned.add(key)
            warnings.warn("sandbox running without: " + "; ".join(f"{k} ({v})" for k, v in sorted(missing.items())),
                          RuntimeWarning, stacklevel=4)

    def _await_frame(self, deadline: float) -> dict:
        fd = self._proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError("no answer in time")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                try:
                    return _read_frame(fd)
                except (EOFError, OSError, ValueError) as e:
                    code = self._proc.poll()
                    raise SandboxError(f"zygote died (exit status {code})" if code is not None
                                       else f"bad frame from the zygote: {e}") from None
            if self._proc.poll() is not None:
                raise SandboxError(f"zygote died (exit status {self._proc.returncode})")

    def _zygote_tail(self) -> str:
        if self._log is None:
            return ""
        try:
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - 40000))
            return _filter_noise(self._log.read().decode(errors="replace"), 2000)
        except (OSError, ValueError):
            return ""

    def _stop(self) -> None:
        if self._owner != os.getpid():
            return  # a forked copy: the zygote and its directory belong to the parent
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the zygote and a supervisor, if one runs
            except (ProcessLookupError, PermissionError):
                pass
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                pipe.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def start(self) -> dict:
        """Start the zygote now (``run`` does when needed); returns ``protections``."""
        with self._lock:
            self._ensure_started()
        return self.protections

    def _ensure_started(self) -> None:
        if self._owner != os.getpid():  # a forked copy of the parent: the zygote is not ours
            self._proc = self._log = self._base = None
            self._owner = os.getpid()
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._start()

    # -- jobs ---------------------------------------------------------------------------
    def run(self, job: str, request: dict, timeout_s: float | None = None,
            memory_bytes: int | None = None) -> SandboxResult:
        """Run ``job`` (``module:function``, importable in the zygote) on ``request`` (JSON)."""
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        memory = self.memory_bytes if memory_bytes is None else int(memory_bytes)
        frame = {"op": "run", "job": job, "timeout_s": timeout, "memory_bytes": memory}
        data = json.dumps(request, allow_nan=False).encode()  # a caller's error: raise here, not in the zygote
        if len(data) > MAX_FRAME_BYTES:
            raise ValueError(f"a request of {len(data)} bytes is too large")
        with self._lock:
            t0 = time.monotonic()
            try:
                self._ensure_started()
            except SandboxError as e:
                return SandboxResult(None, {}, str(e), time.monotonic() - t0, "")
            self._jobs += 1
            jobdir = os.path.join(self._base, f"job-{self._jobs}")
            os.mkdir(jobdir, 0o711)
            os.mkdir(os.path.join(jobdir, "work"), 0o700)
            try:
                with open(os.path.join(jobdir, REQUEST_FILE), "xb",
                          opener=lambda path, flags: os.open(path, flags, 0o600)) as f:
                    f.write(data)
                return self._run(jobdir, dict(frame, dir=jobdir), timeout, t0)
            finally:
                shutil.rmtree(jobdir, ignore_errors=True)

    def _run(self, jobdir: str, frame: dict, timeout: float, t0: float) -> SandboxResult:
        try:
            _write_frame(self._proc.stdin.fileno(), frame)
            msg = self._await_frame(time.monotonic() + timeout + SUPERVISOR_GRACE_S)
        except (OSError, SandboxError) as e:
            tail = self._zygote_tail()
            self._kill_leftover(jobdir)
            self._stop()
            return SandboxResult(None, {}, f"the sandbox failed during the job ({e}); it will be restarted. "
                                 f"Zygote output:\n{tail}", time.monotonic() - t0, "")
        wall = time.monotonic() - t0
        if msg.get("error"):
            return SandboxResult(None, {}, msg["error"], wall, "")
        return self._collect(jobdir, msg, timeout, frame["memory_bytes"], wall)

    def _kill_leftover(self, jobdir: str) -> None:
        try:
            pid = int(_read_bounded(os.path.join(jobdir, PID_FILE), 32))
            if pid > 1:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass

    def _collect(self, jobdir: str, msg: dict, timeout: float, memory: int, wall: float) -> SandboxResult:
        def fail(error: str, tail: str = "", timings=None) -> SandboxResult:
            return SandboxResult(None, {}, error, wall, tail, timings or {})

        try:
            log = _read_bounded(os.path.join(jobdir, LOG_FILE), 4 * LOG_KEEP_BYTES).decode(errors="replace")
        except (OSError, ValueError):
            log = ""
        tail = _filter_noise(log)
        try:
            status = json.loads(_read_bounded(os.path.join(jobdir, STATUS_FILE), MAX_STATUS_BYTES))
            if not isinstance(status, dict):
                raise ValueError("not an object")
        except (OSError, ValueError) as e:
            return fail(f"the sandbox's supervisor failed (wait status {msg.get('status')}, {e})", tail)
        timings = status.get("timings") if isinstance(status.get("timings"), dict) else {}
        if status.get("supervisor_error"):
            return fail(f"the sandbox's supervisor failed: {status['supervisor_error']}", tail, timings)
        if status.get("killed_for") == "timeout":
            return fail(f"timed out after {timeout:g} s", tail, timings)
        if status.get("killed_for") == "output":
            return fail(f"output limit exceeded: more than {MAX_OUTPUT_BYTES / 2**20:g} MiB written to stdout and "
                        "stderr", tail, timings)
        if status.get("killed_for") == "memory":
            return fail(f"memory limit exceeded: {status.get('peak_memory', 0) / 2**30:.2f} GiB in use, limit "
                        f"{memory / 2**30:.2f} GiB", tail, timings)
        if status.get("setup_error"):
            return fail(f"sandbox set-up failed: {status['setup_error']}", tail, timings)
        sig, code = status.get("signal"), status.get("exit_code")
        if sig is not None:
            hint = " (out of memory?)" if sig == signal.SIGKILL else ""
            return fail(f"job killed by signal {_signal_name(sig)}{hint} before returning a result", tail, timings)
        if code == RESULT_UNWRITABLE:
            return fail("the job could not write its result (see its output)", tail, timings)
        if code != 0:
            return fail(f"job exited with code {code} before returning a result", tail, timings)
        if status.get("copy_errors"):
            return fail("malformed result: " + "; ".join(map(str, status["copy_errors"])), tail, timings)
        work = os.path.join(jobdir, "work")
        try:
            manifest, blobs = self._parse_result(work)
        except _JobFailed as e:
            return fail(f"job failed: {e}", tail, timings)
        except FileNotFoundError:
            return fail("malformed result: the job exited without writing its result", tail, timings)
        except (OSError, ValueError, TypeError, KeyError, RecursionError) as e:
            return fail(f"malformed result: {type(e).__name__}: {e}"[:2000], tail, timings)
        return SandboxResult(manifest, blobs, None, wall, tail, timings)

    def _parse_result(self, work: str) -> tuple[dict, dict[str, bytes]]:
        header = json.loads(_read_bounded(os.path.join(work, RESULT_FILE), MAX_RESULT_JSON_BYTES))
        if not isinstance(header, dict):
            raise ValueError(f"{RESULT_FILE} is not a JSON object")
        if "error" in header:
            raise _JobFailed(str(header["error"])[:4000])
        manifest, index = header.get("manifest"), header.get("blobs")
        if not isinstance(manifest, dict):
            raise ValueError("the manifest is not a JSON object")
        if not isinstance(index, list) or len(index) > 10000:
            raise ValueError("the blob index is not a list")
        total, names = 0, set()
        for entry in index:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                    and type(entry[1]) is int and 0 <= entry[1] and len(entry[0]) <= 1000):
                raise ValueError(f"bad blob index entry {str(entry)[:100]}")
            if entry[0] in names:
                raise ValueError(f"blob {entry[0]!r} twice")
            names.add(entry[0])
            total += entry[1]
        try:
            data = _read_bounded(os.path.join(work, BLOBS_FILE), self.disk_bytes)
        except FileNotFoundError:
            data = b""
        if len(data) != total:
            raise ValueError(f"{BLOBS_FILE} has {len(data)} bytes, the index says {total}")
        blobs, pos = {}, 0
        for name, size in index:
            blobs[name] = data[pos:pos + size]
            pos += size
        return manifest, blobs

    # -- copies and clean-up --------------------------------------------------------------
    def __getstate__(self):
        # A copy (pickled to an RLlib env runner, say) starts its own zygote when first used.
        state = dict(self.__dict__)
        state.update(_lock=None, _proc=None, _base=None, _log=None, _jobs=0, _owner=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._owner = os.getpid()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self._stop()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _JobFailed(Exception):
    """The job raised; the message is its own."""


if __name__ == "__main__":
    try:
        _zygote_main(json.loads(sys.argv[1]))
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:  # never through interpreter shutdown: jax's threads may hold locks
        sys.stderr.flush()
        os._exit(1)
