"""The budgets every search runs under: time (``Deadline``) and memory (``check_memory``).

``em.optimize`` makes one ``Deadline`` of ``time_limit_s`` seconds and hands
slices of it to its passes (saturation, extraction, fusion planning,
verification); each pass checks it between steps it cannot interrupt and
stops with what it has. The memory budget bounds what an interpreter would
hold (the verifier's field and float values): a program over it is refused
before anything is allocated, with a ``BudgetError`` naming the largest tensor.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from .errors import BudgetError, MirageError, TimeLimitError
from .node import Op

MEMORY_ENV = "EQSAT_MIRAGE_MEMORY_BUDGET"
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# the longest time limit: a billion seconds (32 years), and no more than a thread can wait
MAX_SECONDS = min(1e9, threading.TIMEOUT_MAX)
SECONDS_RANGE = f"a number of seconds in (0, {MAX_SECONDS:g}]"  # what a time limit may be


KEPT = 4096  # entries a bounded in-memory cache keeps by default (the oldest go first)


def keep_bounded(cache: dict, key, value, limit: int = KEPT) -> None:
    """Store ``value`` at ``key``, dropping the oldest entries past ``limit``."""
    cache[key] = value
    while len(cache) > limit:
        del cache[next(iter(cache))]


# facts of programs that do not change while a caller works (``programs_fixed``):
# (id(program), what) -> (program, fact)
_FIXED: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "eqsat_mirage_fixed_facts", default=None)


@contextlib.contextmanager
def programs_fixed() -> Iterator[None]:
    """Within it, ``fixed_fact`` works out each fact of a program once: for a caller whose
    programs do not change meanwhile (a verification, which only reads them, asks for the
    same memory peaks for each thread count and phase, and runs the same MuGraph's staged
    kernels for every draw). In this thread's context and in copies of it (the verifier's
    pool runs its jobs in one); an enclosing block's facts are shared. Each entry holds its
    program, so no id is reused while it is kept; at most ``KEPT``; they go when the
    outermost block ends."""
    kept = _FIXED.get()
    token = _FIXED.set({} if kept is None else kept)
    try:
        yield
    finally:
        _FIXED.reset(token)


def fixed_fact(program, what, make: Callable[[], object]):
    """``make()``: within ``programs_fixed``, worked out once per ``program`` (the object
    itself) and ``what`` (a hashable name of the fact and of everything else it depends
    on); outside, every time (a program may change between calls)."""
    kept = _FIXED.get()
    if kept is None:
        return make()
    key = (id(program), what)
    hit = kept.get(key)
    if hit is not None and hit[0] is program:
        return hit[1]
    value = make()
    keep_bounded(kept, key, (program, value))
    return value


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_seconds(value, who: str, none_ok: bool = True) -> None:
    """A MirageError naming ``who`` and the accepted range unless ``value`` is a time limit
    a public entry accepts: ``SECONDS_RANGE`` (or None, with ``none_ok``). An infinite, NaN
    or huge limit would overflow a thread's wait or a float; a zero or negative one, stop
    every search before it starts."""
    if value is None and none_ok:
        return
    if not (_is_number(value) and 0 < value <= MAX_SECONDS):
        also = " or None for no limit" if none_ok else ""
        raise MirageError(f"{who}: time_limit_s must be {SECONDS_RANGE}{also}, got {value!r}")


class Deadline:
    """A wall-clock deadline: ``seconds`` from now (or from ``start``), None for none; a
    MirageError for seconds that are not a number of at most ``MAX_SECONDS`` (zero or
    fewer: a deadline already past)."""

    def __init__(self, seconds: float | None, start: float | None = None) -> None:
        if seconds is not None and not (_is_number(seconds) and seconds <= MAX_SECONDS):
            raise MirageError(f"time_limit_s must be a number of seconds of at most "
                              f"{MAX_SECONDS:g} or None here, got {seconds!r}")
        self.start = time.perf_counter() if start is None else start
        self.seconds = seconds
        self.end = math.inf if seconds is None else self.start + seconds

    def remaining(self) -> float:
        """Seconds left (never negative; ``inf`` without a limit)."""
        return max(0.0, self.end - time.perf_counter())

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return time.perf_counter() >= self.end

    def extend(self, seconds: float) -> None:
        """This deadline (its start and end) moved ``seconds`` later: time spent on work
        with a deadline of its own (a shape family's checks at sizes inside a search)."""
        self.start += seconds
        self.end += seconds

    def part(self, fraction: float) -> Deadline:
        """The deadline at ``fraction`` of this one's span (never later than this one; this
        one itself at a fraction of 1 or more, so that moving it moves both)."""
        if self.seconds is None or fraction >= 1.0:
            return self
        return Deadline(self.seconds * min(1.0, fraction), self.start)

    def __repr__(self) -> str:
        return f"Deadline({self.remaining():.2f} s left of {self.seconds})"


class Shares:
    """One time limit shared by a sequence of jobs (the partitions of one compiled graph):
    job ``i`` gets the seconds left times its weight over the weights of the jobs not yet
    run, so time a job leaves unused goes to the jobs after it and the sequence ends
    within the limit (a job past it gets ``LEAST`` seconds: a time limit must be positive,
    and it returns what it has at once). ``seconds`` None: no limit (every share is None)."""

    LEAST = 0.001

    def __init__(self, seconds: float | None, weights: list[float],
                 start: float | None = None) -> None:
        self.deadline = Deadline(seconds, start)
        self.weights = [max(float(w), 1e-9) for w in weights]

    def share(self, i: int) -> float | None:
        """Seconds for job ``i`` (call it when job ``i`` starts); None without a limit."""
        if self.deadline.seconds is None:
            return None
        rest = sum(self.weights[i:])
        return max(self.LEAST, self.deadline.remaining() * self.weights[i] / rest)


# A search's expected cost, in ops (``search_weight``): what a time limit is shared by. The
# e-graph a search saturates grows most around matmuls (layouts, splits, fusion with their
# neighbours) and reductions (online and split forms), and a piece's verification is mostly
# its matmuls. The backend weighs an fx node by the ops it converts to
# (``NodeSupport.weight``): one SDPA call (9 ops: two matmuls, a max, a sum and 5 more)
# weighs 21, where counting fx ops gave it 1 beside four elementwise ops' 4.
MATMUL_SEARCH_WEIGHT = 4.0  # each matmul: 1 op and this much more
REDUCE_SEARCH_WEIGHT = 2.0  # each reduction (sum, max, mean, ...): 1 op and this much more


def search_weight(nodes: Iterable) -> float:
    """The expected search cost of the program of ``nodes`` (em ``Node``s; inputs and
    constants are free): one per op, plus ``MATMUL_SEARCH_WEIGHT`` per matmul and
    ``REDUCE_SEARCH_WEIGHT`` per reduction. ``Shares`` and the pieces of a whole program
    share a time limit by it."""
    from .ops import REDUCE

    total = 0.0
    for n in nodes:
        if n.op in (Op.INPUT, Op.CONST):
            continue
        total += 1.0 + MATMUL_SEARCH_WEIGHT * (n.op is Op.MATMUL) + \
            REDUCE_SEARCH_WEIGHT * (n.op in REDUCE)
    return total


AUTO = "auto"  # a time limit that grows with the program's size (``auto_time_limit``)
AUTO_EVALS = 130  # float64 evaluations of the whole program a full search takes (85-90
#   measured on LLaMA-7B-size layers at sequences 1 and 128, and half as much again)
ELEMENT_FLOPS = 500  # an evaluation's passes over one input element (drawn, scaled,
#   rounded), in matmul flops: what a program of large weights and few rows costs
AUTO_MAX_S = 1800.0  # the most an automatic time limit gives


def evaluation_work(flops: float, elements: float) -> float:
    """One float64 evaluation of a program, in matmul flops: its matmuls' ``flops`` and
    ``ELEMENT_FLOPS`` for each of its inputs' ``elements``."""
    return float(flops) + ELEMENT_FLOPS * float(elements)


def matmul_flops(nodes: Iterable) -> float:
    """Floating-point operations of the matmuls among ``nodes`` (2 per multiply-add): what
    one float64 evaluation of the program costs, nearly all of it at real sizes."""
    total = 0.0
    for n in nodes:
        if n.op is Op.MATMUL:
            total += 2.0 * math.prod(n.shape) * n.srcs[0].shape[-1]
    return total


def program_work(program) -> float:
    """One float64 evaluation of a Graph (``evaluation_work``: its matmuls and its inputs'
    elements), 0 where its sizes are not all numbers."""
    try:
        return evaluation_work(matmul_flops(program.nodes()), sum(
            math.prod(x.shape) for x in program.inputs.values()))
    except (AttributeError, TypeError):
        return 0.0


def auto_time_limit(flops: float, base: float, gflops: float) -> float:
    """The automatic time limit of a program whose float64 evaluation is ``flops`` of work
    (``evaluation_work``), on a machine whose float64 matmuls run at ``gflops`` GFLOP/s:
    ``base`` seconds plus ``AUTO_EVALS`` such evaluations, at most ``AUTO_MAX_S`` (or
    ``base`` when that is more), to a tenth of a second. Small programs get ``base``; a
    LLaMA-7B-size layer (180 M weights) at sequence 128 (46 GFLOP of matmuls) about 340 s
    on a 2-core machine whose one BLAS thread does 57 GFLOP/s, where its search took about
    200 s; at sequence 1 about 240 s, where it took 140 s (bench/RESULTS.md, "Real
    sizes")."""
    if flops <= 0 or gflops <= 0:
        return float(base)
    extra = AUTO_EVALS * flops / (gflops * 1e9)
    return round(float(min(max(base, AUTO_MAX_S), base + extra)), 1)


def check_time_limit(value) -> None:
    """A MirageError for a ``time_limit_s`` given as text other than ``AUTO``."""
    if isinstance(value, str) and value != AUTO:
        raise MirageError(f"time_limit_s must be a number of seconds or {AUTO!r}, got "
                          f"{value!r}")


def resolve_time_limit(value, flops, base: float, gflops):
    """``value`` as given, or for ``AUTO`` the automatic limit (``auto_time_limit``) of a
    program of ``flops``; ``flops`` and ``gflops`` are numbers or functions computing them
    (called only for ``AUTO``: measuring the machine takes a few milliseconds)."""
    check_time_limit(value)
    if value == AUTO:
        return auto_time_limit(flops() if callable(flops) else flops, base,
                               gflops() if callable(gflops) else gflops)
    return value


def memory_budget() -> int:
    """The verifier's memory budget in bytes: ``$EQSAT_MIRAGE_MEMORY_BUDGET`` (bytes, or
    with a K/M/G/T suffix), else 8 GiB or half the machine's memory, whichever is less."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if text:
        unit = text[-1].upper() if text[-1].isalpha() else ""
        try:
            value = float(text[:-1] if unit else text) * _UNITS[unit]
        except (KeyError, ValueError):
            value = -1.0
        if not 0 < value < math.inf:
            raise MirageError(f"${MEMORY_ENV} must be a positive size such as 4G or 500M, "
                              f"got {text!r}")
        return int(value)
    return int(min(8 * 2**30, physical_memory() // 2))


def physical_memory() -> int:
    """This machine's memory in bytes (16 GiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def fmt_bytes(n: float) -> str:
    """``n`` bytes, readable (``1.5 GB``)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"


def check_memory(values: Iterable[tuple[str, int]], bytes_per_element: int, what: str,
                 budget: int | None = None) -> int:
    """Refuse (``BudgetError``) when holding every (description, element count) of
    ``values`` at once would take more than ``budget`` bytes; returns the bytes needed."""
    budget = memory_budget() if budget is None else budget
    items = list(values)
    total = sum(n for _, n in items) * bytes_per_element
    if total > budget:
        who, n = max(items, key=lambda x: x[1])
        raise BudgetError(f"{what} would hold {fmt_bytes(total)}, over the memory budget of "
                          f"{fmt_bytes(budget)} (${MEMORY_ENV}); the largest value is {who} "
                          f"with {n} elements ({fmt_bytes(n * bytes_per_element)} at "
                          f"{bytes_per_element} bytes per element)")
    return total


def check_bytes(parts: Iterable[tuple[str, int]], what: str, budget: int | None = None) -> int:
    """Refuse (``BudgetError``) when the (description, bytes) ``parts`` held at once (an
    estimate of a peak, ``verifier/memory.py``) exceed ``budget``; returns their total."""
    budget = memory_budget() if budget is None else budget
    items = list(parts)
    total = sum(n for _, n in items)
    if total > budget:
        who, n = max(items, key=lambda x: x[1])
        raise BudgetError(f"{what} would hold {fmt_bytes(total)} at its peak, over the memory "
                          f"budget of {fmt_bytes(budget)} (${MEMORY_ENV}); the largest part is "
                          f"{who} ({fmt_bytes(n)})")
    return total


def matmul_scratch(n, blocks: int = 1) -> int:
    """Elements a finite-field matmul holds beside its operands and result: the float64
    copy of both operands and one digit-product result per digit (3 at most below
    2**15 terms; ``semantics.modular.matmul_mod``), over ``blocks`` blocks."""
    return blocks * (sum(math.prod(s.shape) for s in n.srcs) + 3 * math.prod(n.shape) +
                     3 * min(math.prod(s.shape) for s in n.srcs))


# optimize_many's worker processes share one memory budget: a multiprocessing Value of the
# bytes their verifications hold now (None in a process that works alone)
_SHARED = None
_ACTIVE = None  # and a Value of how many of them are searching now
WAIT_S = 0.05  # how often a verification waiting for the shared budget looks again


def share_memory(held, active=None) -> None:
    """Make this process one of several that share the memory budget (``optimize_many``'s
    worker initializer): ``held`` is a ``multiprocessing.Value("q")`` of the bytes that
    their verifications hold at once, its lock guarding it; ``active`` one of how many
    of them are searching (``working``)."""
    global _SHARED, _ACTIVE
    _SHARED, _ACTIVE = held, active


@contextlib.contextmanager
def working() -> Iterator[None]:
    """This worker is searching inside the block (counted in ``share_memory``'s
    ``active``; nothing to count in a process that works alone)."""
    active = _ACTIVE
    if active is None:
        yield
        return
    with active.get_lock():
        active.value += 1
    try:
        yield
    finally:
        with active.get_lock():
            active.value -= 1


def others_working() -> bool | None:
    """Whether another of the workers sharing this process's budget is searching now; None
    in a process that works alone (then only the load average tells, ``blas.busy``)."""
    active = _ACTIVE
    return None if active is None else active.value > 1


def fair_threads() -> int | None:
    """The most threads a verification phase of this worker takes while the other workers
    sharing its budget search too: the cores shared among the workers searching now (one
    each on 2 cores); None in a process that works alone, or alone among them now. More
    threads add no core, and their bytes would keep another worker waiting for the budget
    (a 7B layer's attention piece verified in 28-31 s beside the MLP piece's two threads,
    11 s where that budget was free)."""
    count = None if _ACTIVE is None else _ACTIVE.value  # read once
    if count is None or count <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // count)


@contextlib.contextmanager
def reserved(nbytes: int | list[int], deadline: Deadline | None = None) -> Iterator[int]:
    """Hold ``nbytes`` of the memory budget while the block runs; a list: the first of
    them (most threads first, say) that fits what the others leave, and the block gets
    its index (0 for a single amount). Alone (no ``share_memory``) there is nothing to
    do: the caller checked the first against the budget. Shared, it waits while the
    other processes hold so much that not even the last fits (one that holds nothing is
    never kept waiting on itself), up to ``deadline``: past it, ``TimeLimitError``."""
    wanted = [nbytes] if isinstance(nbytes, int) else list(nbytes)
    shared = _SHARED
    if shared is None:
        yield 0
        return
    budget, waited = memory_budget(), time.perf_counter()
    while True:
        with shared.get_lock():
            held = shared.value
            fits = [i for i, n in enumerate(wanted) if held == 0 or held + n <= budget]
            if fits:
                chosen = fits[0]
                nbytes = wanted[chosen]
                shared.value += nbytes
                break
        if deadline is not None and deadline.expired():
            raise TimeLimitError(f"waited {time.perf_counter() - waited:.1f} s for "
                                 f"{fmt_bytes(min(wanted))} of the memory budget "
                                 f"({fmt_bytes(budget)}) that the other workers held "
                                 f"({fmt_bytes(held)})")
        time.sleep(WAIT_S)
    try:
        yield chosen
    finally:
        with shared.get_lock():
            shared.value -= nbytes
