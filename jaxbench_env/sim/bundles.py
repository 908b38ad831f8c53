"""The TPU compiler's final VLIW bundles: how many cycles each compiled op issues.

With ``--xla_jf_dump_to`` in ``LIBTPU_INIT_ARGS`` the compiler writes, for every XLA fusion
and every Mosaic kernel, the bundles it will issue (one bundle per cycle). This is an
internal format: anything unreadable yields no profile, and the simulator falls back to
its analytic estimate.

The format, as libtpu writes it for v6e (read from dumps of small kernels: static and
dynamic ``fori_loop``s, ``while_loop``s, ``pl.when``, ``lax.cond`` with two branches, loops
inside branches and branches inside loops, grids of 1, 2 and more steps, no grid):

- one bundle per line, ``<address> <key>: <depth> { op ;; op ... } /* comments */``: the
  address is ``0`` then ``0x1``, ``0x2``, ... (consecutive); the key is empty or ``LB``
  (loop body: the first bundle of a loop), ``PF`` (predicated region fallthrough: the
  target of a forward branch), ``LH``/``LE``/``PB``/``CT`` (listed in the file's key,
  rarely used); ``depth`` is one ``>`` per enclosing loop. A bundle may run over several
  lines (its DMA ops carry multi-line descriptor comments).
- Regions are marked by trailing comments, ``/* Start region 96 */``, ``/* End region 3 */``,
  ``/* Start/End empty region 28 */``, several joined by `` :: ``. A branch is
  ``%n = sbr.rel (%p) target = $region<N>`` (``(!%p)`` negated; no predicate:
  unconditional) and lands on the bundle where region N starts; it has 4 delay slots (the
  4 bundles after it always issue).
- A loop is a do-while: its body starts at an ``LB`` bundle (where its region starts) and
  ends with the backward branch to that region (plus its delay slots). Its exit compare is
  tagged ``/* loop exit test */``, with the bound as a constant when it is static (the
  grid loop: ``scmp.ge.s32.totalorder %s, <steps + 2>``); a bound held in a register (a
  ``fori_loop`` bounded by ``program_id`` or a loaded value, a ``while_loop``) has no tag.
  The ``>`` depth marks are not a loop's extent: the scheduler puts bundles of the
  enclosing level (depth one less) in the middle of an inner loop.
- A loop that may run zero times is guarded: a forward branch just before it skips it
  (and a few bundles around it) when its trip count is not positive.
- An ``scf.if`` (``pl.when``, ``lax.cond``) is a forward branch over its ``then`` region,
  and, when the ``else`` region has ops, a second forward branch over the ``else`` region
  right after it: the skipped bundles are those after the delay slots up to the target.
  Small regions that yield values may be if-converted instead (predicated ops, no branch:
  they issue every time). Mosaic folds away loops that never run (the empty remainder loop
  ``fori_loop`` emits) before the LLO dump; control structures keep the Mosaic body's
  order.
- A Pallas kernel's grid is one loop of ``steps + 2`` iterations (pipeline fill and drain)
  whose first forward branch skips the kernel body on the two extra iterations; with one
  grid step (or no grid) there is no grid loop. XLA fusions are loops over windows.

``BundleProfile.control`` gives those loops and branches as a tree (``ControlNode``), which
``mosaic.kernel_features`` maps onto the Mosaic body's ``scf.for``/``scf.while``/``scf.if``
to charge each grid step the iterations and branches that run at that step.

The flag is read once, when libtpu initialises, so ``enable`` must run before the first
v6e compile of the process (``aot.prepare_process`` calls it, ``aot.v6e_device`` again in
case it did not run).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

_BUNDLE = re.compile(r"^\s*(0x[0-9a-f]+|\d+)\s+([A-Z]{2})?:\s*(>*)\s*\{")
_EXIT = re.compile(r"scmp\.\w+\.s32\.totalorder %\w+, (\d+)?[^;}]*?/\* loop exit test \*/")
_REGION = re.compile(r"(Start/End empty|Start|End) region (\d+)")
_BRANCH = re.compile(r"sbr\.rel\s*(\([^)]*\))?\s*target = \$region(\d+)")
_FILE = re.compile(r"^\d+-(.+)-\d+-final_bundles\.txt$")
DELAY_SLOTS = 4  # bundles after a branch that issue whether or not it is taken

_FLAGS = ("--xla_jf_dump_to=", "--xla_jf_dump_llo_pass_label_regex=")
_dump_dir: Path | None = None
_OWN_DIR = "JAXBENCH_BUNDLE_OWN_DIR"  # the directory enable() put in LIBTPU_INIT_ARGS


@dataclass(frozen=True)
class Loop:
    start: int  # address of the first body bundle
    end: int  # address of the last body bundle
    trip: int | None  # None: the bound is a register (data-dependent)


@dataclass(frozen=True)
class Branch:
    """A forward branch: when taken, the bundles ``skip_start..skip_end`` do not issue."""

    at: int  # address of the branch
    skip_start: int
    skip_end: int
    predicated: bool  # False: unconditional


@dataclass
class ControlNode:
    """A loop body or a branch's skipped bundles, with the loops and branches inside it."""

    kind: str  # "loop" or "branch"
    lo: int  # first and last address it covers
    hi: int
    trip: int | None = None  # a loop's static trip count (its exit test's bound), if tagged
    children: list = field(default_factory=list)
    index: int = -1  # position in pre-order
    size: int = 0  # bundles from lo to hi

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()


@dataclass(frozen=True)
class BundleProfile:
    """The bundles of one compiled op: their addresses, loops and forward branches."""

    addresses: tuple[int, ...]
    loops: tuple[Loop, ...]
    branches: tuple[Branch, ...] = ()

    def _multiplicity(self) -> np.ndarray:
        addr = np.asarray(self.addresses)
        mult = np.ones(len(addr))
        for loop in self.loops:
            mult[(addr >= loop.start) & (addr <= loop.end)] *= loop.trip or 1
        return mult

    @property
    def static(self) -> int:
        return len(self.addresses)

    @property
    def dynamic(self) -> float:
        """Bundles issued by one run, each loop body counted trip times (unknown trips once),
        both sides of every branch."""
        return float(self._multiplicity().sum())

    def outer_loop(self) -> Loop | None:
        """The outermost loop (the grid loop of a Pallas kernel), or None."""
        return max(self.loops, key=lambda lp: lp.end - lp.start, default=None)

    def per_iteration(self) -> tuple[float, float, int | None]:
        """(bundles outside the outer loop, bundles per outer iteration, its trip count)."""
        outer = self.outer_loop()
        if outer is None:
            return float(self.static), 0.0, None
        addr, mult = np.asarray(self.addresses), self._multiplicity()
        inside = (addr >= outer.start) & (addr <= outer.end)
        trip = outer.trip or 1
        return float(mult[~inside].sum()), float(mult[inside].sum() / trip), outer.trip

    def count(self, lo: int, hi: int) -> int:
        """Bundles with addresses in ``lo..hi``."""
        addr = self.addresses
        return int(np.searchsorted(addr, hi, side="right") - np.searchsorted(addr, lo, side="left"))

    def control(self, branches: bool = True) -> list[ControlNode] | None:
        """The loops and (unless ``branches`` is False) forward branches as a forest
        (outermost first, in address order), or None when their extents overlap without
        nesting (not a structure this reads)."""
        nodes = [ControlNode("loop", lp.start, lp.end, lp.trip) for lp in self.loops]
        if branches:
            nodes += [ControlNode("branch", b.skip_start, b.skip_end) for b in self.branches if b.predicated]
        # Outer before inner; a guard branch covering exactly a loop's extent encloses it.
        nodes.sort(key=lambda n: (n.lo, -n.hi, n.kind != "branch"))
        roots: list[ControlNode] = []
        stack: list[ControlNode] = []
        for n in nodes:
            while stack and stack[-1].hi < n.lo:
                stack.pop()
            if stack and stack[-1].hi < n.hi:
                return None  # overlapping, not nested
            (stack[-1].children if stack else roots).append(n)
            stack.append(n)
        order = 0
        for root in roots:
            for n in root.walk():
                n.index, order = order, order + 1
                n.size = self.count(n.lo, n.hi)
        return roots


def _bundle_texts(text: str):
    """(address, key, depth, the bundle's whole text) per bundle: a bundle's text runs until
    the next bundle's line (descriptor comments span lines)."""
    current = None
    for line in text.splitlines():
        m = _BUNDLE.match(line)
        if m:
            if current is not None:
                yield current[0], current[1], current[2], "\n".join(current[3])
            current = (int(m.group(1), 0), m.group(2), len(m.group(3)), [line])
        elif current is not None:
            current[3].append(line)
    if current is not None:
        yield current[0], current[1], current[2], "\n".join(current[3])


def parse(text: str) -> BundleProfile | None:
    """Bundles, loops and forward branches of one dump.

    A loop runs from the bundle a backward branch targets to that branch (with its delay
    slots); its trip count is the bound of the tagged exit test inside it (not inside an
    inner loop), when static. A forward branch skips the bundles after its delay slots up
    to its target."""
    rows = []  # (address, branch target region or None, predicated, exit trip or -1 if none)
    starts: dict[int, int] = {}  # region -> address of the bundle where it starts
    marks = []  # (address, depth, opens a loop)
    for addr, key, depth, body in _bundle_texts(text):
        for kind, region in _REGION.findall(body):
            if kind != "End":
                starts.setdefault(int(region), addr)
        b = _BRANCH.search(body)
        e = _EXIT.search(body)
        trip = (int(e.group(1)) if e.group(1) else None) if e else -1
        rows.append((addr, int(b.group(2)) if b else None, bool(b and b.group(1)), trip))
        marks.append((addr, depth, key == "LB"))
    if not rows:
        return None
    addresses = [r[0] for r in rows]
    last = addresses[-1]
    spans: dict[int, int] = {}  # loop start -> end
    branches = []
    for addr, target, predicated, _ in rows:
        if target is None or target not in starts:
            continue
        to = starts[target]
        if to <= addr:  # backward: a loop's latch
            spans[to] = max(spans.get(to, to), min(addr + DELAY_SLOTS, last))
        elif to - 1 >= addr + DELAY_SLOTS + 1:
            branches.append(Branch(addr, addr + DELAY_SLOTS + 1, to - 1, predicated))
    for i, (start, depth, opens) in enumerate(marks):  # a loop body without a latch found: by depth
        if opens and depth and start not in spans:
            end = start
            for addr, d, _ in marks[i:]:
                if 0 < d < depth:
                    break
                if d >= depth:
                    end = addr
            spans[start] = end
    exits = [(a, t) for a, _, _, t in rows if t != -1]
    loops = []
    for start, end in sorted(spans.items()):
        inner = [(s, e) for s, e in spans.items() if start < s and e <= end or (s == start and e < end)]
        tags = [t for a, t in exits if start <= a <= end and not any(s <= a <= e for s, e in inner)]
        loops.append(Loop(start, end, tags[0] if tags else None))
    return BundleProfile(tuple(addresses), tuple(loops), tuple(branches))


def enable() -> Path | None:
    """Ask libtpu to dump final bundles into a private directory (before it initialises)."""
    global _dump_dir
    if _dump_dir is not None:
        return _dump_dir
    args = os.environ.get("LIBTPU_INIT_ARGS", "")
    given = os.environ.get("JAXBENCH_BUNDLE_DIR")  # a worker's: made (and removed) by its parent
    # A process started by one that called enable() (a pytest-xdist worker, a subprocess)
    # inherits that parent's flags; sharing its directory would mix or lose both dumps.
    inherited = os.environ.get(_OWN_DIR)
    if given or (inherited and f"{_FLAGS[0]}{inherited}" in args.split()):
        args = " ".join(a for a in args.split() if not a.startswith(_FLAGS))
    elif "--xla_jf_dump_to" in args:  # the user's own dump: leave it alone, no bundles
        return None
    _dump_dir = Path(given) if given else Path(tempfile.mkdtemp(prefix="jaxbench-bundles-"))
    if not given:
        atexit.register(shutil.rmtree, _dump_dir, True)
    flags = f"{_FLAGS[0]}{_dump_dir} {_FLAGS[1]}^final_bundles$"
    os.environ["LIBTPU_INIT_ARGS"] = (args + " " + flags).strip()
    os.environ[_OWN_DIR] = str(_dump_dir)
    return _dump_dir


def collect() -> dict[str, BundleProfile]:
    """Profiles of the ops compiled since the last call, by HLO instruction name; clears the dump.

    Empty when dumping is off (libtpu initialised before ``enable``)."""
    if _dump_dir is None or not _dump_dir.exists():
        return {}
    profiles = {}
    for path in _dump_dir.iterdir():
        m = _FILE.match(path.name)
        if m and not m.group(1).startswith(("<", "TLP")):
            try:
                profile = parse(path.read_text(errors="replace"))
            except OSError:
                profile = None
            if profile is not None:
                profiles[m.group(1)] = profile
    for path in _dump_dir.iterdir():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return profiles
