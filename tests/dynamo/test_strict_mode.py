"""Strict mode (``EQSAT_MIRAGE_STRICT=1``, on in the test suite): an unexpected internal error
propagates; outside it, the failing partition runs eagerly and its report names the true
error. The project's own errors (``MirageError``) are recorded in both modes."""

import pytest

import eqsat_mirage as em
from eqsat_mirage.ir.errors import STRICT_ENV, strict, unexpected

torch = pytest.importorskip("torch")
from torch_models import GatedMLP  # noqa: E402

from eqsat_mirage.dynamo import backend as torch_backend  # noqa: E402

FAST = dict(time_limit_s=60.0, iter_limit=4, warmup=0)  # ends when done (4 iterations)


@pytest.fixture
def internal_bug(monkeypatch):
    """The search raises a KeyError, as a bug in the pipeline would."""
    def buggy(*args, **kwargs):
        raise KeyError("internal bug")

    monkeypatch.setattr(torch_backend, "optimize", buggy)


def _compile_and_run(be):
    torch.manual_seed(0)
    model, x = GatedMLP().eval(), torch.randn(2, 8)
    with torch.no_grad():
        return model(x), torch.compile(model, backend=be)(x)


def test_the_suite_runs_in_strict_mode():
    assert strict()


def test_unexpected_means_not_a_project_error_in_strict_mode(monkeypatch):
    assert unexpected(KeyError("x")) and unexpected(RuntimeError("x"))
    assert unexpected(ValueError("x"))  # a bare ValueError is no MirageError
    assert not unexpected(em.MirageError("x"))
    monkeypatch.setenv(STRICT_ENV, "0")
    assert not strict() and not unexpected(KeyError("x"))


def test_strict_mode_raises_an_internal_error(internal_bug):
    with pytest.raises(Exception) as info:  # noqa: PT011 - Dynamo may wrap it
        _compile_and_run(em.backend(**FAST))
    chain, exc = [], info.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or getattr(exc, "inner_exception", None)
    assert any(isinstance(e, KeyError) and "internal bug" in str(e) for e in chain), chain


def test_outside_strict_mode_the_partition_fails_with_its_true_reason(internal_bug,
                                                                       monkeypatch):
    monkeypatch.setenv(STRICT_ENV, "0")
    be = em.backend(**FAST)
    with pytest.warns(UserWarning, match="internal bug"):
        want, got = _compile_and_run(be)
    torch.testing.assert_close(got, want)  # run eagerly
    assert [r.status for r in be.report] == ["fallback"]
    assert be.report[0].reason == "KeyError: 'internal bug'"


def test_a_project_error_is_recorded_in_strict_mode_too(monkeypatch):
    def refuses(*args, **kwargs):
        raise em.MirageError("no plan for this program")

    monkeypatch.setattr(torch_backend, "optimize", refuses)
    be = em.backend(**FAST)
    with pytest.warns(UserWarning, match="no plan for this program"):
        _compile_and_run(be)
    assert be.report[0].status == "fallback"
    assert be.report[0].reason == "MirageError: no plan for this program"
