"""A persistent results cache for ``em.optimize``: one SQLite file, shared by processes.

The file is ``results.sqlite`` in ``$EQSAT_MIRAGE_CACHE_DIR`` if set, else in
``$XDG_CACHE_HOME/eqsat-mirage``, else in ``~/.cache/eqsat-mirage``.
``EQSAT_MIRAGE_CACHE=off`` switches the default cache (``cache=True``) off,
e.g. for timing the search itself.

The key of a result is the sha256 of everything that can change it:

- the program in a canonical form (``mugraph.io.graph_to_dict``: its name, its
  inputs with names, shapes and dtypes, its nodes operands-first with ops and
  arguments, its outputs), independent of object ids and of the file:line
  where the user built each node;
- the rule files (built-in schema and guards included): base name and contents, in order;
- the target profile: the TOML file's name and bytes (its calibration included);
- the package version and a digest of the package's own source files, so a
  changed optimizer never serves a stale result;
- every other ``optimize`` option (level, guards, k, trials, seed, split
  factors, node/iteration/time limits, strategy) by its ``repr``.

The value is the pickled ``OptimizeResult`` (``dumps``/``loads``: IR nodes are
pickled by their fields and rebuilt, because a node's cached hash depends on
the process's string hashing) with its name, target, level, cost, search
seconds and creation time beside it for ``entries()``. A corrupt file or one of
another schema version is recreated with a warning; concurrent processes are
serialized by SQLite (WAL journal, a 30 s busy timeout). A cache that cannot be
opened or written never fails an optimization: it warns and runs uncached.
"""

from __future__ import annotations

import copy
import copyreg
import functools
import hashlib
import io
import json
import os
import pickle
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..ir.errors import MirageError
from ..ir.node import Node
from ..version import __version__

SCHEMA_VERSION = 1
OFF = ("0", "off", "false", "no")  # $EQSAT_MIRAGE_CACHE values that switch the default off
FILENAME = "results.sqlite"
_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE results (key TEXT PRIMARY KEY, name TEXT, target TEXT, level TEXT, "
    "cost_us REAL, search_seconds REAL, created REAL NOT NULL, result BLOB NOT NULL)",
)


def default_dir() -> Path:
    """The folder of the default cache (see the module docstring for the order)."""
    env = os.environ.get("EQSAT_MIRAGE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "eqsat-mirage"


def default_path() -> Path:
    """The default cache file, ``default_dir() / "results.sqlite"``."""
    return default_dir() / FILENAME


# -- pickling -------------------------------------------------------------------------------


def _reduce_node(node: Node):
    return Node, (node.op, node.srcs, node.arg, node.shape, node.dtype, node.loc)


class _Pickler(pickle.Pickler):
    dispatch_table = {**copyreg.dispatch_table, Node: _reduce_node}


def dumps(obj) -> bytes:
    """Pickle ``obj``; IR nodes are rebuilt on loading (their hashes are per process)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes):
    """Unpickle what ``dumps`` wrote."""
    return pickle.loads(data)


def _picklable(obj) -> bool:
    try:
        dumps(obj)
        return True
    except Exception:  # noqa: BLE001 - anything that does not pickle is left out
        return False


def storable(result):
    """``result`` itself if it pickles, else a copy without the parts that do not.

    Stats entries, candidates and the fusion plan that fail to pickle (a
    callback, an egglog object) are dropped; the copy's ``stats["cache_dropped"]``
    names them. Returns None when even the copy does not pickle.
    """
    if _picklable(result):
        return result
    res = copy.copy(result)
    dropped = [k for k, v in result.stats.items() if not _picklable(v)]
    res.stats = {k: v for k, v in result.stats.items() if k not in dropped}
    for attr in ("candidates", "plan"):
        if not _picklable(getattr(res, attr, None)):
            setattr(res, attr, [] if attr == "candidates" else None)
            dropped.append(attr)
    res.stats["cache_dropped"] = dropped
    return res if _picklable(res) else None


# -- the key --------------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """The package version and a digest of its source files (read once per process)."""
    root = Path(__file__).resolve().parents[1]  # eqsat_mirage/, every subpackage included
    h = hashlib.sha256(__version__.encode())
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}:{h.hexdigest()}"


def program_text(graph) -> str:
    """The canonical serialization of ``graph`` (JSON, sorted keys, no locations)."""
    from ..mugraph.io import graph_to_dict

    return json.dumps(graph_to_dict(graph), sort_keys=True, separators=(",", ":"))


def rules_digest(rules) -> list[tuple[str, str]]:
    """(file name, sha256) of every rule file ``rules`` names, schema and guards first."""
    from ..egraph.rulefiles import builtin_rules_dir, rule_paths

    builtin = builtin_rules_dir()
    paths = [builtin / "schema.egg", builtin / "guards.egg", *rule_paths(rules)]
    return [(p.name, _sha(p.read_bytes())) for p in paths if p.is_file()]


def target_digest(target) -> tuple[str, str]:
    """(profile name, sha256 of its TOML bytes) for a target name or .toml path."""
    from ..cost.profile import GPUProfile, profile_path

    if isinstance(target, GPUProfile):
        return target.name, _sha(repr(target).encode())
    path = profile_path(target)
    return path.stem, _sha(path.read_bytes())


def make_key(graph, options: dict) -> str:
    """The cache key of optimizing ``graph`` with ``options`` (every optimize keyword
    except ``progress`` and ``cache``, defaults filled in)."""
    opts = dict(options)
    parts = {"program": program_text(graph), "code": code_digest(),
             "rules": rules_digest(opts.pop("rules", ("rules",))),
             "target": target_digest(opts.pop("target", "h100")),
             "options": sorted((k, repr(v)) for k, v in opts.items())}
    return _sha(json.dumps(parts, sort_keys=True).encode())


# -- the store ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheEntry:
    """One row of ``ResultCache.entries()``."""

    key: str
    name: str
    target: str
    level: str
    cost_us: float | None
    search_seconds: float | None
    created: float
    size: int

    @property
    def prefix(self) -> str:
        """The first 12 hex digits of the key."""
        return self.key[:12]


class ResultCache:
    """The SQLite results cache at ``path`` (default: ``default_path()``)."""

    def __init__(self, path: str | os.PathLike | None = None, timeout: float = 30.0) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        if self.path.is_dir():
            self.path = self.path / FILENAME
        self.timeout = timeout
        self._ready = False

    def __repr__(self) -> str:
        return f"ResultCache({str(self.path)!r})"

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    @staticmethod
    def _schema_state(conn: sqlite3.Connection) -> tuple[set[str], str | None]:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        version = None
        if "meta" in tables:
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            version = row[0] if row else None
        return tables, version

    def _init(self, conn: sqlite3.Connection) -> None:
        """Create the tables, or recreate them when the file has another schema version."""
        if self._schema_state(conn)[1] == str(SCHEMA_VERSION):
            return
        conn.execute("BEGIN IMMEDIATE")  # one process at a time; look again under the lock
        try:
            tables, version = self._schema_state(conn)
            if version != str(SCHEMA_VERSION):
                if tables:
                    warnings.warn(f"results cache {self.path}: schema version {version} is "
                                  f"not {SCHEMA_VERSION}; recreating it (cached results are "
                                  "lost)", RuntimeWarning, stacklevel=4)
                for t in sorted(tables & {"meta", "results"}):
                    conn.execute(f"DROP TABLE {t}")
                for stmt in _SCHEMA:
                    conn.execute(stmt)
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _connect(self) -> sqlite3.Connection:
        """An open connection to a file with the current schema (recreated when corrupt)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = self._open()
            if not self._ready:
                self._init(conn)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            warnings.warn(f"results cache {self.path} is unreadable ({exc}); recreating it",
                          RuntimeWarning, stacklevel=3)
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            conn = self._open()
            self._init(conn)
        self._ready = True
        return conn

    def get(self, key: str):
        """The ``OptimizeResult`` stored under ``key``, or None."""
        conn = self._connect()
        try:
            row = conn.execute("SELECT result FROM results WHERE key=?", (key,)).fetchone()
            if row is None:
                return None
            try:
                return loads(row[0])
            except Exception as exc:  # noqa: BLE001 - a stale or damaged value is a miss
                warnings.warn(f"results cache {self.path}: entry {key[:12]} cannot be loaded "
                              f"({type(exc).__name__}: {exc}); dropping it",
                              RuntimeWarning, stacklevel=2)
                conn.execute("DELETE FROM results WHERE key=?", (key,))
                return None
        finally:
            conn.close()

    def put(self, key: str, result, name: str | None = None, target: str | None = None,
            cost_us: float | None = None, search_seconds: float | None = None) -> bool:
        """Store ``result`` under ``key`` (replacing any entry); False if it cannot pickle.

        ``name``, ``target``, ``cost_us`` and ``search_seconds`` default to the
        result's own (source program name, ``stats["target"]``, ``cost_us``,
        ``stats["seconds"]``).
        """
        try:
            res, blob = result, dumps(result)
        except Exception:  # noqa: BLE001 - store what pickles (storable says what it dropped)
            res = storable(result)
            if res is None:
                warnings.warn(f"results cache: the result of {name or '?'} does not pickle; "
                              "not cached", RuntimeWarning, stacklevel=2)
                return False
            blob = dumps(res)
        stats = getattr(res, "stats", {}) or {}
        row = (key, name if name is not None else getattr(res.source, "name", None),
               target if target is not None else stats.get("target"), stats.get("level"),
               cost_us if cost_us is not None else getattr(res, "cost_us", None),
               search_seconds if search_seconds is not None else stats.get("seconds"),
               time.time(), blob)
        conn = self._connect()
        try:
            conn.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
        finally:
            conn.close()
        return True

    def entries(self) -> list[CacheEntry]:
        """Every entry, newest first (the stored result itself is not loaded)."""
        if not self.path.exists():
            return []
        conn = self._connect()
        try:
            rows = conn.execute("SELECT key, name, target, level, cost_us, search_seconds, "
                                "created, length(result) FROM results ORDER BY created DESC")
            return [CacheEntry(*r) for r in rows.fetchall()]
        finally:
            conn.close()

    def delete(self, key: str) -> int:
        """Remove the entries whose key starts with ``key`` (8+ hex digits); how many."""
        if len(key) < 8 or not self.path.exists():
            return 0
        conn = self._connect()
        try:
            return conn.execute("DELETE FROM results WHERE substr(key, 1, ?) = ?",
                                (len(key), key)).rowcount
        finally:
            conn.close()

    def clear(self) -> int:
        """Remove every entry; returns how many there were."""
        if not self.path.exists():
            return 0
        conn = self._connect()
        try:
            n = conn.execute("DELETE FROM results").rowcount
            conn.execute("VACUUM")
            return n
        finally:
            conn.close()


def open_cache(cache) -> ResultCache | None:
    """``optimize``'s ``cache=`` argument as a ``ResultCache`` (None when off, or when
    ``cache`` is True and ``$EQSAT_MIRAGE_CACHE`` is "off")."""
    if cache is None or cache is False:
        return None
    if cache is True:
        off = os.environ.get("EQSAT_MIRAGE_CACHE", "").strip().lower() in OFF
        return None if off else ResultCache()
    if isinstance(cache, ResultCache):
        return cache
    if isinstance(cache, str | os.PathLike):
        return ResultCache(cache)
    raise MirageError(f"optimize: cache must be True, False, None, a path or a ResultCache, "
                      f"got {type(cache).__name__}")


def lookup(store: ResultCache, graph, key: str, t0: float | None = None):
    """The result stored under ``key`` for ``graph`` (marked as a hit), or None."""
    t0 = time.perf_counter() if t0 is None else t0
    res = store.get(key)
    if res is not None:
        res.source = graph  # the caller's own object (the stored one is an equal copy)
        res.stats.update(cache="hit", cache_key=key[:12], cache_seconds=time.perf_counter() - t0)
    return res


def store_result(store: ResultCache, key: str, res, name: str | None = None) -> None:
    """Mark ``res`` as a cache miss and store it under ``key``; warn if the file cannot be
    written."""
    res.stats.update(cache="miss", cache_key=key[:12])
    try:
        store.put(key, res, name=name)
    except (sqlite3.Error, OSError) as exc:
        warnings.warn(f"results cache {store.path} cannot be written ({exc}); result not "
                      "cached", RuntimeWarning, stacklevel=3)


def cached_optimize(graph, store: ResultCache, progress, options: dict, search,
                    key: str | None = None):
    """``search(graph, cache=False, progress=progress, **options)`` through the open cache
    ``store`` (see ``open_cache``); ``search`` is ``em.optimize``, passed in because the
    cache sits below the search it caches.

    ``key`` is the entry's key when the caller computed it (``optimize_many``'s
    workers use their parent's, so that both sides agree), else ``make_key``'s.
    """
    from ..ir.check import check

    check(graph)
    t0 = time.perf_counter()
    key = make_key(graph, options) if key is None else key
    name = getattr(graph, "name", "program")
    try:
        res = lookup(store, graph, key, t0)
    except (sqlite3.Error, OSError) as exc:
        warnings.warn(f"results cache {store.path} cannot be read ({exc}); running uncached",
                      RuntimeWarning, stacklevel=3)
        store, res = None, None
    if res is not None:
        if progress:
            progress(f"cache hit: {name} ({key[:12]}, {res.cost_us:.2f} us) from {store.path}")
        return res
    if progress and store is not None:
        progress(f"cache miss: {name} ({key[:12]}); searching")
    res = search(graph, cache=False, progress=progress, **options)
    if store is not None:
        store_result(store, key, res, name)
    return res


def format_entries(entries: list[CacheEntry]) -> str:
    """``entries`` as a table: key prefix, program, target, level, cost, search time, age."""
    rows = [f"{'key':<12}  {'program':<20} {'target':<8} {'level':<8} {'cost us':>9} "
            f"{'search s':>9}  {'created':<19} {'bytes':>8}"]
    for e in entries:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.created))
        cost = f"{e.cost_us:.2f}" if e.cost_us is not None else "?"
        search = f"{e.search_seconds:.2f}" if e.search_seconds is not None else "?"
        rows.append(f"{e.prefix:<12}  {str(e.name):<20} {str(e.target):<8} {str(e.level):<8} "
                    f"{cost:>9} {search:>9}  {created:<19} {e.size:>8}")
    return "\n".join(rows)
