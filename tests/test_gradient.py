"""The simulator's differentiable tier and the gradient policy that searches on it."""

from jaxbench_env.aot import prepare_process

prepare_process()

import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jaxbench_env  # noqa: E402,F401
import workloads  # noqa: E402
from jaxbench_env.sim import V6E, calibration, relaxed  # noqa: E402
from jaxbench_env.sim.model import price_kernel  # noqa: E402
from jaxbench_env.sim.pallas import kernel_features, pallas_call_eqns  # noqa: E402
from policies import GradientPolicy, make_policy  # noqa: E402
from policies.gradient import template_tracer  # noqa: E402
from policies.base import schedule_action  # noqa: E402

CONFIG = {"M": 2048, "K": 2048, "N": 2048}


@pytest.fixture(scope="module")
def gemm_model():
    wl = workloads.get("gemm", CONFIG)
    start = {**wl.schedule_space().default(), "block_m": 256, "block_k": 256, "block_n": 256}
    return wl, start, relaxed.build(wl, template_tracer(wl), start)


def test_relaxed_model_relaxes_the_block_knobs_only(gemm_model):
    wl, _, model = gemm_model
    assert model.knobs == ["block_m", "block_k", "block_n"]  # not buffers (1, 2) or order
    assert [k.name for k in relaxed.block_knobs(workloads.get("rmsnorm").schedule_space())] == ["block_rows"]


def test_relaxed_model_agrees_with_the_full_model_at_its_start(gemm_model):
    wl, start, model = gemm_model
    (eqn,) = pallas_call_eqns(template_tracer(wl)(start))
    full = price_kernel(kernel_features(eqn), V6E, calibration())["time_s"]  # analytic compute: no compile
    assert float(model.time(model.x0)) == pytest.approx(full, rel=0.1)


def test_relaxed_model_is_differentiable_and_points_to_bigger_blocks(gemm_model):
    _, _, model = gemm_model
    g = jax.grad(lambda x: model.time(x))(np.asarray(model.x0, np.float32))
    assert np.all(np.isfinite(g)) and np.all(g < 0)  # 256-wide steps: every block should grow
    end = relaxed.descend(model, model.x0, steps=150, lr=0.15)
    assert np.all(end >= np.log2(512))
    assert float(model.time(end)) < 0.5 * float(model.time(model.x0))


def test_vmem_wall_stops_the_descent(gemm_model):
    _, _, model = gemm_model
    biggest = model.upper
    small = model.vmem_limits * 0 + 1.0  # pretend a 1-byte VMEM limit: every schedule is over
    walled = relaxed.RelaxedModel(**{**model.__dict__, "vmem_limits": small})
    assert float(walled.time(biggest)) > 100 * float(model.time(biggest))


def test_gradient_policy_improves_on_the_start_through_the_env():
    env = gym.make("JAXBench/gemm-v0", backend="sim", config=CONFIG)
    try:
        env.reset(seed=0)
        u = env.unwrapped
        small = {**u.schedule, "block_m": 256, "block_k": 256, "block_n": 256}
        *_, info = env.step(schedule_action(env, small))  # start the search from small blocks
        assert u.schedule == small
        start = info["speedup"]
        policy = make_policy("gradient", seed=0)
        assert isinstance(policy, GradientPolicy)
        seen = []
        for _ in range(2):
            action = policy.act(env)
            _, _, _, _, info = env.step(action)
            assert info["correct"] and info["error"] is None, info["error"]
            seen.append(info["speedup"])
        assert policy.model is not None and policy.error is None
        assert max(seen) > start
    finally:
        env.close()
