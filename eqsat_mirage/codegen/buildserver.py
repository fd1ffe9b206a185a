"""One child Python that builds module after module for ``compiled.compile_report``.

A process that runs kernels under ``TRITON_INTERPRET=1`` cannot compile them (its
``triton.language`` is the interpreted one), so it builds in a child Python without it.
A child per build imported torch and Triton and hashed Triton's sources every time: 4-5 s
of CPU a build, most of the compile check's cost (a tiny LLaMA layer's search: 31 of its
45 s in float16, more in float32, whose spilling kernels are rebuilt at other warp counts;
issue 51). ``BuildServer`` starts one child (``python -m eqsat_mirage.codegen.compiled
--serve``) at the first build and keeps it for this process's lifetime: a JSON request a
line on its stdin ({"source", "target"}), a JSON answer a line on its stdout ({"kernels":
[...]} or {"error": the exception's last traceback line, as a child per build ended}).
The child ends when this process does (its stdin closes); a build past its deadline kills
it, and the next build starts another; a process forked from this one starts its own. A
search with the compile check on starts the child as it begins (``BuildServer.start``): the
child's imports and a first tiny build (about 2.5 s of CPU) then run beside the search's
saturation (on another core where there is one), not before the first build. A search
that builds nothing leaves the child idle until this process ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

from ..ir.errors import TimeLimitError
from .concat import CodegenError

CHILD = [sys.executable, "-m", "eqsat_mirage.codegen.compiled", "--serve"]
LONGEST_S = 600.0  # a build that takes longer is stopped (subprocess.TimeoutExpired)


class BuildServer:
    """The child Python that builds (see the module docstring); one build at a time."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.pid = 0  # the process that started ``proc`` (a fork starts its own)
        self.errors = None  # the child's stderr: a temporary file, never a full pipe
        self.lock = threading.Lock()

    def _started(self) -> subprocess.Popen:
        if self.proc is not None and self.pid == os.getpid() and self.proc.poll() is None:
            return self.proc
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(CHILD, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.errors, text=True)
        self.pid = os.getpid()
        return self.proc

    def start(self) -> None:
        """Start the child now if none runs, without waiting for it: its imports then
        overlap what this process does until its first build (``compiled.start_builds``).
        Nothing while a build holds the lock (a child is running then)."""
        if self.lock.acquire(blocking=False):
            try:
                self._started()
            finally:
                self.lock.release()

    def stop(self) -> None:
        """Kill the child (the next build starts another)."""
        if self.proc is not None and self.pid == os.getpid():
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def _why_ended(self) -> str:
        """The last line the child wrote to its stderr, or its exit status."""
        rc = self.proc.poll() if self.proc is not None else None
        lines: list[str] = []
        if self.errors is not None:
            self.errors.seek(0)
            lines = self.errors.read().strip().splitlines()
        return lines[-1] if lines else f"compiler process failed ({rc})"

    def build(self, source: str, target: str, deadline=None) -> list[dict]:
        """The child's answer for the generated module ``source`` built for ``target``: one
        dict per kernel (``compiled.KernelResources``' fields). ``CodegenError`` when the
        build failed or the child ended; past ``deadline`` (an ``ir.limits.Deadline``) the
        child is killed (``TimeLimitError``), after ``LONGEST_S`` too
        (``subprocess.TimeoutExpired``)."""
        with self.lock:
            if deadline is not None and deadline.expired():
                raise TimeLimitError(f"the compile for {target} was stopped at its time limit "
                                     f"({deadline.seconds:g} s) before it started")
            timeout = LONGEST_S if deadline is None else min(LONGEST_S, deadline.remaining())
            proc, answer = self._started(), []
            try:
                proc.stdin.write(json.dumps({"source": source, "target": target}) + "\n")
                proc.stdin.flush()
            except OSError:  # the child ended: no answer comes (why: below)
                pass
            reader = threading.Thread(target=lambda: answer.append(proc.stdout.readline()),
                                      daemon=True)
            reader.start()
            reader.join(timeout)
            if reader.is_alive():  # past the deadline (or LONGEST_S): the build is stopped
                self.stop()
                reader.join()
                if deadline is not None and deadline.expired():
                    raise TimeLimitError(f"the compile for {target} was stopped at its time "
                                         f"limit ({deadline.seconds:g} s)")
                raise subprocess.TimeoutExpired(CHILD, timeout)
            if not answer or not answer[0]:  # the child ended without an answer
                why = self._why_ended()
                self.stop()
                raise CodegenError(why)
        got = json.loads(answer[0])
        if "error" in got:
            raise CodegenError(got["error"])
        return got["kernels"]


SERVER = BuildServer()
