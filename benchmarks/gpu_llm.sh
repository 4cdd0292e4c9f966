#!/usr/bin/env bash
# One command for a lent GPU: calibrate the 1B- and 8B-shaped decoders in bf16 on CUDA and
# write their step profiles (commit them afterwards). About 6-8 minutes on an H200.
# Usage (on the device machine, from the repository root): bash benchmarks/gpu_llm.sh [OUT]
set -euo pipefail
out="${1:-${OUT:-calibration/profiles}}"
python3 -m pip install --quiet -e . >/dev/null
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
gpu="$(python3 -c "import torch; print(torch.cuda.get_device_name(0).split()[-1].lower())")"
for shape in 1b 8b; do
    servelab calibrate --model llm --device cuda --dtype bf16 --param shape="$shape" \
        --reps 5 --warmup 2 --out "$out/llm-$shape-$gpu.json"
done
