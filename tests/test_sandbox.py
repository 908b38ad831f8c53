"""The candidate sandbox under attack: one test per attack, each checking that the job fails
or is contained with a clear error, that nothing outside its work dir changed, and that the
next honest job still works.

The jobs are Python source run by ``exec_job`` below, in the sandbox's forked job process
(the zygote imports this module as ``tests.test_sandbox``). The attacks that need the
kernel's protections are skipped where the sandbox reports them missing.
"""

from __future__ import annotations

import os
import pickle
import secrets
import shutil
import signal
import socket
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

from jaxbench_env.sandbox import JOB_UID_BASE, Sandbox

JOB = "tests.test_sandbox:exec_job"
PROJECT = Path(__file__).resolve().parent.parent
SECRET_VAR = "JAXBENCH_SANDBOX_TEST_SECRET"
NAMESPACES = ("pid_namespace", "mount_namespace", "network_namespace", "ipc_namespace", "uts_namespace")


def exec_job(request):
    """The test job: exec ``request["code"]`` with ``request``, ``manifest`` and ``blobs`` in scope."""
    scope = {"request": request, "manifest": {}, "blobs": {}}
    exec(compile(request["code"], "<job>", "exec"), scope)
    return scope["manifest"], scope["blobs"]


# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def places():
    """A token, a read-only directory and a hidden one (outside /tmp, so the job could see them)."""
    where = "/var/tmp" if os.path.isdir("/var/tmp") else None
    base = Path(tempfile.mkdtemp(prefix="jaxbench-sandbox-test-", dir=where))
    ro, hidden = base / "cache", base / "hidden"
    ro.mkdir()
    hidden.mkdir()
    token = secrets.token_hex(16)
    (ro / "entry.json").write_text("{}")
    (hidden / "secret.txt").write_text(token)
    for p in (base, ro, hidden):
        p.chmod(0o755)
    (hidden / "secret.txt").chmod(0o644)  # readable by anyone: only the hiding protects it
    yield {"token": token, "ro": ro, "hidden": hidden, "base": base}
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def sandbox(places):
    """One sandbox with the real preload (jax and the v6e topology), shared by the attacks."""
    os.environ[SECRET_VAR] = places["token"]  # set before the zygote starts: it must not inherit it
    sb = Sandbox(timeout_s=20, memory_bytes=4 * 2**30, readonly_paths=(str(places["ro"]),),
                 hidden_paths=(str(places["hidden"]),))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = sb.run(JOB, {"code": "manifest['ok'] = 1"})
    assert first.error is None, first.error
    yield sb
    sb.close()
    os.environ.pop(SECRET_VAR, None)


def run(sb: Sandbox, code: str, timeout_s: float | None = None, **request):
    return sb.run(JOB, {"code": textwrap.dedent(code), **request}, timeout_s=timeout_s)


def assert_healthy(sb: Sandbox) -> None:
    r = run(sb, "manifest['ok'] = 1; blobs['b'] = bytes(range(256))")
    assert r.error is None, r.error
    assert r.manifest == {"ok": 1} and r.blobs == {"b": bytes(range(256))}


def processes_with(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
            except OSError:
                pass
    return found


def require(sb: Sandbox, *names: str) -> None:
    missing = [n for n in names if sb.protections.get(n) is not True]
    if missing:
        pytest.skip(f"protection unavailable here: {missing}")


@pytest.fixture(autouse=True)
def untouched(places):
    """After every test: nothing outside the jobs' work dirs changed."""
    home = Path(os.path.expanduser("~"))
    watched = [PROJECT, PROJECT / "jaxbench_env", PROJECT / "tests", home, places["ro"], places["hidden"],
               Path(tempfile.gettempdir())]
    before = {p: sorted(os.listdir(p)) for p in watched if p.is_dir()}
    ro_files = {p: p.read_bytes() for p in places["ro"].iterdir()}
    yield
    for p, names in before.items():
        now = sorted(os.listdir(p))
        assert not [n for n in now if "pwned" in n.lower()], f"the job wrote into {p}"
        if p in (places["ro"], places["hidden"]):
            assert now == names, f"{p} changed"
    assert {p: p.read_bytes() for p in places["ro"].iterdir()} == ro_files
    assert (places["hidden"] / "secret.txt").read_text() == places["token"]


# ---------------------------------------------------------------------------------------
# Honest jobs

def test_protections_hold_as_root(sandbox):
    if os.geteuid() != 0:
        pytest.skip("as root only")
    assert all(v is True for v in sandbox.protections.values()), sandbox.protections


def test_honest_job_round_trip(sandbox):
    r = run(sandbox, """
        import os, sys
        print("to stdout"); print("to stderr", file=sys.stderr)
        manifest.update(uid=os.getuid(), pid=os.getpid(), cwd=os.getcwd(), nested={"a": [1, 2.5, None]},
                        fds=sorted(int(f) for f in os.listdir("/proc/self/fd")))
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        manifest["caps"] = [int(status[k], 16) for k in ("CapEff", "CapPrm", "CapBnd")] + [int(status["NoNewPrivs"])]
        blobs.update(empty=b"", data=os.urandom(100000), text=b"x" * 7)
        open("scratch", "w").write("the work dir is writable")
    """)
    assert r.error is None, r.error
    assert r.manifest["nested"] == {"a": [1, 2.5, None]}
    assert set(r.blobs) == {"empty", "data", "text"} and len(r.blobs["data"]) == 100000 and r.blobs["empty"] == b""
    assert "to stdout" in r.stderr_tail and "to stderr" in r.stderr_tail
    assert r.manifest["fds"][:3] == [0, 1, 2] and len(r.manifest["fds"]) <= 4  # + the listing's own
    if os.geteuid() == 0 and sandbox.protections.get("unprivileged") is True:
        assert r.manifest["uid"] >= JOB_UID_BASE and r.manifest["caps"] == [0, 0, 0, 1]
    if sandbox.protections.get("pid_namespace") is True:
        assert r.manifest["pid"] == 1
    assert 0 < r.wall_s < 10


def test_build_artifacts_of_a_pallas_kernel(sandbox):
    """The real job after the real preload: forking after jax is loaded works."""
    import workloads

    source = workloads.get("gemm").template_source()
    r = sandbox.run("jaxbench_env.candidate_process:build_artifacts", {"workload": "gemm", "source": source})
    assert r.error is None, r.error
    assert r.manifest["error"] is None, r.manifest["error"]
    assert {"full_tpu", "check_tpu", "check_cpu"} <= set(r.blobs)
    assert all(len(b) > 100 for b in r.blobs.values())


def test_job_exceptions_and_bad_returns_are_reported(sandbox):
    r = run(sandbox, "raise ValueError('candidate says no')")
    assert r.manifest is None and "ValueError: candidate says no" in r.error
    r = sandbox.run("jaxbench_env.sandbox:_short", {"x": 1})  # returns a str, not (dict, dict)
    assert r.manifest is None and "not (manifest dict, blobs dict)" in r.error
    r = sandbox.run("no_such_module_xyz:job", {})
    assert r.manifest is None and "cannot load job" in r.error
    r = run(sandbox, "manifest['x'] = object()")
    assert r.manifest is None and "not JSON serializable" in r.error
    assert_healthy(sandbox)


def test_threads_share_one_sandbox_sequentially(sandbox):
    errors = []

    def worker(i):
        for j in range(3):
            r = run(sandbox, f"manifest['v'] = {i * 10 + j}")
            if r.error or r.manifest != {"v": i * 10 + j}:
                errors.append((i, j, r.error, r.manifest))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ---------------------------------------------------------------------------------------
# Attacks

def test_writes_outside_the_work_dir_fail(sandbox, places):
    home = os.path.expanduser("~")
    r = run(sandbox, """
        import os
        done = []
        for d in request["targets"]:
            try:
                with open(os.path.join(d, "PWNED-by-candidate"), "w") as f:
                    f.write("x")
                done.append(d)
            except OSError:
                pass
        for victim in request["victims"]:
            try:
                open(victim, "a").write("# pwned")
                done.append(victim)
            except OSError:
                pass
            try:
                os.chmod(victim, 0o777)
                done.append("chmod " + victim)
            except OSError:
                pass
        manifest["written"] = done
    """, targets=[str(PROJECT), str(PROJECT / "jaxbench_env"), home, str(places["ro"]), str(places["hidden"]),
                  str(places["base"]), "/var/tmp", "/dev", "/dev/shm", "/run", tempfile.gettempdir(), "/etc"],
        victims=[str(PROJECT / "jaxbench_env" / "sandbox.py"), str(places["ro"] / "entry.json"),
                 str(PROJECT / "README.md")])
    assert r.error is None, r.error
    allowed = {tempfile.gettempdir(), "/dev/shm", "/run"} if sandbox.protections.get("private_tmp") is True else set()
    assert set(r.manifest["written"]) <= allowed, r.manifest["written"]
    assert not list(places["base"].glob("**/PWNED*"))
    assert_healthy(sandbox)


def test_secrets_are_not_visible(sandbox, places):
    require(sandbox, "hidden_paths", "private_proc")
    token = places["token"]
    r = run(sandbox, """
        import os, glob
        seen = {"environ": dict(os.environ)}
        for path in [f"/proc/{request['parent']}/environ", f"/proc/{request['parent']}/cmdline",
                     "/proc/1/environ", request["secret_file"], os.path.expanduser("~root") + "/.bash_history"]:
            try:
                seen[path] = open(path, "rb").read().decode(errors="replace")
            except OSError as e:
                seen[path] = f"{type(e).__name__}"
        for path in glob.glob("/proc/[0-9]*/environ"):
            try:
                seen[path] = open(path, "rb").read().decode(errors="replace")
            except OSError as e:
                seen[path] = f"{type(e).__name__}"
        seen["pids"] = sorted(p for p in os.listdir("/proc") if p.isdigit())
        print(seen)
        manifest.update(seen=seen)
    """, parent=os.getpid(), secret_file=str(places["hidden"] / "secret.txt"))
    assert r.error is None, r.error
    assert os.environ[SECRET_VAR] == token
    assert token not in repr(r.manifest) and token not in r.stderr_tail
    assert SECRET_VAR not in r.manifest["seen"]["environ"]
    assert r.manifest["seen"]["pids"] == ["1"]  # its own PID namespace: nobody else's /proc
    assert_healthy(sandbox)


def test_no_network(sandbox):
    require(sandbox, "network_namespace")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.5)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0jaxbench-sandbox-test-" + secrets.token_hex(4).encode())
    abstract.listen(5)
    abstract.settimeout(0.5)
    try:
        r = run(sandbox, """
            import socket
            out = {}
            for family, addr in [(socket.AF_INET, ("127.0.0.1", request["port"])),
                                 (socket.AF_UNIX, request["abstract"].encode("latin-1"))]:
                s = socket.socket(family)
                s.settimeout(2)
                try:
                    s.connect(addr)
                    s.sendall(b"leak")
                    out[str(family)] = "connected"
                except OSError as e:
                    out[str(family)] = f"{type(e).__name__}: {e}"
            manifest.update(out)
        """, port=server.getsockname()[1], abstract=abstract.getsockname().decode("latin-1"))
        assert r.error is None, r.error
        assert all(v != "connected" for v in r.manifest.values()), r.manifest
        for s in (server, abstract):
            with pytest.raises((socket.timeout, TimeoutError)):
                s.accept()
    finally:
        server.close()
        abstract.close()
    assert_healthy(sandbox)


def test_detached_processes_die_with_the_job(sandbox, places):
    require(sandbox, "pid_namespace")
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6) + 1}"
    late = places["ro"] / "late-marker"
    r = run(sandbox, """
        import os, subprocess, time
        # a setsid shell, and a double-forked setsid Python process: both outlive the job's main process
        subprocess.Popen(["sh", "-c", f"sleep 1; echo pwned > {request['late']}; sleep {request['marker']}"],
                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", request["marker"]])
            os._exit(0)
        time.sleep(0.3)
        manifest["spawned"] = True
    """, marker=marker, late=str(late))
    assert r.error is None, r.error
    assert processes_with(marker) == []  # gone as soon as the job answered
    time.sleep(1.5)
    assert processes_with(marker) == [] and not late.exists()
    assert_healthy(sandbox)


def test_timeout_kills_the_job(sandbox):
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6) + 2}"
    r = run(sandbox, """
        import subprocess, time
        subprocess.Popen(["sleep", request["marker"]], start_new_session=True)
        time.sleep(100)
    """, timeout_s=1.5, marker=marker)
    assert r.manifest is None and r.error == "timed out after 1.5 s"
    assert r.wall_s < 6
    assert processes_with(marker) == []
    r = run(sandbox, "while True: pass", timeout_s=1)
    assert r.error == "timed out after 1 s"
    assert_healthy(sandbox)


def test_allocating_100_gb_fails(sandbox):
    r = run(sandbox, "x = bytearray(100 * 2**30); manifest['n'] = len(x)")
    assert r.manifest is None and "MemoryError" in r.error
    assert_healthy(sandbox)


def test_memory_of_all_processes_is_capped(sandbox):
    """Under the per-process data limit, but four processes together are over the job's limit."""
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6) + 3}"
    r = sandbox.run(JOB, {"code": textwrap.dedent("""
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                block = bytearray(600 * 2**20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(60)
        block = bytearray(600 * 2**20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(60)
    """), "marker": marker}, timeout_s=20, memory_bytes=1 * 2**30)
    assert r.manifest is None and r.error.startswith("memory limit exceeded"), r.error
    assert r.wall_s < 15
    assert_healthy(sandbox)


def test_printing_gigabytes_is_contained(sandbox):
    """Output under the cap is kept as a short tail; a flood past it stops the job at once, on no disk."""
    r = run(sandbox, """
        import os
        chunk = b"spam " * (2**20 // 5)
        for _ in range(8):  # 8 MiB: under the cap
            os.write(1, chunk)
        print("the end", flush=True)
        manifest["done"] = True
    """, timeout_s=30)
    assert r.error is None, r.error
    assert r.manifest == {"done": True}
    assert r.stderr_tail.endswith("spam the end") and len(r.stderr_tail) < 10000

    before = shutil.disk_usage(tempfile.gettempdir()).used
    r = run(sandbox, """
        import os
        chunk = b"spam " * (2**20 // 5)
        for _ in range(1536):  # 1.5 GiB on stdout
            os.write(1, chunk)
        manifest["done"] = True
    """, timeout_s=30)
    assert r.manifest is None and r.error.startswith("output limit exceeded"), r.error
    assert r.wall_s < 15
    assert shutil.disk_usage(tempfile.gettempdir()).used - before < 100 * 2**20
    assert_healthy(sandbox)


def test_filling_the_disk_is_capped(sandbox):
    require(sandbox, "private_tmp")
    before = shutil.disk_usage(tempfile.gettempdir()).used
    r = run(sandbox, """
        import os
        written, errors = 0, []
        chunk = b"\\0" * 2**24
        for i in range(200):  # up to 3 GiB in 16 MiB files... or one big one
            try:
                with open(f"junk-{i}", "wb") as f:
                    for _ in range(8):
                        f.write(chunk)
                        written += len(chunk)
            except OSError as e:
                errors.append(e.strerror)
                break
        manifest.update(written=written, errors=errors)
    """, timeout_s=30)
    assert r.error is None, r.error
    assert r.manifest["errors"] and r.manifest["written"] <= sandbox.disk_bytes
    assert shutil.disk_usage(tempfile.gettempdir()).used - before < 100 * 2**20
    assert_healthy(sandbox)


def test_exit_and_signals_are_reported(sandbox):
    zygote = sandbox._proc.pid
    r = run(sandbox, "import os; os._exit(3)")
    assert r.manifest is None and r.error == "job exited with code 3 before returning a result"
    r = run(sandbox, "import ctypes; ctypes.string_at(0)")
    assert r.manifest is None and "killed by signal SIGSEGV (11)" in r.error
    r = run(sandbox, "import sys; sys.exit(0)")  # SystemExit is an exception like any other
    assert r.manifest is None and "SystemExit" in r.error
    assert sandbox._proc.pid == zygote
    assert_healthy(sandbox)


def test_killing_its_group_and_parent(sandbox):
    """Its own session and PID namespace: the signals reach nothing outside. (As PID 1 of its
    namespace, the job even survives its own SIGKILL.)"""
    zygote = sandbox._proc.pid
    for code in ["import os, signal; os.killpg(0, signal.SIGKILL); manifest['alive'] = True",
                 "import os, signal; os.kill(os.getppid(), signal.SIGKILL); manifest['alive'] = True",
                 "import os, signal\ntry: os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError: pass\n"
                 "manifest['alive'] = True"]:
        r = run(sandbox, code, timeout_s=10)
        assert r.manifest == {"alive": True} or "killed by signal SIGKILL (9)" in r.error, r.error
        assert sandbox._proc.poll() is None and sandbox._proc.pid == zygote
    assert_healthy(sandbox)


def test_infinite_recursion(sandbox):
    r = run(sandbox, """
        def f(n):
            return f(n + 1) + 1
        f(0)
    """)
    assert r.manifest is None and "RecursionError" in r.error, r.error
    r = run(sandbox, """
        import sys
        sys.setrecursionlimit(10**6)
        nested = []
        for _ in range(10**6):
            nested = [nested]
        repr(nested)  # recursion in C: the stack overflows
    """, timeout_s=10)
    assert r.manifest is None and "killed by signal SIGSEGV (11)" in r.error, r.error
    assert_healthy(sandbox)


def test_fork_bomb_is_bounded(sandbox):
    require(sandbox, "pid_namespace", "rlimits")
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6) + 4}"
    r = run(sandbox, """
        import os, time
        failed = 0
        while True:
            try:
                if os.fork() == 0:
                    os.execvp("sleep", ["sleep", request["marker"]]) if os.getpid() % 2 else None
            except OSError:
                failed += 1
                time.sleep(0.01)
    """, timeout_s=3, marker=marker)
    assert r.manifest is None and r.error == "timed out after 3 s"
    assert processes_with(marker) == []
    assert_healthy(sandbox)


def test_a_fork_bomb_leaves_a_neighbouring_job_its_threads(sandbox):
    """RLIMIT_NPROC counts per uid: jobs of one uid would share the bomb's exhausted count."""
    require(sandbox, "pid_namespace", "rlimits", "unprivileged")
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6) + 4}"
    bomb = threading.Thread(target=run, args=(sandbox, """
        import os, time
        while True:
            try:
                if os.fork() == 0:
                    os.execvp("sleep", ["sleep", request["marker"]])
            except OSError:
                time.sleep(0.01)
    """, 6), kwargs={"marker": marker})
    bomb.start()
    deadline = time.monotonic() + 5
    while len(processes_with(marker)) < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    neighbour = Sandbox(timeout_s=20, preload=None)
    try:
        r = run(neighbour, """
            import os, threading
            ts = [threading.Thread(target=lambda: None) for _ in range(64)]
            for t in ts: t.start()
            for t in ts: t.join()
            manifest["uid"] = os.getuid()
        """)
    finally:
        bomb.join()
        neighbour.close()
    assert len(processes_with(marker)) == 0
    assert r.error is None, r.error
    assert r.manifest["uid"] >= JOB_UID_BASE


@pytest.mark.parametrize("garbage", [
    "open('result.json', 'w').write('{not json')",
    "open('result.json', 'w').write('[' * 100000 + ']' * 100000)",
    "import json; open('result.json', 'w').write(json.dumps({'manifest': {}, 'blobs': [['a', -1]]}))",
    "import json; open('result.json', 'w').write(json.dumps({'manifest': [], 'blobs': []}))",
    "import json; open('result.json', 'w').write(json.dumps({'manifest': {}, 'blobs': [['a', 10**12]]}))",
    "import json; open('result.json', 'w').write(json.dumps({'manifest': {}, 'blobs': [['a', 1], ['a', 1]]})); "
    "open('blobs.bin', 'wb').write(b'xy')",
    "import os; os.symlink('/etc/passwd', 'result.json')",
    "import os; os.mkfifo('result.json')",
    "import os; os.symlink('/dev/zero', 'blobs.bin'); open('result.json', 'w').write('{}')",
    "open('result.json', 'wb').write(b' ' * (17 * 2**20))",
])
def test_garbage_results_are_failures(sandbox, garbage):
    """The job's result files overwritten (then ``os._exit(0)``, so they stay as they are)."""
    result_dir = "/run" if sandbox.protections.get("private_tmp") is True else "."
    r = run(sandbox, f"import os\nos.chdir({result_dir!r})\n{garbage}\nos._exit(0)", timeout_s=10)
    assert r.manifest is None and r.blobs == {}
    assert r.error.startswith(("malformed result", "job failed")), r.error


# ---------------------------------------------------------------------------------------
# The zygote's life

@pytest.fixture
def light():
    """A sandbox of its own, without the jax preload (starts in about a second)."""
    sb = Sandbox(timeout_s=10, preload=None)
    yield sb
    sb.close()


def test_a_dead_zygote_is_replaced(light):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_healthy(light)
    first = light._proc.pid
    os.kill(first, signal.SIGKILL)  # between jobs: noticed before the next one
    light._proc.wait()
    assert_healthy(light)
    second = light._proc.pid
    assert second != first
    marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6) + 5}"
    threading.Timer(1.0, os.kill, (second, signal.SIGKILL)).start()  # during a job
    r = run(light, "import subprocess, time; subprocess.Popen(['sleep', request['marker']]); time.sleep(8)",
            marker=marker)
    assert r.manifest is None and "sandbox failed during the job" in r.error and r.wall_s < 5
    assert_healthy(light)
    assert light._proc.pid not in (first, second)
    time.sleep(0.2)
    assert processes_with(marker) == []


def test_pickled_copies_start_their_own_zygote(light):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_healthy(light)
        copy = pickle.loads(pickle.dumps(light))
        assert copy._proc is None and copy.timeout_s == light.timeout_s
        try:
            assert_healthy(copy)
            assert copy._proc.pid != light._proc.pid
        finally:
            copy.close()
    assert_healthy(light)


def test_degraded_mode_warns_and_still_works():
    sb = Sandbox(timeout_s=10, preload=None, disable=NAMESPACES)
    try:
        with pytest.warns(RuntimeWarning, match="sandbox running without: .*pid_namespace"):
            assert_healthy(sb)
        assert sb.protections["pid_namespace"] == "disabled"
        assert sb.protections["readonly_fs"] == "no mount namespace"
        marker = f"{secrets.randbelow(10**6)}.{secrets.randbelow(10**6) + 6}"
        r = run(sb, """
            import subprocess, time
            subprocess.Popen(["sleep", request["marker"]], start_new_session=True)
            time.sleep(100)
        """, timeout_s=1, marker=marker)
        assert r.error == "timed out after 1 s"
        assert processes_with(marker) == []  # the supervisor is a child subreaper: setsid() does not escape
        assert_healthy(sb)
    finally:
        sb.close()


def test_user_namespace_mode():
    """The unprivileged set-up (a user namespace, capabilities dropped), exercised as root."""
    sb = Sandbox(timeout_s=10, preload=None, user_namespace=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = run(sb, """
                import os
                manifest["pid"] = os.getpid()
                try:
                    open(request["target"], "w")
                    manifest["wrote"] = True
                except OSError as e:
                    manifest["wrote"] = e.strerror
                status = dict(line.split(":", 1) for line in open("/proc/self/status"))
                manifest["caps"] = [status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs")]
            """, target=str(PROJECT / "PWNED-userns"))
        if sb.protections.get("user_namespace") is not True:
            pytest.skip(f"no user namespaces here: {sb.protections.get('user_namespace')}")
        assert r.error is None, r.error
        assert r.manifest["pid"] == 1 and r.manifest["wrote"] != True  # noqa: E712
        assert [int(c, 16) for c in r.manifest["caps"]] == [0, 0, 0, 1]
        assert not (PROJECT / "PWNED-userns").exists()
    finally:
        sb.close()


def test_a_failing_preload_is_reported():
    sb = Sandbox(timeout_s=10, preload="no_such_module_xyz:preload")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = run(sb, "manifest['ok'] = 1")
        assert r.manifest is None
        assert "did not start" in r.error and "preload failed: ModuleNotFoundError" in r.error, r.error
    finally:
        sb.close()
