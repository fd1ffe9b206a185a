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

The value is plain data, never a pickle: ``result.to_data`` (the chosen program
as MuGraph or Graph JSON, the figures, the verdict, the JSON-able stats) as JSON
text, with its name, target, level, cost, search seconds and creation time
beside it for ``entries()``, and an integrity tag: an HMAC-SHA256 of the key and
the text under a secret of this user (``integrity.key_path()``, created 0600 in a 0700
folder outside the cache folder, so a cache folder copied from elsewhere, such
as a CI cache restored from another branch, brings no valid tags).

A hit is checked before use (``lookup``): the text must parse and the program
must load, validate and have the input program's inputs and outputs
(``result.from_data``). Then either its tag is this user's, or it is
re-verified against the input program (``em.verify`` with optimize's trials
and max_bound, fresh randomness) and re-tagged. An entry that fails is dropped
with a warning and the search runs.

The cache only touches files it created: an existing path must be an SQLite
file holding its own tables (``meta`` with the ``application`` marker, and
``results``); anything else (a text file, another application's database) is
a ``CacheError``. Its own file of an older schema is recreated with a warning.
Concurrent processes are serialized by SQLite (WAL journal, a 30 s busy
timeout). A cache that cannot be written never fails an optimization: it warns
and runs uncached.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..cost.tiles import dynamic_context
from ..ir.errors import MirageError
from ..version import __version__
from .integrity import CacheError, tag
from .options import SearchOptions
from .result import ResultDataError, from_data, to_data

SCHEMA_VERSION = 2  # 1 stored pickles
APPLICATION = "eqsat-mirage results cache"
OFF = ("0", "off", "false", "no")  # $EQSAT_MIRAGE_CACHE values that switch the default off
FILENAME = "results.sqlite"
_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE results (key TEXT PRIMARY KEY, name TEXT, target TEXT, level TEXT, "
    "cost_us REAL, search_seconds REAL, created REAL NOT NULL, result TEXT NOT NULL, "
    "tag TEXT NOT NULL)",
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
    """(profile name, sha256 of its TOML bytes, and of its measured calibration file when
    there is one: ``GPUProfile.load`` reads both) for a target name or .toml path."""
    from ..cost.profile import MEASURED_SUFFIX, GPUProfile, profile_path

    if isinstance(target, GPUProfile):
        return target.name, _sha(repr(target).encode())
    path = profile_path(target)
    data = path.read_bytes()
    measured = path.with_name(f"{path.stem}{MEASURED_SUFFIX}.toml")
    if measured.is_file():
        data += b"\0" + measured.read_bytes()
    return path.stem, _sha(data)


def make_key(graph, options: SearchOptions | dict) -> str:
    """The cache key of optimizing ``graph`` with ``options`` (a ``SearchOptions``, or a
    dict of every optimize keyword except ``progress`` and ``cache``, defaults filled in),
    and, inside a shape family's search, that family's dynamic axes and padded size (the
    only context that changes prices outside the options: ``cost.tiles.dynamic_context``)."""
    opts = options.key_data() if isinstance(options, SearchOptions) else dict(options)
    for name in ("partition", "piece_ops", "jobs"):  # whole programs are not cached whole
        opts.pop(name, None)
    parts = {"program": program_text(graph), "code": code_digest(),
             "rules": rules_digest(opts.pop("rules", ("rules",))),
             "target": target_digest(opts.pop("target", "h100")),
             "options": sorted((k, repr(v)) for k, v in opts.items())}
    if (family := dynamic_context()) is not None:  # a shape family's search: its own rules
        parts["family"] = [sorted((n, sorted(a)) for n, a in family[0].items()), family[1]]
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
        deadline = time.monotonic() + self.timeout
        while True:  # switching to WAL answers "locked" at once (no busy wait) under a writer
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                return conn
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    conn.close()
                    raise
            time.sleep(0.005)

    @staticmethod
    def _schema_state(conn: sqlite3.Connection) -> tuple[set[str], dict[str, str]]:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall()) \
            if "meta" in tables else {}
        return tables, meta

    def _foreign(self, why: str) -> CacheError:
        return CacheError(f"{self.path} is not an eqsat-mirage results cache ({why}); it is "
                          "left alone: point cache= at a new file or folder")

    def _check_ours(self) -> None:
        """Raise ``CacheError`` unless the existing file is this cache's own database."""
        if not self.path.is_file():
            raise self._foreign("not a regular file")
        with open(self.path, "rb") as f:
            head = f.read(16)
        if head and head != b"SQLite format 3\0":
            raise self._foreign("not an SQLite file")
        if not head:
            return  # an empty file: SQLite makes it a database (ours from here on)
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                               timeout=self.timeout)
        try:
            tables, meta = self._schema_state(conn)
        except sqlite3.DatabaseError as exc:
            raise self._foreign(f"unreadable: {exc}") from exc
        finally:
            conn.close()
        v1 = tables == {"meta", "results"} and meta.get("schema") == "1"  # ours, pickles
        if not tables or v1 or (meta.get("application") == APPLICATION
                                and tables <= {"meta", "results"}):
            return
        raise self._foreign(f"its tables are {sorted(tables)}")

    def _init(self, conn: sqlite3.Connection) -> None:
        """Create the tables, or recreate its own tables of an older schema version."""
        if self._schema_state(conn)[1].get("schema") == str(SCHEMA_VERSION):
            return
        conn.execute("BEGIN IMMEDIATE")  # one process at a time; look again under the lock
        try:
            tables, meta = self._schema_state(conn)
            if meta.get("schema") != str(SCHEMA_VERSION):
                if tables:
                    warnings.warn(f"results cache {self.path}: schema version "
                                  f"{meta.get('schema')} is not {SCHEMA_VERSION}; recreating "
                                  "it (cached results are lost)", RuntimeWarning, stacklevel=4)
                for t in sorted(tables & {"meta", "results"}):
                    conn.execute(f"DROP TABLE {t}")
                for stmt in _SCHEMA:
                    conn.execute(stmt)
                conn.executemany("INSERT INTO meta VALUES (?, ?)",
                                 [("schema", str(SCHEMA_VERSION)), ("application", APPLICATION)])
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def check(self) -> ResultCache:
        """Raise ``CacheError`` if the path exists and is not this cache's own database."""
        if self.path.exists() or self.path.is_symlink():
            self._check_ours()
        return self

    def _connect(self) -> sqlite3.Connection:
        """An open connection to its own file with the current schema."""
        if not self._ready:
            self.check()
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = self._open()
        try:
            if not self._ready:
                self._init(conn)
        except BaseException:
            conn.close()
            raise
        self._ready = True
        return conn

    def get(self, key: str) -> tuple[str, str] | None:
        """The (JSON text, tag) stored under ``key``, or None."""
        conn = self._connect()
        try:
            row = conn.execute("SELECT result, tag FROM results WHERE key=?", (key,)).fetchone()
        finally:
            conn.close()
        return None if row is None else (str(row[0]), str(row[1]))

    def drop(self, key: str) -> None:
        """Remove the entry stored under exactly ``key``."""
        conn = self._connect()
        try:
            conn.execute("DELETE FROM results WHERE key=?", (key,))
        finally:
            conn.close()

    def load(self, key: str, graph):
        """The ``OptimizeResult`` stored under ``key`` for ``graph``, parsed and validated
        (``result.from_data``), and whether its tag is this user's; None if absent.
        Raises ``ResultDataError`` for an entry that does not parse or validate."""
        row = self.get(key)
        if row is None:
            return None
        text, mark = row
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ResultDataError(f"not JSON ({exc})") from exc
        res = from_data(data, graph)
        return res, hmac.compare_digest(mark, tag(key, text))

    def put(self, key: str, result, name: str | None = None, target: str | None = None,
            cost_us: float | None = None, search_seconds: float | None = None) -> bool:
        """Store ``result`` under ``key`` as plain data (replacing any entry), tagged.

        ``name``, ``target``, ``cost_us`` and ``search_seconds`` default to the
        result's own (source program name, ``stats["target"]``, ``cost_us``,
        ``stats["seconds"]``).
        """
        text = json.dumps(to_data(result), sort_keys=True, separators=(",", ":"))
        stats = result.stats or {}
        row = (key, name if name is not None else getattr(result.source, "name", None),
               target if target is not None else stats.get("target"), stats.get("level"),
               cost_us if cost_us is not None else result.cost_us,
               search_seconds if search_seconds is not None else stats.get("seconds"),
               time.time(), text, tag(key, text))
        conn = self._connect()
        try:
            conn.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
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
        return ResultCache(cache).check()  # a path that is not its own database: CacheError
    raise MirageError(f"optimize: cache must be True, False, None, a path or a ResultCache, "
                      f"got {type(cache).__name__}")


def lookup(store: ResultCache, graph, key: str, t0: float | None = None,
           reverify=None):
    """The result stored under ``key`` for ``graph`` (marked as a hit), or None.

    An entry that does not parse or validate, or whose tag is not this user's and that
    ``reverify(result)`` (a ``VerifyResult``) does not accept, is dropped with a
    warning. An accepted re-verified entry is re-tagged. Without ``reverify`` an
    untagged entry is dropped.
    """
    t0 = time.perf_counter() if t0 is None else t0
    why = None
    try:
        found = store.load(key, graph)
    except ResultDataError as exc:
        found, why = None, str(exc)
    if found is not None:
        res, trusted = found
        how = "hit"
        if not trusted:
            verdict = reverify(res) if reverify is not None else None
            if verdict is None or not verdict.equivalent:
                why = ("its tag is not this user's and it does not verify against the program"
                       + (f": {verdict.reason}" if verdict is not None else ""))
            else:
                res.verified, how = verdict, "hit (re-verified)"
                store.put(key, res)
        if why is None:
            res.source = graph  # the caller's own object (the stored one is an equal copy)
            res.record(cache=how, cache_key=key[:12],
                       cache_seconds=time.perf_counter() - t0)
            return res
    if why is not None:
        warnings.warn(f"results cache {store.path}: entry {key[:12]} is dropped ({why}); "
                      "searching", RuntimeWarning, stacklevel=3)
        store.drop(key)
    return None


def store_result(store: ResultCache, key: str, res, name: str | None = None) -> None:
    """Mark ``res`` as a cache miss and store it under ``key`` (not a result cut short by
    the time limit); warn if the file cannot be written."""
    res.record(cache="miss", cache_key=key[:12])
    if res.stats.get("time_limited"):  # a pass ran out of time: depends on the machine's load
        return
    try:
        store.put(key, res, name=name)
    except (sqlite3.Error, OSError, CacheError) as exc:
        warnings.warn(f"results cache {store.path} cannot be written ({exc}); result not "
                      "cached", RuntimeWarning, stacklevel=3)


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
