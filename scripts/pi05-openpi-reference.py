"""Regenerates vla/tests/data/pi05_tiny_openpi.json, or pi0_tiny_openpi.json for a Pi0 checkpoint
(development only): actions of openpi's own PyTorch model
(`openpi.models_pytorch.pi0_pytorch.PI0Pytorch`, pi05=True or False as the checkpoint's
`config.json` says, float32) on the tiny configuration, with the weights frt's generator
writes and inputs defined by formulas that `vla/tests/openpi_reference.rs` computes the same
way.

openpi's PyTorch model needs transformers 4.53.2 with openpi's `transformers_replace` files
copied over it (openpi's install instructions), and an openpi source tree:

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.7.1 transformers==4.53.2 safetensors numpy
    cp -r $OPENPI/src/openpi/models_pytorch/transformers_replace/* \
        /tmp/ref/lib/python3.11/site-packages/transformers/
    cargo run --release -p frt-vla --example pi05-reference-checkpoint -- /tmp/pi05-tiny
    OPENPI=... /tmp/ref/bin/python scripts/pi05-openpi-reference.py /tmp/pi05-tiny
    cargo run --release -p frt-vla --example pi05-reference-checkpoint -- /tmp/pi0-tiny 7 pi0
    OPENPI=... /tmp/ref/bin/python scripts/pi05-openpi-reference.py /tmp/pi0-tiny

The tiny SigLIP (width 64, depth 2) is not one of the tower sizes openpi's PyTorch wrapper
hard-codes, so the vision config is set to the checkpoint's sizes when the PaliGemma model is
built; the language model and the expert use openpi's `dummy` Gemma variant, which is what
frt's tiny configuration is. Nothing else of openpi is changed.
"""
import dataclasses
import json
import math
import os
import sys
import types

import numpy as np
import safetensors.torch
import torch

ckpt = sys.argv[1]
cfg = json.load(open(os.path.join(ckpt, "config.json")))
PI05 = cfg.get("variant", "pi05") == "pi05"
sys.path.insert(0, os.path.join(os.environ["OPENPI"], "src"))


# openpi.models.gemma (JAX) is only asked for the variant's sizes; openpi.shared.image_tools
# (JAX) only for resizing, which 224×224 inputs never need. Both are given without JAX.
@dataclasses.dataclass
class GemmaSizes:
    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


def gemma_config(variant):
    assert variant == "dummy", variant
    e = cfg["expert"]
    assert cfg["llm"] == e, "the tiny configuration uses one Gemma size for both"
    return GemmaSizes(e["width"], e["depth"], e["mlp"], e["heads"], e["kv_heads"], e["head_dim"])


import openpi  # noqa: E402

openpi.models = types.ModuleType("openpi.models")
openpi.models.gemma = types.ModuleType("openpi.models.gemma")
openpi.models.gemma.get_config = gemma_config
sys.modules["openpi.models"] = openpi.models
sys.modules["openpi.models.gemma"] = openpi.models.gemma
sys.modules["openpi.shared.image_tools"] = types.ModuleType("openpi.shared.image_tools")

import openpi.models_pytorch.gemma_pytorch as gemma_pytorch  # noqa: E402
import openpi.models_pytorch.pi0_pytorch as pi0_pytorch  # noqa: E402

RealPaliGemma = gemma_pytorch.PaliGemmaForConditionalGeneration


def paligemma_with_checkpoint_sizes(config):
    s = cfg["siglip"]
    v = config.vision_config
    v.hidden_size, v.intermediate_size = s["width"], s["mlp"]
    v.num_hidden_layers, v.num_attention_heads = s["depth"], s["heads"]
    v.patch_size, v.image_size = s["patch"], s["image_size"]
    v.projection_dim = cfg["llm"]["width"]
    config.text_config.vocab_size = cfg["vocab"]
    config._vocab_size = cfg["vocab"]  # noqa: SLF001
    return RealPaliGemma(config=config)


gemma_pytorch.PaliGemmaForConditionalGeneration = paligemma_with_checkpoint_sizes


@dataclasses.dataclass
class ModelConfig:
    pi05: bool = PI05
    paligemma_variant: str = "dummy"
    action_expert_variant: str = "dummy"
    dtype: str = "float32"
    action_dim: int = cfg["action_dim"]
    action_horizon: int = cfg["action_horizon"]
    pytorch_compile_mode: object = None


model = pi0_pytorch.PI0Pytorch(ModelConfig()).eval()
state = safetensors.torch.load_file(os.path.join(ckpt, "model.safetensors"))
missing, unexpected = model.load_state_dict(state, strict=False)
# The expert's LM head and the language model's are never used by the policy.
missing = [m for m in missing if not m.endswith("lm_head.weight")]
assert not missing and not unexpected, (missing, unexpected)

# Inputs: formulas evaluated in f64 and rounded to f32 (the Rust test does the same).
size, views = cfg["siglip"]["image_size"], cfg["views"]
horizon, adim, max_len = cfg["action_horizon"], cfg["action_dim"], cfg["max_token_len"]


def image(view):
    y, x, c = np.meshgrid(np.arange(size), np.arange(size), np.arange(3), indexing="ij")
    v = 0.9 * np.sin(0.031 * x * (c + 1) + 0.017 * y * (view + 2) + 0.5 * c + 1.1 * view)
    return v.astype(np.float32)  # [h, w, c]


def robot_state(n, seed):
    """`n` normalized joint values, padded with zeros to action_dim (as openpi pads the state)."""
    i = np.arange(adim, dtype=np.float64)
    v = np.where(i < n, 0.8 * np.sin(0.7 * i + seed) - 0.1 * seed, 0.0)
    return v.astype(np.float32)


def noise(seed):
    i = np.arange(horizon * adim, dtype=np.float64)
    v = 1.3 * np.sin(0.37 * i + seed) + 0.4 * np.cos(0.11 * i * (seed + 1))
    return v.astype(np.float32).reshape(horizon, adim)


# Pi0.5 reads the state from its prompt tokens (the model is given zeros); Pi0 from the state
# input: `state_len` values, 0 for none.
CASES = [
    {"name": "all views, 10 tokens", "present": [True, True, True], "noise_seed": 1,
     "tokens": [2, 17, 99, 301, 5, 42, 7, 108, 900, 33], "state_len": 8},
    {"name": "second view missing, 25 tokens", "present": [True, False, True], "noise_seed": 2,
     "tokens": [(37 * k + 11) % cfg["vocab"] for k in range(25)], "state_len": adim},
    {"name": "first view only, 1 token", "present": [True, False, False], "noise_seed": 3,
     "tokens": [1000], "state_len": 0},
]
if PI05:
    for case in CASES:
        case["state_len"] = 0

keys = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
assert views == len(keys)
for case in CASES:
    tok = np.zeros((1, max_len), dtype=np.int64)
    tok[0, : len(case["tokens"])] = case["tokens"]
    mask = np.zeros((1, max_len), dtype=bool)
    mask[0, : len(case["tokens"])] = True
    obs = types.SimpleNamespace(
        images={k: torch.from_numpy(image(v)).permute(2, 0, 1)[None] for v, k in enumerate(keys)},
        image_masks={k: torch.tensor([p]) for k, p in zip(keys, case["present"])},
        state=torch.from_numpy(robot_state(case["state_len"], case["noise_seed"]))[None],
        tokenized_prompt=torch.from_numpy(tok),
        tokenized_prompt_mask=torch.from_numpy(mask),
        token_ar_mask=None,
        token_loss_mask=None,
    )
    with torch.no_grad():
        actions = model.sample_actions(torch.device("cpu"), obs, noise=torch.from_numpy(noise(case["noise_seed"]))[None])
    # 9 significant digits keep every f32 exactly.
    case["actions"] = [float(f"{a:.9g}") for a in actions[0].flatten().tolist()]
    print(case["name"], "| max |a|", max(abs(a) for a in case["actions"]))

name = "pi05_tiny_openpi.json" if PI05 else "pi0_tiny_openpi.json"
out = os.path.join(os.path.dirname(__file__), "..", "vla", "tests", "data", name)
with open(out, "w") as f:
    json.dump({
        "source": f"openpi PI0Pytorch (pi05={PI05}, float32), transformers 4.53.2 + openpi transformers_replace",
        "seed": 7,
        "cases": CASES,
    }, f)
print("wrote", out)
