"""Regenerates vla/tests/data/preprocess.json and resize_240x320.bin (development only).

Reference values from independent implementations: jax.image.resize (linear, antialiased)
inside the resize-with-pad geometry openpi uses (aspect kept, padding split evenly, uint8
rounded and clipped), and numpy.digitize for the 256-bin state discretization.

    /tmp/fw/bin/pip install "jax[cpu]" && /tmp/fw/bin/python scripts/vla-references.py
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

out_dir = os.path.join(os.path.dirname(__file__), "..", "vla", "tests", "data")


def image(h, w, seed):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    # Smooth gradients plus noise, so interpolation errors would show.
    yy, xx = np.mgrid[0:h, 0:w]
    grad = ((yy * 255 // max(h - 1, 1) + xx * 128 // max(w - 1, 1)) % 256).astype(np.uint8)
    return ((base.astype(np.int32) + grad[..., None]) // 2).astype(np.uint8)


def resize_with_pad(img, height, width):
    cur_h, cur_w = img.shape[:2]
    ratio = max(cur_w / width, cur_h / height)
    rh, rw = int(cur_h / ratio), int(cur_w / ratio)
    resized = jax.image.resize(jnp.asarray(img)[None], (1, rh, rw, 3), method=jax.image.ResizeMethod.LINEAR)[0]
    resized = np.asarray(jnp.round(resized).clip(0, 255).astype(jnp.uint8))
    ph0, rem_h = divmod(height - rh, 2)
    pw0, rem_w = divmod(width - rw, 2)
    return np.pad(resized, ((ph0, ph0 + rem_h), (pw0, pw0 + rem_w), (0, 0)), constant_values=0)


cases = []
for (h, w, th, tw, seed) in [(48, 64, 32, 32, 1), (20, 10, 32, 32, 2), (31, 31, 32, 32, 3), (32, 32, 32, 32, 4), (7, 300, 24, 40, 5)]:
    src = image(h, w, seed)
    cases.append({"h": h, "w": w, "target": [th, tw], "seed": seed, "src": src.flatten().tolist(), "out": resize_with_pad(src, th, tw).flatten().tolist()})
big = image(240, 320, 9)
with open(os.path.join(out_dir, "resize_240x320.bin"), "wb") as f:
    f.write(big.tobytes())
    f.write(resize_with_pad(big, 224, 224).tobytes())
state = np.array([-1.5, -1.0, -0.999, -0.5, 0.0, 0.0039, 0.5, 0.992, 0.99219, 0.9922, 1.0, 1.7], dtype=np.float32)
bins = np.linspace(-1, 1, 256 + 1)[:-1]
with open(os.path.join(out_dir, "preprocess.json"), "w") as f:
    json.dump({
        "jax": jax.__version__, "numpy": np.__version__,
        "resize_with_pad": cases,
        "resize_240x320": {"src": [240, 320, 3], "out": [224, 224, 3], "file": "resize_240x320.bin"},
        "digitize": {"state": state.tolist(), "bins": (np.digitize(state, bins=bins) - 1).tolist()},
    }, f)
print("ok", [c["out"][:6] for c in cases])
