#!/usr/bin/env bash
# The GPU checks, for a session lent a device (`run` of the device tool, from the repository root):
# tests/test_cuda.py, the training scan and the pair map at GPT-2-small shape, on the GPU. The device image has
# PyTorch but not TransformerLens 3.x, plotly, datasets and the rest: they travel as .devdeps/deps.tar.xz, a tar
# of this checkout's site-packages folders of them (pure Python), unpacked to /tmp/deps. Build it here first:
#   mkdir -p .devdeps && echo .devdeps/ >> .git/info/exclude && cd .venv/lib/python3.11/site-packages &&
#   tar --exclude=__pycache__ -cf - $(ls -d transformer_lens* datasets* dill* multiprocess* _multiprocess* beartype* \
#     typeguard* better_abc* fancy_einsum* transformers_stream_generator* plotly* _plotly_utils* narwhals* shapiq* \
#     circuitsvis*) | xz -T2 -6 > ../../../../.devdeps/deps.tar.xz
# then run `bash benchmarks/gpu_checks.sh` on the device with carry [".devdeps"].
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p /tmp/deps "$OUT" && tar -xJf .devdeps/deps.tar.xz -C /tmp/deps
export PYTHONPATH=/tmp/deps:$PWD HEADCOOP_PROGRESS=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import sys, torch, transformer_lens, headcoop; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())" 2>&1 | tail -3 | tee -a "$OUT/gpu.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts= tests/test_cuda.py 2>&1 | tail -15 | tee "$OUT/cuda_tests.txt"
timeout 60 python3 benchmarks/training.py --device cuda --scan --scan-max 1024 2>&1 | tail -15 | tee "$OUT/training.txt"
timeout 300 python3 benchmarks/pair_map.py --layers 12 --device cuda --budget-mb 16384 --json "$OUT/pair_map.json" 2>&1 \
  | grep -v "^hc\." | tail -8 | tee "$OUT/pair_map.txt"
