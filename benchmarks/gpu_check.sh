#!/usr/bin/env bash
# One short GPU check of the learner (about 3-4 minutes on an H100/H200; every stage has its own timeout,
# 7.5 minutes in all at most): the GPU tests (with how close a replay of a recorded CUDA run comes to its
# checkpoints), then the 1.5B learner benchmark at 4096-token packed micro-batches, without and with
# activation checkpointing, and (optional) with flex attention.
# Needs no network, no vLLM, no pip.
#
#   bash benchmarks/gpu_check.sh            # results in $OUT (default: runs/gpu_check)
#
# Which python: the first of $PYTHON, python3, python, .venv/bin/python whose torch sees a CUDA device
# (the project's .venv usually holds the CPU build of torch). When that python lacks a pure-python
# dependency the .venv has (transformers, pytest, ...), the .venv's packages other than torch and its
# CUDA libraries are put on PYTHONPATH behind a directory of links, so the system torch stays the one used.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu_check}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
started=$(date +%s)
echo "gpu_check: $(date -u +%FT%TZ) in $(pwd), results in $OUT"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

probe='import torch; assert torch.cuda.is_available(); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
PY=""
for cand in "${PYTHON:-}" python3 python .venv/bin/python; do
    [ -n "$cand" ] && command -v "$cand" >/dev/null || continue
    if found=$("$cand" -c "$probe" 2>/dev/null); then PY=$(command -v "$cand"); echo "python: $PY (torch, cuda, gpu: $found)"; break; fi
    echo "python: $cand has no CUDA torch ($("$cand" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1))"
done
if [ -z "$PY" ]; then
    echo '{"gpu_check": "failed", "reason": "no python with a CUDA build of torch that sees a GPU"}' | tee "$OUT/summary.json"
    exit 1
fi

need="transformers safetensors numpy prometheus_client pytest aiohttp msgpack zmq tokenizers"
missing=$("$PY" -c "import importlib.util as u; print(' '.join(m for m in '$need'.split() if u.find_spec(m) is None))")
if [ -n "$missing" ] && [ -d .venv ]; then
    site=$(cd "$(ls -d .venv/lib/python3*/site-packages | head -1)" && pwd)
    work=$(mktemp -d)  # links, not results: kept out of $OUT
    shim="$work/venv-packages" && mkdir -p "$shim"
    for entry in "$site"/*; do
        case "$(basename "$entry")" in
            torch|torch-*|torchgen|functorch|triton|triton-*|nvidia|nvidia_*|_distutils_hack|*.pth) ;;
            *) ln -s "$entry" "$shim/" ;;
        esac
    done
    # appended after the system's site-packages (sitecustomize runs once they are on sys.path), so the
    # system's own packages, torch above all, win and the .venv only fills the gaps
    mkdir -p "$work/pyshim" && echo "import sys; sys.path.append('$shim')" > "$work/pyshim/sitecustomize.py"
    export PYTHONPATH="$work/pyshim${PYTHONPATH:+:$PYTHONPATH}"
    echo "python lacks: $missing; appending the .venv's packages (without torch) from $site"
fi
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'EOF' | tee "$OUT/environment.json"
import json, platform, torch, transformers
from transformers.utils import is_flash_attn_2_available
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                  "gpu": torch.cuda.get_device_name(0), "transformers": transformers.__version__,
                  "flash_attn_2": is_flash_attn_2_available(), "bf16": torch.cuda.is_bf16_supported()}))
EOF

status=0
echo "== GPU tests (tests/gpu, marker gpu) =="
timeout 150 "$PY" -m pytest tests/gpu -m gpu -rs -q -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" \
    | tee "$OUT/gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}
[ "$tests_rc" -eq 0 ] || status=1

bench() {  # name, seconds, required (1: a failure fails the check), extra args
    local name=$1 limit=$2 required=$3; shift 3
    echo "== bench $name =="
    timeout "$limit" "$PY" -m turnstream.cli bench learner --model-config 1.5b --device cuda --seq-len 4096 \
        --microbatches 8 --steps 5 "$@" | tee "$OUT/bench_$name.txt"
    local rc=${PIPESTATUS[0]}
    tail -n 1 "$OUT/bench_$name.txt" > "$OUT/bench_$name.json"
    [ "$rc" -eq 0 ] || [ "$required" -eq 0 ] || status=1
}
bench 1.5b 120 1
bench 1.5b_checkpointing 90 1 --checkpointing
# optional: flex attention skips the masked-out blocks of a packed row (sdpa computes the full square);
# its first call compiles kernels, so it may not fit the time limit
bench 1.5b_flex 90 0 --attn flex_attention

"$PY" - "$OUT" "$tests_rc" "$(( $(date +%s) - started ))" <<'EOF' | tee "$OUT/summary.json"
import json, sys
import xml.etree.ElementTree as ET
out, tests_rc, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
summary = {"gpu_check": "done", "tests_rc": tests_rc, "wall_s": wall}
try:  # the replay test's figures (record_property), by case: default kernels and deterministic
    cases = ET.parse(f"{out}/gpu_tests.xml").iter("testcase")
    summary["replay"] = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
                         for c in cases if "cuda_replay" in c.get("name", "")}
except (OSError, ET.ParseError) as exc:
    summary["replay"] = f"no result: {exc!r}"
for name in ("1.5b", "1.5b_checkpointing", "1.5b_flex"):
    try:
        r = json.load(open(f"{out}/bench_{name}.json"))
        summary[name] = {k: r[k] for k in ("tokens_per_s", "step_s", "mfu", "achieved_tflops", "peak_memory_gib",
                                           "attn_implementation", "device")}
    except (OSError, ValueError, KeyError) as exc:
        summary[name] = f"no result: {exc!r}"
print(json.dumps(summary))
EOF
exit $status
