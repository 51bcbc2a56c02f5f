#!/usr/bin/env bash
# The tests, with all their set-up, on a Debian/Ubuntu machine with Rust (what CI runs through
# .ci/run): the system tools the tests use (a C compiler, nm, python3 with pip; installed with
# apt when missing), what they read (scripts/fetch-models.sh: Whisper tiny.en, a Gemma
# tokenizer, Cyclone DDS for Python, openpi-client, NVRTC, into .cache), then every test of the
# workspace with the pure-Rust DDS transport and its wire test against Cyclone DDS, the CUDA
# kernels compiled for every target architecture by that NVRTC (no GPU needed), and a type
# check of the ROS 2 (r2r) transport without ROS (it cannot link there).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cc >/dev/null 2>&1 || ! command -v nm >/dev/null 2>&1 \
    || ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends gcc libc6-dev binutils python3 python3-pip
fi

bash scripts/fetch-models.sh

cargo test --workspace --locked --features frt_robot_host/dds
LD_LIBRARY_PATH="$(pwd)/.cache/pip-nvrtc/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test -p frt-kernels --test targets --locked -- --ignored --nocapture
cargo check -p frt_robot_host --features ros2-doc-only --bins --locked
