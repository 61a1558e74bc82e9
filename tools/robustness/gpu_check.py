"""Check and measure rowstore.torch's CUDA path; prints one JSON object.

On a machine with CUDA:

- correctness: every batch ``BatchedDataLoader(device="cuda")`` yields (pinned ring + side
  stream, and the unpinned path) equals, once copied back, the host batch of the same epoch;
  fixed-shape fields, padded and nested variable-length fields, a transform; and a resume;
- host-to-device throughput of the loader (one epoch, rows/s and GB/s) beside the raw pinned
  ``copy_`` bandwidth and the CPU-only loader;
- overlap: a compute loop on the default stream per batch, against the loader copying on its
  side stream: ``overlap = (t_load + t_compute - t_both) / min(t_load, t_compute)`` (1 = the
  copies hide completely behind compute, 0 = they serialize).

Without CUDA it prints ``{"cuda": false, ...}`` with a "no CUDA" message and exits 0.

    python tools/robustness/gpu_check.py [--rows 400000] [--repeats 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import rowstore.torch as rst
from rowstore.demo import make_demo


def _sync() -> None:
    torch.cuda.synchronize()


def _host_ref(path: str, **kw) -> list[dict]:
    with rst.BatchedDataLoader(path, **kw) as dl:
        return [
            {
                k: (v.clone() if isinstance(v, torch.Tensor) and not v.is_nested else v)
                for k, v in b.items()
            }
            for b in dl
        ]


def _same(dev: dict, host: dict) -> str | None:
    """None when a device batch equals its host batch, else what differs."""
    if set(dev) != set(host):
        return f"keys {sorted(dev)} != {sorted(host)}"
    for k, h in host.items():
        d = dev[k]
        if isinstance(h, torch.Tensor):
            if not isinstance(d, torch.Tensor) or d.device.type != "cuda":
                return f"{k}: not a CUDA tensor ({type(d).__name__})"
            if h.is_nested:
                parts_d, parts_h = d.unbind(), h.unbind()
                if len(parts_d) != len(parts_h) or not all(
                    torch.equal(a.cpu(), b) for a, b in zip(parts_d, parts_h)
                ):
                    return f"{k}: nested values differ"
            elif d.dtype != h.dtype or d.shape != h.shape or not torch.equal(d.cpu(), h):
                return f"{k}: values differ"
        elif isinstance(h, list) and h and isinstance(h[0], torch.Tensor):
            if not all(torch.equal(a.cpu(), b) for a, b in zip(d, h)):
                return f"{k}: list values differ"
        elif d != h:
            return f"{k}: {d!r:.60} != {h!r:.60}"
    return None


def check_correctness(tiny: str, speech: str) -> dict:
    results = {}

    def norm(b):
        b["x"] = b["x"] * 2.0
        return b

    cases = {
        "tiny_pinned": (tiny, dict(batch_size=1000, seed=1)),
        "tiny_unpinned": (tiny, dict(batch_size=1000, seed=1, pin_memory=False)),
        "tiny_transform_full_shuffle": (
            tiny,
            dict(batch_size=777, seed=2, shuffle="full", transform=norm),
        ),
        "speech_padded": (speech, dict(batch_size=64, seed=3)),
        "speech_nested": (speech, dict(batch_size=64, seed=3, varlen="nested")),
        "speech_list": (speech, dict(batch_size=64, seed=3, varlen="list")),
    }
    for name, (path, kw) in cases.items():
        ref = _host_ref(path, **kw)
        bad = None
        n = 0
        with rst.BatchedDataLoader(path, device="cuda", **kw) as dl:
            for b, h in zip(dl, ref, strict=True):
                # The consumer's stream waits on the loader's event: use the tensors right away.
                bad = bad or _same(b, h)
                n += 1
        results[name] = {"batches": n, "ok": bad is None, **({"error": bad} if bad else {})}
    # resume on the device path: the rest of the epoch after 5 batches, same order
    kw = dict(batch_size=1000, seed=4)
    ref = _host_ref(tiny, **kw)
    dl = rst.BatchedDataLoader(tiny, device="cuda", **kw)
    it = iter(dl)
    for _ in range(5):
        next(it)
    state = dl.state_dict()
    dl.close()
    dl2 = rst.BatchedDataLoader(tiny, device="cuda", **kw)
    dl2.load_state_dict(state)
    rest = list(dl2)
    ok = len(rest) == len(ref) - 5 and all(_same(a, b) is None for a, b in zip(rest, ref[5:]))
    results["resume"] = {"ok": ok}
    return results


def measure_throughput(tiny: str, repeats: int) -> dict:
    out = {}
    # raw pinned host -> device bandwidth, 64 MiB
    nbytes = 64 << 20
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    _sync()
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        _sync()
        ts.append(time.perf_counter() - t0)
    out["raw_pinned_h2d_GBps"] = round(nbytes / statistics.median(ts) / 1e9, 2)

    for bs in (1024, 8192):
        res = {}
        for label, kw in (
            ("cpu", {}),
            ("cuda", {"device": "cuda"}),
            ("cuda_unpinned", {"device": "cuda", "pin_memory": False}),
        ):
            with rst.BatchedDataLoader(tiny, batch_size=bs, seed=0, **kw) as dl:
                ts = []
                for rep in range(repeats + 1):
                    dl.set_epoch(rep)
                    t0 = time.perf_counter()
                    rows = nbytes_epoch = 0
                    for b in dl:
                        rows += len(b["label"])
                        nbytes_epoch += sum(v.numel() * v.element_size() for v in b.values())
                    if kw:
                        _sync()
                    if rep:
                        ts.append(time.perf_counter() - t0)
            t = statistics.median(ts)
            res[label] = {
                "s": round(t, 4),
                "rows_per_s": round(rows / t),
                "GBps": round(nbytes_epoch / t / 1e9, 3),
            }
        out[f"batch_{bs}"] = res
    return out


def measure_overlap(patch: str, repeats: int) -> dict:
    """Big rows (~19 KB) so copies take real time; compute sized to about the copy time."""
    bs = 256
    a = torch.randn(2048, 2048, device="cuda")

    def compute(k: int) -> None:
        x = a
        for _ in range(k):
            x = torch.tanh(x @ a) * 0.01

    def epoch_load(dl, k: int | None) -> float:
        dl.set_epoch(0)
        _sync()
        t0 = time.perf_counter()
        for b in dl:
            if k:
                compute(k)
                b["foo"].add_(0)  # touch the batch on the default stream
        _sync()
        return time.perf_counter() - t0

    with rst.BatchedDataLoader(patch, batch_size=bs, seed=0, device="cuda", prefetch=4) as dl:
        nb = len(dl)
        epoch_load(dl, None)  # warm-up
        t_load = statistics.median(epoch_load(dl, None) for _ in range(repeats))
        # pick k so that compute per batch ~ load per batch
        _sync()
        t0 = time.perf_counter()
        compute(10)
        _sync()
        per10 = time.perf_counter() - t0
        k = max(1, int(round(10 * (t_load / nb) / max(per10, 1e-6))))

        def compute_only() -> float:
            _sync()
            t0 = time.perf_counter()
            for _ in range(nb):
                compute(k)
            _sync()
            return time.perf_counter() - t0

        t_comp = statistics.median(compute_only() for _ in range(repeats))
        t_both = statistics.median(epoch_load(dl, k) for _ in range(repeats))
    overlap = (t_load + t_comp - t_both) / min(t_load, t_comp)
    return {
        "batches": nb,
        "matmuls_per_batch": k,
        "t_load_s": round(t_load, 4),
        "t_compute_s": round(t_comp, 4),
        "t_both_s": round(t_both, 4),
        "overlap": round(overlap, 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rows", type=int, default=400_000, help="rows of the tiny demo (72-byte rows)"
    )
    ap.add_argument(
        "--patch-rows", type=int, default=4_000, help="rows of the patch demo (~19 KB rows)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--dir", default=None, help="where to write the demo files (default: a temp dir)"
    )
    args = ap.parse_args(argv)
    info = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if not torch.cuda.is_available():
        info["message"] = (
            "no CUDA: rowstore.torch's GPU path was not checked (CPU fallback is tested in "
            "tests/torch/test_torch.py)"
        )
        print(json.dumps(info))
        return 0
    info["device"] = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tiny = make_demo("tiny", os.path.join(tmp, "tiny.h5"), args.rows)
        speech = make_demo("speech", os.path.join(tmp, "speech.h5"), 600)
        patch = make_demo("patch", os.path.join(tmp, "patch.h5"), args.patch_rows)
        info["correctness"] = check_correctness(tiny, speech)
        info["ok"] = all(v["ok"] for v in info["correctness"].values())
        info["throughput"] = measure_throughput(tiny, args.repeats)
        info["overlap"] = measure_overlap(patch, args.repeats)
    print(json.dumps(info, indent=1))
    return 0 if info["ok"] else 1


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
