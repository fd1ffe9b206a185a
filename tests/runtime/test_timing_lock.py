"""Pieces searched in worker processes time on one device one group at a time
(``runtime.timing.holding_device``): two processes timing candidates with one device name
never interleave their measurements; holding one device leaves another free."""

from __future__ import annotations

import multiprocessing
import time

from eqsat_mirage.runtime.timing import device_lock_path, time_candidates

HOLD_S = 0.2  # each fake measurement keeps the "device" busy this long


class SleepTimer:
    """A timer that records when each of its measurements starts and ends."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __call__(self, name, launch):
        start = time.monotonic()
        launch()
        time.sleep(HOLD_S)
        return [start, time.monotonic()]  # the samples: this measurement's interval


def _time_group(device: str, tag: str, queue) -> None:
    timings = time_candidates({f"{tag}{i}": (lambda: None) for i in range(3)}, SleepTimer(device))
    queue.put([(tag, t.samples[0], t.samples[1]) for t in timings])


def _run_two(devices: tuple[str, str]) -> list[tuple[str, float, float]]:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_time_group, args=(dev, tag, queue))
             for dev, tag in zip(devices, "ab")]
    for p in procs:
        p.start()
    got = [x for _ in procs for x in queue.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
    return sorted(got, key=lambda x: x[1])


def test_one_device_is_timed_by_one_process_at_a_time():
    got = _run_two(("fake-gpu|test-one-device", "fake-gpu|test-one-device"))
    tags = [t for t, _, _ in got]
    assert tags in (["a"] * 3 + ["b"] * 3, ["b"] * 3 + ["a"] * 3)  # one group, then the other
    first_end = max(e for t, _, e in got if t == tags[0])
    second_start = min(s for t, s, _ in got if t == tags[-1])
    assert first_end <= second_start  # no overlap at all


def _try_lock(device: str, queue) -> None:
    import fcntl

    with open(device_lock_path(device), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            queue.put(False)
            return
        queue.put(True)


def test_holding_one_device_leaves_another_free():
    from eqsat_mirage.runtime.timing import holding_device

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    with holding_device("fake-gpu|test-held"):
        for device in ("fake-gpu|test-held", "fake-gpu|test-free"):
            p = ctx.Process(target=_try_lock, args=(device, queue))
            p.start()
            p.join(timeout=60)
        held, free = queue.get(timeout=60), queue.get(timeout=60)
    assert (held, free) == (False, True)
    p = ctx.Process(target=_try_lock, args=("fake-gpu|test-held", queue))
    p.start()
    p.join(timeout=60)
    assert queue.get(timeout=60) is True  # released on exit


def test_the_lock_file_is_per_device():
    assert device_lock_path("gpu A") != device_lock_path("gpu B")
    assert device_lock_path("gpu A") == device_lock_path("gpu A")
