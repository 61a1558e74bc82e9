#!/usr/bin/env bash
# FFCV in its own venv (.ffcv-venv) for the FFCV baselines of bench/jpeg_bench.py and
# bench/ingest_bench.py: FFCV needs numpy < 2 and numba, which must not touch the project's
# .venv. Its C extension finds libturbojpeg and OpenCV through pkg-config (apt, as root:
# libturbojpeg0-dev, libopencv-dev, pkg-config).
# Idempotent; fails loudly (pip's message) when it cannot be built.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.ffcv-venv
PY=${PYTHON:-python3}
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    pkgs="libturbojpeg0-dev libopencv-dev pkg-config"
    if ! dpkg -s $pkgs >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q $pkgs >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && \
                 DEBIAN_FRONTEND=noninteractive apt-get install -y -q $pkgs >/dev/null; }
    fi
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip wheel setuptools
# ffcv's setup.py imports numpy and finds libturbojpeg/opencv through pkg-config.
# From PyPI only (the one index these machines reach; a second index only stalls pip on timeouts).
"$VENV/bin/python" -m pip install -q "numpy<2" numba opencv-python-headless pillow tqdm psutil \
    terminaltables fastargs assertpy matplotlib pandas torch torchvision
"$VENV/bin/python" -m pip install -q --no-build-isolation ffcv==1.0.2
"$VENV/bin/python" -c "import ffcv, ffcv.fields.decoders; print('ffcv', ffcv.__version__)"
