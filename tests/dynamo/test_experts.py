"""``em.use_experts``: transformers' mixture-of-experts layers with each expert's MLP
through the backend (issue 52: with the default experts implementation Dynamo runs the
loop over the experts, their matmuls included, without any backend). Real transformers
classes, tiny random-init configs, eager torch as the reference."""

import pytest

import eqsat_mirage as em

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


pytestmark = pytest.mark.slow


def _init(mod, seed: int = 0):
    """Experts' weights are torch.empty until a PreTrainedModel initialises them."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0.0, p.shape[-1] ** -0.5)
    return mod.eval()


def _mlp_reports(be):
    """The backend's reports of the experts' MLP graph (a linear or a matmul, the gate)."""
    return [r for r in be.report if "operator.mul" in r.ops
            and any(op in r.ops for op in ("torch.linear", "operator.matmul"))]


def test_mixtral_moe_block_runs_every_expert_through_one_search():
    """The router and the loop stay as they were; every expert's MLP call runs optimized,
    served by at most two searches (the first token count static, then the family over the
    count), and the block equals the eager implementation."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2,
                        num_key_value_heads=1, num_hidden_layers=1, vocab_size=32,
                        num_local_experts=4, num_experts_per_tok=2,
                        experts_implementation="eager")
    mod = _init(MixtralSparseMoeBlock(cfg))
    x = torch.randn(1, 24, 64)
    with torch.no_grad():
        want = mod(x)
        _, _, index = mod.gate(x.view(-1, 64))
    hit = len(torch.unique(index))
    be = em.backend(time_limit_s=120, warn=False, warmup=0, cache=False)
    assert em.use_experts(mod, be) == 1
    assert cfg._experts_implementation == "eqsat_mirage"
    with torch.no_grad():
        got = torch.compile(mod, backend=be)(x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()
    mlps = _mlp_reports(be)
    assert 1 <= len(mlps) <= 2, [(r.name, r.status, r.reason) for r in be.report]
    assert all(r.status == "optimized" and r.eager_calls == 0 for r in mlps), [
        (r.status, r.reason, r.eager_calls) for r in mlps]
    assert sum(r.calls for r in mlps) == hit  # every expert hit ran through them
    s = be.summary()
    assert s["optimized_compute_ops"] >= 8  # the MLP's: two linears, chunk, silu, muls


def test_two_moe_layers_in_a_compiled_function_equal_eager():
    """Two bound MoE blocks in one compiled function (Dynamo's own "eager" backend for the
    function, eqsat-mirage's for the experts' MLP): the second block equals eager too
    (with only the loop hidden from Dynamo it was off by 3.44)."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2,
                        num_key_value_heads=1, num_hidden_layers=2, vocab_size=32,
                        num_local_experts=4, num_experts_per_tok=2,
                        experts_implementation="eager")
    blocks = _init(torch.nn.ModuleList([MixtralSparseMoeBlock(cfg) for _ in range(2)]))

    def fn(x):
        for b in blocks:
            x = x + b(x)
        return x

    x = torch.randn(1, 12, 64)
    with torch.no_grad():
        want = fn(x)
        em.use_experts(blocks, em.backend(time_limit_s=120, warn=False, cache=False))
        torch._dynamo.reset()
        got = torch.compile(fn, backend="eager")(x)
    torch._dynamo.reset()
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), (got - want).abs().max()


def test_qwen2_moe_block_with_a_shared_expert_equals_eager():
    """Qwen2-MoE: routed experts (bound) beside a shared expert and its sigmoid gate (the
    compiled block's own graph); equal to eager, the routed experts' MLP optimized."""
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    cfg = Qwen2MoeConfig(hidden_size=64, moe_intermediate_size=64,
                         shared_expert_intermediate_size=128, num_experts=4,
                         num_experts_per_tok=2, num_attention_heads=2, num_key_value_heads=1,
                         num_hidden_layers=1, vocab_size=32, experts_implementation="eager")
    mod = _init(Qwen2MoeSparseMoeBlock(cfg), seed=1)
    x = torch.randn(1, 16, 64)
    with torch.no_grad():
        want = mod(x)
    be = em.backend(time_limit_s=120, warn=False, warmup=0, cache=False)
    em.use_experts(mod, be)
    with torch.no_grad():
        got = torch.compile(mod, backend=be)(x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()
    mlps = _mlp_reports(be)
    assert mlps and all(r.status == "optimized" for r in mlps), [
        (r.name, r.status, r.reason) for r in be.report]


def test_transposed_expert_weights_equal_eager():
    """Aria stores each expert's weights (in, out) (``is_transposed``): the bound MLP reads
    them that way round and equals the eager implementation on the same routing."""
    from transformers.models.aria.configuration_aria import AriaTextConfig
    from transformers.models.aria.modeling_aria import AriaExperts

    cfg = AriaTextConfig(hidden_size=64, intermediate_size=64, moe_num_experts=4,
                         moe_topk=2, num_attention_heads=2, num_key_value_heads=1,
                         num_hidden_layers=1, vocab_size=32, experts_implementation="eager")
    mod = _init(AriaExperts(cfg), seed=2)
    assert mod.is_transposed
    torch.manual_seed(3)
    x = torch.randn(12, 64)
    index = torch.stack([torch.randperm(4)[:2] for _ in range(12)])
    weights = torch.softmax(torch.randn(12, 2), -1)
    with torch.no_grad():
        want = mod(x, index, weights)
    be = em.backend(time_limit_s=120, warn=False, warmup=0, cache=False)
    em.use_experts(mod, be)
    with torch.no_grad():
        got = mod(x, index, weights)  # the module itself, not compiled: the MLP still is
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (got - want).abs().max()
    assert _mlp_reports(be) and all(r.status == "optimized" for r in _mlp_reports(be))


def test_unsupported_forms_and_unbound_modules_are_refused_by_name():
    """GPT-OSS's experts (interleaved gate and up, a clamped custom gate) and an activation
    with weights of its own (PReLU: one per layer) are refused with the module's name and
    reason, before any module is changed; so are a model without experts and a backend
    that is not eqsat-mirage's. An experts module that use_experts did not bind, though
    its shared config names the implementation, runs its own eager forward, and says so."""
    from transformers import GptOssConfig, MixtralConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    cfg = GptOssConfig(hidden_size=64, intermediate_size=64, num_local_experts=4,
                       num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
                       vocab_size=32, experts_implementation="eager")
    holder = torch.nn.ModuleDict({"experts": GptOssExperts(cfg)})
    be = em.backend(warn=False)
    with pytest.raises(em.MirageError, match=r"'experts' \(GptOssExperts\) has"):
        em.use_experts(holder, be)
    assert cfg._experts_implementation == "eager"  # nothing changed
    with pytest.raises(em.MirageError, match="has no experts module"):
        em.use_experts(torch.nn.Linear(4, 4), be)
    mcfg = MixtralConfig(hidden_size=64, intermediate_size=64, num_local_experts=2,
                         num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
                         experts_implementation="eager")
    prelu = MixtralExperts(MixtralConfig(**{**mcfg.to_dict(), "hidden_act": "prelu"}))
    with pytest.raises(em.MirageError, match="weights of its own"):
        em.use_experts(prelu, be)
    with pytest.raises(em.MirageError, match="takes an eqsat-mirage backend"):
        em.use_experts(prelu, "inductor")
    bound, other = _init(MixtralExperts(mcfg)), _init(MixtralExperts(mcfg), seed=1)
    x, index = torch.randn(3, 64), torch.tensor([[0], [1], [0]])
    weights = torch.ones(3, 1)
    with torch.no_grad():
        want = other(x, index, weights)
        em.use_experts(bound, be)  # the config both share now names eqsat_mirage
        with pytest.warns(UserWarning, match="did not bind"):
            got = other(x, index, weights)
    assert torch.equal(got, want)


def test_backends_and_forms_compile_functions_of_their_own():
    """Each backend's expert MLP has a code object of its own, so one backend's compiles
    never use up another's share of Dynamo's recompile limit."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    cfg = MixtralConfig(hidden_size=64, intermediate_size=64, num_local_experts=2,
                        num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
                        experts_implementation="eager")
    one, two = em.backend(warn=False), em.backend(warn=False)
    em.use_experts(MixtralExperts(cfg), one)
    em.use_experts(MixtralExperts(cfg), two)
    (f1,), (f2,) = one.experts.values(), two.experts.values()
    assert f1._torchdynamo_orig_callable.__code__ is not f2._torchdynamo_orig_callable.__code__
