#!/usr/bin/env bash
# Lance (pylance) in its own venv (.lance-venv) for bench/ingest_bench.py's peer writer: its
# pinned pyarrow must not touch the project's .venv. Idempotent; fails loudly (pip's message)
# when it cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.lance-venv
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q pylance==14.0.2 pyarrow numpy
"$VENV/bin/python" -c "import lance, pyarrow; print('lance', lance.__version__, 'pyarrow', pyarrow.__version__)"
