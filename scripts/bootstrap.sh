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

# apt_install WHAT CHECK PKG...: installs Debian packages when CHECK fails and we may (root with
# apt); else says what WHAT loses. Each package is optional: without it a kernel is not built or
# some tests skip.
apt_install() {
    local what=$1 check=$2
    shift 2
    eval "$check" && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing $* ($what)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1; } \
            || echo "bootstrap: could not install $*: without it, $what"
    else
        echo "bootstrap: not installed: $* (apt-get install $*): without it, $what"
    fi
}

# The JPEG kernel (_ext/_jpeg.pyx) needs libjpeg-turbo's headers; without them JPEG image ops
# decode through imagecodecs.
apt_install "no JPEG kernel (imagecodecs decodes)" \
    "[ -f /usr/include/jpeglib.h ] || [ -f /usr/local/include/jpeglib.h ]" libjpeg62-turbo-dev

# The audio kernel (_ext/_audio.pyx) needs libFLAC's headers; without them the flac/wav codecs
# decode through soundfile.
apt_install "no audio kernel (soundfile decodes)" \
    "[ -f /usr/include/FLAC/stream_decoder.h ] || [ -f /usr/local/include/FLAC/stream_decoder.h ]" libflac-dev

# Rebuilds only kernels whose sources changed.
"$VENV/bin/python" setup.py -q build_ext --inplace 2>&1 | grep -vE "^(running|copying|skipping)|SetuptoolsDeprecationWarning|^\s*$|^\s*!!|^\s*\*+|Please|See https|^\s*\*\*\*" || true

# Spark tests (rowstore.spark) need Java 17; without it they skip.
command -v java >/dev/null 2>&1 || echo "bootstrap: no java found: the Spark tests will skip (apt-get install openjdk-17-jre-headless)"

# The fault-injection tests (tests/robustness/test_read_faults.py, test_write_faults.py) run their
# children under libfiu's fiu-run.
apt_install "the fault-injection tests skip" "command -v fiu-run >/dev/null 2>&1" fiu-utils libfiu-dev

# The report and notebook-view tests (tests/inspect) open pages in Debian's headless Chromium.
apt_install "the report tests skip" "command -v chromium >/dev/null 2>&1" chromium
