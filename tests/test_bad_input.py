"""Bad actions get the penalty and a clear message, and the env keeps working after each."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import workloads
from conftest import SMALL_GEMM

PENALTY = -1.0

KERNEL_PREAMBLE = """
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
"""

BAD_SOURCES = {
    "syntax error": ("def workload(a, b)\n    return a @ b\n", "syntax error at line 1"),
    "no workload": ("x = 1\n", "no callable `workload"),
    "exception at import": ("raise RuntimeError('boom at import')\n", "import failed: RuntimeError: boom at import"),
    "exception at call": ("def workload(a, b):\n    raise ValueError('boom at call')\n", "boom at call"),
    "wrong shape": ("def workload(a, b):\n    return (a @ b)[:, :128]\n", "output shape (1024, 128) does not match"),
    "wrong dtype": ("import jax.numpy as jnp\ndef workload(a, b):\n    return (a @ b).astype(jnp.float16)\n",
                    "output dtype float16 does not match"),
    "wrong result": ("def workload(a, b):\n    return (a @ b) * 1.5\n", "wrong result"),
    "nan output": ("import jax.numpy as jnp\ndef workload(a, b):\n    return (a @ b) * jnp.nan\n", "NaN/Inf"),
    "block shape Mosaic rejects": (KERNEL_PREAMBLE + textwrap.dedent("""
        def copy(x_ref, o_ref):
            o_ref[...] = x_ref[...]
        def workload(a, b):
            c = a @ b
            return pl.pallas_call(copy, grid=(c.shape[0] // 4,),
                in_specs=[pl.BlockSpec((4, 100), lambda i: (i, 0))],
                out_specs=pl.BlockSpec((4, 100), lambda i: (i, 0)),
                out_shape=jax.ShapeDtypeStruct(c.shape, c.dtype))(c)
        """), "compile failed"),
    "kernel far over VMEM": (KERNEL_PREAMBLE + textwrap.dedent("""
        def kernel(a_ref, b_ref, o_ref, big_ref):
            o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32).astype(o_ref.dtype)
        def workload(a, b):
            m, n = a.shape[0], b.shape[1]
            return pl.pallas_call(kernel, grid=(m // 256, n // 256),
                in_specs=[pl.BlockSpec((256, a.shape[1]), lambda i, j: (i, 0)),
                          pl.BlockSpec((b.shape[0], 256), lambda i, j: (0, j))],
                out_specs=pl.BlockSpec((256, 256), lambda i, j: (i, j)),
                out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
                scratch_shapes=[pltpu.VMEM((8192, 8192), jnp.float32)])(a, b)
        """), "VMEM exhausted"),
    "empty text": ("", "source action is empty"),
    "enormous text": ("x" * 200_001, "over the limit"),
    "edit not found": ("<<<<<<< SEARCH\nno such line\n=======\nx\n>>>>>>> REPLACE\n", "was not found"),
}


@pytest.fixture(scope="module")
def env(make_env):
    env = make_env("gemm", SMALL_GEMM, action_mode="source")
    env.reset(seed=0)
    return env


@pytest.mark.parametrize("case", sorted(BAD_SOURCES))
def test_bad_source_gets_penalty_and_message(env, case):
    source, message = BAD_SOURCES[case]
    before = env.source
    _, reward, terminated, truncated, info = env.step(source)
    assert reward == PENALTY
    assert not (info["compiled"] and info["correct"])
    assert info["error"] and message in info["error"], info["error"]
    assert info["speedup"] is None
    assert env.source == before  # a failed candidate does not become the current kernel


def test_env_keeps_working_after_bad_input(env):
    _, reward, _, _, info = env.step("def workload(a, b):\n    return a @ b\n")
    assert info["correct"] and info["compiled"], info["error"]
    assert reward > 0


def test_infinite_loop_times_out_and_worker_recovers(make_env):
    env = make_env("gemm", SMALL_GEMM, action_mode="source", timeout_s=30)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("def workload(a, b):\n    while True:\n        pass\n")
    assert reward == PENALTY and "timed out" in info["error"]
    _, reward, _, _, info = env.step("def workload(a, b):\n    return (a @ b) - 0\n")
    assert info["correct"], info["error"]


def test_crashing_candidate_process_is_reported(make_env):
    env = make_env("gemm", SMALL_GEMM, action_mode="source")
    env.reset(seed=0)
    _, reward, _, _, info = env.step("import os\ndef workload(a, b):\n    os._exit(3)\n")
    assert reward == PENALTY and "exited with code 3" in info["error"]
    _, reward, _, _, info = env.step("def workload(a, b):\n    return (a @ b) + 0\n")
    assert info["correct"], info["error"]


def test_schedule_outside_the_space(make_env):
    env = make_env("gemm", SMALL_GEMM, action_mode="schedule")
    env.reset(seed=0)
    bad = np.array([99, 0, 0, 0, 0, 0])
    _, reward, _, _, info = env.step(bad)
    assert reward == PENALTY and "index 99 outside" in info["error"]
    _, reward, _, _, info = env.step(np.array([0, 0]))
    assert reward == PENALTY and "needs 6 indices" in info["error"]


def test_schedule_over_vmem_is_rejected_with_reason(make_env):
    env = make_env("gemm", {"dtype": "float32"}, action_mode="schedule")  # full size, f32 tiles
    space = env.schedule_space
    action = space.encode({"block_m": 2048, "block_k": 1024, "block_n": 2048, "buffers": 2, "order": "mn",
                           "accumulator": "none"})  # all of K=8192 in one step: ~288 MiB of f32 blocks
    _, reward, _, _, info = env.step(action)
    assert reward == PENALTY and "VMEM" in info["error"]


def test_compiler_vmem_error_is_reported_readably():
    from jaxbench_env.judge import compile_error as _compile_error

    # The v6e compiler's message for a kernel whose blocks needed 292 MiB (seen with libtpu 0.0.42.1).
    err = RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space "
                       "vmem. Used 291.86M of 127.94M vmem. Exceeded vmem capacity by 163.92M.\n\nProgram vmem ...")
    message = _compile_error(err)
    assert message.startswith("VMEM exhausted (v6e compiler): ")
    assert "Used 291.86M of 127.94M vmem" in message and "\n" not in message


@pytest.mark.parametrize("name", sorted(workloads.WORKLOADS))
def test_every_workload_rejects_a_non_positive_dimension(name):
    dims = [k for k, v in workloads.WORKLOADS[name].defaults.items() if isinstance(v, int) and not isinstance(v, bool)]
    for bad in (0, -8, 2.5):
        with pytest.raises(ValueError, match=f"{name}: {dims[0]} must be a positive int"):
            workloads.get(name, {dims[0]: bad})
