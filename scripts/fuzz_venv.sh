#!/usr/bin/env bash
# A separate venv for the coverage-guided fuzzer: .fuzz-venv/ (git-ignored) with atheris 3.0.0
# and, through a .pth file, the packages of the project's .venv (numpy, h5py, blosc2, ...), so
# nothing is installed into .venv and nothing is installed twice. Idempotent.
#
#   scripts/fuzz_venv.sh            # then: .fuzz-venv/bin/python tools/robustness/fuzz_atheris.py ...
#   ATHERIS_WHEEL=/path/atheris-3.0.0-cp311-...whl scripts/fuzz_venv.sh   # offline
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE_VENV:-.venv}
VENV=${FUZZ_VENV:-.fuzz-venv}
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import atheris, numpy, h5py" 2>/dev/null; then
    exit 0
fi
base_py=$("$BASE/bin/python" -c "import sys; print(sys._base_executable)")
"$base_py" -m venv "$VENV"
site=$("$BASE/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
own=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$site" > "$own/_rowstore_base_venv.pth"
"$VENV/bin/python" -m pip install -q --no-deps "${ATHERIS_WHEEL:-atheris==3.0.0}"
"$VENV/bin/python" -c "import atheris, numpy, h5py; print('fuzz venv ready:', atheris.path())"
