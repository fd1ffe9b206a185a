"""The results cache: keys, hits and misses, the SQLite store's robustness."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import eqsat_mirage as em
from eqsat_mirage.pipeline import cache as cache_mod
from eqsat_mirage.pipeline import integrity
from eqsat_mirage.pipeline.cache import ResultCache, default_dir, default_path, make_key
from eqsat_mirage.pipeline.result import to_data

KW = {"level": "kernel", "trials": 1}


def tiny(name: str = "tiny", n: int = 64) -> em.Graph:
    """A small LoRA-shaped program: X@W + (X@A)@B."""
    g = em.Graph(name)
    x, w = g.input("X", (16, n)), g.input("W", (n, 128))
    a, b = g.input("A", (n, 4)), g.input("B", (4, 128))
    g.output(x @ w + (x @ a) @ b, "O")
    return g


def options(**kw) -> dict:
    """The full option dict optimize builds for its cache key."""
    from eqsat_mirage.pipeline.many import _options

    return _options({**KW, **kw})


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.setenv("EQSAT_MIRAGE_CACHE_DIR", str(tmp_path / "mine"))
    assert default_path() == tmp_path / "mine" / "results.sqlite"
    monkeypatch.delenv("EQSAT_MIRAGE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dir() == tmp_path / "xdg" / "eqsat-mirage"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_dir() == tmp_path / "home" / ".cache" / "eqsat-mirage"


def test_tests_never_touch_the_user_cache():
    assert "pytest" in os.environ["EQSAT_MIRAGE_CACHE_DIR"] or \
        os.environ["EQSAT_MIRAGE_CACHE_DIR"].startswith(str(Path(os.sep, "tmp")))


def test_second_optimize_is_a_fast_hit():
    g = tiny()
    lines: list[str] = []
    first = em.optimize(g, **KW)
    assert first.stats["cache"] == "miss"
    t = time.perf_counter()
    again = em.optimize(tiny(), progress=lines.append, **KW)
    elapsed = time.perf_counter() - t
    assert again.stats["cache"] == "hit" and elapsed < 0.5, elapsed
    assert again.cost_us == first.cost_us and str(again.program) == str(first.program)
    assert again.verified.equivalent and em.verify(g, again.program, trials=1).equivalent
    assert any(line.startswith("cache hit: tiny") for line in lines), lines
    assert [e.name for e in ResultCache().entries()] == ["tiny"]


def test_cache_off_and_explicit_caches(tmp_path):
    g = tiny()
    assert em.optimize(g, cache=False, **KW).stats["cache"] == "off"
    assert not default_path().exists()
    path = tmp_path / "elsewhere.sqlite"
    assert em.optimize(g, cache=str(path), **KW).stats["cache"] == "miss"
    store = ResultCache(path)
    assert em.optimize(g, cache=store, **KW).stats["cache"] == "hit"
    assert ResultCache(tmp_path).path == tmp_path / "results.sqlite"  # a folder
    with pytest.raises(em.MirageError, match="cache must be"):
        em.optimize(g, cache=3, **KW)


def test_environment_switches_the_default_cache_off(monkeypatch, tmp_path):
    monkeypatch.setenv("EQSAT_MIRAGE_CACHE", "off")
    assert em.optimize(tiny(), **KW).stats["cache"] == "off"
    assert not default_path().exists()
    path = tmp_path / "explicit.sqlite"  # an explicit cache is still used
    assert em.optimize(tiny(), cache=path, **KW).stats["cache"] == "miss"


def test_key_ignores_locations_and_ids_but_not_the_program():
    a, b = tiny(), tiny()  # built twice: other nodes, other file:line
    assert make_key(a, options()) == make_key(b, options())
    assert make_key(a, options()) != make_key(tiny(n=32), options())
    assert make_key(a, options()) != make_key(tiny("renamed"), options())


@pytest.mark.parametrize("change", [{"target": "a100"}, {"trials": 2}, {"guards": False},
                                    {"level": "mugraph"}, {"node_limit": 1000}])
def test_changed_option_or_target_misses(change):
    g = tiny()
    assert make_key(g, options()) != make_key(g, options(**change))


def test_changed_target_misses_end_to_end():
    em.optimize(tiny(), **KW)
    res = em.optimize(tiny(), target="a100", **KW)
    assert res.stats["cache"] == "miss" and res.stats["target"] == "a100"
    assert em.optimize(tiny(), **{**KW, "trials": 2}).stats["cache"] == "miss"


def test_target_file_contents_are_part_of_the_key(tmp_path):
    from eqsat_mirage.cost.profile import profiles_dir

    text = (profiles_dir() / "h100.toml").read_text()
    mine = tmp_path / "h100.toml"
    mine.write_text(text)
    g = tiny()
    same = make_key(g, options(target=str(mine)))
    assert same == make_key(g, options(target="h100"))
    mine.write_text(text + "\n# recalibrated\n")
    assert make_key(g, options(target=str(mine))) != same
    with pytest.raises(em.MirageError, match="unknown target"):
        make_key(g, options(target="tpu9"))


def test_user_rule_file_contents_are_part_of_the_key(tmp_path):
    rules = tmp_path / "mine.egg"
    rules.write_text("(ruleset user)\n; add commutes\n"
                     "(rewrite (Add a b) (Add b a) :ruleset user)\n")
    kw = {**KW, "rules": ["rules", str(rules)]}
    assert em.optimize(tiny(), **kw).stats["cache"] == "miss"
    assert em.optimize(tiny(), **kw).stats["cache"] == "hit"
    rules.write_text("(ruleset user)\n; mul commutes\n"
                     "(rewrite (Mul a b) (Mul b a) :ruleset user)\n")
    assert em.optimize(tiny(), **kw).stats["cache"] == "miss"
    assert em.optimize(tiny(), **KW).stats["cache"] == "miss"  # built-in rules alone differ too


def test_entries_delete_and_clear(tmp_path):
    store = ResultCache(tmp_path / "c.sqlite")
    assert store.entries() == [] and store.clear() == 0
    res = em.optimize(tiny(), cache=store, **KW)
    (entry,) = store.entries()
    assert entry.name == "tiny" and entry.target == "h100" and entry.level == "kernel"
    assert entry.cost_us == res.cost_us and entry.size > 0 and entry.prefix == entry.key[:12]
    assert entry.created <= time.time() and entry.search_seconds > 0
    assert store.delete(entry.prefix) == 1 and store.entries() == []
    store.put("k" * 64, res)
    assert store.clear() == 1 and store.get("k" * 64) is None


def test_stats_that_are_not_plain_data_are_dropped(tmp_path):
    store = ResultCache(tmp_path / "c.sqlite")
    res = em.optimize(tiny(), cache=False, **KW)
    res.record(callback=lambda s: None)
    assert store.put("x" * 64, res)
    back, trusted = store.load("x" * 64, tiny())
    assert trusted and "callback" not in back.stats and back.stats["cache_dropped"] == ["callback"]
    assert "callback" in res.stats  # the caller's result is left alone
    assert back.cost_us == res.cost_us and str(back.program) == str(res.program)
    assert back.verified.equivalent and back.verified.primes == res.verified.primes


def test_the_store_holds_json_text_never_a_pickle(tmp_path):
    store = ResultCache(tmp_path / "c.sqlite")
    em.optimize(tiny(), cache=store, level="mugraph", trials=1)
    conn = sqlite3.connect(store.path)
    (text, tag), = conn.execute("SELECT result, tag FROM results").fetchall()
    conn.close()
    data = json.loads(text)
    assert data["kind"] == "mugraph" and data["program"]["kernels"] and len(tag) == 64
    assert "import pickle" not in Path(cache_mod.__file__).read_text()


def test_foreign_files_are_refused_and_left_alone(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    with pytest.raises(cache_mod.CacheError, match="not an SQLite file"):
        em.optimize(tiny(), cache=text, **KW)
    assert text.read_text() == "my notes\n"
    other = tmp_path / "app.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE results (id INTEGER, score REAL)")
    conn.execute("INSERT INTO results VALUES (1, 2.5)")
    conn.commit()
    conn.close()
    with pytest.raises(cache_mod.CacheError, match="not an eqsat-mirage results cache"):
        em.optimize(tiny(), cache=other, **KW)
    conn = sqlite3.connect(other)
    assert conn.execute("SELECT * FROM results").fetchall() == [(1, 2.5)]
    conn.close()
    assert isinstance(cache_mod.CacheError("x"), ValueError)


def test_its_own_old_schema_is_recreated_with_a_warning(tmp_path):
    path = tmp_path / "results.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema', '1')")
    conn.execute("CREATE TABLE results (key TEXT, result BLOB)")
    conn.execute("INSERT INTO results VALUES ('k', x'80049500')")  # a pickle of version 1
    conn.commit()
    conn.close()
    with pytest.warns(RuntimeWarning, match="schema version"):
        assert ResultCache(path).entries() == []
    assert em.optimize(tiny(), cache=path, **KW).stats["cache"] == "miss"


def test_damaged_entry_is_dropped_with_a_warning(tmp_path):
    store = ResultCache(tmp_path / "c.sqlite")
    em.optimize(tiny(), cache=store, **KW)
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE results SET result = '{not json'")
    conn.commit()
    conn.close()
    with pytest.warns(RuntimeWarning, match="dropped .not JSON"):
        assert em.optimize(tiny(), cache=store, **KW).stats["cache"] == "miss"
    assert em.optimize(tiny(), cache=store, **KW).stats["cache"] == "hit"


def _plant(store: ResultCache, key: str, program) -> None:
    """Write an entry as someone without this user's key would: valid data, a forged tag."""
    res = em.optimize(tiny(), cache=False, **KW)
    res.program = program
    text = json.dumps(to_data(res), sort_keys=True)
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE results SET result = ?, tag = ? WHERE key = ?", (text, "0" * 64, key))
    conn.commit()
    conn.close()


def test_a_planted_wrong_program_is_rejected_and_the_search_runs(tmp_path):
    store = ResultCache(tmp_path / "c.sqlite")
    first = em.optimize(tiny(), cache=store, **KW)
    (entry,) = store.entries()
    g = em.Graph("tiny")
    x, w = g.input("X", (16, 64)), g.input("W", (64, 128))
    a, b = g.input("A", (64, 4)), g.input("B", (4, 128))
    g.output(x @ w + (x @ a) @ b * 2.0, "O")  # same interface, wrong values
    _plant(store, entry.key, g)
    with pytest.warns(RuntimeWarning, match="tag is not this user's and it does not verify"):
        res = em.optimize(tiny(), cache=store, **KW)
    assert res.stats["cache"] == "miss" and str(res.program) == str(first.program)
    assert res.verified.equivalent
    assert em.optimize(tiny(), cache=store, **KW).stats["cache"] == "hit"


def test_a_correct_entry_without_this_users_tag_is_reverified(tmp_path):
    store = ResultCache(tmp_path / "c.sqlite")
    first = em.optimize(tiny(), cache=store, **KW)
    _plant(store, store.entries()[0].key, first.program)
    res = em.optimize(tiny(), cache=store, **KW)
    assert res.stats["cache"] == "hit (re-verified)" and res.verified.equivalent
    assert em.optimize(tiny(), cache=store, **KW).stats["cache"] == "hit"  # re-tagged


def test_an_entry_for_another_signature_is_dropped(tmp_path):
    store = ResultCache(tmp_path / "c.sqlite")
    em.optimize(tiny(), cache=store, **KW)
    _plant(store, store.entries()[0].key, tiny(n=32))
    with pytest.warns(RuntimeWarning, match=r"input 'X' is float16\[16, 32\]"):
        assert em.optimize(tiny(), cache=store, **KW).stats["cache"] == "miss"


def test_a_key_file_open_to_others_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("EQSAT_MIRAGE_CONFIG_DIR", str(tmp_path / "cfg"))
    assert len(integrity.secret()) == 32
    key = integrity.key_path()
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    key.chmod(0o644)
    with pytest.raises(cache_mod.CacheError, match="open to other users"):
        integrity.secret()
    with pytest.warns(RuntimeWarning, match="open to other users"):
        res = em.optimize(tiny(), cache=tmp_path / "c.sqlite", **KW)
    assert res.verified.equivalent


def test_concurrent_writers(tmp_path):
    res = em.optimize(tiny(), cache=False, **KW)
    path = tmp_path / "c.sqlite"
    failures: list[BaseException] = []

    def write(t: int) -> None:
        try:
            store = ResultCache(path)
            for i in range(5):
                store.put(f"{t:02d}{i:02d}" + "0" * 60, res)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures and len(ResultCache(path).entries()) == 30


def test_unwritable_cache_never_fails_an_optimization(tmp_path, monkeypatch):
    def broken(self, *a, **k):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(ResultCache, "put", broken)
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        res = em.optimize(tiny(), **KW)
    assert res.verified.equivalent


def test_entry_loaded_in_a_fresh_process_rebuilds_node_hashes(tmp_path):
    """Node hashes depend on the process's string hashing: loading rebuilds them."""
    store = ResultCache(tmp_path / "c.sqlite")
    store.put("f" * 64, em.optimize(tiny(), cache=False, **KW))
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "import eqsat_mirage as em\nfrom eqsat_mirage.pipeline.cache import ResultCache\n"
            "from test_cache import tiny\n"
            "g = tiny()\n"
            f"res, trusted = ResultCache({str(store.path)!r}).load({'f' * 64!r}, g)\n"
            "assert trusted and g.inputs['X'] == res.program.inputs['X']\n"
            "assert em.verify(g, res.program, trials=1).equivalent\nprint('ok')\n")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_worker_pickles_keep_dag_sharing():
    from eqsat_mirage.pipeline import many

    g = tiny()
    back = many.loads(many.dumps(g))
    assert len(back.nodes()) == len(g.nodes())
    assert back.outputs["O"] == g.outputs["O"] and hash(back.outputs["O"]) == hash(g.outputs["O"])


def test_a_search_cut_short_by_its_time_limit_is_not_cached(tmp_path):
    path = tmp_path / "cut.sqlite"
    lines: list[str] = []
    res = em.optimize(tiny("cut"), cache=path, time_limit_s=0.01, progress=lines.append)
    assert res.stats["time_limited"]
    assert ResultCache(path).entries() == []
    assert any("not cached: cut's search was cut short" in line for line in lines), lines
    full = em.optimize(tiny("cut"), cache=path)
    assert not full.stats["time_limited"] and len(ResultCache(path).entries()) == 1


def test_an_online_softmax_plan_is_a_hit_the_second_time(tmp_path):
    """The store writes JSON with sorted keys, which reorders a block stage's outputs;
    a thread chain's node indices refer to the order the nodes were written in, so the
    plan (running maxima and thread chains) loads back and the second call is a hit."""
    import warnings

    def safe_attention():
        g = em.Graph("safe_attn")
        q, k = g.input("Q", (2, 32, 64)), g.input("K", (2, 64, 512))
        v = g.input("V", (2, 512, 64))
        g.output(em.softmax(q @ k, axis=-1) @ v, "O")
        return g

    path = tmp_path / "c.sqlite"
    first = em.optimize(safe_attention(), cache=path)
    assert any(k.threads for k in first.program.kernels if k.kind == "custom")
    loaded = em.MuGraph.from_json(json.dumps(first.program.to_dict(), sort_keys=True))
    rng = np.random.default_rng(0)
    x = {n: rng.standard_normal(v.shape) for n, v in first.program.inputs.items()}
    np.testing.assert_allclose(em.evaluate(loaded, x)["O"], em.evaluate(first.program, x)["O"])
    assert sum(len(k.threads) for k in loaded.kernels if k.kind == "custom") == sum(
        len(k.threads) for k in first.program.kernels if k.kind == "custom")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dropped entry warns
        again = em.optimize(safe_attention(), cache=path)
    assert again.stats["cache"] == "hit" and again.cost_us == first.cost_us


def test_a_search_inside_a_shape_family_has_its_own_key():
    """The same program searched as a part of a shape family (schedules reading the dynamic
    dim whole refused) and on its own may get different plans: their keys differ."""
    from eqsat_mirage.cost.tiles import dynamic_dims

    g = em.Graph("k")
    x = g.input("X", (8, 64))
    g.output(em.exp(x) * 2.0, "Y")
    plain = make_key(g, {"time_limit_s": 1})
    with dynamic_dims({"X": {1}}, 64):
        inside = make_key(g, {"time_limit_s": 1})
    with dynamic_dims({"X": {0}}, 64):
        other = make_key(g, {"time_limit_s": 1})
    assert len({plain, inside, other}) == 3
    assert make_key(g, {"time_limit_s": 1}) == plain  # the context ended


def test_the_tag_key_made_by_many_threads_at_once_is_one_whole_key(tmp_path, monkeypatch):
    """The first use from several threads (or processes): one key, never read half-written
    (a reader used to see the file before its 32 bytes were in)."""
    monkeypatch.setenv("EQSAT_MIRAGE_CONFIG_DIR", str(tmp_path / "config"))
    got: list = []

    def read() -> None:
        try:
            got.append(integrity.secret())
        except BaseException as exc:  # noqa: BLE001 - reported below
            got.append(exc)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and len(got[0]) == 32, got
    assert sorted(p.name for p in (tmp_path / "config").iterdir()) == ["cache.key"]
