("Block-FP8 checkpoints on the CPU: the writer's bytes against transformers' quantizer, loading against "
 "transformers' dequantized load, TP 2 on gloo ranks, fast mode, offload, and each bad input refused before compute.")
import json
import os
import types
import pytest
import torch
from safetensors.torch import load_file, save_file
from qwen3vl_l50_nbdev.dist import spawn
from qwen3vl_l50_nbdev.encoder import Encoder
from qwen3vl_l50_nbdev.quant.blocks import (FP8, BlockFp8, BlockTensor, block_tiny, quantize_blocks, scale_name,
                                          dequantize_blocks, quantize_checkpoint)
from qwen3vl_l50_nbdev.quant.block_layers import (block_mm_reference, quantize_act_blocks, BlockFp8ColumnParallelLinear,
                                                BlockFp8RowParallelLinear, quantize_act_fused, act_quant_kernel)
from qwen3vl_l50_nbdev.metrics import diff_row
from qwen3vl_l50_nbdev.tiny import make_tiny_checkpoint, synthetic_inputs
from qwen3vl_l50_nbdev.testing import broken_checkpoint, edit_config, fake_group, encode_on_ranks
from qwen3vl_l50_nbdev.model.tp import ColumnParallelLinear, RowParallelLinear, projections_on_meta

CFG = block_tiny(3)

@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("blocks")
    src = make_tiny_checkpoint(d / "bf16", CFG)
    return src, quantize_checkpoint(src, d / "fp8")

@pytest.fixture(scope="module")
def inputs(): return synthetic_inputs(CFG)

@pytest.fixture(scope="module")
def exact(ckpts, inputs): return Encoder.from_pretrained(ckpts[1], 3, progress=False).encode(**inputs)

def test_writer_bytes_equal_transformers_quantizer():
    "transformers' `Fp8Quantize` (its per-tensor function: its quantizer refuses a CPU) against ours, bytewise."
    from transformers.integrations.finegrained_fp8 import Fp8Quantize, Fp8Dequantize
    from transformers.utils.quantization_config import FineGrainedFP8Config
    hq = types.SimpleNamespace(quantization_config=FineGrainedFP8Config())
    w = (torch.randn(384, 256, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16()
    w[:128, :128] = 0   # an all-zero block: scale 1, zeros
    theirs, (q, s) = Fp8Quantize(hq)._quantize_one("a.weight", w), quantize_blocks(w)
    assert torch.equal(theirs["a.weight"].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(theirs["a.weight_scale_inv"], s)
    ours = dequantize_blocks(q, s, dtype=torch.bfloat16)
    assert torch.equal(Fp8Dequantize(hq)._dequantize_one(q, s, torch.bfloat16), ours)

def test_writer_quantizes_the_linears_transformers_would(ckpts):
    "Every nn.Linear of HF's model (but lm_head) is FP8 in the written checkpoint, and nothing else."
    from transformers import Qwen3VLForConditionalGeneration
    with torch.device("meta"): hf = Qwen3VLForConditionalGeneration(CFG.to_hf())
    linears = {n for n, m in hf.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    sd = load_file(ckpts[1] / "model.safetensors")
    assert {k.removesuffix(".weight") for k, t in sd.items() if t.dtype == FP8} == linears
    cfg = json.loads((ckpts[1] / "config.json").read_text())["quantization_config"]
    assert cfg["weight_block_size"] == [128, 128] and cfg["activation_scheme"] == "dynamic"

def test_exact_equals_transformers_dequantized_load(ckpts, inputs, exact):
    ("CPU: transformers dequantizes an FP8 checkpoint on load (fp32 product, rounded once to bf16): so do we. "
     "Its FP8 quantizer needs accelerate (a dev requirement: missing, this fails rather than skips).")
    from qwen3vl_l50_nbdev.check.hf import hf_reference
    assert torch.equal(exact, hf_reference(ckpts[1], inputs, 3, dtype=torch.bfloat16))

def test_error_against_bf16_is_fp8_sized(ckpts, inputs, exact):
    ref = Encoder.from_pretrained(ckpts[0], 3, progress=False).encode(**inputs)
    d = diff_row(exact, ref)
    assert 1e-3 < d["rel_l2"] < 0.1, d   # FP8 (3 mantissa bits, 2^-4 relative rounding): a few percent; not zero

def test_fast_and_offload(ckpts, inputs, exact):
    fast = Encoder.from_pretrained(ckpts[1], 3, progress=False, mode="fast").encode(**inputs)
    assert diff_row(fast, exact)["rel_l2"] < 2e-2   # fused q|k|v, gate|up GEMMs: bf16 rounding only
    off = Encoder.from_pretrained(ckpts[1], 3, progress=False, offload="cpu").encode(**inputs)
    assert torch.equal(off, exact)   # the same weights and ops, only where they live

def test_tp2_gloo(ckpts, inputs, exact):
    outs = spawn(encode_on_ranks, 2, ckpts[1], inputs, 3, "fp32")
    assert torch.equal(outs[0], outs[1])
    assert diff_row(outs[0], exact)["rel_l2"] < 2e-2   # the split row-parallel sums round differently in bf16

def test_tp4_cutting_blocks_refused(ckpts):
    "k_proj and v_proj are 256 rows: TP 4 gives 64 a rank, half a scale block; named before anything is read."
    enc = Encoder(block_tiny(3), fake_group(0, 4))
    from qwen3vl_l50_nbdev.weights.loading import load_checkpoint
    with pytest.raises(ValueError, match=r"TP 4 would cut .*k_proj.weight: 256 rows / TP 4 = 64 a rank"):
        load_checkpoint(enc, ckpts[1], progress=False)

def test_block_layers_tp2_slices_and_math():
    "Each rank's FP8 rows/columns and scales are the full ones' slices; the GEMM matches its fp32 emulation."
    torch.manual_seed(0)
    H, M = 256, 512
    gate, up, down = ((torch.randn(*s) * .05).bfloat16() for s in ((M, H), (M, H), (H, M)))
    full = {k: BlockTensor(*quantize_blocks(w), name=k) for k, w in dict(gate=gate, up=up, down=down).items()}
    x = torch.randn(5, H, dtype=torch.bfloat16)
    for r in range(2):
        col = BlockFp8ColumnParallelLinear(ColumnParallelLinear(H, [M, M], fake_group(r, 2)))
        col.load(full["gate"], 0); col.load(full["up"], 1)
        mine, theirs = col.weight[:256].view(torch.uint8), full["gate"].weight[256 * r:256 * (r + 1)]
        assert torch.equal(mine, theirs.view(torch.uint8))
        assert torch.equal(col.weight_scale_inv[2:], full["up"].scale_inv[2 * r:2 * r + 2])
        row = BlockFp8RowParallelLinear(RowParallelLinear(M, H, fake_group(r, 2)))
        row.load(full["down"])
        assert torch.equal(row.weight_scale_inv, full["down"].scale_inv[:, 2 * r:2 * r + 2])
    y = col(x)[1]
    ref = x.double() @ dequantize_blocks(*quantize_blocks(up)).double().T
    assert diff_row(y, ref[:, 256:])["rel_l2"] < 0.05   # activations in e4m3 per 128 columns: ~2^-5 relative

def test_act_quantization_per_group():
    x = torch.randn(3, 256)
    x[0, :128] *= 1000   # one loud group does not coarsen the others' scales
    q, s = quantize_act_blocks(x)
    assert s.shape == (3, 2) and torch.allclose(s[0, 1], x[0, 128:].abs().max() / 448)
    assert diff_row(block_mm_reference(x, *quantize_blocks(torch.eye(256))), x)["rel_l2"] < 0.05

def test_fused_quantization_off_cuda_is_the_reference_and_names_bad_shapes():
    x = torch.randn(5, 384) * torch.rand(5, 1) * 30
    (q, s), (rq, rs) = quantize_act_fused(x), quantize_act_blocks(x)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
    assert act_quant_kernel("cpu") == "torch"
    for bad in (torch.randn(5, 200), torch.randn(2, 5, 384)):
        with pytest.raises(ValueError, match="columns a multiple of 128"): quantize_act_fused(bad)

def _edit(fn):
    def edit(d):
        sd = load_file(d / "model.safetensors"); fn(sd)
        save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    return edit

K = "model.language_model.layers.0.self_attn.q_proj.weight"
BAD = {
    "scale of the wrong shape": (_edit(lambda sd: sd.__setitem__(K + "_scale_inv", sd[K + "_scale_inv"][:, :1] * 1)),
                                 r"q_proj.weight_scale_inv in model.safetensors has shape \[4, 1\] but .* "
                                 r"needs \[4, 2\]"),
    "scale of the wrong dtype": (_edit(lambda sd: sd.__setitem__(K + "_scale_inv", sd[K + "_scale_inv"].half())),
                                 r"q_proj.weight_scale_inv in model.safetensors is F16: block scales must be one of"),
    "missing weight_scale_inv": (_edit(lambda sd: sd.pop(K + "_scale_inv")),
                                 r"q_proj.weight \(F8_E4M3 in model.safetensors\) has no .*q_proj.weight_"
                                 r"scale_inv"),
    "another block size": (edit_config(lambda c: c["quantization_config"].__setitem__("weight_block_size", [64, 64])),
                           r"weight_scale_inv in model.safetensors has shape \[2, 4\] but .* in 64x64 blocks .* "
                           r"needs \[4, 8\]"),
    "static activations": (edit_config(lambda c: c["quantization_config"].__setitem__("activation_scheme", "static")),
                           r"activation_scheme is 'static': only \('dynamic',\) is supported"),
    "another method": (edit_config(lambda c: c["quantization_config"].__setitem__("quant_method", "awq")),
                       r"quant_method is 'awq': only 'fp8'"),
    "FP8 without a config": (edit_config(lambda c: c.pop("quantization_config")),
                             r"FP8 tensor\(s\) .* but config.json has no quantization_config"),
    "a NaN scale": (_edit(lambda sd: sd[K + "_scale_inv"].__setitem__((0, 0), float("nan"))),
                    r"q_proj.weight_scale_inv in model.safetensors holds 1 NaN or Inf value"),
    "a zero scale": (_edit(lambda sd: sd[K + "_scale_inv"].__setitem__((0, 0), 0.0)),
                     r"q_proj.weight_scale_inv holds 1 scale\(s\) that are not finite and positive"),
    "a huge scale": (_edit(lambda sd: sd[K + "_scale_inv"].__setitem__((0, 0), 1e30)),
                     r"q_proj.weight_scale_inv holds 1 scale\(s\) .* above 146 .*the first 1e\+30"),
}

@pytest.mark.parametrize("what", list(BAD))
def test_bad_input_named_before_compute(ckpts, tmp_path, what):
    edit, msg = BAD[what]
    d = broken_checkpoint(ckpts[1], tmp_path / "bad", edit)
    with pytest.raises(ValueError, match=msg):
        Encoder.from_pretrained(d, 3, progress=False)

@pytest.mark.parametrize("what", ["a zero scale", "a NaN scale", "a huge scale"])
def test_bad_scales_refused_by_block_layers(ckpts, tmp_path, what):
    "The block-FP8 layers (Hopper's path, which keeps FP8) refuse bad scales as the dequantizing path does."
    edit, msg = BAD[what]
    with pytest.raises(ValueError, match=msg): _block_encoder(broken_checkpoint(ckpts[1], tmp_path / "bad", edit))

@pytest.fixture
def staged(monkeypatch):
    "Block-FP8 weights of bf16 layers staged as on a GPU, here on the CPU, one tensor a batch."
    from qwen3vl_l50_nbdev.weights import loading
    monkeypatch.setattr(loading, "STAGE_ON", ("cuda", "cpu"))
    monkeypatch.setattr(loading, "STAGE_BYTES", 1)

def test_staged_load_equals_the_slice_reads(ckpts, staged, monkeypatch):
    "Streamed whole onto the layer's device, then dequantized there: every parameter bit for bit, every byte counted."
    from qwen3vl_l50_nbdev.weights import loading
    calls, stream = [], loading._stream
    monkeypatch.setattr(loading, "_stream", lambda parts, *a, **kw: calls.append(len(parts)) or stream(parts, *a, **kw))
    a = Encoder.from_pretrained(ckpts[1], 3, progress=False)
    assert sum(n == 2 for n in calls) > 10   # a weight and its scales per batch
    monkeypatch.setattr(loading, "STAGE_ON", ())
    b = Encoder.from_pretrained(ckpts[1], 3, progress=False)
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    assert a.load_stats["bytes_read"] == b.load_stats["bytes_read"]

V = "model.visual.blocks.0.attn.qkv.weight"
@pytest.mark.parametrize("what,edit,msg", [
    ("a NaN weight", lambda sd: sd[V].view(torch.uint8).view(-1).__setitem__(5, 0x7F),
     rf"{V} in model.safetensors holds 1 NaN or Inf value"),
    ("a zero scale", lambda sd: sd[V + "_scale_inv"].view(-1).__setitem__(0, 0.0),
     rf"{V}_scale_inv holds 1 scale\(s\) that are not finite and positive")])
def test_staged_bad_values_named(ckpts, tmp_path, staged, what, edit, msg):
    with pytest.raises(ValueError, match=msg):
        Encoder.from_pretrained(broken_checkpoint(ckpts[1], tmp_path / "bad", _edit(edit)), 3, progress=False)

def test_quant_fp8_on_a_block_checkpoint_refused(ckpts):
    with pytest.raises(ValueError, match="block-FP8 checkpoint .* drop quant='fp8'"):
        Encoder.from_pretrained(ckpts[1], 3, progress=False, quant="fp8")

def test_not_converted_modules_stay_bf16(tmp_path, ckpts, inputs):
    fmt = BlockFp8(not_converted=("lm_head", "model.visual", "mlp.down_proj"))
    d = quantize_checkpoint(ckpts[0], tmp_path / "skip", fmt)
    sd = load_file(d / "model.safetensors")
    assert sd["model.language_model.layers.0.mlp.down_proj.weight"].dtype == torch.bfloat16
    assert sd["model.visual.blocks.0.attn.qkv.weight"].dtype == torch.bfloat16
    assert sd["model.language_model.layers.0.mlp.up_proj.weight"].dtype == FP8
    assert Encoder.from_pretrained(d, 3, progress=False).encode(**inputs).isfinite().all()

def test_make_tiny_fp8_blocks_cli(tmp_path, inputs):
    from qwen3vl_l50_nbdev.cli import main
    assert main(["make-tiny", str(tmp_path / "t"), "--fp8-blocks", "--text-layers", "3"]) in (0, None)
    assert json.loads((tmp_path / "t" / "config.json").read_text())["quantization_config"]["quant_method"] == "fp8"
    umask = os.umask(0o022); os.umask(umask)
    assert (tmp_path / "t" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask   # not safetensors' 0600
    h = Encoder.from_pretrained(tmp_path / "t", 3, progress=False).encode(**inputs)
    assert h.shape == (len(inputs["input_ids"]), 256)


@pytest.fixture(scope="module")
def real_vocab_fp8(tmp_path_factory):
    "A tiny block-FP8 checkpoint with Qwen's vocabulary (real prompts tokenize), fresh weights, and a prompts file."
    from PIL import Image
    from qwen3vl_l50_nbdev.cli import main
    from qwen3vl_l50_nbdev.inputs.pixels import sample_photo
    d = tmp_path_factory.mktemp("fp8vocab")
    seed = int(torch.randint(1 << 30, (), generator=torch.Generator().manual_seed(torch.seed())))
    assert main(["make-tiny", str(d / "m"), "--fp8-blocks", "--real-vocab", "--text-layers", "3", "--seed",
                 str(seed)]) == 0
    Image.open(sample_photo()).resize((40, 48)).save(d / "photo.png")
    lines = [dict(id="photo", text="A portrait of a naval officer.", images=["photo.png"]),
             dict(id="text", text="A lighthouse at dusk.")]
    (d / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d / "m", d / "p.jsonl"


def test_validate_block_fp8_checkpoint(real_vocab_fp8, tmp_path, capsys):
    ("`validate` on a block-FP8 checkpoint (CPU: dequantized): its streamed reference is transformers' own FP8 load, "
     "exact mode HF bf16's bits at every layer, fast within its bound, the verdict PASS and the report saying FP8.")
    from qwen3vl_l50_nbdev.check import validate as V, report as R
    from qwen3vl_l50_nbdev.cli import main, parser
    from qwen3vl_l50_nbdev.cli.validate import validate_kwargs
    from qwen3vl_l50_nbdev.check.hf import hf_reference
    model, prompts = real_vocab_fp8
    out = tmp_path / "r"
    a = parser().parse_args(["validate", "--model", str(model), "--prompts", str(prompts), "--out", str(out),
                             "--max-pixels", "4096", "--layer", "3", "--mode", "exact,fast"])
    assert V.run_validate(**validate_kwargs(a)) == 0
    assert "PASS: every variant within the numerics contract" in capsys.readouterr().out
    df = R.load_results(out)
    assert list(dict.fromkeys(df.variant)) == [R.HF_BF16, "tp1 exact", "tp1 fast"]
    assert df.weights.eq("fp8 blocks 128x128").all() and set(df.prompt) == {"photo", "text"}
    assert df[df.variant == "tp1 exact"].bitwise_hf.all() and df.layer.max() == 3
    assert R.verdicts(df).passed.all()
    html = (out / "report.html").read_text()
    assert "fp8 blocks 128x128" in html and "within the numerics contract" in html
    # the reference validate streams is transformers' from_pretrained of the FP8 checkpoint (its dequantized load)
    _, _, xs, _ = V.prepare(model, prompts, tmp_path / "p", 3, max_pixels=4096)
    ref = V.reference(model, xs, 3)
    for p, x in xs.items():
        assert torch.equal(ref.hf[p][-1], hf_reference(model, x, 3, torch.bfloat16)), p
        theirs = hf_reference(model, x, 3, torch.float32)
        assert diff_row(ref.states[p][-1], theirs)["rel_l2"] < 1e-5, p   # fp32: only op order (a layer at a time)
    assert main(["validate", "--model", str(model), "--prompts", str(prompts), "--out", str(tmp_path / "q"),
                 "--quant", "none,fp8"]) == 2
    assert "--quant fp8: " in capsys.readouterr().err   # FP8 already: refused before a weight is read


def _block_encoder(path, group=None, cfg=CFG):
    ("An encoder holding block-FP8 layers on the CPU, built as `from_pretrained` builds one on a Hopper GPU (its "
     "projections on meta, then FP8 or bf16 where they run): their GEMMs emulated in fp32.")
    from qwen3vl_l50_nbdev.quant.block_layers import block_fp8_model_
    from qwen3vl_l50_nbdev.weights.loading import check_checkpoint, load_checkpoint
    with projections_on_meta(): enc = Encoder(cfg, group)
    block_fp8_model_(enc.text, (128, 128), {k for k, e in check_checkpoint(path, enc).items() if e.scale}, device="cpu")
    load_checkpoint(enc, path, progress=False)
    return enc

def test_block_layers_built_without_bf16_projections(ckpts, tmp_path, inputs):
    "No bf16 copy of a projection is ever made; the ones a checkpoint keeps bf16 are built on the device and loaded."
    from qwen3vl_l50_nbdev.quant.block_layers import block_fp8_model_
    with projections_on_meta(): enc = Encoder(CFG)
    projections = [m for m in enc.text.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    assert len(projections) == 4 * 3 and all(m.weight.is_meta for m in projections)   # 4 a layer, 3 layers
    assert not enc.vision.blocks[0].attn.qkv.weight.is_meta and not enc.text.embed_tokens.weight.is_meta
    with pytest.raises(ValueError, match="pass the device"): block_fp8_model_(enc.text, (128, 128), set())
    d = quantize_checkpoint(ckpts[0], tmp_path / "skip", BlockFp8(not_converted=("lm_head", "mlp.down_proj")))
    enc = _block_encoder(d)
    assert not any(t.is_meta for t in (*enc.parameters(), *enc.buffers()))
    down, up = enc.text.layers[0].mlp.down_proj, enc.text.layers[0].mlp.gate_up_proj
    assert type(down) is RowParallelLinear and down.weight.dtype == torch.bfloat16
    assert isinstance(up, BlockFp8ColumnParallelLinear)
    sd = load_file(d / "model.safetensors")
    assert torch.equal(down.weight, sd["model.language_model.layers.0.mlp.down_proj.weight"])   # loaded, not garbage
    ref = diff_row(enc.encode(**inputs), Encoder.from_pretrained(d, 3, progress=False).encode(**inputs))
    assert ref["rel_l2"] < 0.05   # activations in e4m3 per 128 columns (the GPU's GEMMs) against dequantized ones


def test_offload_with_block_layers(ckpts, inputs):
    "offload='cpu' and 'layerwise' move FP8 weights and their scales as bytes: the same output bits, FP8 kept."
    enc = _block_encoder(ckpts[1])
    qkv = enc.text.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, BlockFp8ColumnParallelLinear) and qkv.weight.dtype == FP8
    ref = enc.encode(**inputs)
    for where in ("cpu", "layerwise", None):
        enc.set_offload(where)
        assert torch.equal(enc.encode(**inputs), ref), where
        assert qkv.weight.dtype == FP8 and qkv.weight_scale_inv.dtype == torch.float32, where
    assert diff_row(ref, Encoder.from_pretrained(ckpts[1], 3, progress=False).encode(**inputs))["rel_l2"] < 0.05
    # (activations in e4m3 per 128 columns, as the GPU's block-scaled GEMMs: ~2^-5 relative against dequantized)


def test_unshard_block_layers_tp2(ckpts):
    "Two ranks' block-FP8 layers put back together: the checkpoint's FP8 bytes and scales, by its names."
    from qwen3vl_l50_nbdev.weights.loading import unshard
    encs = [_block_encoder(ckpts[1], fake_group(r, 2)) for r in range(2)]
    full, sd = unshard(encs), load_file(ckpts[1] / "model.safetensors")
    fp8 = [k for k, t in full.items() if t.dtype == FP8]
    assert len(fp8) == 7 * 3 and all(scale_name(k) in full for k in fp8)   # 7 projections a layer, 3 layers
    for k, t in full.items():
        if t.dtype == FP8: assert torch.equal(t.view(torch.uint8), sd[k].view(torch.uint8)), k
        elif sd[k].dtype == FP8:   # the vision tower's FP8 linears: dequantized on load, as transformers does
            assert torch.equal(t, dequantize_blocks(sd[k], sd[scale_name(k)], dtype=t.dtype)), k
        else: assert torch.equal(t, sd[k].to(t.dtype)), k


def test_encode_dataset_block_fp8_checkpoint(real_vocab_fp8, tmp_path):
    ("`encode-dataset` on a block-FP8 checkpoint (CPU: dequantized on load): every prompt, the bits of `encode` on the "
     "same checkpoint in exact mode, and the provenance naming the checkpoint's fingerprint.")
    from qwen3vl_l50_nbdev.cli import main
    from qwen3vl_l50_nbdev.dataset import load_embeddings
    from qwen3vl_l50_nbdev.inputs.processor import Processor
    from qwen3vl_l50_nbdev.inputs.prompts import read_prompts, process_prompts
    ckpt, prompts = real_vocab_fp8
    out = tmp_path / "emb"
    assert main(["encode-dataset", "--model", str(ckpt), "--prompts", str(prompts), "--out", str(out), "--layer", "3",
                 "--max-pixels", "4096"]) == 0
    enc = Encoder.from_pretrained(ckpt, 3, progress=False)
    px = dict(max_pixels=4096, min_pixels=1024)   # as --max-pixels 4096 gives
    xs = process_prompts(read_prompts(prompts), Processor.from_pretrained(ckpt, video=px, **px), enc.cfg)
    emb = load_embeddings(out)
    assert sorted(emb) == sorted(xs)
    for k, x in xs.items(): assert torch.equal(emb[k], enc.encode(**x)), k
    assert json.loads((out / "provenance.json").read_text())["checkpoint"]
