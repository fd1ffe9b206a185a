"""The backend's CPU torch path (no TRITON_INTERPRET): a chosen program with split kernels
(a decode-like attention: few query rows, many keys) runs optimized, not eagerly."""

import warnings

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")


def test_split_attention_runs_optimized_on_the_torch_path(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def attend(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 32, 64), torch.randn(1, 4096, 64), torch.randn(1, 4096, 64)
    # priced at plain launches, where the split (two kernels) is the model's choice; at CUDA
    # graph replays (the backend's default pricing) more kernels cost less and it is not
    be = em.backend(warmup=0, time_limit_s=20.0, launch="plain")
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        want = attend(q, k, v)
        got = torch.compile(attend, backend=be)(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert not [w for w in caught if "runs eagerly" in str(w.message)], \
        [str(w.message) for w in caught]
    (entry,) = be.report
    assert (entry.status, entry.mode, entry.calls) == ("optimized", "torch", 1), entry.reason
    program = entry.result.program
    split = [kn for kn in program.kernels if kn.kind == "custom" and kn.source is None]
    assert split, f"expected split kernels (no source) in the chosen program:\n{program}"
