#!/usr/bin/env bash
# Regenerates the spoken test clips of asr/tests/data (development only; the WAVs are
# committed). Needs espeak-ng and sox (Debian: apt-get install espeak-ng sox).
set -euo pipefail
cd "$(dirname "$0")/../asr/tests/data"
tmp=$(mktemp -d)
say() { # name, text
    espeak-ng -v en-us -s 130 -w "$tmp/$1.wav" "$2"
}
to16k() { sox "$tmp/$1.wav" -r 16000 -c 1 -b 16 "$1.wav"; }
say stop "stop"
say pick_blue_cup "now pick up the blue cup"
say red_block_bowl "put the red block in the bowl"
say open_drawer "open the top drawer"
say arm_left "move the arm to the left"
say wipe_table "wipe the table with the sponge"
say halt_now "halt now"
say screwdriver "hand me the screwdriver"
say fold_towel "fold the towel and place it on the shelf"
for c in stop pick_blue_cup red_block_bowl open_drawer arm_left wipe_table halt_now; do to16k "$c"; done
# Leading silence (1 s) and pink background noise under the whole clip.
sox "$tmp/screwdriver.wav" -r 16000 -c 1 "$tmp/sd16.wav" pad 1.0 0.3
len=$(soxi -D "$tmp/sd16.wav")
sox -n -r 16000 -c 1 "$tmp/noise.wav" synth "$len" pinknoise vol 0.06
sox -m "$tmp/sd16.wav" "$tmp/noise.wav" -b 16 screwdriver_noisy.wav
# 48 kHz stereo (the resampler and the down-mix are exercised).
sox "$tmp/fold_towel.wav" -r 48000 -c 2 -b 16 fold_towel_48k_stereo.wav
rm -rf "$tmp"
ls -la *.wav
