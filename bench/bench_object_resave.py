#!/usr/bin/env python3
"""bench_object_resave.py - successive saves to S3-compatible storage from one process through one engine (what a
training job does every N steps): the client CPU seconds per GB and GB/s of each save, the first one apart.

    eval "$(scripts/s3_server.sh start)"       # or any S3 endpoint: AWS_ENDPOINT_URL, AWS_* credentials
    CKPTIO_S3_SIGN_PAYLOAD=off python3 bench/bench_object_resave.py --size 256M --saves 4

Workloads (the same bytes each save, the same float32 tensors as bench_object_storage.py):
  model   4 safetensors shards under a new prefix, one ckptio.save after another
  dcp     a DCP checkpoint under a new prefix (ckptio.dcp.FileSystemWriter, one process)
  dcp-plain  the same with a new FileSystemWriter(prefix) per save and no engine= (the writers' shared engine,
          docs/DCP.md "Engines")
model and dcp pass one ckptio.Engine to every save, as CheckpointManager does: the first save allocates the
upload part buffers, the later ones take them from the engine's pool (docs/OBJECT_STORAGE.md, 3.). Each save's objects are
deleted after it is measured. Prints one line per save; the summary is the median of the saves after the first.
Results: $OUT/object_resave.json (bench/_common.py).
"""
import argparse
import os
import resource
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="256M", help="bytes of tensor data per save (default 256M)")
    ap.add_argument("--saves", type=int, default=4, help="saves per workload (default 4)")
    ap.add_argument("--only", default="", help="model, dcp or dcp-plain (default all)")
    a = ap.parse_args()
    size = _common.parse_size(a.size)

    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed.checkpoint as dcp

    import ckptio
    from ckptio import _ckptio
    from ckptio.dcp import FileSystemWriter

    bucket = os.environ.get("CKPTIO_TEST_S3_BUCKET", "ckptio-test")
    g = torch.Generator().manual_seed(0)
    n = size // 4 // 16
    sd = {f"layer.{s}.{t}": torch.randn(n, generator=g) for s in range(4) for t in range(4)}
    names = sorted(sd)
    results = []
    for work in ("model", "dcp", "dcp-plain"):
        if a.only and a.only != work:
            continue
        engine = ckptio.Engine()
        rows = []
        for i in range(a.saves):
            prefix = f"s3://{bucket}/resave-{uuid.uuid4().hex[:8]}"
            c0, t0 = cpu_self(), time.perf_counter()
            if work == "model":
                for s in range(4):
                    ckptio.save({k: sd[k] for k in names[s * 4:(s + 1) * 4]}, f"{prefix}/model-{s + 1}.safetensors",
                                engine=engine)
            elif work == "dcp":
                dcp.save(sd, storage_writer=FileSystemWriter(prefix, engine=engine), no_dist=True)
            else:
                dcp.save(sd, storage_writer=FileSystemWriter(prefix), no_dist=True)
            wall, cpu = time.perf_counter() - t0, cpu_self() - c0
            rows.append({"save": i, "GBps": size / 1e9 / wall, "cpu_s_per_GB": cpu / (size / 1e9)})
            _common.log(work, rows[-1])
            for entry in _ckptio.object_list(prefix + "/"):
                _ckptio.object_delete(f"s3://{bucket}/{entry[0]}")
        later = rows[1:] or rows
        results.append({"work": work, "saves": rows,
                        "first_cpu_s_per_GB": rows[0]["cpu_s_per_GB"],
                        "later_cpu_s_per_GB": statistics.median(r["cpu_s_per_GB"] for r in later),
                        "later_GBps": statistics.median(r["GBps"] for r in later)})
        del engine
    for r in results:
        print(f"{r['work']:9s} first save {r['first_cpu_s_per_GB']:.2f} CPU s/GB; later saves (median) "
              f"{r['later_cpu_s_per_GB']:.2f} CPU s/GB, {r['later_GBps']:.3f} GB/s")
    meta = _common.machine()
    meta.update({"size": size, "saves": a.saves, "endpoint": os.environ.get("AWS_ENDPOINT_URL", ""),
                 "ckptio_sign_payload": os.environ.get("CKPTIO_S3_SIGN_PAYLOAD", "auto")})
    print("results:", _common.write_result("object_resave.json", meta, results))


if __name__ == "__main__":
    main()
