"""An LLM writes gemm kernels through any OpenAI-compatible chat endpoint.

    python examples/llm_policy.py --base-url http://127.0.0.1:8000/v1 --model my-model [--steps 3]

Each step sends ``env.unwrapped.describe()`` (workload, reference, current source, last
result) and applies the reply's last fenced code block: a full module or search/replace
edit blocks. The same run from the command line:

    jaxbench optimize gemm --policy llm --base-url ... --model ... --steps 3 --out runs/llm
"""

from __future__ import annotations

import argparse
import os

import gymnasium as gym

import jaxbench_env  # noqa: F401
from policies.llm import LLMPolicy

SMALL_GEMM = {"M": 1024, "K": 1024, "N": 2048}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    policy = LLMPolicy(base_url=args.base_url, model=args.model, api_key=args.api_key)
    env = gym.make("jaxbench_env:JAXBench/gemm-v0", action_mode="source", config=SMALL_GEMM)
    _, info = env.reset(seed=0)
    print(f"start speedup {info['speedup']:.3f}x")
    for step in range(1, args.steps + 1):
        action = policy.act(env)
        _, reward, _, truncated, info = env.step(action)
        status = f"{info['speedup']:.3f}x" if info["speedup"] is not None else f"FAILED: {(info['error'] or '')[:200]}"
        print(f"step {step}: reward {reward:.3f}, {status}")
        if truncated:
            break
    u = env.unwrapped
    print(f"best speedup {u.best_speedup:.3f}x")
    env.close()


if __name__ == "__main__":
    main()
