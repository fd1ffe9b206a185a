"""The runtime stage runs an optimized module without the search's dependencies.

The parent process optimizes a small RMSNorm + Linear (``em.optimize``, level mugraph) and
writes the generated module's source to a file. A subprocess, where importing egglog,
galois or SciPy raises ImportError (a ``sys.meta_path`` finder installed before anything
else), imports ``eqsat_mirage.runtime`` alone, loads that source, runs it on CPU tensors
under ``TRITON_INTERPRET=1`` with the checked first launch against a plain-torch
reference written here, and checks that a wrong reference raises ``LaunchCheckError``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

import eqsat_mirage as em  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("egglog", "galois", "scipy")

# first in each subprocess: a meta-path finder refusing the search's dependencies
REFUSE = textwrap.dedent(f'''
    import sys


    class Refuse:
        """A meta-path finder: the search's dependencies cannot be imported here."""

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {BLOCKED!r}:
                raise ImportError(name + " cannot be imported in this test")
            return None


    sys.meta_path.insert(0, Refuse())
''')

# the rest of the subprocess: ``source`` and ``folder`` are filled in
RUN = textwrap.dedent('''
    import json
    import os

    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import eqsat_mirage.runtime as rt

    run = rt.load_source(open({source!r}).read(), directory={folder!r})


    def reference(X, W):  # the input program, written in plain torch
        return {{"Y": (X * torch.rsqrt((X * X).mean(-1, keepdim=True) + 1e-6)) @ W}}


    torch.manual_seed(0)
    x, w = torch.randn(8, 64), torch.randn(64, 32)
    fn = rt.checked(run, reference, ["X", "W"], rt.tolerance(["float32"]))
    got = fn(x, w)["Y"]
    fn(X=x, W=w)  # the same signature: checked once
    wrong = rt.checked(run, lambda X, W: {{"Y": 1.1 * reference(X, W)["Y"]}}, ["X", "W"],
                       rt.tolerance(["float32"]), {{"Y": "k0"}})
    try:
        wrong(x, w)
        caught = ""
    except rt.LaunchCheckError as exc:
        caught = str(exc)
    print(json.dumps({{
        "checked": len(fn.checked), "caught": caught,
        "max_error": float((got - reference(x, w)["Y"]).abs().max()),
        "loaded": sorted(m for m in ("egglog", "galois", "scipy") if m in sys.modules),
        "package": sorted(m for m in sys.modules if m.split(".")[0] == "eqsat_mirage")}}))
''')


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """The generated module of an optimized RMSNorm + Linear, written to a file."""
    g = em.Graph("rmslin")
    x = g.input("X", (8, 64), dtype="float32")
    w = g.input("W", (64, 32), dtype="float32")
    g.output(em.rms_norm(x) @ w, "Y")
    res = em.optimize(g, level="mugraph", cache=False)
    assert any(k.kind == "custom" for k in res.program.kernels), res
    path = tmp_path_factory.mktemp("saved") / "rmslin.py"
    path.write_text(res.triton_source())
    return path


def child(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that imports the package from this checkout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def test_the_runtime_runs_a_saved_module_without_the_search_dependencies(generated, tmp_path):
    done = child(REFUSE + RUN.format(source=str(generated), folder=str(tmp_path / "mods")),
                 tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["checked"] == 1 and report["max_error"] < 1e-3, report
    assert "output 'Y' (written by kernel 'k0') differs from the input program" in \
        report["caught"], report
    assert report["loaded"] == [], report  # neither egglog, galois nor SciPy
    # of the package: the runtime and what it stands on (ir's errors), nothing of the search
    assert {m.split(".")[1] for m in report["package"] if "." in m} <= {
        "runtime", "ir", "version"}, report


def test_the_finder_refuses_the_search(tmp_path):
    """The subprocess's finder really refuses the search's dependencies: the search itself
    cannot be imported there."""
    done = child(REFUSE + textwrap.dedent('''
        import eqsat_mirage as em

        try:
            em.optimize
        except ImportError as exc:
            print("refused:", exc)
    '''), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "cannot be imported in this test" in done.stdout
