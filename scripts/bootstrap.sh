#!/usr/bin/env bash
# Idempotent set-up on a fresh clone: a venv in .venv with the pinned dependencies, and the
# Cython kernels built in place. Re-running only does what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV with $($PY --version)"
    "$PY" -m venv "$VENV"
fi

stamp="$VENV/.deps-$(cat requirements/dev.txt pyproject.toml setup.py | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "bootstrap: installing dependencies (requirements/dev.txt)"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -r requirements/dev.txt
    # Editable install for the console scripts; the kernels are rebuilt in place below.
    "$VENV/bin/python" -m pip install -q --no-build-isolation --no-deps -e .
    rm -f "$VENV"/.deps-*
    touch "$stamp"
fi

# The JPEG kernel (_ext/_jpeg.pyx) needs libjpeg-turbo's headers; installed here when we may
# (root with apt), else the kernel is not built and JPEG image ops decode through imagecodecs.
if [ ! -f /usr/include/jpeglib.h ] && [ ! -f /usr/local/include/jpeglib.h ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing libjpeg62-turbo-dev for the JPEG kernel"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q libjpeg62-turbo-dev >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libjpeg62-turbo-dev >/dev/null 2>&1; } \
            || echo "bootstrap: could not install libjpeg62-turbo-dev: no JPEG kernel (imagecodecs decodes)"
    else
        echo "bootstrap: no jpeglib.h: the JPEG kernel is not built (apt-get install libjpeg62-turbo-dev)"
    fi
fi
# The audio kernel (_ext/_audio.pyx) needs libFLAC's headers; installed here when we may (root
# with apt), else the kernel is not built and the flac/wav codecs decode through soundfile.
if [ ! -f /usr/include/FLAC/stream_decoder.h ] && [ ! -f /usr/local/include/FLAC/stream_decoder.h ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing libflac-dev for the audio kernel"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q libflac-dev >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libflac-dev >/dev/null 2>&1; } \
            || echo "bootstrap: could not install libflac-dev: no audio kernel (soundfile decodes)"
    else
        echo "bootstrap: no FLAC/stream_decoder.h: the audio kernel is not built (apt-get install libflac-dev)"
    fi
fi

# Rebuilds only kernels whose sources changed.
"$VENV/bin/python" setup.py -q build_ext --inplace 2>&1 | grep -vE "^(running|copying|skipping)|SetuptoolsDeprecationWarning|^\s*$|^\s*!!|^\s*\*+|Please|See https|^\s*\*\*\*" || true

# Spark tests (rowstore.spark) need Java 17; without it they skip.
command -v java >/dev/null 2>&1 || echo "bootstrap: no java found: the Spark tests will skip (apt-get install openjdk-17-jre-headless)"

# The fault-injection tests (tests/robustness/test_read_faults.py, test_write_faults.py) run their children
# under libfiu's fiu-run; installed here when we may (root with apt), else those tests skip.
if ! command -v fiu-run >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing libfiu (fiu-utils, libfiu-dev) for the fault-injection tests"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q fiu-utils libfiu-dev >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q fiu-utils libfiu-dev >/dev/null 2>&1; } \
            || echo "bootstrap: could not install libfiu: the fault-injection tests will skip"
    else
        echo "bootstrap: no fiu-run found: the fault-injection tests will skip (apt-get install fiu-utils libfiu-dev)"
    fi
fi
