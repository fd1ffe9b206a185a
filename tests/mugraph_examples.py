"""Hand-built MuGraphs shared by the MuGraph and code generation tests: a tiled matmul,
fused RMSNorm+Linear and FlashAttention-style attention, with their reference graphs."""

import eqsat_mirage as em

EPS = 1e-6


def matmul_graph(m=32, k=48, n=24, dtype="float32"):
    """C = A @ B, a kernel-level Graph (A: m x k, B: k x n)."""
    g = em.Graph("matmul")
    a = g.input("A", (m, k), dtype)
    b = g.input("B", (k, n), dtype)
    g.output(a @ b, "C")
    return g


def tiled_matmul(a_imap=None, b_imap=None, a_fmap=1, b_fmap=0, omap=None, drop_acc=False):
    g = matmul_graph()
    mg = em.MuGraph("matmul_tiled")
    mg.input("A", (32, 48), "float32")
    mg.input("B", (48, 24), "float32")
    k = mg.custom_kernel(grid=(4, 4), forloop=4, source=g)
    a = k.input("A", imap={0: 0} if a_imap is None else a_imap, fmap=a_fmap)
    b = k.input("B", imap={1: 1} if b_imap is None else b_imap, fmap=b_fmap)
    omap = {0: 0, 1: 1} if omap is None else omap
    if drop_acc:  # the loop's matmul is written directly: the last iteration's write stays
        k.output(a @ b, "C", omap=omap)
    else:
        k.output(k.accumulate(a @ b, "acc"), "C", omap=omap)
    mg.output("C")
    return g, mg


def rmsnorm_linear_graph(moved=True, dtype="float16"):
    g = em.Graph("rmsnorm_linear")
    x = g.input("X", (8, 64), dtype)
    w = g.input("W", (64, 32), dtype)
    if moved:  # the normalisation after the matmul (the form the kernel implements)
        y = (x @ w) * em.rsqrt((x * x).mean(axis=1, keepdims=True) + EPS)
    else:
        y = em.rms_norm(x, eps=EPS) @ w
    g.output(y, "Y")
    return g


def rmsnorm_linear(local_mean=False, dtype="float16"):
    g = rmsnorm_linear_graph(dtype=dtype)
    mg = em.MuGraph("rmsnorm_linear_fused")
    mg.input("X", (8, 64), dtype)
    mg.input("W", (64, 32), dtype)
    k = mg.custom_kernel(grid=(4,), forloop=4, name="rms_linear", source=g)
    x = k.input("X", fmap=1)                    # (8, 16): rows whole, hidden dim in the loop
    w = k.input("W", imap={1: 0}, fmap=0)       # (16, 8): a column block, hidden dim in the loop
    ss = k.accumulate((x * x).sum(axis=1, keepdims=True), "ss")
    xw = k.accumulate(x @ w, "xw")
    mean = ss / (16 if local_mean else 64)
    shifted = mean + EPS
    r = em.rsqrt(shifted)
    y = xw * r
    k.fuse(mean, shifted, r, y)
    k.output(y, "Y", omap={1: 0})
    mg.output("Y")
    return g, mg


def attention_graph(gqa_form=False):
    g = em.Graph("attention")
    q = g.input("Q", (2, 16, 8), "float32")
    k = g.input("K", (2, 8, 32), "float32")
    v = g.input("V", (2, 32, 8), "float32")
    s = em.exp(q @ k)
    o = (s / s.sum(axis=2, keepdims=True)) @ v if gqa_form else (s @ v) / s.sum(axis=2,
                                                                                keepdims=True)
    g.output(o, "O")
    return g


def flash_attention(drop_sum_acc=False):
    g = attention_graph()
    mg = em.MuGraph("flash")
    for name, node in g.inputs.items():
        mg.input(name, node.shape, node.dtype)
    k = mg.custom_kernel(grid=(2, 2), forloop=4, source=g)
    q = k.input("Q", imap={0: 0, 1: 1})             # (1, 8, 8), whole head dim, no loop
    kk = k.input("K", imap={0: 0}, fmap=2)          # (1, 8, 8), key length in the loop
    v = k.input("V", imap={0: 0}, fmap=1)           # (1, 8, 8)
    s = em.exp(q @ kk)
    if drop_sum_acc:  # the row sum of this iteration only, written in the loop
        k.output((s @ v) / s.sum(axis=2, keepdims=True), "O", omap={0: 0, 1: 1})
    else:
        o = k.accumulate(s @ v, "o")
        lse = k.accumulate(s.sum(axis=2, keepdims=True), "l")
        k.output(o / lse, "O", omap={0: 0, 1: 1})
    mg.output("O")
    return g, mg


def safe_attention_graph(b=2, m=16, d=8, n=32, dtype="float32"):
    g = em.Graph("safe_attention")
    q = g.input("Q", (b, m, d), dtype)
    k = g.input("K", (b, d, n), dtype)
    v = g.input("V", (b, n, d), dtype)
    g.output(em.softmax(q @ k, axis=-1) @ v, "O")
    return g


def online_attention(mistake=None, dtype="float32"):
    """FlashAttention with a running max: the loop walks the keys, m is the running row max,
    and the output and row-sum accumulators are rescaled by exp(m_old - m_new).

    ``mistake``: "no-max" (subtract this tile's own max: a stale, per-tile max),
    "sum-not-rescaled" (the row sum subtracts the running max of an earlier form)."""
    g = safe_attention_graph(dtype=dtype)
    mg = em.MuGraph("online")
    for name, node in g.inputs.items():
        mg.input(name, node.shape, node.dtype)
    k = mg.custom_kernel(grid=(2, 2), forloop=4, source=g)
    q = k.input("Q", imap={0: 0, 1: 1})
    kk = k.input("K", imap={0: 0}, fmap=2)
    v = k.input("V", imap={0: 0}, fmap=1)
    s = q @ kk
    tile_max = s.max(axis=2, keepdims=True)
    k.accumulate(tile_max, "m", how="max")
    m = tile_max if mistake == "no-max" else k.running("m")
    e = em.exp(s - m)
    o = k.accumulate(e @ v, "o")
    if mistake == "sum-not-rescaled":
        lse = k.accumulate(em.exp(s - tile_max).sum(axis=2, keepdims=True), "l")
    else:
        lse = k.accumulate(e.sum(axis=2, keepdims=True), "l")
    k.output(o / lse, "O", omap={0: 0, 1: 1})
    mg.output("O")
    return g, mg


def attention_tiles(rows: int, keys: int = 128):
    """Attention's numerator and denominator in one lowered kernel: ``rows`` query rows per
    block and ``keys`` keys per loop iteration (GQA b=1 shapes; for register and warp tests)."""
    from eqsat_mirage.fusion.lower import lower
    from eqsat_mirage.fusion.schedule import Schedule

    g = em.Graph("attn")
    q = g.input("Q", (2, 256, 64), "float16")
    k = g.input("K", (2, 64, 4096), "float16")
    v = g.input("V", (2, 4096, 64), "float16")
    a = em.exp(q @ k)
    g.output(a @ v, "N")
    g.output(a.sum(axis=2, keepdims=True), "D")
    return lower(g, Schedule(grid=(("a", 2), ("b", 256 // rows)), loop="d",
                             forloop=4096 // keys))
