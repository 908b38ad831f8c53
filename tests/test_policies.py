"""Search policies on the small gemm config: real evaluations, shared result cache."""

from __future__ import annotations

import numpy as np
import pytest

from policies import BeamPolicy, GreedyPolicy, RandomPolicy, beam_search, make_policy, run_policy
from policies.base import local_moves

SMALL = {"M": 1024, "K": 1024, "N": 2048}


@pytest.fixture(scope="module")
def env(make_env):
    e = make_env("gemm", SMALL, action_mode="schedule", max_steps=50)
    e.reset(seed=0)
    return e


def check_records(records):
    assert records
    for rec in records:
        if rec["speedup"] is not None:
            assert rec["correct"] and rec["compiled"]
            assert rec["speedup"] > 0
            assert rec["speedup"] == pytest.approx(rec["baseline_ms"] / rec["time_ms"])
            assert rec["reward"] == pytest.approx(rec["speedup"])
        else:
            assert rec["error"] and rec["reward"] == -1.0


def test_random_respects_mask(env):
    policy = RandomPolicy(seed=13)  # seed 13 samples cheap schedules (few grid steps)
    env.reset(seed=0)
    for _ in range(20):  # sampling is cheap: check the mask without stepping
        a = policy.act(env)
        mask = env.action_masks()
        assert all(m[i] for m, i in zip(mask, a))
    records = run_policy(policy, env, 3, seed=0)  # same samples as test_cli (cache hits)
    assert len(records) == 3
    check_records(records)


def test_random_legal_only_samples_whole_schedules_the_check_allows(make_env):
    """conv2d_relu_biasadd's knobs are coupled (layout, patches, block sizes): the per-knob
    mask lets about half of plain samples through to a rejection; legal_only none. No step
    is taken, so nothing compiles."""
    e = make_env("conv2d_relu_biasadd", None, action_mode="schedule")
    space = e.unwrapped.schedule_space

    def rejected(policy):
        return sum(space.check(space.decode(policy.act(e))) is not None for _ in range(40))

    assert rejected(RandomPolicy(seed=0)) > 5
    assert rejected(RandomPolicy(seed=0, legal_only=True)) == 0


def test_greedy_moves_from_best_and_finds_speedup(env):
    policy = GreedyPolicy()
    env.reset(seed=0)
    start_speedup = env.current_speedup
    records = run_policy(policy, env, 3, reset=False)
    check_records(records)
    start = env.schedule_space.default()
    # the first move is the nearest-value move of the first knob, from the start schedule
    first = next(local_moves(env.schedule_space, start))
    assert records[0]["schedule"] == first
    assert len({tuple(sorted(r["schedule"].items())) for r in records}) == 3  # no repeats
    ok = [r["speedup"] for r in records if r["speedup"] is not None]
    assert env.best_speedup == pytest.approx(max(ok + [start_speedup]))


def test_beam_search_beats_or_keeps_start(env):
    env.reset(seed=0)
    start_speedup = env.current_speedup
    start_schedule = dict(env.schedule)
    seen = []
    schedule, speedup = beam_search(env, beam_width=2, depth=1, expand=3,
                                    callback=lambda s, v: seen.append((s, v)))
    assert len(seen) > 0
    assert speedup >= start_speedup > 0
    assert env.schedule == start_schedule and env.steps == 0  # the search ran on forks
    # the reported speedup is real: re-evaluating the schedule (a cache hit) gives it back
    _, _, _, _, info = env.step(env.schedule_space.encode(schedule))
    assert info["speedup"] == pytest.approx(speedup)
    assert info["speedup"] == pytest.approx(info["baseline_ms"] / info["time_ms"])


def test_beam_policy_steps_and_registry(env):
    policy = make_policy("beam", beam_width=2, expand=2)
    assert isinstance(policy, BeamPolicy)
    records = policy.run(env, 3, seed=0)
    check_records(records)
    assert set(make_policy.__globals__["POLICIES"]) == {"random", "greedy", "beam", "gradient", "llm", "llm-beam", "expert"}
    assert isinstance(make_policy("random"), RandomPolicy) and isinstance(make_policy("greedy"), GreedyPolicy)


def test_random_in_both_mode(make_env):
    e = make_env("gemm", SMALL, action_mode="both")
    e.reset(seed=1)
    a = RandomPolicy().act(e)
    assert a["source"] == "" and np.asarray(a["schedule"]).shape == (6,)


def test_legal_only_reaches_random_from_the_command_line():
    from jaxbench_env.cli import build_parser, policy_kwargs

    args = build_parser().parse_args(["bench", "--policy", "random", "--steps", "1", "--out", "x", "--legal-only"])
    policy = make_policy(args.policy, **policy_kwargs(args))
    assert policy.legal_only and policy.seed == 0
    args = build_parser().parse_args(["optimize", "gemm", "--policy", "random", "--steps", "1", "--out", "x"])
    assert not make_policy(args.policy, **policy_kwargs(args)).legal_only


def test_local_moves_repair_a_move_the_mask_rejects():
    """All of K in one step does not fit next to 2048x2048 tiles; the move comes with the
    nearest smaller block that makes room, so a local search can reach it."""
    import workloads

    space = workloads.get("matmul_subtract_multiply_relu").schedule_space()
    tall = {**space.default(), "block_m": 2048, "block_k": 512, "block_n": 2048}
    assert space.check(tall) is None and space.check({**tall, "accumulator": "none"}) is not None
    moves = list(local_moves(space, tall))
    assert all(space.check(m) is None for m in moves)
    assert {**tall, "accumulator": "none", "block_n": 256} in moves
    assert all(sum(m[k] != tall[k] for k in tall) in (1, 2) for m in moves)
    assert len({tuple(sorted(m.items())) for m in moves}) == len(moves)


def test_local_moves_leave_knobs_the_schedule_does_not_use():
    """With all of K in one step block_k builds the same program: a greedy search that moved
    it spent three of its evaluations on one kernel (42k, 2026-12-06) and ran out before the
    x_panel move. Moves elsewhere, and back to an accumulator, still come."""
    import workloads

    space = workloads.get("gemm_max_subtract_gelu").schedule_space()
    whole_k = {**space.default(), "block_m": 2048, "block_n": 256, "accumulator": "none"}
    assert space.inert(whole_k) == {"block_k"} and space.inert({**whole_k, "accumulator": "vmem"}) == set()
    moves = list(local_moves(space, whole_k))
    assert moves and all(m["block_k"] == whole_k["block_k"] for m in moves if m["accumulator"] == "none")
    assert {**whole_k, "x_panel": "prefetched"} in moves[:8]
    assert any(m["accumulator"] == "vmem" for m in moves)


def test_schedules_that_build_one_program_share_a_key():
    """The gradient policy's first proposals on 39k (2026-12-06) were block_k values with the
    patches in VMEM, where block_k is unused: six of its 24 evaluations priced one kernel. With
    the space, the key leaves unused knobs out, so searches and the final checks skip them."""
    import workloads
    from policies.base import schedule_key

    space = workloads.get("conv2d_gelu_globalavgpool").schedule_space()
    vmem = {**space.default(), "patches": "vmem"}
    assert schedule_key(vmem, space) == schedule_key({**vmem, "block_k": 128}, space)
    assert schedule_key(vmem) != schedule_key({**vmem, "block_k": 128})  # without the space: every knob
    assert schedule_key(vmem, space) != schedule_key({**vmem, "patches": "vmem_im2col"}, space)
    space18 = workloads.get("conv2d_relu_biasadd").schedule_space()
    hbm = {**space18.default(), "patches": "hbm"}  # block_k then tiles the contraction (576)
    assert schedule_key(hbm, space18) != schedule_key({**hbm, "block_k": 128}, space18)
