"How a video is written into the prompt follows the installed transformers: the probe, the ids, a resumed dataset."
import json
import random
from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers import BatchFeature, Qwen2VLImageProcessorPil, Qwen3VLProcessor
from transformers.video_utils import VideoMetadata

from qwen3vl_l50_nbdev.config import EncoderConfig
from qwen3vl_l50_nbdev.dataset import encode_dataset
from qwen3vl_l50_nbdev.inputs import processor as P
from qwen3vl_l50_nbdev.inputs.pixels import IMAGE, VIDEO, _hf_settings, video_pixels
from qwen3vl_l50_nbdev.inputs.tokenizer import byte_tokenizer

SEED = random.SystemRandom().randrange(2 ** 31)   # fresh clips each session; printed when a test fails
TOKENS = dict(image_token_id="<|image_pad|>", video_token_id="<|video_pad|>",
              vision_start_token_id="<|vision_start|>", vision_end_token_id="<|vision_end|>")


class OurVideos:
    "HF's video processor (it needs torchvision) stood in for by our pixels and grids; HF writes the prompt."
    merge_size, temporal_patch_size = VIDEO.merge_size, VIDEO.temporal_patch_size

    def __call__(self, videos, **kw):
        rows = [video_pixels(torch.from_numpy(np.asarray(v)).permute(0, 3, 1, 2), VIDEO) for v in videos]
        meta = [VideoMetadata(total_num_frames=len(v), fps=2.0, frames_indices=list(range(len(v)))) for v in videos]
        return BatchFeature(dict(pixel_values_videos=torch.cat([r for r, _ in rows]),
                                 video_grid_thw=torch.tensor([g for _, g in rows]), video_metadata=meta))


@pytest.fixture(scope="module")
def pair():
    "Our `Processor` (installed convention) and transformers' `Qwen3VLProcessor` on one byte-level tokenizer."
    tok = byte_tokenizer()
    cfg = replace(EncoderConfig(selected_layer=1), **{k: tok.convert_tokens_to_ids(t) for k, t in TOKENS.items()})
    hf = type("HF", (Qwen3VLProcessor,), dict(check_argument_for_proper_class=lambda *a: None))(
        image_processor=Qwen2VLImageProcessorPil(**_hf_settings(IMAGE)), tokenizer=tok.to_transformers(),
        video_processor=OurVideos())
    return P.Processor(tok, cfg, IMAGE, VIDEO), hf, cfg


def clip(g, t, h, w):
    "A random uint8 clip [t, h, w, 3]: fresh values, never constant."
    return g.integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def test_probe_matches_installed_processor(pair):
    "transformers' own ids for a 6-frame clip (3 temporal patches) hold the outer pair exactly when the probe says so."
    ours, hf, cfg = pair
    g = np.random.default_rng(SEED)
    ids = hf(text=[ours.prompt("What happens?", 0, 1)], videos=[clip(g, 6, 64, 96)])["input_ids"][0]
    starts, ends = ids.count(cfg.vision_start_token_id), ids.count(cfg.vision_end_token_id)
    found = P.installed_video_prompt()
    assert (starts, ends) == ((4, 4) if found == "outer" else (3, 3)), (transformers.__version__, found, starts)
    assert P.Processor(ours.tokenizer, cfg).video_prompt == found


@pytest.mark.parametrize("case", ["video", "video in the text", "bare video marker", "image and two videos"])
def test_processor_equals_hf(pair, case):
    "`Processor`'s ids, pixels and grids are the installed transformers'; the other convention's video ids aren't."
    ours, hf, cfg = pair
    g = np.random.default_rng(SEED)
    text, images, videos = {
        "video": ("Describe the clip.", [], [clip(g, 5, 40, 56)]),
        "video in the text": (f"Before {P.VIDEO_BLOCK} after.", [], [clip(g, 4, 48, 48)]),
        "bare video marker": ("Before <|video_pad|> after.", [], [clip(g, 3, 32, 64)]),
        "image and two videos": ("Both clips and the picture.", [clip(g, 1, 60, 44)[0]],
                                 [clip(g, 4, 64, 64), clip(g, 2, 32, 32)]),
    }[case]
    mine = ours(text, images=images, videos=[list(v) for v in videos])
    theirs = hf(text=[ours.prompt(text, len(images), len(videos))],
                images=[Image.fromarray(p) for p in images] or None, videos=videos, return_tensors="pt")
    assert sorted(mine) == sorted(k for k in theirs if k not in ("attention_mask", "mm_token_type_ids"))
    for k, v in mine.items():
        assert torch.equal(v, theirs[k][0] if k == "input_ids" else theirs[k]), (k, transformers.__version__, SEED)
    other = next(v for v in P.VIDEO_PROMPTS if v != P.installed_video_prompt())
    off = P.Processor(ours.tokenizer, cfg, IMAGE, VIDEO, video_prompt=other)(text, images=images,
                                                                            videos=[list(v) for v in videos])
    if "<|video_pad|>" in text and P.VIDEO_BLOCK not in text:   # a bare marker: both write the frames alone
        assert torch.equal(off["input_ids"], mine["input_ids"])
    else: assert len(off["input_ids"]) != len(mine["input_ids"])


def test_dataset_resumed_under_other_convention_refused(vocab_ckpt, tmp_path, monkeypatch):
    ("A video dataset records the transformers version and convention it was begun under, and is refused, in one "
     "line saying what to install, where a transformers of the other convention resumes it.")
    g = np.random.default_rng(SEED)
    frames = [Image.fromarray(f) for f in clip(g, 4, 32, 40)]
    frames[0].save(tmp_path / "clip.gif", save_all=True, append_images=frames[1:], duration=500)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(dict(id="v", text="The clip.", videos=["clip.gif"])) + "\n"
                       + json.dumps(dict(id="t", text="Words alone.")) + "\n")
    out, found = tmp_path / "out", P.installed_video_prompt()
    run = lambda: encode_dataset(vocab_ckpt, prompts, out, layer=3, max_pixels=4096, device="cpu", progress=False)
    assert run().status == "done"
    job, prov = (json.loads((out / f).read_text()) for f in ("job.json", "provenance.json"))
    assert (job["transformers"], job["video_prompt"]) == (transformers.__version__, found)
    assert (prov["transformers"], prov["video_prompt"]) == (transformers.__version__, found)
    other = next(v for v in P.VIDEO_PROMPTS if v != found)
    monkeypatch.setattr(P, "installed_video_prompt", lambda: other)   # a transformers of the other convention
    with pytest.raises(ValueError) as e:
        run()
    msg = str(e.value)
    assert "\n" not in msg and f"begun under transformers {transformers.__version__}" in msg, msg
    assert f"install a transformers that writes {P.VIDEO_PROMPTS[found]}" in msg and "--overwrite" in msg, msg
    monkeypatch.undo()
    assert run().status == "finished"   # under its own convention it is the same job
