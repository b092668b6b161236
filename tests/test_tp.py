"TP primitives on real gloo ranks (tp 2 and 4) against the unsharded layers, and their bad inputs."
import pytest, torch
import torch.nn.functional as F
import torch.distributed as dist
from qwen3vl_l50_nbdev.dist import Group, encoder_group, spawn
from qwen3vl_l50_nbdev.tp import (divide, shard, VocabParallelEmbedding, ColumnParallelLinear, RowParallelLinear,
                                  REDUCE_MODES)


def _gather(g, t):
    out = [torch.empty_like(t) for _ in range(g.size)]
    dist.all_gather(out, t.contiguous(), group=g.pg)
    return torch.cat(out, -1)


def _primitives(seed):
    g = encoder_group()
    torch.manual_seed(seed)   # the same full weights and inputs on every rank
    V, H, nh, nkv, hd, S = 96, 48, 8, 4, 6, 11
    emb_w, x, ids = torch.randn(V, H), torch.randn(S, H), torch.randint(0, V, (S,))
    Wq, Wk, Wv, Wo = torch.randn(nh * hd, H), torch.randn(nkv * hd, H), torch.randn(nkv * hd, H), torch.randn(H, nh * hd)
    emb = VocabParallelEmbedding(V, H, g, torch.float32)
    emb.load(emb_w)
    qkv = ColumnParallelLinear(H, [nh * hd, nkv * hd, nkv * hd], g, dtype=torch.float32)
    for i, w in enumerate((Wq, Wk, Wv)):
        qkv.load_split(i, w)
    q, k, v = qkv(x)
    out = dict(emb=torch.equal(emb(ids), emb_w[ids]),
               qkv=all(torch.equal(_gather(g, o), x @ w.T) for o, w in zip((q, k, v), (Wq, Wk, Wv))))
    a = torch.randn(S, nh * hd, dtype=torch.bfloat16)
    ref = a.double() @ Wo.bfloat16().double().T
    for mode in REDUCE_MODES:
        row = RowParallelLinear(nh * hd, H, g, reduce=mode)
        row.load(Wo.bfloat16())
        y = row(shard(a, 1, g.rank, g.size))
        out[mode] = (y.dtype, ((y.double() - ref).norm() / ref.norm()).item(), y)
    return out


@pytest.mark.parametrize("tp", [2, 4])
def test_primitives_on_gloo(tp):
    res = spawn(_primitives, tp, 0)
    for r in res:
        assert r["emb"] and r["qkv"]          # no sum of real values crosses ranks: exact
        for mode in REDUCE_MODES:
            dtype, rel, y = r[mode]
            assert dtype == torch.bfloat16
            assert rel < 2 ** -8                # one bf16 rounding of the output, plus the reduction's own
            assert torch.equal(y, res[0][mode][2])   # replicated: every rank holds the same bits


def test_tp1_row_parallel_is_the_plain_gemm():
    torch.manual_seed(1)
    a, w = torch.randn(7, 64, dtype=torch.bfloat16), torch.randn(32, 64, dtype=torch.bfloat16)
    for mode in REDUCE_MODES:
        row = RowParallelLinear(64, 32, reduce=mode)
        row.load(w)
        assert torch.equal(row(a), F.linear(a, w))


def test_shards_concatenate_in_one_process():
    torch.manual_seed(2)
    w = torch.randn(24, 10)
    for tp in (1, 2, 4):
        pieces = [shard(w, 0, r, tp, splits=[16, 4, 4]) for r in range(tp)]
        q = torch.cat([p[:16 // tp] for p in pieces])
        assert torch.equal(q, w[:16])
        assert torch.equal(torch.cat([shard(w, 1, r, 2) for r in range(2)], 1), w)


def test_bad_sizes():
    with pytest.raises(ValueError, match="vocab_size 1000 is not divisible by the tensor-parallel size 3"):
        VocabParallelEmbedding(1000, 8, Group(None, (0, 1, 2), 0))
    with pytest.raises(ValueError, match="output size 10 is not divisible"):
        ColumnParallelLinear(8, [12, 10], Group(None, (0, 1, 2, 3), 1))
    with pytest.raises(ValueError, match="reduce='fp16'"):
        RowParallelLinear(8, 8, reduce="fp16")
    with pytest.raises(ValueError, match="sizes that divide it: \\[1, 2, 4, 8\\]"):
        divide(8, 3)
    with pytest.raises(RuntimeError, match="rank 2 is not a member of the encoder group \\[0, 1\\]"):
        VocabParallelEmbedding(8, 8, Group(None, (0, 1), 2))
