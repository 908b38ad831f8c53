"""The on-disk result cache under concurrent writers."""

from __future__ import annotations

import json
import multiprocessing as mp

from jaxbench_env.cache import ResultCache
from jaxbench_env.candidate import Candidate, content_key


def _writer(root, worker, n):
    cache = ResultCache(root)
    for i in range(n):
        cache.put(content_key(i=i), {"i": i, "writer": worker, "pad": "x" * 5000})
        got = cache.get(content_key(i=(i * 7) % n))
        assert got is None or got["i"] == (i * 7) % n


def test_concurrent_writers_never_leave_partial_entries(tmp_path):
    procs = [mp.get_context("spawn").Process(target=_writer, args=(tmp_path, w, 200)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = ResultCache(tmp_path)
    assert all(cache.get(content_key(i=i))["i"] == i for i in range(200))
    assert not list(tmp_path.rglob(".tmp-*"))


def test_key_depends_on_source_and_schedule():
    a = Candidate("def workload(x): return x", {"block": 128})
    keys = {
        content_key(c=a.key()),
        content_key(c=Candidate(a.source, {"block": 256}).key()),
        content_key(c=Candidate(a.source + " ", {"block": 128}).key()),
    }
    assert len(keys) == 3
    assert content_key(c=a.key()) == content_key(c=Candidate(a.source, {"block": 128}).key())


def test_results_are_keyed_by_the_code_that_judged_them(tmp_path):
    # An edit to a workload's reference, inputs or adapter (or to the judge) must not be
    # answered from results cached before it: the key holds a digest of that code.
    from jaxbench_env import evaluation

    pkg = tmp_path / "workloads"
    pkg.mkdir()
    (pkg / "gemm.py").write_text("def reference(a, b):\n    return a @ b\n")
    before = evaluation.source_digest(pkg)
    assert evaluation.source_digest(pkg) == before  # stable
    (pkg / "gemm.py").write_text("def reference(a, b):\n    return (a @ b) * 2\n")
    assert evaluation.source_digest(pkg) != before
    assert evaluation.package_versions()["code"] == evaluation.code_digest() != before


def test_entries_written_without_the_secret_are_misses(tmp_path):
    cache = ResultCache(tmp_path)
    key = content_key(i=1)
    cache.put(key, {"time_ms": 5.0})
    assert cache.get(key) == {"time_ms": 5.0}
    path = tmp_path / key[:2] / f"{key}.json"
    entry = json.loads(path.read_text())
    entry["value"] = entry["value"].replace("5.0", "0.001")  # a rewritten value, old MAC
    path.write_text(json.dumps(entry))
    assert cache.get(key) is None
    path.write_text(json.dumps({"time_ms": 0.001}))  # an unauthenticated entry
    assert cache.get(key) is None
    path.write_text("garbage{")
    assert cache.get(key) is None
    assert (tmp_path / ".secret").stat().st_mode & 0o077 == 0  # readable by its owner only


def test_nodes_sharing_a_directory_share_its_secret(tmp_path, monkeypatch):
    ResultCache(tmp_path).put(content_key(i=2), {"ok": True})
    assert ResultCache(tmp_path).get(content_key(i=2)) == {"ok": True}  # another process, same dir
    monkeypatch.setenv("JAXBENCH_CACHE_SECRET", "ab" * 32)  # an explicit secret is another key
    assert ResultCache(tmp_path).get(content_key(i=2)) is None
