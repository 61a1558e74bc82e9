"""Run the fuzz corpus and the kernel tests through the ASan + UBSan build.

    python tools/robustness/asan_check.py [--cases 300] [--seed 0] [--out
    bench/results/asan_check.json]

Builds ``build/asan`` first if it is missing (``scripts/build_sanitized.sh asan``: clang
``-fsanitize=address,undefined -fno-omit-frame-pointer``; the normal ``rowstore/_*.so`` are not
touched), then runs, each in a subprocess with the sanitized modules first on ``PYTHONPATH``
(and its working directory, since ``python -m`` puts the working directory first), the ASan
runtime in ``LD_PRELOAD`` (python itself is not instrumented), ``ASAN_OPTIONS=detect_leaks=0:
abort_on_error=1:allocator_may_return_null=1:max_allocation_size_mb=4096`` and
``UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1``, reports written under ``--logs``:

1. a check that the sanitized modules and the runtime are what got loaded;
2. ``tools/robustness/fuzz.py --replay`` of the committed reproducers (``tests/data/fuzz``);
3. ``tools/robustness/fuzz_atheris.py --replay`` of the committed atheris corpus and crashers
   (``tests/data/atheris``); ``tools/robustness/audio_fuzz.py --replay`` of the hostile audio
   corpus (``tests/data/fuzz/audio``) and ``10 * --cases`` new mutated FLAC/WAV values;
4. ``--cases`` new cases of ``tools/robustness/fuzz.py`` (file regions, ``all``) and as many of its
   dataset regions (``datasets``); ``RLIMIT_AS`` is off (ASan reserves terabytes of shadow
   memory), ``max_allocation_size_mb`` bounds single allocations instead;
5. pytest on the kernel-heavy tests (``KERNEL_TESTS``).

Every sanitizer report is read back and classified: a report with a frame in rowstore's
extension modules is a kernel finding (exit status 1); others (libhdf5's known crash on damaged
metadata, see ``tests/data/fuzz/README.md``) are listed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build", "asan")
PY = sys.executable

KERNEL_TESTS = (
    "tests/kernels/test_kernels.py",
    "tests/format/test_limits.py",
    "tests/writer/test_bad_input.py",
    "tests/format/test_hostile_metadata.py",
    "tests/reader/test_default_integrity.py",
    "tests/robustness/test_fuzz_atheris.py",
    "tests/codecs/test_compression.py",
    "tests/kernels/test_png_kernel.py",
    "tests/kernels/test_jpeg_kernel.py",
    "tests/writer/test_encoded_images.py",
    "tests/writer/test_write_fast.py",
    "tests/kernels/test_audio_kernel.py",
    "tests/codecs/test_audio.py",
)


def runtime() -> str:
    out = subprocess.run(
        [os.path.join(ROOT, "scripts", "build_sanitized.sh"), "--runtime"],
        capture_output=True,
        text=True,
        check=True,
    )
    path = out.stdout.strip()
    if not os.path.exists(path):
        raise SystemExit(f"ASan runtime {path!r} not found (apt-get install -y clang)")
    return path


def sanitized_env(logs: str) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([BUILD, ROOT]),
            "LD_PRELOAD": runtime(),
            "ASAN_OPTIONS": (
                "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:max_allocation_size_mb=4096:"
                f"handle_segv=1:log_path={logs}/asan:log_exe_name=1"
            ),
            "UBSAN_OPTIONS": f"halt_on_error=1:print_stacktrace=1:log_path={logs}/ubsan",
            "PYTHONFAULTHANDLER": "",
        }
    )
    return env


def _run(name: str, cmd: list[str], env: dict, timeout: float) -> dict:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            cwd=BUILD,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = (
            "timeout",
            (exc.stdout or b"").decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else str(exc.stdout or ""),
        )
    secs = round(time.monotonic() - t0, 1)
    print(f"[{name}] rc={rc} in {secs} s", file=sys.stderr)
    return {"step": name, "rc": rc, "seconds": secs, "tail": out[-3000:], "_out": out}


def _outcomes(text: str) -> dict:
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                o = json.loads(line)["outcome"]
            except (ValueError, KeyError):
                continue
            counts[o] = counts.get(o, 0) + 1
    return counts


_FRAME = re.compile(r"^\s*#\d+ 0x[0-9a-f]+ in (\S+) (.*)$", re.M)


def reports(logs: str) -> list[dict]:
    out = []
    for path in sorted(glob.glob(os.path.join(logs, "*"))):
        with open(path, errors="replace") as fh:
            text = fh.read()
        head = next(
            (ln for ln in text.splitlines() if "ERROR:" in ln or "runtime error:" in ln), text[:200]
        )
        frames = _FRAME.findall(text)
        kernel = any("/rowstore/_" in where or "_ext/" in where for _, where in frames)
        out.append(
            {
                "file": os.path.basename(path),
                "summary": head.strip()[:300],
                "kernel": kernel,
                "frames": [f"{fn} {where}" for fn, where in frames[:8]],
            }
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cases", type=int, default=300, help="new tools/robustness/fuzz.py cases per target kind"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build", action="store_true", help="rebuild build/asan even if present")
    ap.add_argument("--logs", default=os.path.join(BUILD, "logs"))
    ap.add_argument("--out", default="bench/results/asan_check.json")
    ap.add_argument("--skip-tests", action="store_true")
    args = ap.parse_args(argv)
    if args.build or not glob.glob(os.path.join(BUILD, "rowstore", "_frame*.so")):
        subprocess.run([os.path.join(ROOT, "scripts", "build_sanitized.sh"), "asan"], check=True)
    logs = os.path.abspath(args.logs)
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs)
    env = sanitized_env(logs)
    steps = []
    t0 = time.monotonic()
    probe = (
        "import rowstore, rowstore._frame as f, rowstore._gather as g; "
        "maps = open('/proc/self/maps').read(); "
        "assert '/build/asan/' in f.__file__ and '/build/asan/' in g.__file__, (f.__file__, "
        "g.__file__); "
        "assert 'libclang_rt.asan' in maps, 'ASan runtime not loaded'; print('sanitized:', "
        "f.__file__)"
    )
    steps.append(_run("probe", [PY, "-c", probe], env, 120))
    if steps[-1]["rc"] != 0:
        print(steps[-1]["tail"], file=sys.stderr)
        return 1
    fuzz = os.path.join(ROOT, "tools", "robustness", "fuzz.py")
    repro = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "fuzz", "*.h5.gz")))
    if repro:
        s = _run(
            "fuzz-replay",
            [PY, fuzz, "--replay", *repro, "--mem-gib", "0", "--timeout", "10"],
            env,
            60 + 15 * len(repro),
        )
        s["outcomes"] = _outcomes(s["_out"])
        steps.append(s)
    atheris_data = os.path.join(ROOT, "tests", "data", "atheris")
    targets = [
        d
        for d in (os.path.join(atheris_data, "corpus"), os.path.join(atheris_data, "crashers"))
        if os.path.isdir(d)
    ]
    if targets:
        s = _run(
            "atheris-replay",
            [
                PY,
                os.path.join(ROOT, "tools", "robustness", "fuzz_atheris.py"),
                "--replay",
                *targets,
            ],
            env,
            1200,
        )
        try:
            s["replay"] = json.loads(s["_out"][s["_out"].index("{\n") :])
        except ValueError:
            pass
        steps.append(s)
    audio_fuzz = os.path.join(ROOT, "tools", "robustness", "audio_fuzz.py")
    hostile = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "fuzz", "audio", "*.*[cv]")))
    if hostile:  # the audio kernel: the hostile corpus, then new mutated FLAC/WAV values
        steps.append(_run("audio-replay", [PY, audio_fuzz, "--replay", *hostile], env, 600))
        audio_out = os.path.join(BUILD, "audio-fuzz-cases")
        steps.append(
            _run(
                "audio-fuzz",
                [PY, audio_fuzz, "--cases", str(10 * args.cases), "--seed", str(args.seed),
                 "--timeout", "20", "--out", audio_out],
                env,
                20 * args.cases + 600,
            )
        )  # fmt: skip
    for region in ("all", "datasets"):
        out = os.path.join(logs, f"fuzz-{region}.json")
        s = _run(
            f"fuzz-{region}",
            [
                PY,
                fuzz,
                "--cases",
                str(args.cases),
                "--region",
                region,
                "--seed",
                str(args.seed),
                "--mem-gib",
                "0",
                "--out",
                out,
                "--cases-dir",
                os.path.join(BUILD, "fuzz-cases"),
                "--quiet",
            ],
            env,
            40 * args.cases + 120,
        )
        if os.path.exists(out):
            with open(out) as fh:
                s["by_outcome"] = json.load(fh)["by_outcome"]
            os.remove(out)
        steps.append(s)
    if not args.skip_tests:
        tests = [
            os.path.join(ROOT, t) for t in KERNEL_TESTS if os.path.exists(os.path.join(ROOT, t))
        ]
        s = _run(
            "pytest",
            [
                PY,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:xdist",
                "--rootdir",
                ROOT,
                "-c",
                os.path.join(ROOT, "pyproject.toml"),
                *tests,
            ],
            env,
            1800,
        )
        s["summary"] = next(
            (ln for ln in reversed(s["tail"].splitlines()) if " passed" in ln or " failed" in ln),
            None,
        )
        steps.append(s)
    found = reports(logs)
    kernel = [r for r in found if r["kernel"]]
    report = {
        "seconds": round(time.monotonic() - t0, 1),
        "cases": args.cases,
        "seed": args.seed,
        "steps": steps,
        "sanitizer_reports": found,
        "kernel_findings": len(kernel),
    }
    for st in report["steps"]:
        st.pop("_out", None)
        if st["rc"] == 0 and st["step"] != "pytest":
            st["tail"] = st["tail"][-400:]
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    for st in steps:
        extra = (
            st.get("outcomes")
            or st.get("by_outcome")
            or st.get("summary")
            or (st.get("replay") or {}).get("by_outcome")
        )
        print(f"{st['step']:16s} rc={st['rc']} {st['seconds']:7.1f} s  {extra or ''}")
    print(f"sanitizer reports: {len(found)} ({len(kernel)} in rowstore's kernels)")
    for r in found:
        print(
            f"  {'KERNEL ' if r['kernel'] else ''}{r['summary']}\n    "
            + "\n    ".join(r["frames"][:4])
        )
    failed = [
        st["step"]
        for st in steps
        if st["step"] in ("probe", "pytest", "atheris-replay") and st["rc"] != 0
    ]
    return 1 if kernel or failed else 0


if __name__ == "__main__":
    sys.exit(main())
