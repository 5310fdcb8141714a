"""The copy engine's timeline of a model load: every host-to-device copy with its start and end on the GPU (issue 17).

Loads a model directory with `ckptio.load(DIR, device="cuda:0")` in a fresh process under torch.profiler, whose
CUPTI activity records every copy the process queues (ckptio's own included, though they are not torch's), then a
second load into the blocks torch's allocator kept, and prints one JSON line: per load the GB/s of the call, the
copies' span (first start to last end), the time some copy was running (busy) and the gaps, the GB/s of each 10 ms
slice, each copy's own rate in the first 30 ms and after, and the GB moved by 5, 10, 20 and 30 ms. With OUTDIR it
also writes each load's copies as CSV (start_us from the first copy, dur_us, bytes, stream):

    python3 bench/probe_copy_timeline.py DIR [OUTDIR TAG]

Seen on an H200 (BENCHMARKS.md "A first load's copies on the GPU's clock"): a process's first load starts its 16
workers' copies over 7-13 ms, one slot registration apart, where a second load starts them within 1.7 ms; the
copies themselves, 4 MiB each, take 78-79 us with 2.7 us between them in both. The profiler adds to the call's
time: compare variants under it, not against unprofiled runs.
"""
import csv
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import ckptio


def copies_of(trace_path):
    """(start_us, dur_us, bytes, stream) of each host-to-device copy in a chrome trace, by start."""
    with open(trace_path) as fh:
        events = json.load(fh)["traceEvents"]
    out = [(e["ts"], e["dur"], int(e.get("args", {}).get("bytes", 0)), e.get("args", {}).get("stream", -1))
           for e in events if e.get("ph") == "X" and "Memcpy HtoD" in e.get("name", "")]
    out.sort()
    return out


def summarize(copies):
    if not copies:
        return {"copies": 0}
    t0 = copies[0][0]
    end = max(s + d for s, d, _, _ in copies)
    busy, run_s, run_e, gaps = 0.0, None, None, []
    for s, d, _, _ in copies:  # the union of the copies' intervals; the holes between them
        if run_e is None:
            run_s, run_e = s, s + d
        elif s > run_e:
            busy += run_e - run_s
            gaps.append(s - run_e)
            run_s, run_e = s, s + d
        else:
            run_e = max(run_e, s + d)
    busy += run_e - run_s
    nbytes = sum(b for _, _, b, _ in copies)
    slices = {}
    for s, _, b, _ in copies:
        slices[int((s - t0) / 10000)] = slices.get(int((s - t0) / 10000), 0) + b

    def own_rate(part):  # bytes over the copies' summed durations (GB/s)
        d = sum(c[1] for c in part)
        return round(sum(c[2] for c in part) / d / 1e3, 2) if d else None

    first_per_stream = {}
    for s, _, _, st in copies:
        first_per_stream.setdefault(st, s - t0)
    return {"copies": len(copies), "bytes": nbytes, "span_ms": round((end - t0) / 1e3, 2),
            "busy_ms": round(busy / 1e3, 2), "gap_ms": round(sum(gaps) / 1e3, 3),
            "GBps_over_span": round(nbytes / (end - t0) / 1e3, 2),
            "per_10ms_GBps": [round(slices.get(k, 0) / 1e7, 1) for k in range(max(slices) + 1)],
            "copy_rate_first30ms": own_rate([c for c in copies if c[0] - t0 < 30000]),
            "copy_rate_rest": own_rate([c for c in copies if c[0] - t0 >= 30000]),
            "GB_by_ms": {t: round(sum(b for s, d, b, _ in copies if s + d - t0 <= t * 1000) / 1e9, 3)
                         for t in (5, 10, 20, 30)},
            "streams_started_ms": sorted(round(v / 1e3, 2) for v in first_per_stream.values())}


def main():
    d = sys.argv[1]
    outdir = sys.argv[2] if len(sys.argv) > 2 else None
    tag = sys.argv[3] if len(sys.argv) > 3 else "load"
    torch.zeros(1, device="cuda:0")  # CUDA initialised before the clock, as bench_model_gpu.py FIRST=1 does
    torch.cuda.synchronize()
    res = {"tag": tag}
    scratch = outdir or os.environ.get("TMPDIR", "/tmp")
    for which in ("first", "second"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            sd = ckptio.load(d, device="cuda:0")
            torch.cuda.synchronize()
            secs = time.perf_counter() - t
        nbytes = sum(v.numel() * v.element_size() for v in sd.values())
        path = os.path.join(scratch, f"trace_{tag}_{which}.json")
        prof.export_chrome_trace(path)
        copies = copies_of(path)
        if outdir:
            with open(os.path.join(outdir, f"copies_{tag}_{which}.csv"), "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["start_us", "dur_us", "bytes", "stream"])
                for s, du, b, st in copies:
                    w.writerow([f"{s - copies[0][0]:.3f}", f"{du:.3f}", b, st])
        os.remove(path)
        res[which] = {"GBps": round(nbytes / secs / 1e9, 2), "s": round(secs, 4), **summarize(copies)}
        del sd  # the second load gets torch's cached blocks back
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
