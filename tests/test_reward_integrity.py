"""The reward cannot be gamed: one test per known exploit, each run as an adversary would,
through the Gymnasium API. Every cheat gets the penalty with a clear error, leaves nothing
changed outside its own temporary directory, and the next honest candidate gets the same
reward as on a fresh environment.

The gemm config is chosen so the check size (M=1024, K=1024, N=2048) is smaller than the
full size (M=2048): a candidate can tell the two apart by its inputs' shapes.
"""

from __future__ import annotations

import json
import os
import socket
import textwrap
import time
from pathlib import Path

import pytest

from jaxbench_env.candidate import Candidate
from jaxbench_env.evaluation import EvalResult, Evaluator

CONFIG = {"M": 2048, "K": 1024, "N": 2048}
PENALTY = -1.0
PRE = "import jax, jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
HONEST = PRE + "def workload(a, b):\n    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)\n"
SECRET = "sk-test-not-for-candidates-1234"


def src(body: str, *helpers: str) -> str:
    return PRE + "".join(textwrap.dedent(h) for h in helpers) + textwrap.dedent(body)


# K's t-th 512-wide chunk of the product, added to the accumulator: the step of the gemms below
# whose K loop runs in chunks.
ADD_CHUNK = """
    def add_chunk(a_ref, b_ref, acc_ref, t):
        s = pl.multiple_of(t * 512, 512)
        acc_ref[...] += jnp.dot(a_ref[:, pl.ds(s, 512)].astype(jnp.float32),
                                b_ref[pl.ds(s, 512), :].astype(jnp.float32),
                                precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)

    """


@pytest.fixture(scope="module")
def env(make_env):
    os.environ["JAXBENCH_TEST_SECRET"] = SECRET  # in the trainer's environment, like an API key
    env = make_env("gemm", CONFIG, action_mode="source")
    env.reset(seed=0)
    return env


@pytest.fixture(scope="module")
def honest_reward(tmp_path_factory):
    """The honest candidate's reward on a fresh environment with a cache of its own."""
    ev = Evaluator("gemm", CONFIG, backend="sim", cache_dir=tmp_path_factory.mktemp("fresh-cache"))
    try:
        result = ev.evaluate(Candidate(HONEST, {}))
        assert result.ok, result.error
        return result.speedup
    finally:
        ev.close()


def _cache_snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def step(env, source: str):
    _, reward, _, _, info = env.step(source)
    return reward, info


def assert_penalized(env, source: str, *fragments: str) -> dict:
    reward, info = step(env, source)
    assert reward == PENALTY, info
    assert info["error"], info
    for fragment in fragments:
        assert fragment in info["error"], info["error"]
    return info


def assert_next_honest_is_unaffected(env, honest_reward):
    # A variant of the honest kernel, so the answer is not the cached one.
    reward, info = step(env, HONEST + f"\n# after an attack, {time.time_ns()}\n")
    assert info["correct"] and info["compiled"], info["error"]
    assert reward == pytest.approx(honest_reward, rel=1e-9)


def test_size_branching_is_rejected(env, honest_reward):
    info = assert_penalized(env, src("""
        def workload(a, b):
            if a.shape[0] > 1024:  # the full size: skip the work
                return jnp.zeros((a.shape[0], b.shape[1]), a.dtype)
            return jnp.dot(a, b)
        """))
    assert not info["correct"]
    assert_next_honest_is_unaffected(env, honest_reward)


def test_interpret_mode_branching_checks_the_program_the_tpu_runs(env, honest_reward):
    assert_penalized(env, src("""
        from jax._src import config
        def workload(a, b):
            if config.pallas_tpu_interpret_mode_context_manager.value:  # the old check's tell
                return jnp.dot(a, b)
            return jnp.zeros((a.shape[0], b.shape[1]), a.dtype)
        """), "wrong result")
    assert_next_honest_is_unaffected(env, honest_reward)


def test_host_callbacks_are_rejected(env, honest_reward):
    assert_penalized(env, src("""
        import numpy as np
        def workload(a, b):
            out = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype)
            return jax.pure_callback(lambda x, y: (np.asarray(x, np.float32) @ np.asarray(y, np.float32))
                                     .astype(x.dtype), out, a, b)
        """), "callback")
    assert_next_honest_is_unaffected(env, honest_reward)


def test_platform_dependent_is_rejected(env, honest_reward):
    assert_penalized(env, src("""
        from jax import lax
        def workload(a, b):
            return lax.platform_dependent(a, b, cpu=lambda a, b: jnp.dot(a, b),
                                          default=lambda a, b: jnp.zeros((a.shape[0], b.shape[1]), a.dtype))
        """))
    assert_next_honest_is_unaffected(env, honest_reward)


def test_patching_the_judge_from_the_candidate_changes_nothing(env, honest_reward):
    assert_penalized(env, src("""
        import sys, types
        import jaxbench_env.judge as judge
        judge.check_outputs = lambda *a, **k: 0.0
        judge.compare_outputs = lambda *a, **k: 0.0
        fake = types.SimpleNamespace(check=lambda *a, **k: 0.0, predict_program=lambda *a, **k: None)
        sys.modules["jaxbench_env.pipeline"] = fake
        def workload(a, b):
            return jnp.zeros((a.shape[0], b.shape[1]), a.dtype)
        """), "wrong result")
    assert_next_honest_is_unaffected(env, honest_reward)


def test_the_cache_cannot_be_rewritten_or_read(env, honest_reward, cache_dir):
    before = _cache_snapshot(cache_dir)
    reward, info = step(env, src(f"""
        import glob, json, os, pathlib
        found, wrote = [], []
        for root in ({str(cache_dir)!r}, os.path.expanduser("~/.cache/jaxbench_gym")):
            for path in glob.glob(os.path.join(root, "**", "*.json"), recursive=True):
                found.append(path)
                try:
                    pathlib.Path(path).write_text(json.dumps({{"time_ms": 1e-6, "correct": True}}))
                    wrote.append(path)
                except OSError:
                    pass
        if found or wrote:
            raise RuntimeError(f"saw {{len(found)}} cache entries, rewrote {{len(wrote)}}")
        def workload(a, b):
            return jnp.dot(a, b)
        """))
    assert info["correct"], info["error"]  # it did nothing harmful, so it is judged normally
    after = _cache_snapshot(cache_dir)
    assert all(after[k] == v for k, v in before.items())  # only new entries were added
    assert_next_honest_is_unaffected(env, honest_reward)


def test_the_candidate_sees_no_secret_no_network_and_no_writable_tree(env, honest_reward):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.1)
    port = server.getsockname()[1]
    project = Path(__file__).resolve().parents[1]
    marker = Path("/tmp") / f"jaxbench-escaped-{os.getpid()}"
    try:
        reward, info = step(env, src(f"""
            import os, pathlib, socket, subprocess
            report = {{"secret": os.environ.get("JAXBENCH_TEST_SECRET")}}
            try:
                report["environ_of_parent"] = open(f"/proc/{{os.getppid()}}/environ", "rb").read().count(b"sk-test")
            except OSError as e:
                report["environ_of_parent"] = type(e).__name__
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
                report["socket"] = "connected"
            except OSError as e:
                report["socket"] = type(e).__name__
            for path in ({str(project / "pwned.txt")!r}, {str(marker)!r}):
                try:
                    pathlib.Path(path).write_text("x")
                    report[path] = "written"
                except OSError as e:
                    report[path] = type(e).__name__
            subprocess.Popen(["sh", "-c", "sleep 4; touch {marker}.late"], start_new_session=True)
            raise RuntimeError("REPORT " + repr(report))
            """))
        assert reward == PENALTY and "REPORT" in info["error"]
        report = info["error"]
        assert SECRET not in report and "'secret': None" in report
        assert "'socket': 'connected'" not in report
        assert f"{str(project / 'pwned.txt')!r}: 'written'" not in report  # /tmp is its own, private
        with pytest.raises(OSError):
            server.accept()
        assert not (project / "pwned.txt").exists() and not marker.exists()
        time.sleep(6)
        assert not Path(f"{marker}.late").exists()  # the detached child died with the candidate
    finally:
        server.close()
    assert_next_honest_is_unaffected(env, honest_reward)


def test_no_earlier_candidates_source_is_in_a_candidates_memory(env, honest_reward):
    # Every candidate is forked from one pre-warmed process; had it read the earlier requests,
    # their sources would be in each later candidate's heap. Only a hash of the marker is in
    # the scanner, so it cannot find its own copy.
    import hashlib
    import secrets

    marker = secrets.token_hex(16)
    reward, info = step(env, HONEST + f"\n# marker:{marker}\n")
    assert info["correct"], info["error"]
    scan = textwrap.dedent(f"""
        import hashlib, re
        found = set()
        with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                lo, hi = (int(x, 16) for x in span.split("-"))
                if not perms.startswith("r") or hi - lo > 2**31:
                    continue
                try:
                    mem.seek(lo)
                    data = mem.read(hi - lo)
                except (OSError, ValueError, OverflowError):
                    continue
                for m in re.finditer(rb"# marker:([0-9a-f]{{32}})", data):
                    if hashlib.sha256(m.group(1)).hexdigest() == "{hashlib.sha256(marker.encode()).hexdigest()}":
                        found.add(line.split()[-1])
        if found:
            raise RuntimeError("an earlier candidate's source is in " + ", ".join(sorted(found)))
        """)
    reward, info = step(env, scan + HONEST)
    assert info["correct"] and reward == pytest.approx(honest_reward), info["error"]


@pytest.mark.parametrize("attack, fragment", [
    ("os._exit(3)", "exited with code 3"),
    ("sys.setrecursionlimit(10**6)\ndef f(n): return f(n + 1)\nf(0)", ""),
    ("x = bytearray(100 * 2**30)", "MemoryError"),
    ("while True: sys.stdout.write('x' * 2**20)", "output limit exceeded"),
])
def test_process_level_attacks_are_contained(env, honest_reward, attack, fragment):
    assert_penalized(env, "import os, signal, sys\n" + attack + "\n" + HONEST, fragment)
    assert_next_honest_is_unaffected(env, honest_reward)


@pytest.mark.parametrize("attack", ["os.killpg(0, signal.SIGKILL)", "os.kill(os.getppid(), signal.SIGKILL)"])
def test_signals_reach_nothing_outside_the_candidate(env, honest_reward, attack):
    # The candidate is the init of its own PID namespace: its group and "parent" are itself.
    reward, info = step(env, "import os, signal\n" + attack + "\n" + HONEST)
    assert info["correct"] and reward == pytest.approx(honest_reward), info["error"]
    assert_next_honest_is_unaffected(env, honest_reward)


def test_sleeping_past_the_timeout(make_env, honest_reward):
    env = make_env("gemm", CONFIG, action_mode="source", timeout_s=20)
    env.reset(seed=0)
    assert_penalized(env, "import time\ntime.sleep(60)\n" + HONEST, "timed out")
    assert_next_honest_is_unaffected(env, honest_reward)


def test_the_reference_is_judged_under_a_limit_of_its_own(tmp_path):
    # A limit that times candidates out must not fail the reference every reward divides.
    ev = Evaluator("gemm", CONFIG, backend="sim", cache_dir=tmp_path, timeout_s=2)
    try:
        assert ev.baseline().ok
        slow = ev.evaluate(Candidate("import time\ntime.sleep(30)\n" + HONEST, {}))
    finally:
        ev.close()
    assert not slow.ok and "timed out after 2 s" in slow.error


def test_an_output_cached_in_a_module_global_is_rejected(env, honest_reward):
    assert_penalized(env, src("""
        _memo = {}
        def workload(a, b):
            if "out" not in _memo:  # KernelBench exploit: compute once, replay afterwards
                _memo["out"] = jnp.dot(a, b)
            return _memo["out"]
        """))
    assert_next_honest_is_unaffected(env, honest_reward)


def test_writing_into_the_inputs_changes_nothing(env, honest_reward):
    assert_penalized(env, src("""
        import numpy as np
        def workload(a, b):
            view = np.asarray(a)  # tracers have no buffer: a candidate never holds the judge's inputs
            view[...] = 0
            return jnp.dot(a, b)
        """))
    assert_next_honest_is_unaffected(env, honest_reward)


def test_reading_the_references_output_from_disk_finds_nothing(env, honest_reward):
    reward, info = step(env, src("""
        import glob, os
        hits = [p for root in ("/tmp", os.path.expanduser("~"), "/root")
                for p in glob.glob(os.path.join(root, "**", "*.npy"), recursive=True)][:5]
        if hits:
            raise RuntimeError(f"found {hits}")
        def workload(a, b):
            return jnp.dot(a, b)
        """))
    assert info["correct"], info["error"]
    assert_next_honest_is_unaffected(env, honest_reward)


def test_kernels_tiled_beyond_the_check_size_climb_the_ladder(env, honest_reward):
    reward, info = step(env, src("""
        def workload(a, b):
            assert a.shape[0] % 2048 == 0, f"M={a.shape[0]} must be a multiple of bm=2048"
            return jnp.dot(a, b)
        """))
    assert info["correct"] and reward > 0, info["error"]
    result = env.evaluator.evaluate(Candidate(env.source, env.schedule))  # the cached result, with details
    assert result.cached and result.details["check_rung"] == 1 and result.details["check_size"] == {}


def test_candidate_modules_are_real_modules(env):
    reward, info = step(env, src("""
        import dataclasses, functools, typing
        @dataclasses.dataclass(frozen=True)
        class Blocks:
            bm: int = 512
            bn: int = 512
        hints = typing.get_type_hints(Blocks)
        @functools.lru_cache(maxsize=None)
        def blocks() -> Blocks:
            return Blocks()
        def workload(a, b):
            assert blocks().bm == 512 and hints
            return jnp.dot(a, b)
        """))
    assert info["correct"], info["error"]


def test_cached_results_carry_no_code(env):
    # Results reach the trainer's process as JSON the judge wrote, never as pickles.
    root = Path(env.evaluator.cache.root)
    entries = [json.loads(p.read_text()) for p in root.rglob("*.json")]
    assert entries and all(set(e) == {"value", "mac"} for e in entries)


def test_no_prediction_is_under_the_physical_floor(monkeypatch):
    """The judge's time is never below the workload's essential work at the chip's peak:
    an honest program is priced above its floor by the model; a prediction under it
    (here, a floor made 1000x the program's work) is raised to the floor and says so."""
    import jax

    import workloads
    from jaxbench_env import judge
    from jaxbench_env.sim import V6E

    wl = workloads.get("gemm", CONFIG)
    specs = jax.eval_shape(lambda: wl.make_inputs(wl.config, 0))
    compiled, profiles = judge.compile_v6e(lambda a, b: wl.reference(wl.config, a, b), specs)
    seconds, details = judge._simulate(wl, compiled, profiles)
    nbytes, flops = wl.essential_work(wl.config)
    assert (nbytes, flops) == (2 * (2048 * 1024 + 1024 * 2048 + 2048 * 2048), 2 * 2048 * 1024 * 2048)
    floor = details["floor"]
    assert floor["time_s"] == pytest.approx(V6E.floor_s(nbytes, flops)) and not floor["applied"]
    assert seconds == details["time_s"] == floor["model_time_s"] > floor["time_s"]
    assert details["bounds"] == []

    monkeypatch.setattr(judge, "_essential_cache", {})
    monkeypatch.setattr(wl, "essential_work", lambda config: (1000 * nbytes, 1000 * flops))
    raised, details = judge._simulate(wl, compiled, profiles)
    assert details["floor"]["applied"] and raised == details["time_s"] == details["floor"]["time_s"]
    assert raised == pytest.approx(1000 * V6E.floor_s(nbytes, flops)) and raised > 100 * seconds
    assert any("under the physical floor" in n for n in details["caveats"]), details["caveats"]
    assert details["bounds"] == ["physical floor"]


def test_info_says_whether_a_bound_set_the_time(env):
    """Gymnasium's info carries ``trusted_timing``: the honest gemm's time is the model's."""
    _, info = step(env, HONEST + "\n# trusted timing\n")
    assert info["correct"] and info["trusted_timing"] is True, info
    assert info["timing_source"] == "v6e-sim"
    floored = EvalResult("gemm", "sim", "v6e-sim", True, True, time_ms=1.0,
                         details={"sim": {"bounds": ["physical floor"]}})
    assert floored.trusted_timing is False and floored.to_dict()["trusted_timing"] is False


def test_work_in_a_loop_of_unknown_trip_count_is_rejected(env, honest_reward):
    # Four quarter-products in a loop whose bound is computed from the data: the compiler
    # cannot count its trips, so it would be priced once (a 4x reward for nothing).
    cheat = src("""
        def workload(a, b):
            n = (a[0, 0] * 0).astype(jnp.int32) + 4
            def body(i, acc):
                return acc + jnp.dot(a, b, preferred_element_type=jnp.float32) / 4
            out = jax.lax.fori_loop(0, n, body, jnp.zeros((a.shape[0], b.shape[1]), jnp.float32))
            return out.astype(a.dtype)
    """)
    info = assert_penalized(env, cheat, "trip count", "cannot be priced")
    assert info["compiled"]
    assert_next_honest_is_unaffected(env, honest_reward)


def test_a_conditional_is_priced_at_both_branches_and_said(tmp_path):
    # Two branches, one runs: the price is an upper bound, and the result says so.
    source = src("""
        def workload(a, b):
            dot = lambda: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
            return jax.lax.cond(a[0, 0] > 100, dot, lambda: dot() * 1)
    """)
    ev = Evaluator("gemm", CONFIG, backend="sim", cache_dir=tmp_path)
    try:
        honest = ev.evaluate(Candidate(HONEST, {}))
        branched = ev.evaluate(Candidate(source, {}))
    finally:
        ev.close()
    assert branched.ok and branched.correct, branched.error
    assert branched.details["sim"]["bounds"] == ["upper bound: every branch of a conditional"]
    assert branched.trusted_timing is False and honest.trusted_timing is True
    assert branched.time_ms > 1.5 * honest.time_ms  # both dots charged


def test_the_judge_checks_with_deterministic_cpu_math(env):
    # Multi-threaded Eigen can sum a contraction in a thread-timing-dependent order; the judge
    # (the worker process that runs the check) has it off, so a check gives one answer.
    from jaxbench_env.worker import deterministic_xla_flags

    assert deterministic_xla_flags(None) == "--xla_cpu_multi_thread_eigen=false"
    assert deterministic_xla_flags("--xla_dump_to=/x") == "--xla_dump_to=/x --xla_cpu_multi_thread_eigen=false"
    assert deterministic_xla_flags("--xla_cpu_multi_thread_eigen=true") == "--xla_cpu_multi_thread_eigen=true"
    worker = env.unwrapped.evaluator.worker
    assert worker._proc is not None and worker._proc.poll() is None
    environ = Path(f"/proc/{worker._proc.pid}/environ").read_bytes().split(b"\0")
    flags = next(v for v in environ if v.startswith(b"XLA_FLAGS="))
    assert b"--xla_cpu_multi_thread_eigen=false" in flags


# A tiled Pallas gemm (f32 products on the MXU: compute-bound, so skipped work shows in the
# price) and three ways to skip the product on row blocks the check-size grid (two of them)
# never reaches: a branch, a loop of no trips, a while loop of no trips.
PALLAS_GEMM = src("""
    from jax.experimental.pallas import tpu as pltpu

    def product(a_ref, b_ref, acc_ref):
        acc_ref[...] += jnp.dot(a_ref[...].astype(jnp.float32), b_ref[...].astype(jnp.float32),
                                precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)

    def kernel(a_ref, b_ref, o_ref, acc_ref):
        k = pl.program_id(2)

        @pl.when(k == 0)
        def _init():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        WORK

        @pl.when(k == pl.num_programs(2) - 1)
        def _store():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def workload(a, b):
        (m, kk), n = a.shape, b.shape[1]
        bm, bk, bn = 512, 512, 1024
        return pl.pallas_call(
            kernel, grid=(m // bm, n // bn, kk // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)])(a, b)
    """)
SKIPS = {
    "honest": "product(a_ref, b_ref, acc_ref)",
    "branch": "pl.when(pl.program_id(0) < 2)(lambda: product(a_ref, b_ref, acc_ref))",
    "loop": "jax.lax.fori_loop(0, jnp.where(pl.program_id(0) < 2, 1, 0), "
            "lambda t, c: product(a_ref, b_ref, acc_ref) or c, 0)",
    "while": "n = jnp.where(pl.program_id(0) < 2, 1, 0); "
             "jax.lax.while_loop(lambda t: t < n, lambda t: product(a_ref, b_ref, acc_ref) or t + 1, 0)",
}


def pallas_gemm(skip: str) -> str:
    return PALLAS_GEMM.replace("WORK", SKIPS[skip])


# A memory-bound Pallas gemm whose A row panel moves every step; ``rows`` is its index map's
# row block. Capped at 3, it reads all four row blocks of the check's A and half of the full one's.
ROW_PANELS = src("""
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)

    def workload(a, b):
        (m, kk), n = a.shape, b.shape[1]
        bm, bn = 256, 512
        return pl.pallas_call(
            kernel, grid=(n // bn, m // bm),
            in_specs=[pl.BlockSpec((bm, kk), lambda j, i: (ROWS, 0)), pl.BlockSpec((kk, bn), lambda j, i: (0, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda j, i: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype))(a, b)
    """)


def row_panels(rows: str) -> str:
    return ROW_PANELS.replace("ROWS", rows)


# A tiled gemm whose product runs in a loop over K's two halves, one trip more on row block 0
# (an idle one, past the guard). Capped with ``jnp.maximum(3 - i, 1)`` instead, the loop runs
# the same trips at the check size's two row blocks and one at full size's rows 2 and 3: its
# patterns (runs, varies) are those of the honest loop at both sizes; only the maximum shows it.
CHUNKED = src("""
    from jax.experimental.pallas import tpu as pltpu

    def kernel(a_ref, b_ref, o_ref, acc_ref):
        acc_ref[...] = jnp.zeros_like(acc_ref)

        def chunk(t, carry):
            @pl.when(t < 2)
            def _():
                add_chunk(a_ref, b_ref, acc_ref, t)
            return carry

        jax.lax.fori_loop(0, TRIPS, chunk, 0)
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def workload(a, b):
        (m, kk), n = a.shape, b.shape[1]
        bm, bn = 512, 1024
        return pl.pallas_call(
            kernel, grid=(m // bm, n // bn),
            in_specs=[pl.BlockSpec((bm, kk), lambda i, j: (i, 0)), pl.BlockSpec((kk, bn), lambda i, j: (0, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)])(a, b)
    """, ADD_CHUNK)
TRIPS = {"honest": "jnp.where(pl.program_id(0) == 0, 3, 2)", "capped": "jnp.maximum(3 - pl.program_id(0), 1)",
         # The capped count by arithmetic alone, no decision: only its fewest trips show it.
         "arithmetic": "3 - pl.program_id(0) + (pl.program_id(0) // 2) * (pl.program_id(0) - 2)"}


def chunked(trips: str) -> str:
    return CHUNKED.replace("TRIPS", TRIPS[trips])


# CHUNKED's loop with its trip count cut by ``cut``, a maximum that takes its second operand
# (0) wherever the check looks and, with ``>> 1``, its first (1) on full size's rows 2 and 3.
# Before it, a Python loop over the row panels (one iteration at the check size, two at full
# size) makes a maximum each iteration. Numbered in body order, each full-size decision after
# it was compared with the check's next one, the cut with one deciding both ways there: the
# cheat was bounded only where that shift happened to show, 9% under the honest kernel, which
# was itself charged 10% over for decisions with no counterpart (0.0586, 0.0715 and 0.0647 ms).
UNROLLED = src("""
    import functools
    from jax.experimental.pallas import tpu as pltpu

    def kernel(a_ref, b_ref, o_ref, acc_ref, *, panels):
        i = pl.program_id(0)
        acc_ref[...] = jnp.zeros_like(acc_ref)
        extra = i * 0
        for r in range(panels):
            extra = jnp.maximum(i - 9 - r, extra)
        cut = jnp.maximum((i >> SHIFT) * 2 - 1, 0)
        trips = jnp.maximum(3 - i * 8, 2) - cut + extra
        store = jnp.maximum(i, 1 - i) >= 0

        def chunk(t, carry):
            @pl.when(t < 2)
            def _():
                add_chunk(a_ref, b_ref, acc_ref, t)
            return carry

        jax.lax.fori_loop(0, trips, chunk, 0)

        @pl.when(store)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def workload(a, b):
        (m, kk), n = a.shape, b.shape[1]
        bm, bn = 512, 1024
        return pl.pallas_call(
            functools.partial(kernel, panels=m // 1024), grid=(m // bm, n // bn),
            in_specs=[pl.BlockSpec((bm, kk), lambda i, j: (i, 0)), pl.BlockSpec((kk, bn), lambda i, j: (0, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)])(a, b)
    """, ADD_CHUNK)


def unrolled(cut: str) -> str:
    return UNROLLED.replace("SHIFT", {"honest": "3", "capped": "1"}[cut])


# Row panels read whole on the first column pass (j == 0) and, at full size, row block 4 kept
# for rows 4-7 on the others: every block is read once (coverage is whole), fewer are fetched.
REUSED = "jnp.where((j == 0) | (i < 4), i, 4)"
# The same blocks with no comparison at all (jnp's floor division never corrects a sign here).
REUSED_BY_ARITHMETIC = "i - (i // 4) * (i - 4) * ((j + 3) // 4)"


# Kernels whose work is set by the glue from the inputs' values: a K loop's trip count read
# from a scalar-prefetch table, and a grid whose K axis is sized at run time. FLAG recognises
# the inputs a time is priced on (the spec's, seed 0, public) by two of A's values, which are
# the same at every size; the check's secret seeds never match. Keyed on size too (A's sum of
# squares: 1M at the check size, 2M at full size), it fires only where the time is priced.
TABLE_TRIPS = src("""
    from jax.experimental.pallas import tpu as pltpu

    def kernel(t_ref, a_ref, b_ref, o_ref, acc_ref):
        acc_ref[...] = jnp.zeros_like(acc_ref)

        def chunk(k, carry):
            add_chunk(a_ref, b_ref, acc_ref, k)
            return carry

        jax.lax.fori_loop(0, t_ref[0], chunk, 0)
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def workload(a, b):
        (m, kk), n = a.shape, b.shape[1]
        bm, bn = 512, 1024
        trips = jnp.where(FLAG, 0, kk // 512).astype(jnp.int32).reshape(1)
        return pl.pallas_call(
            kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(m // bm, n // bn),
                in_specs=[pl.BlockSpec((bm, kk), lambda i, j, t: (i, 0)),
                          pl.BlockSpec((kk, bn), lambda i, j, t: (0, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, t: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype))(trips, a, b)
    """, ADD_CHUNK)
TABLE_GRID = src("""
    from jax.experimental.pallas import tpu as pltpu

    def kernel(ks_ref, a_ref, b_ref, o_ref, acc_ref):
        k = pl.program_id(2)

        @pl.when(k == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(a_ref[...].astype(jnp.float32), b_ref[...].astype(jnp.float32),
                                precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)

        @pl.when(k == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def workload(a, b):
        (m, kk), n = a.shape, b.shape[1]
        bm, bk, bn = 512, 512, 1024
        ksteps = jnp.where(FLAG, 1, kk // bk).astype(jnp.int32)
        return pl.pallas_call(
            kernel, grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1, grid=(m // bm, n // bn, ksteps),
                in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k, s: (i, k)),
                          pl.BlockSpec((bk, bn), lambda i, j, k, s: (k, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, k, s: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype))(ksteps.reshape(1), a, b)
    """)


# K's two chunks split between two loops at a point the glue sets from A's first value, so
# on the check's secret seeds either loop may run no trips. The cheat ends the second loop
# where the first ends on the spec's inputs at full size: neither runs there, and both were
# seen skipped on some check input; only the check on the spec's inputs never saw the second
# skipped.
TABLE_SPLIT = (TABLE_TRIPS
               .replace("jax.lax.fori_loop(0, t_ref[0], chunk, 0)",
                        "jax.lax.fori_loop(0, t_ref[0], chunk, 0)\n    jax.lax.fori_loop(t_ref[0], t_ref[1], chunk, 0)")
               .replace("trips = jnp.where(FLAG, 0, kk // 512).astype(jnp.int32).reshape(1)",
                        "split = jnp.where(a[0, 0] > 0, kk // 512, 0)\n"
                        "    trips = jnp.stack([split, jnp.where(FLAG, split, kk // 512)]).astype(jnp.int32)"))


def recognising_the_priced_inputs(source: str, cheat: str) -> str:
    import numpy as np

    import workloads

    a = np.asarray(workloads.get("gemm", CONFIG).make_inputs(CONFIG, 0)[0][0, :2].astype("float32"))
    flag = f"(a[0, 0].astype(jnp.float32) == {float(a[0])!r}) & (a[0, 1].astype(jnp.float32) == {float(a[1])!r})"
    flag = {"honest": "False", "values": flag,
            "values-and-size": f"{flag} & (jnp.sum(jnp.square(a.astype(jnp.float32))) > 1.5e6)"}[cheat]
    return source.replace("FLAG", flag)


@pytest.mark.parametrize("source", [TABLE_TRIPS, TABLE_GRID], ids=["loop", "grid"])
@pytest.mark.parametrize("cheat", ["values", "values-and-size"])
def test_work_set_from_the_priced_inputs_values_is_checked_on_them(env, honest_reward, source, cheat):
    # Before the check ran the spec's inputs too, each cheat was correct on the secret seeds at
    # full size and priced on the spec's: the loop at 0.025 ms (no trips) against the honest
    # form's 0.065 ms, the grid at 0.035 against 0.064 ms (one K step).
    _, info = step(env, recognising_the_priced_inputs(source, "honest"))
    assert info["correct"] and info["time_ms"] > 0.05, info
    # Keyed on values alone, it cheats on the check's spec inputs; on size too, only at full
    # size, which gemm's last rung is (where it is not, the next test's rule applies).
    assert_penalized(env, recognising_the_priced_inputs(source, cheat), "wrong result")
    assert_next_honest_is_unaffected(env, honest_reward)


@pytest.mark.parametrize("source, fragment", [
    (TABLE_TRIPS, "loop 1 does at full size what it never did at any check size, and its trip count comes from "
                  "values the kernel loads"),
    (TABLE_GRID, "grid axis 2, sized at run time from the inputs, runs fewer steps at full size"),
    (TABLE_SPLIT, "does at full size what it never did at any check size, and its trip count comes from values"),
], ids=["loop", "grid", "split"])
def test_work_set_from_the_priced_inputs_where_no_check_size_reaches_is_not_priced(source, fragment):
    """Where the largest check size is below the full size (taken here as the first), work
    set by loaded values that does at full size what no check showed has no bound the judge
    controls (its largest trip count on the spec's inputs is the cheat's own): no price."""
    import workloads
    from jaxbench_env import candidate_process, judge

    wl = workloads.get("gemm", CONFIG)
    request = {"workload": "gemm", "config": CONFIG, "schedule": {}, "backend": "sim", "min_rung": 0}
    for cheat in ("honest", "values-and-size"):
        manifest, blobs = candidate_process.build_artifacts(
            {**request, "source": recognising_the_priced_inputs(source, cheat)})
        assert manifest["error"] is None and manifest["rung"] == 0, manifest["error"]
        programs, check_config, _, aligned = judge.verify_request(wl, {**request, "artifacts": blobs, "rung": 0})
        full = programs["full_tpu"]
        assert judge.SPEC_SEED in judge.check_seeds(full)
        unseen = judge.unseen_control(wl, full, judge.full_size_tables(wl, full), programs["check_tpu"],
                                      check_config, aligned, judge.check_seeds(full))
        unbounded = judge.unbounded_unseen(full, unseen)
        if cheat == "honest":
            assert not any(unseen) and unbounded is None, unseen
        else:
            assert unbounded is not None and fragment in unbounded, (unseen, unbounded)


@pytest.mark.parametrize("skip", ["branch", "loop", "while"])
def test_work_skipped_past_the_check_grid_is_checked_where_it_is_skipped(env, honest_reward, skip):
    # At the first check size the grid has two row blocks, where the product always runs; the
    # full size has four. The judge climbs to a check size whose grid shows the skip.
    assert_penalized(env, pallas_gemm(skip), "wrong result")
    result = env.evaluator.evaluate(Candidate(pallas_gemm(skip), {}))  # cached, with its details
    assert "never did at the check size" in result.details["climbed"][0], result.details
    assert_next_honest_is_unaffected(env, honest_reward)


def test_an_input_read_whole_only_at_the_check_size_is_checked_where_it_is_not(env, honest_reward):
    assert_penalized(env, row_panels("jnp.minimum(i, 3)"), "wrong result")
    result = env.evaluator.evaluate(Candidate(row_panels("jnp.minimum(i, 3)"), {}))
    assert "reads all of its input 0 at the check size but not at full size" in result.details["climbed"][0]
    assert_next_honest_is_unaffected(env, honest_reward)


@pytest.mark.parametrize("cheat, fragment", [
    (chunked("capped"), "decides at full size a way it never did at the check size (a comparison, select, "
                        "min or max in its body"),
    (chunked("arithmetic"), "loop 1 at full size do what they never did at the check size"),
    (row_panels(REUSED), "min or max in the index map of window 0"),
    (row_panels(REUSED_BY_ARITHMETIC), "window 0 keeps its block at full size where grid axis"),
], ids=["loop-cap", "loop-arithmetic", "index-reuse", "index-arithmetic"])
def test_a_bound_or_index_deciding_past_the_check_grid_is_checked_there(env, honest_reward, cheat, fragment):
    # Loops and inputs that behave alike at both sizes by every other measure: only the
    # maximum (the index map's select) takes a side at full size that no check-size step took.
    assert_penalized(env, cheat, "wrong result")
    result = env.evaluator.evaluate(Candidate(cheat, {}))
    assert fragment in result.details["climbed"][0], result.details
    assert_next_honest_is_unaffected(env, honest_reward)


@pytest.mark.parametrize("honest_source, cheat, said, least, most", [
    # The product compiles to ~10% fewer bundles inside the branch than inline: another program.
    (pallas_gemm("honest"), pallas_gemm("branch"), "never showed", 0.85, 0.95),
    (row_panels("i"), row_panels("jnp.minimum(i, 3)"), "read whole only at the check size", 0.95, 0.95),
    (chunked("honest"), chunked("capped"), "deciding a way it never did", 0.95, 0.9),
    (chunked("honest"), chunked("arithmetic"), "never went so low", 0.95, 0.9),
    # Three of eight row panels re-read on three of four passes: a few percent of the traffic.
    (row_panels("i"), row_panels(REUSED), "deciding a way it never did", 0.95, 0.97),
    (row_panels("i"), row_panels(REUSED_BY_ARITHMETIC), "keeping a block where it always moved on", 0.95, 0.97),
    (unrolled("honest"), unrolled("capped"), "deciding a way it never did", 0.95, 0.9),
], ids=["branch", "index-map", "loop-cap", "loop-arithmetic", "index-reuse", "index-arithmetic",
         "after-an-unrolled-loop"])
def test_what_no_check_size_saw_is_priced_as_done(honest_source, cheat, said, least, most):
    """Where no affordable check size shows what a kernel does at full size (taken here as the
    first, priced as if it were the last), it is charged at a bound: a branch as if it ran
    wherever reached, a loop at its largest trip count, an input as a fresh block every
    step. That is the honest price, flagged; priced as it runs, the cheat would be faster
    than the honest kernel."""
    import workloads
    from jaxbench_env import candidate_process, judge

    wl = workloads.get("gemm", CONFIG)
    request = {"workload": "gemm", "config": CONFIG, "schedule": {}, "backend": "sim", "min_rung": 0}
    priced = {}
    for name, source in (("honest", honest_source), ("cheat", cheat)):
        manifest, blobs = candidate_process.build_artifacts({**request, "source": source})
        assert manifest["error"] is None and manifest["rung"] == 0, manifest["error"]
        programs, check_config, _, aligned = judge.verify_request(wl, {**request, "artifacts": blobs, "rung": 0})
        full = programs["full_tpu"]
        tables = judge.full_size_tables(wl, full)
        unseen = judge.unseen_control(wl, full, tables, programs["check_tpu"], check_config, aligned)
        compiled, profiles = judge.compile_v6e(full.call, full.in_avals)
        priced[name] = [judge._simulate(wl, compiled, profiles, full, tables, u) for u in (unseen, None)]
        assert bool(any(unseen)) == (name == "cheat"), unseen
    (honest, details), _ = priced["honest"]
    (bounded, bound_details), (as_run, _) = priced["cheat"]
    assert details["bounds"] == [], details["caveats"]
    assert bounded > least * honest and as_run < most * honest, (bounded, as_run, honest)
    assert any(said in b for b in bound_details["bounds"]), bound_details["bounds"]
