"""bench/gpu_bench.py: the torch reference of every benchmark, and ``eqsat-mirage bench --gpu``."""

import numpy as np
import pytest

import eqsat_mirage as em
from bench.gpu_bench import NO_GPU, format_table, make_inputs, section, torch_reference
from bench.programs import BENCHMARKS, program, rewritten
from eqsat_mirage.cli.main import main

torch = pytest.importorskip("torch")


def _check(graph) -> None:
    inputs = {k: v.float() for k, v in make_inputs(graph, device="cpu", seed=1).items()}
    got = torch_reference(graph)(**inputs)
    want = em.evaluate(graph, {k: v.double().numpy() for k, v in inputs.items()})
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k].double().numpy()
        assert g.shape == w.shape
        assert np.linalg.norm(g - w) <= 1e-4 * np.linalg.norm(w), k


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_torch_reference_matches_evaluate(name):
    _check(program(name, 1))


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_torch_reference_of_rewritten_forms(name):
    # concat, transpose, split-K reshapes, constants: the rest of the op set
    _check(rewritten(name, 1))


def test_torch_reference_small_graph_every_op():
    g = em.Graph("ops")
    x = g.input("X", (4, 6), dtype="float32")
    y = g.input("Y", (6, 4), dtype="float32")
    a = em.exp(-x) + em.sqrt(x * x + 1.0) - em.relu(x) / (em.silu(x) + 3.0)
    b = em.rsqrt((a * a).mean(axis=-1, keepdims=True) + 1e-6) * a
    c = em.concat([b, y.T], axis=0).reshape(2, 4, 6).sum(axis=0)
    g.output(c @ y, "O")
    g.output(c.transpose(1, 0).sum(axis=1, keepdims=True), "S")
    _check(g)


def test_format_table_and_section():
    row = {"case": "gqa b=1", "eager": 20.0, "compile": 10.0, "sdpa": 5.0, "ours": 8.0,
           "predicted": 7.5, "dram_frac": None}
    text = format_table([row])
    assert "2.50x" in text and "1.25x" in text
    sec = section([row], "NVIDIA H100", "eqsat-mirage bench --gpu", 100)
    assert sec.startswith("## GPU timings") and "NVIDIA H100" in sec


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cli_without_cuda_exits_2(capsys):
    assert main(["bench", "--gpu", "--bench", "lora", "--batch", "1"]) == 2
    err = capsys.readouterr().err
    assert f"error: {NO_GPU}" in err and "Traceback" not in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_one_case_end_to_end(tmp_path, capsys):
    out = tmp_path / "RESULTS.md"
    assert main(["bench", "--gpu", "--bench", "lora", "--batch", "1", "--reps", "5",
                 "--write", str(out)]) == 0
    text = out.read_text()
    assert "## GPU timings" in text and "lora b=1" in text


def test_write_section_replaces_only_its_own(tmp_path):
    from bench.gpu_bench import write_section

    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\n## Verification\n\nkeep\n\n## GPU timings\n\nold\n")
    write_section(path, "## GPU timings\n\nnew\n")
    text = path.read_text()
    assert "keep" in text and "new" in text and "old" not in text
