"""bench/real_sizes.py at a tiny size: the profile it prints names every step and every
piece, the figures are consistent, and the compiled layer equals eager. Invariants only:
the time limit may cut any search short on a slow machine."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
from bench import real_sizes  # noqa: E402


def test_the_profile_names_every_step_and_piece():
    r = real_sizes.run(hidden=64, heads=2, kv_heads=1, intermediate=128, seq=8,
                       dtype="float32", time_limit_s=20.0)
    assert r["finite"] and r["max_error"] < 1e-3
    assert 0 <= r["optimized_ops"] <= r["compute_ops"] <= r["ops"]
    assert r["peak_bytes"] > 0 and r["estimate_bytes"] > 0 and r["estimate_what"]
    (part,) = r["profile"]
    assert part["status"] in ("optimized", "unchanged")
    pieces = part["pieces"]
    assert len(pieces) >= 2
    for q in pieces:
        assert q["status"] in ("optimized", "unchanged")
        assert set(q["phases"]) == {"saturate", "extract", "fusion", "verify"} or q["same_as"] \
            is not None or q["time_limited"]
    assert (r["optimized_ops"] > 0) == any(q["status"] == "optimized" for q in pieces)
    text = real_sizes.show(r)
    assert "compile call:" in text and "peak memory: measured" in text
    assert "end-to-end check" in text
    for q in pieces:
        assert f"piece {q['index']} ({q['ops']} ops)" in text
    late = [q for q in pieces if q["time_limited"] and q["same_as"] is None]
    warning = [w for w in r["warnings"] if w.startswith("eqsat-mirage: ")]
    assert len(warning) == 1
    assert bool(late) == ("ran out of time" in warning[0])
