#!/bin/bash
# studies/depth.py end to end at the paper's width (d_model 768, 12 heads x 64, n_ctx 1024) on a GPU:
# 1-4 layers x 3 seeds, each trained alone, then term importance of every model and the table.
#   bash studies/depth_gpu.sh OUT_DIR                       # on a lent GPU
#   WIDTH=tiny DEVICE=cpu bash studies/depth_gpu.sh /tmp/x  # the same steps on the CPU, in seconds
# STEPS overrides the recipe's steps; SEEDS and DEPTHS the models trained.
set -euo pipefail
out=${1:?usage: depth_gpu.sh OUT_DIR}
width=${WIDTH:-paper}
device=${DEVICE:-cuda}
python=${PYTHON:-.venv/bin/python}
steps=${STEPS:+--steps $STEPS}
mkdir -p "$out"
for seed in ${SEEDS:-0 1 2}; do
    for layers in ${DEPTHS:-1 2 3 4}; do
        [ -f "$out/L$layers-s$seed/model.safetensors" ] && continue  # a rerun resumes
        "$python" studies/depth.py train --layers "$layers" --seed "$seed" --out "$out/L$layers-s$seed" \
            --width "$width" --device "$device" $steps
    done
done
rm -f "$out/measured.jsonl"
"$python" studies/depth.py measure "$out"/L*-s* --out "$out/measured.jsonl" --device "$device"
"$python" studies/depth.py table "$out/measured.jsonl" --figure "$out/depth.svg" | tee "$out/table.md"
