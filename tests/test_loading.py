"Checkpoint loading: sharded round trips on fake and real ranks, and every bad checkpoint with its message."
import json, shutil
import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file
from qwen3vl_l50_nbdev.config import tiny, bytes_per_rank
from qwen3vl_l50_nbdev.dist import Group, spawn, encoder_group
from qwen3vl_l50_nbdev.loading import (map_name, source_name, make_tiny_checkpoint, check_checkpoint,
                                       load_checkpoint, unshard, hf_shapes)
from qwen3vl_l50_nbdev.text import TextModel
from qwen3vl_l50_nbdev.vision import VisionModel

CFG = tiny(selected_layer=3)   # 4 text layers in the checkpoint, 3 kept
Q1, K1 = "model.language_model.layers.1.self_attn.q_proj.weight", "model.language_model.layers.1.self_attn.k_proj.weight"


def build(cfg, g, layers=None):
    "The encoder's modules for group `g`: vision tower and text model, `layers` (default N) deep."
    return nn.ModuleDict(dict(vision=VisionModel(cfg.vision), text=TextModel(cfg.text, layers or cfg.selected_layer, g)))


def fake(rank, tp): return Group(None, tuple(range(tp)), rank)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    return make_tiny_checkpoint(d / "single", CFG), make_tiny_checkpoint(d / "sharded", CFG, max_shard_size="40KB")


@pytest.fixture(scope="module")
def full(ckpts):
    "Every tensor the encoder needs, read whole from the single file."
    return {k: v for k, v in load_file(ckpts[0] / "model.safetensors").items() if map_name(k, CFG.selected_layer)}


def broken(src, dst, edit):
    shutil.copytree(src, dst); edit(dst); return dst


def rewrite(fn):
    def edit(d):
        sd = load_file(d / "model.safetensors"); fn(sd)
        save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    return edit


def test_name_map():
    N = CFG.selected_layer
    assert map_name("model.language_model.layers.2.self_attn.v_proj.weight", N) == ("text.layers.2.self_attn.qkv_proj.weight", 2)
    assert map_name("model.language_model.layers.0.mlp.gate_proj.weight", N) == ("text.layers.0.mlp.gate_up_proj.weight", 0)
    assert map_name("model.visual.blocks.5.attn.qkv.bias", N) == ("vision.blocks.5.attn.qkv.bias", None)
    for skipped in ("lm_head.weight", "model.language_model.norm.weight", "model.language_model.layers.3.mlp.up_proj.weight"):
        assert map_name(skipped, N) is None
    with pytest.raises(ValueError, match="matches no row of NAME_MAP"): map_name("visual.blocks.0.attn.qkv.weight", N)
    for k in hf_shapes(CFG):   # every name the config implies maps, and maps back
        if (m := map_name(k, N)) is not None: assert source_name(*m) == k


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sharded_round_trip(ckpts, full, tp):
    models = [build(CFG, fake(r, tp)) for r in range(tp)]
    stats = [load_checkpoint(m, ckpts[1], CFG, progress=False) for m in models]
    back = unshard(models)
    assert set(back) == set(full) and all(torch.equal(back[k], full[k]) for k in full)
    assert all(s["bytes_read"] == bytes_per_rank(CFG, tp) for s in stats)   # a rank reads exactly what it holds


def test_single_file(ckpts, full):
    m = build(CFG, Group.local())
    load_checkpoint(m, ckpts[0], CFG, progress=False)
    assert all(torch.equal(v, full[k]) for k, v in unshard([m]).items())


def _load_rank(path, cfg):
    g = encoder_group()
    m = build(cfg, g)
    stats = load_checkpoint(m, path, cfg, progress=False)
    return {k: v.clone() for k, v in m.state_dict().items()}, stats


def test_real_ranks(ckpts, full):
    res = spawn(_load_rank, 2, ckpts[1], CFG)
    models = [build(CFG, fake(r, 2)) for r in range(2)]
    for m, (sd, _) in zip(models, res): m.load_state_dict(sd)
    back = unshard(models)
    assert set(back) == set(full) and all(torch.equal(back[k], full[k]) for k in full)
    assert [s["bytes_read"] for _, s in res] == [bytes_per_rank(CFG, 2)] * 2


def test_fewer_layers(tmp_path):
    two = make_tiny_checkpoint(tmp_path / "two", tiny(2, text=dict(num_hidden_layers=2)))
    with pytest.raises(ValueError, match=r"has 2 decoder layers .* selected_layer=3 needs layers 0..2"): check_checkpoint(two, CFG)


def test_fewer_layer_tensors_than_config(ckpts, tmp_path):
    d = broken(ckpts[0], tmp_path / "cut", rewrite(lambda sd: [sd.pop(k) for k in list(sd) if ".layers.2." in k or ".layers.3." in k]))
    with pytest.raises(ValueError, match="tensors cover 2 decoder layers but selected_layer=3"): check_checkpoint(d, CFG)


def test_missing_shard(ckpts, tmp_path):
    lost = sorted(ckpts[1].glob("*.safetensors"))[2].name
    d = broken(ckpts[1], tmp_path / "lost", lambda d: (d / lost).unlink())
    with pytest.raises(FileNotFoundError, match=f"lists 1 file\\(s\\) missing from .*{lost}"): check_checkpoint(d, CFG)


def test_no_weights(ckpts, tmp_path):
    d = broken(ckpts[0], tmp_path / "none", lambda d: (d / "model.safetensors").unlink())
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index.json"): check_checkpoint(d, CFG)


def test_truncated(ckpts, tmp_path):
    def cut(d): (f := d / "model.safetensors").write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ValueError, match="model.safetensors is truncated or corrupt"): check_checkpoint(broken(ckpts[0], tmp_path / "t", cut), CFG)


def test_quantization_config(ckpts, tmp_path):
    def quant(d):
        c = json.loads((d / "config.json").read_text()); c["quantization_config"] = {"quant_method": "fp8"}
        (d / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match="config.json has quantization_config .*online FP8"): check_checkpoint(broken(ckpts[0], tmp_path / "q", quant), CFG)


def test_float8_tensor(ckpts, tmp_path):
    d = broken(ckpts[0], tmp_path / "f8", rewrite(lambda sd: sd.update({Q1: sd[Q1].to(torch.float8_e4m3fn)})))
    with pytest.raises(ValueError, match=f"serialized FP8 .*{Q1} is F8_E4M3"): check_checkpoint(d, CFG)


def test_wrong_shape(ckpts, tmp_path):
    d = broken(ckpts[0], tmp_path / "s", rewrite(lambda sd: sd.update({Q1: sd[Q1][:96]})))
    with pytest.raises(ValueError, match=rf"{Q1} has shape \[96, 64\] in model.safetensors but the config implies \[128, 64\]"):
        load_checkpoint(build(CFG, Group.local()), d, CFG, progress=False)


def test_missing_fused_source(ckpts, tmp_path):
    d = broken(ckpts[0], tmp_path / "k", rewrite(lambda sd: sd.pop(K1)))
    with pytest.raises(ValueError, match=rf"{K1} \(source 1 of the fused text.layers.1.self_attn.qkv_proj.weight\)"):
        load_checkpoint(build(CFG, Group.local()), d, CFG, progress=False)


def test_unknown_and_extra_tensors(ckpts, tmp_path):
    w = torch.randn(32).bfloat16()
    d = broken(ckpts[0], tmp_path / "u", rewrite(lambda sd: sd.update({"mtp.norm.weight": w})))
    with pytest.raises(ValueError, match="'mtp.norm.weight' matches no row of NAME_MAP"): check_checkpoint(d, CFG)
    d = broken(ckpts[0], tmp_path / "x", rewrite(lambda sd: sd.update({"model.visual.blocks.9.norm1.weight": w})))
    with pytest.raises(ValueError, match="model.visual.blocks.9.norm1.weight'\\]: is cfg this checkpoint's config"): check_checkpoint(d, CFG)


def test_model_side(ckpts):
    with pytest.raises(RuntimeError, match=r"text.layers.3.self_attn.qkv_proj.weight \(fused: missing "
                                           r"model.language_model.layers.3.self_attn.q_proj.weight, .*k_proj.weight, .*v_proj.weight\)"):
        load_checkpoint(build(CFG, Group.local(), layers=4), ckpts[0], CFG, progress=False)
    with pytest.raises(ValueError, match="maps to text.layers.2.input_layernorm.weight, which the model does not have"):
        load_checkpoint(build(CFG, Group.local(), layers=2), ckpts[0], CFG, progress=False)
    other = tiny(3, text=dict(intermediate_size=256))
    with pytest.raises(ValueError, match=r"down_proj.weight has shape \[64, 128\] but text.layers.0.mlp.down_proj.weight is a slice of \[64, 256\]"):
        load_checkpoint(build(other, Group.local()), ckpts[0], CFG, progress=False)
