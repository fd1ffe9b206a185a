"""Fixtures the verifier's tests of fixed (int8, fp8) inputs share."""

from __future__ import annotations

import pytest

from eqsat_mirage.verifier import draws as draws_mod


@pytest.fixture
def sharing():
    """``run(share, fn)``: ``fn()`` with the fixed inputs' values shared across draws and
    programs (``draws.SHARE_FIXED``) or not, the setting restored after."""
    def run(share: bool, fn):
        old = draws_mod.SHARE_FIXED
        draws_mod.SHARE_FIXED = share
        try:
            return fn()
        finally:
            draws_mod.SHARE_FIXED = old
    return run


@pytest.fixture
def calls_kept(monkeypatch):
    """``watch(module, name)``: a list that gets, at each call of ``module.name`` from then
    on, whether it returned a value (not None)."""
    def watch(module, name: str) -> list:
        runs, real = [], getattr(module, name)

        def counted(*args, **kwargs):
            value = real(*args, **kwargs)
            runs.append(value is not None)
            return value

        monkeypatch.setattr(module, name, counted)
        return runs
    return watch
