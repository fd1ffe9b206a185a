"""Real Hugging Face modules through torch.compile(backend=em.backend): issue 15.

Tiny random-init configs (bench/hf_models.py: hidden 256, 4 heads, 2 key/value heads
for LLaMA, seq 64), nothing downloaded. Each case must equal eager torch (fp32 within
2e-3, fp16 within 2e-2, relative to the output's largest value), run at least 90% of
its ops in optimized partitions, and report a predicted speedup. Under
TRITON_INTERPRET=1 (as CI runs) the optimized partitions run as Triton kernels.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench.hf_models import TOLERANCE, case, first, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _meets_the_bar(r: dict, share: float = 0.9) -> None:
    assert r["finite"], r
    assert r["error"] <= TOLERANCE[r["dtype"]], r
    # ops whose piece ran out of time (the machine's speed, reported as such) count as
    # covered: nothing else (an unsupported op, a crash, a refused plan) may cost coverage
    assert r["optimized_compute_ops"] <= min(r["compute_ops"], r["optimized_ops"]), r
    covered = r["optimized_compute_ops"] + r["time_limited_ops"]
    assert covered >= share * r["compute_ops"], (r["optimized_ops"], r["time_limited_ops"],
                                                 r["eager"])
    if r["optimized_ops"] == 0:  # a loaded machine left every piece to the time limit
        pytest.skip(f"{r['name']}: every piece ran out of time on this machine "
                    f"({r['time_limited_ops']} of {r['compute_ops']} compute ops)")
    assert 0 < r["after"] < r["before"], r  # the predicted speedup is reported, and real


# LLaMA fp32 with SDPA at these sizes is README's quickstart layer, compiled and checked
# against eager by tests/test_readme.py::test_readme_quickstart_hugging_face_layer
@pytest.mark.parametrize("name,dtype,impl", [
    ("llama_layer", "float16", "sdpa"),
    ("llama_layer", "float32", "eager"), ("gpt2_block", "float32", "sdpa"),
    ("gpt2_block", "float16", "eager")])
def test_layer_equals_eager_mostly_optimized(name, dtype, impl):
    _meets_the_bar(run(name, dtype, impl))


_AVX512 = "avx512f" in (open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else "")


@pytest.mark.skipif(not _AVX512, reason="needs a CPU with OpenBLAS's AVX-512 kernel")
def test_gpt2_block_with_another_blas_kernel():
    """Issue 51: the float check's verdict does not depend on the CPU's BLAS kernel. GPT-2's
    block in float32 had its attention piece put back by the end-to-end check with
    OpenBLAS's AVX-512 kernel (3.7 bits lost at a common offset of 65536 on two biases: the
    kernel's summation order), 28 of 42 ops, and all 42 with Haswell's (the suite's,
    Makefile). Run here with the AVX-512 kernel, in a process of its own."""
    # the searches stop on work done (about 23 s here); 120 s is a cap that a loaded machine
    # does not reach (at the bench's 30 s, a suite run beside three other jobs left 4 ops)
    code = ("import json; from bench.hf_models import run; "
            "r = run('gpt2_block', 'float32', 'sdpa', time_limit_s=120); "
            "print(json.dumps({k: r[k] for k in ('optimized_compute_ops', 'compute_ops', "
            "'time_limited_ops', 'error', 'finite')}))")
    env = {**os.environ, "OPENBLAS_CORETYPE": "SkylakeX", "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["finite"] and r["error"] <= TOLERANCE["float32"], r
    assert r["optimized_compute_ops"] == r["compute_ops"], r


@pytest.mark.parametrize("name,dtype", [("phi3_layer", "float16"), ("mistral_layer", "float32")])
def test_layers_whose_first_piece_the_float_check_refused(name, dtype):
    """Issue 31: Phi-3 fp16's RMSNorm and fused QKV projection (refused per element where
    the input's rounding errors cancel, 50 of 64) and Mistral fp32's RMSNorm with its
    weight reassociated (refused on an all-subnormal output, 39 of 55 when no other
    candidate verified in time) are optimized (tests/verifier/test_subnormal_outputs.py)."""
    r = run(name, dtype, "sdpa", time_limit_s=120.0)
    _meets_the_bar(r, share=1.0)  # every compute op (or left by the time limit only)


@pytest.mark.parametrize("name,impl", [("llama_mlp", "sdpa"), ("llama_attention", "sdpa")])
def test_llama_parts(name, impl):  # (eager attention: in the llama_layer eager case above)
    _meets_the_bar(run(name, "float32", impl))


def test_two_layer_llama_for_causal_lm():
    """The whole model with its default KV cache: an empty one (zero-size tensors) that the
    first step concatenates to, and int position math, stay eager without breaking the
    partitioner; compute ops are those producing non-empty float tensors. At hidden 64
    and 16 tokens (the layers' own tests run at 256 and 64: 123 s there; at 128 and 32:
    51 s in the suite)."""
    r = run("llama_model", "float32", "sdpa", time_limit_s="auto", seq=16, hidden=64)
    _meets_the_bar(r)
    assert any("zero-size" in e for e in r["eager"]) and r["compute_ops"] < r["ops"]


def test_summary_warning_names_the_partitions():
    """The one warning a compile gives holds the summary's counts and predicted times (a
    LLaMA MLP: one partition; the layers' tests above count theirs)."""
    fn, args = case("llama_mlp", "float32", "sdpa")
    be = em.backend(warmup=0, time_limit_s=30)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = first(torch.compile(fn, backend=be)(*args))
    texts = [str(w.message) for w in caught if str(w.message).startswith("eqsat-mirage: ")]
    assert len(texts) == 1, texts
    s = be.summary()
    assert f"{s['optimized_ops']} of {s['ops']} ops in {s['optimized_partitions']} optimized " \
           f"partitions (predicted {s['predicted_us'][0]:.2f} us -> " \
           f"{s['predicted_us'][1]:.2f} us)" in texts[0]
    with torch.no_grad():
        want = first(fn(*args))
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_mixtral_experts_batched_mm():
    """Issue 52: Mixtral's sparse MoE block with transformers' ``batched_mm`` experts. Each
    token's expert weights are gathered by ``w[expert_ids]`` (an integer tensor index: a
    gather), so the experts' MLP, the gathers and the weighting are one optimized partition;
    only the router's ``topk`` (and its outputs' getitems) stay eager. Before: the gathers
    stayed eager (26 of 30 compute ops)."""
    r = run("mixtral_moe", "float32", "batched_mm", time_limit_s=120.0)
    _meets_the_bar(r)
    assert all(e.startswith(("torch.topk ", "operator.getitem at modeling_mixtral"))
               for e in r["eager"]), r["eager"]
    experts = [p for p in r["backend"].report if "torch.bmm" in p.ops]
    assert experts and all(p.status == "optimized" for p in experts), r["backend"].report
    assert all("operator.getitem" in p.ops for p in experts)  # the gathers inside
