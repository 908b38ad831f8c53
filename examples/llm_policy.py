"""An LLM writes gemm kernels through any OpenAI-compatible chat endpoint: plan-then-code beam search.

    python examples/llm_policy.py --base-url http://127.0.0.1:8000/v1 --model my-model [--steps 8]
    python examples/llm_policy.py --replay runs/llm-example/transcript.jsonl      # no endpoint

Each beam member gets a plan request (strategies from ``policies.llm_prompt.STRATEGIES``,
with the kernel's simulated profile, its history and the Pallas TPU guide sections its
category calls for) and a code request per plan; every exchange and score goes to the
transcript, which ``--replay`` re-runs without an endpoint. The same from the command line:

    jaxbench optimize gemm --policy llm-beam --base-url ... --model ... --steps 8 --out runs/llm
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import jaxbench_env  # noqa: F401
from policies import run_policy
from policies.llm_beam import make_llm_beam
from policies.llm_client import make_client

SMALL_GEMM = {"M": 1024, "K": 1024, "N": 2048}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", help="default $OPENAI_BASE_URL")
    ap.add_argument("--model", help="default $OPENAI_MODEL")
    ap.add_argument("--replay", help="a transcript to replay instead of an endpoint")
    ap.add_argument("--transcript", default="runs/llm-example/transcript.jsonl")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()

    client = make_client(args.base_url, args.model, replay=args.replay, transcript=args.transcript,
                         max_requests=64)
    policy = make_llm_beam(client, beam_width=2, n_plans=2)
    env = gym.make("jaxbench_env:JAXBench/gemm-v0", action_mode="source", config=SMALL_GEMM)
    for rec in run_policy(policy, env, args.steps, seed=0):
        status = f"{rec['speedup']:.3f}x" if rec["speedup"] is not None else f"FAILED: {(rec['error'] or '')[:200]}"
        print(f"step {rec['step']}: {status}")
    for failure in policy.proposer.failures:
        print(f"no candidate from plan {failure['plan'][:60]!r}: {failure['error'][:120]}")
    print(f"best speedup {policy.best.speedup:.3f}x; transcript {args.transcript}")
    env.close()


if __name__ == "__main__":
    main()
