#!/usr/bin/env bash
# Build the Cython kernels (_ext/*.pyx) with AddressSanitizer + UBSan into a separate tree that
# shadows the package through PYTHONPATH; the normal rowstore/_*.so are never touched.
#
#   scripts/build_sanitized.sh asan    # -> build/asan/rowstore: clang -fsanitize=address,undefined
#   scripts/build_sanitized.sh fuzz    # -> build/fuzz/rowstore: the same + -fsanitize=fuzzer-no-link
#                                      #    (libFuzzer edge/cmp coverage for atheris)
#
# build/<kind>/rowstore holds the sanitized extension modules and a symbolic link to every other
# entry of rowstore/ (the Python sources stay those of this checkout). Use it with
#   PYTHONPATH=build/<kind>:$PWD LD_PRELOAD=$(scripts/build_sanitized.sh --runtime) python ...
# (python itself is not instrumented, so the ASan runtime must be loaded first); see
# tools/robustness/asan_check.py, which does that, and docs/reliability.md ("How to run").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
CC=${CC:-clang}

if [[ "${1:-}" == "--runtime" ]]; then  # the ASan runtime (with UBSan's handlers) to LD_PRELOAD
    "$CC" -print-file-name=libclang_rt.asan-x86_64.so
    exit 0
fi
kind=${1:-asan}
case "$kind" in
    asan) san="-fsanitize=address,undefined" ;;
    fuzz) san="-fsanitize=address,undefined,fuzzer-no-link" ;;
    *) echo "usage: $0 asan|fuzz|--runtime" >&2; exit 2 ;;
esac
command -v "$CC" >/dev/null || { echo "$0: $CC not found (apt-get install -y clang)" >&2; exit 1; }

out=build/$kind
# Up to date (every module newer than every kernel source)? Then nothing to do; FORCE=1 rebuilds.
if [[ -z "${FORCE:-}" ]] && [[ $(ls "$out"/rowstore/*.so 2>/dev/null | wc -l) -eq $(ls _ext/*.pyx | wc -l) ]]; then
    oldest=$(ls -t "$out"/rowstore/*.so | tail -1)
    if [[ -z $(find _ext setup.py -newer "$oldest" \( -name '*.pyx' -o -name '*.pxd' -o -name setup.py \)) ]]; then
        echo "$kind build up to date in $out/rowstore"; exit 0
    fi
fi
# -g: file:line in reports; -fno-sanitize-recover: the first UBSan finding aborts (with
# UBSAN_OPTIONS=halt_on_error=1 it would anyway); -fno-sanitize=function,vptr: C only.
flags="$san -fno-omit-frame-pointer -fno-sanitize-recover=all -g -O1"
export CC LDSHARED="$CC -shared" CFLAGS="$flags" LDFLAGS="$san"
# (setup.py's -O3 comes after CFLAGS and wins: the kernels are checked as optimized.)
"$PY" setup.py -q build_ext --build-lib "$out" --build-temp "$out/tmp" --force
mkdir -p "$out/rowstore"
for entry in rowstore/*; do
    name=$(basename "$entry")
    case "$name" in *.so|__pycache__) continue ;; esac
    ln -sfn "$ROOT/$entry" "$out/rowstore/$name"
done
echo "$kind build: $(ls "$out"/rowstore/*.so | wc -l) sanitized modules in $out/rowstore ($flags)"
