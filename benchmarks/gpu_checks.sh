#!/bin/bash
# Every GPU check in one command, for a machine with one GPU (or two: GPUS=2), about 12 minutes:
#   bash benchmarks/gpu_checks.sh [LOG_DIR]
# or some of them: CHECKS="scale analyze" bash benchmarks/gpu_checks.sh
# 0. scale.py (scale): a random bf16 Llama at Llama-3.1-8B's shapes, sharded as Hugging Face writes
#    it, through `qkov analyze --weights-only --device cuda` (read layer by layer from the mapped
#    files): every step's time and peak GPU memory (the issue's target: 2 minutes), and
#    TransformerLens on the same GPU;
# 1. gpu_train.py: the paper-size 2-layer model on 20M tokens in bf16: tokens/s, MFU, peak memory,
#    the scores reached, torch.compile against eager (and with GPUS=2 the DDP speed-up);
# 2. analyze_device.py: `qkov analyze --device cuda` on GPT-2 small's shapes beside the CPU, every
#    number of the two results compared;
# 3. spectra_gpu.py: exact self_top1 of GPT-2 small's 144 heads;
# 4. `qkov reproduce --quick --device cuda`: every stage on the GPU, end to end.
# Each check has its own time limit and writes its log to LOG_DIR (default: gpu-checks).
set -u
cd "$(dirname "$0")/.."
LOGS=${1:-gpu-checks}
mkdir -p "$LOGS"
export PYTHONPATH="$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
started=$(date +%s)
step() { echo "== [$(( $(date +%s) - started )) s] $1"; }
quiet() { grep -v -E "Warning|^W[0-9]{4} |^\s*$"; }

python3 -c "import sys, torch
if not torch.cuda.is_available(): sys.exit('gpu_checks.sh: no CUDA device here')
print(torch.cuda.device_count(), 'x', torch.cuda.get_device_name(), 'torch', torch.__version__)" || exit 2
CHECKS=${CHECKS:-scale train analyze spectra reproduce}
wanted() { [[ " $CHECKS " == *" $1 "* ]]; }
if wanted scale; then
  step "scale.py --shape llama-3.1-8b --device cuda"
  timeout 420 python3 benchmarks/scale.py --shape llama-3.1-8b --device cuda --tl-timeout 120 2>&1 | quiet | tee "$LOGS/scale_8b.txt"
fi
if wanted train; then
  step "gpu_train.py"
  timeout 200 python3 benchmarks/gpu_train.py --tokens 20e6 --compile-steps 30 --gpus "${GPUS:-1}" 2>&1 | quiet | tee "$LOGS/gpu_train.txt"
fi
if wanted analyze; then
  step "analyze_device.py"
  timeout 240 python3 benchmarks/analyze_device.py --device cuda 2>&1 | quiet | tee "$LOGS/analyze_device.txt"
fi
if wanted spectra; then
  step "spectra_gpu.py"
  timeout 120 python3 benchmarks/spectra_gpu.py 2>&1 | quiet | tee "$LOGS/spectra_gpu.txt"
fi
if wanted reproduce; then
  step "qkov reproduce --quick --device cuda"
  timeout 120 python3 -m qkov reproduce --quick --device cuda --quiet --out "$LOGS/reproduce-quick" 2>&1 | quiet | tail -15 | tee "$LOGS/reproduce_quick.txt"
fi
step "done"
