"FP8 linears: quantization bounds, the CPU `_scaled_mm` path, TP=2 layers and models on gloo ranks, serialized FP8 refused."
import json, shutil
import pytest, torch
import torch.nn as nn
from safetensors.torch import load_file, save_file
from qwen3vl_l50_nbdev.config import tiny
from qwen3vl_l50_nbdev.dist import encoder_group, spawn
from qwen3vl_l50_nbdev.tp import ColumnParallelLinear, RowParallelLinear, REDUCE_MODES
from qwen3vl_l50_nbdev.text import TextModel, TP_PLAN
from qwen3vl_l50_nbdev.metrics import diff_row
from qwen3vl_l50_nbdev.fp8 import (FP8, GRANULARITIES, ACT_MODES, quantize_weight, quantize_act, scaled_mm, fp8_linear,
                                   Fp8ColumnParallelLinear, Fp8RowParallelLinear, quantize_model_, _check_tp_layers)
from qwen3vl_l50_nbdev.errors import random_weights_


def _dq(q, s): return q.float() * s


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_weight_round_trip_within_e4m3_rounding(granularity, dtype):
    torch.manual_seed(0)
    w = torch.randn(96, 200, dtype=dtype) * torch.logspace(-3, 3, 96)[:, None].to(dtype)   # rows over 6 decades
    w[7] = 0                                                                                # an all-zero row stays zero
    q, s = quantize_weight(w, granularity)
    assert q.dtype == FP8 and s.dtype == torch.float32 and s.shape == ((96, 1) if granularity == "channel" else ())
    # a normal e4m3 value is within 2^-4 (half an ulp, 3 mantissa bits) of itself; a subnormal within half a step, 2^-10 * scale;
    # the slack covers the fp32 rounding of the scale
    bound = torch.maximum(w.float().abs() * 2 ** -4, 2 ** -10 * s.expand_as(w))
    assert ((_dq(q, s) - w.float()).abs() <= bound * (1 + 2 ** -20)).all()
    assert torch.equal(_dq(q, s)[7], torch.zeros(200)) and q.float().abs().max() <= 448


@pytest.mark.parametrize("act", ACT_MODES)
def test_activation_round_trip(act):
    torch.manual_seed(1)
    x = torch.randn(33, 128, dtype=torch.bfloat16)
    q, s = quantize_act(x, act)
    assert s.shape == ((33, 1) if act == "token" else ())
    assert diff_row(_dq(q, s), x)["rel_l2"] < 2 ** -5   # 3 mantissa bits: ~0.026 rms relative rounding on Gaussian values
    if act == "token":   # each row's largest magnitude maps onto 448 exactly
        assert torch.equal(q.float().abs().amax(-1), torch.full((33,), 448.0))


def test_bad_modes():
    with pytest.raises(ValueError, match="granularity='block': choose one of"):
        quantize_weight(torch.randn(4, 4), "block")
    with pytest.raises(ValueError, match="act='channel': choose one of"):
        quantize_act(torch.randn(4, 4), "channel")


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("act", ACT_MODES)
@pytest.mark.parametrize("shape", [(7, 48, 40), (1, 64, 16), (19, 40, 24)])
def test_cpu_scaled_mm_is_the_dequantized_gemm(granularity, act, shape):
    M, K, N = shape
    torch.manual_seed(2)
    (aq, sa), (wq, sw) = quantize_act(torch.randn(M, K), act), quantize_weight(torch.randn(N, K), granularity)
    ref = _dq(aq, sa) @ _dq(wq, sw).T
    y = scaled_mm(aq, sa, wq, sw, torch.float32)
    assert diff_row(y, ref)["rel_l2"] < 1e-6            # the same fp32 GEMM of the same values, up to summation order
    yb = scaled_mm(aq, sa, wq, sw)
    assert yb.dtype == torch.bfloat16 and diff_row(yb, ref)["rel_l2"] < 2 ** -8   # plus one bf16 rounding of the output


def test_fp8_linear_vs_fp64():
    torch.manual_seed(3)
    x, w = torch.randn(2, 9, 256, dtype=torch.bfloat16), (torch.randn(128, 256) / 16).bfloat16()
    y = fp8_linear(x, *quantize_weight(w))
    assert y.shape == (2, 9, 128) and y.dtype == torch.bfloat16
    assert diff_row(y, x.double() @ w.double().T)["rel_l2"] < 2 ** -4   # two e4m3 roundings (~0.026 rms each) in quadrature


def test_layers_at_tp1():
    torch.manual_seed(4)
    col = ColumnParallelLinear(64, [32, 16])
    col.load_split(0, torch.randn(32, 64).bfloat16()); col.load_split(1, torch.randn(16, 64).bfloat16())
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    f = Fp8ColumnParallelLinear(col)
    outs = f(x)
    assert [o.shape for o in outs] == [(5, 32), (5, 16)] and f.weight.dtype == FP8 and f.weight_scale.shape == (48, 1)
    for o, w in zip(outs, col.weight.split([32, 16])): assert diff_row(o, x.double() @ w.double().T)["rel_l2"] < 2 ** -4
    for mode in REDUCE_MODES:   # at tp=1 every reduce mode is the plain FP8 GEMM
        row = RowParallelLinear(64, 32, reduce=mode); row.load(torch.randn(32, 64).bfloat16())
        assert torch.equal(Fp8RowParallelLinear(row)(x), fp8_linear(x, *quantize_weight(row.weight.data)))


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("act", ACT_MODES)
def test_tp2_layers_on_gloo(granularity, act):
    res = spawn(_check_tp_layers, 2, granularity, act)
    assert torch.equal(res[0]["row_out"], res[1]["row_out"])   # replicated after the all-reduce
    for r in res:
        # the scales agreed over the group make every rank's e4m3 shard the exact slice of the tp=1 FP8 weight
        assert r["col_weight"] and r["col_scale"] and r["row_weight"] and r["row_scale"] and r["col_out"]
        assert r["row_rel_l2"] <= 1.25 * r["row_rel_l2_tp1"]   # rank-local activation scales, fp32 partial sums: TP contract


def _model(group=None, dtype=torch.bfloat16, seed=0):
    "A tiny TextModel with the same full (bf16-valued) weights at any TP size: each rank holds its slice of them."
    return random_weights_(TextModel(tiny().text, 3, group, dtype=dtype), seed)


def _inputs(seq=24):
    torch.manual_seed(9)
    return torch.randn(seq, tiny().text.hidden_size, dtype=torch.bfloat16), torch.arange(seq).expand(3, seq)


def test_quantize_model_tp1():
    x, pos = _inputs()
    ref, bf, f8 = _model(dtype=torch.float32), _model(), quantize_model_(_model())
    for layer in f8.layers:
        for name, (style, _) in TP_PLAN.items():
            assert isinstance(layer.get_submodule(name), Fp8ColumnParallelLinear if style == "column" else Fp8RowParallelLinear)
        assert layer.input_layernorm.weight.dtype == torch.bfloat16
    assert f8.embed_tokens.weight.dtype == torch.bfloat16
    with torch.no_grad(): r, b, y = ref(x.float(), pos), bf(x, pos), f8(x, pos)
    e8, eb = diff_row(y, r)["rel_l2"], diff_row(b, r)["rel_l2"]
    assert eb < e8 / 4 and e8 < 2 ** -3 and diff_row(y, r)["cosine"] > 0.99   # e4m3 vs bf16 roundings, 3 layers deep
    with pytest.raises(ValueError, match="already FP8"): quantize_model_(f8)
    with pytest.raises(ValueError, match="no text.DecoderLayer"): quantize_model_(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="granularity='row'"): quantize_model_(_model(), "row")


def _tp_model_fp8(granularity, act):
    g = encoder_group()
    x, pos = _inputs()
    with torch.no_grad():
        ref = _model(dtype=torch.float32)(x.float(), pos)
        tp1 = quantize_model_(_model(), granularity, act)(x, pos)
        tp = quantize_model_(_model(g), granularity, act)(x, pos)
    return diff_row(tp1, ref)["rel_l2"], diff_row(tp, ref)["rel_l2"], tp


@pytest.mark.parametrize("granularity,act", [("channel", "token"), ("tensor", "tensor")])
def test_quantize_model_tp2_on_gloo(granularity, act):
    res = spawn(_tp_model_fp8, 2, granularity, act)
    assert torch.equal(res[0][2], res[1][2])          # every rank holds the same output
    e1, e2, _ = res[0]
    assert e2 <= 1.25 * e1                             # the project's TP contract, for the FP8 model


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    from qwen3vl_l50_nbdev.loading import make_tiny_checkpoint
    cfg = tiny(1, text=dict(num_hidden_layers=1))
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "bf16", cfg), cfg


def test_refuses_quantization_config(tiny_ckpt, tmp_path):
    from qwen3vl_l50_nbdev.loading import check_checkpoint
    src, cfg = tiny_ckpt
    d = shutil.copytree(src, tmp_path / "q")
    c = json.loads((d / "config.json").read_text())
    c["quantization_config"] = dict(quant_method="fp8", activation_scheme="dynamic", weight_block_size=[128, 128])
    (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match="only online FP8 is supported: load the bf16 checkpoint with quant='fp8'"):
        check_checkpoint(d, cfg)


@pytest.mark.parametrize("dtype,name", [(torch.float8_e4m3fn, "F8_E4M3"), (torch.float8_e5m2, "F8_E5M2")])
def test_refuses_float8_tensors(tiny_ckpt, tmp_path, dtype, name):
    from qwen3vl_l50_nbdev.loading import check_checkpoint
    src, cfg = tiny_ckpt
    d = shutil.copytree(src, tmp_path / "f8")
    sd = load_file(d / "model.safetensors")
    k = "model.language_model.layers.0.self_attn.o_proj.weight"
    sd[k] = sd[k].to(dtype)
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"serialized FP8 checkpoints are not supported .*{k} is {name}"):
        check_checkpoint(d, cfg)
