"""The TPU compiler's final VLIW bundles: how many cycles each compiled op issues.

With ``--xla_jf_dump_to`` in ``LIBTPU_INIT_ARGS`` the compiler writes, for every XLA fusion
and every Mosaic kernel, the bundles it will issue (one bundle per cycle), with loop
markers: ``LB:`` opens a loop body and the body's last compare is tagged
``/* loop exit test */``, naming the trip count when it is static. A Pallas kernel's grid
is one such loop (trip = grid steps + 2 pipeline stages); XLA fusions are loops over
windows. This is an internal format: anything unreadable yields no profile, and the
simulator falls back to its analytic estimate.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_BUNDLE = re.compile(r"^\s*0x([0-9a-f]+)\s+(?:([A-Z]{2}):)?\s*:?")  # LB: loop body, PF:, PB:, ...
_DEPTH = re.compile(r"\s*(>*)")
_EXIT = re.compile(r"scmp\.\w+\.s32\.totalorder %\w+, (\d+)?[^;}]*?/\* loop exit test \*/")
_FILE = re.compile(r"^\d+-(.+)-\d+-final_bundles\.txt$")

_FLAGS = ("--xla_jf_dump_to=", "--xla_jf_dump_llo_pass_label_regex=")
_dump_dir: Path | None = None


@dataclass(frozen=True)
class Loop:
    start: int  # address of the first body bundle
    end: int  # address of the exit test
    trip: int | None  # None: the bound is a register (data-dependent)


@dataclass(frozen=True)
class BundleProfile:
    """The bundles of one compiled op: their addresses and its loops."""

    addresses: tuple[int, ...]
    loops: tuple[Loop, ...]

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
        """Bundles issued by one run, each loop body counted trip times (unknown trips once)."""
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


def parse(text: str) -> BundleProfile | None:
    """Bundles and loops of one dump. Each bundle line carries its loop depth as ``>``
    marks; ``LB:`` opens a loop at that depth, which lasts while the depth stays at or
    above it. The loop's trip count is on its own exit test, when the bound is static."""
    rows = []  # (address, depth, opens a loop, trip of a tagged exit test or -1)
    for line in text.splitlines():
        m = _BUNDLE.match(line)
        if not m:
            continue
        depth = len(_DEPTH.match(line[m.end():]).group(1))
        e = _EXIT.search(line)
        trip = (int(e.group(1)) if e.group(1) else None) if e else -1
        rows.append((int(m.group(1), 16), depth, m.group(2) == "LB", trip))
    if not rows:
        return None
    loops = []
    for i, (start, depth, opens, _) in enumerate(rows):
        if not opens or depth == 0:
            continue
        end, trip = start, None
        for addr, d, _, t in rows[i:]:
            if 0 < d < depth:
                break
            if d >= depth:
                end = addr
                if d == depth and t != -1 and trip is None:
                    trip = t
        loops.append(Loop(start, end, trip))
    return BundleProfile(tuple(r[0] for r in rows), tuple(loops))


def enable() -> Path | None:
    """Ask libtpu to dump final bundles into a private directory (before it initialises)."""
    global _dump_dir
    if _dump_dir is not None:
        return _dump_dir
    args = os.environ.get("LIBTPU_INIT_ARGS", "")
    given = os.environ.get("JAXBENCH_BUNDLE_DIR")  # a worker's: made (and removed) by its parent
    if given:  # the parent's own dump flags may be inherited: ours replace them
        args = " ".join(a for a in args.split() if not a.startswith(_FLAGS))
    elif "--xla_jf_dump_to" in args:  # the user's own dump: leave it alone, no bundles
        return None
    _dump_dir = Path(given) if given else Path(tempfile.mkdtemp(prefix="jaxbench-bundles-"))
    if not given:
        atexit.register(shutil.rmtree, _dump_dir, True)
    flags = f"{_FLAGS[0]}{_dump_dir} {_FLAGS[1]}^final_bundles$"
    os.environ["LIBTPU_INIT_ARGS"] = (args + " " + flags).strip()
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
