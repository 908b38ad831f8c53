"""What an LLM policy shows the model: the guide, the score explained, the history, the plan.

The prompt for a kernel (``Context``) carries the workload and its tolerance, the XLA
reference, the simulator's (or the TPU's) breakdown of the kernel being improved, a compact
history of earlier attempts, the kernel's source, and the sections of the Pallas TPU guide
(``policies/guide/*.md``, this project's own text) that the workload's category and the last
error call for. Prompts are kept under ``PROMPT_TOKEN_BUDGET`` tokens, counted as characters
/ 4 (a conservative estimate for code and English with the usual BPE tokenizers): the
guide gets what the rest leaves, the history is cut from its oldest end first.

Plan then code, as Autocomp searches: ``plan_messages`` asks for N plans, each one strategy
from ``STRATEGIES`` made concrete for this kernel; ``code_messages`` asks for the code of one
plan, as a whole module or search/replace edits in one fenced block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

GUIDE_DIR = Path(__file__).parent / "guide"
PROMPT_TOKEN_BUDGET = 12_000
CHARS_PER_TOKEN = 4
GUIDE_MAX_CHARS = 16_000  # at most this much guide even when the rest is short
HISTORY_SHOWN = 8  # attempts shown at most, newest last


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


# --- the guide ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Section:
    id: str
    title: str
    categories: tuple  # workload categories it serves; ("all",) for every workload
    errors: tuple  # compiled regexes: an error matching one brings the section
    body: str

    def text(self) -> str:
        return f"### {self.title}\n{self.body.strip()}\n"


def load_guide(directory: Path = GUIDE_DIR) -> list[Section]:
    """The guide's sections, sorted by file name. Each file: ``# Title``, ``categories: a, b``
    (or ``all``), ``errors: regex | regex`` (or ``none``), a blank line, the body."""
    sections = []
    for path in sorted(Path(directory).glob("*.md")):
        lines = path.read_text().splitlines()
        if len(lines) < 3 or not lines[0].startswith("# "):
            raise ValueError(f"guide section {path.name}: expected '# Title', 'categories:', 'errors:' lines")
        head = dict(line.split(":", 1) for line in lines[1:3] if ":" in line)
        if set(head) != {"categories", "errors"}:
            raise ValueError(f"guide section {path.name}: lines 2-3 must be 'categories:' and 'errors:'")
        # commas inside parentheses belong to a name: "attention (ragged, paged)"
        categories = tuple(c.strip() for c in re.split(r",(?![^()]*\))", head["categories"]) if c.strip())
        errors = head["errors"].strip()
        patterns = () if errors == "none" else tuple(re.compile(p.strip(), re.IGNORECASE)
                                                     for p in errors.split(" | ") if p.strip())
        sections.append(Section(path.stem, lines[0][2:].strip(), categories, patterns, "\n".join(lines[3:])))
    return sections


# The sections for every workload, most needed first (the rest follow in file order).
GENERAL_ORDER = ("environment_contract", "tiling_rules", "grid_and_blockspec", "memory_hierarchy",
                 "pipelining_and_buffering", "dimension_semantics", "conditionals_and_loops",
                 "compiler_params_vmem", "mosaic_errors")


def select_sections(sections: list[Section], category: str, error: str | None, max_chars: int) -> list[Section]:
    """Sections for a prompt, within ``max_chars``: first those the last ``error`` matches,
    then those written for the workload's ``category`` (file order), then those for every
    workload (``GENERAL_ORDER``); a section that does not fit is skipped for a shorter one."""
    matched = [s for s in sections if error and any(p.search(error) for p in s.errors)]
    own = [s for s in sections if category in s.categories]
    general = sorted((s for s in sections if "all" in s.categories),
                     key=lambda s: GENERAL_ORDER.index(s.id) if s.id in GENERAL_ORDER else len(GENERAL_ORDER))
    chosen, used = [], 0
    for s in dict.fromkeys(matched + own + general):
        size = len(s.text())
        if used + size <= max_chars:
            chosen.append(s)
            used += size
    return chosen


# --- plans ------------------------------------------------------------------------------------

STRATEGIES = {
    "tiling": "change block sizes (MXU multiples of 256, as large as VMEM allows) or the grid",
    "grid_order": "reorder grid axes so the block re-used across steps stays resident (no re-fetch)",
    "fusion": "fuse the ops before or after the main computation into the kernel (epilogue, "
              "bias, activation, the reduction that follows a matmul)",
    "algebra": "rewrite the math to do less: fold a reduction over a matmul's output into its "
               "weights, drop work whose result is unused, reassociate",
    "masked_blocks": "skip blocks a mask makes all-zero (causal, sparse) and clamp their index "
                     "maps so they are not fetched either",
    "row_in_vmem": "keep a whole row or group in VMEM so softmax, norm or logsumexp epilogues "
                   "need one pass",
    "layout": "change the layout so the lane axis is 128-dense and no transposes are needed",
    "pipelining": "change buffering depth (pipeline_mode=pl.Buffered(n)) or issue DMAs by hand "
                  "to overlap copies with compute",
    "accumulator": "accumulate in an f32 VMEM scratch across the reduction axis; cast once at the end",
    "direct_taps": "for convolutions, sum shifted-window matmuls over the kernel taps instead of "
                   "materializing an im2col",
    "precision": "keep inputs and outputs bf16 (half the HBM bytes) while computing in f32",
}

_PLAN = re.compile(r"^\s*\**\s*PLAN\s*(\d+)\s*\**\s*[:.)-]\s*(.*?)(?=^\s*\**\s*PLAN\s*\d+|\Z)",
                   re.IGNORECASE | re.MULTILINE | re.DOTALL)


def parse_plans(reply: str, limit: int) -> list[str]:
    """The ``PLAN k: ...`` paragraphs of a reply, at most ``limit``; the whole reply as one
    plan if it has none."""
    plans = [m.group(2).strip() for m in _PLAN.finditer(reply or "") if m.group(2).strip()]
    if not plans and (reply or "").strip():
        plans = [reply.strip()]
    return plans[:limit]


# --- the state of one kernel ------------------------------------------------------------------

@dataclass
class Attempt:
    """One earlier candidate, for the history: what was tried and how it scored."""

    summary: str  # the plan, or "schedule {...}"
    correct: bool | None
    speedup: float | None
    time_ms: float | None
    error: str | None

    @classmethod
    def of(cls, summary: str, result) -> "Attempt":
        """The attempt ``summary`` that an ``EvalResult`` scored."""
        error = None if result.ok else (result.error or "not correct")
        return cls(summary, result.correct, result.speedup, result.time_ms, error)

    def line(self, n: int) -> str:
        if self.error:
            first = self.error.strip().splitlines()[0][:200]
            outcome = f"FAILED: {first}"
        else:
            outcome = f"correct, {self.speedup:.3f}x ({self.time_ms:.4f} ms)" if self.speedup else "no time"
        summary = " ".join(self.summary.split())[:240]
        return f"{n}. {summary} -> {outcome}"


def breakdown(details: dict | None, vmem_bytes: int) -> str:
    """The simulator's (or measurement's) view of a kernel, one line per Pallas kernel."""
    sim = (details or {}).get("sim") or {}
    if not sim:
        if (details or {}).get("device_kind"):  # the tpu backend times the whole program, not its parts
            return (f"measured on a {details['device_kind']}: the whole program end to end (median of the timed "
                    "runs; its time is in the history), no per-kernel breakdown")
        return "(no breakdown for this kernel)"
    ms = lambda s: f"{1e3 * s:.4f} ms"  # noqa: E731
    lines = [f"total {ms(sim['time_s'])}; outside the Pallas kernels (XLA glue) {ms(sim.get('glue_s') or 0.0)}"]
    for k in sim.get("kernels", []):
        bound = "compute-bound" if k["compute_s"] >= k["dma_s"] else "memory-bound"
        lines.append(
            f"kernel {k['name']}: grid {tuple(k['grid'])} ({k['steps']} steps), {ms(k['time_s'])}: compute "
            f"{ms(k['compute_s'])}, HBM traffic {k['hbm_bytes'] / 2**20:.1f} MiB = {ms(k['dma_s'])} at the "
            f"achieved bandwidth -> {bound}; VMEM {k['vmem_bytes'] / 2**20:.1f} of {vmem_bytes / 2**20:.0f} MiB")
    for c in (sim.get("caveats") or [])[:4]:
        lines.append(f"caveat: {c}")
    return "\n".join(lines)


@dataclass
class Context:
    """Everything a prompt says about one kernel of one workload."""

    workload: str
    header: str  # name, description, config, tolerance, baseline
    category: str
    reference: str
    source: str
    profile: str  # ``breakdown`` of this source's evaluation
    history: list  # of Attempt, oldest first
    last_error: str | None

    @classmethod
    def of(cls, env, source: str | None = None, details: dict | None = None,
           history: list | None = None, last_error: str | None = None) -> "Context":
        """The context of ``source`` (default: the env's current source and last result)."""
        from jaxbench_env.sim import V6E

        u = env.unwrapped
        wl = u.workload
        atol, rtol = wl.tolerance(wl.config)
        word = "predicted by the v6e simulator" if u.evaluator.backend == "sim" else "measured on a TPU"
        header = "\n".join([
            f"Workload {wl.name} ({wl.jaxbench_id}, {wl.category}): {wl.description}",
            f"Config: {wl.config}",
            f"Correctness: allclose(atol={atol}, rtol={rtol}) against the reference on random inputs, checked "
            "at smaller sizes too (the kernel must work for any size, not only this config).",
            f"XLA baseline: {u.evaluator.baseline().time_ms:.4f} ms ({word}); best so far {u.best_speedup:.3f}x.",
        ])
        if source is None:
            source = u.source
            details = u.last.details if u.last is not None else None
            last_error = last_error or (u.last.error if u.last is not None else None)
        return cls(wl.name, header, wl.category, u.reference_source(), source,
                   breakdown(details, V6E.vmem_bytes), list(history or []), last_error)

    def history_text(self, shown: int = HISTORY_SHOWN) -> str:
        recent = self.history[-shown:]
        first = len(self.history) - len(recent) + 1
        return "\n".join(a.line(first + i) for i, a in enumerate(recent)) or "(none yet)"


SYSTEM = ("You optimize Pallas TPU kernels for a TPU v6e. A kernel is a Python module defining "
          "workload(*inputs) that returns what the JAX reference returns, within tolerance, on any "
          "inputs of the workload's shapes. Be concrete and brief.")

CODE_FORMAT = """Answer with ONE fenced ```python block at the end of your reply, either:
  * the whole new module, or
  * one or more search/replace edits against the current kernel source:
<<<<<<< SEARCH
exact lines from the current source
=======
replacement lines
>>>>>>> REPLACE"""


def _body(ctx: Context, task: str, budget_tokens: int, guide: list[Section]) -> str:
    """The user message: the fixed parts, then as much history and guide as the budget allows."""
    fixed = "\n\n".join([
        f"## Workload\n{ctx.header}",
        f"## Reference (the XLA baseline)\n```python\n{ctx.reference.rstrip()}\n```",
        f"## Current kernel: where its time goes\n{ctx.profile}",
        f"## Current kernel source\n```python\n{ctx.source.rstrip()}\n```",
        *([f"## Its last error\n{ctx.last_error.strip()[:1500]}"] if ctx.last_error else []),
        task,
    ])
    room = budget_tokens * CHARS_PER_TOKEN - len(fixed) - 200
    shown = HISTORY_SHOWN
    history = f"## Earlier attempts (oldest first)\n{ctx.history_text(shown)}"
    while len(history) > room // 3 and shown > 1:
        shown -= 1
        history = f"## Earlier attempts (oldest first)\n{ctx.history_text(shown)}"
    room -= len(history)
    chosen = select_sections(guide, ctx.category, ctx.last_error, min(GUIDE_MAX_CHARS, max(room, 0)))
    guide_text = "## Pallas TPU guide (v6e)\n" + "\n".join(s.text() for s in chosen) if chosen else ""
    return "\n\n".join(p for p in (guide_text, history, fixed) if p)


def plan_messages(ctx: Context, n_plans: int, guide: list[Section],
                  budget_tokens: int = PROMPT_TOKEN_BUDGET) -> list[dict]:
    menu = "\n".join(f"- {name}: {what}" for name, what in STRATEGIES.items())
    task = (f"## Task: plan\nPropose {n_plans} distinct plans to make the current kernel faster on a v6e "
            f"while staying correct. Each plan takes one strategy from this menu and says concretely what to "
            f"change in this kernel and why its profile says it will help:\n{menu}\n\n"
            f"Write them as 'PLAN 1: <strategy>: <what to change>', 'PLAN 2: ...'. No code.")
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": _body(ctx, task, budget_tokens, guide)}]


def code_messages(ctx: Context, plan: str | None, guide: list[Section],
                  budget_tokens: int = PROMPT_TOKEN_BUDGET) -> list[dict]:
    what = f"Implement this plan:\n{plan.strip()}" if plan else "Make the current kernel faster on a v6e."
    task = f"## Task: code\n{what}\nKeep it correct.\n\n{CODE_FORMAT}"
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": _body(ctx, task, budget_tokens, guide)}]
