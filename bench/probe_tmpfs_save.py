"""Saves to tmpfs by thread count: is a save to one in-memory file bound by the file, not by the threads?

Buffered writes to one file take its inode lock one at a time (tmpfs, and ext4 without O_DIRECT), so
the engine's writer threads may wait on each other while the kernel allocates and zeroes new pages.
This times `ckptio.save(sd, DIR/f.safetensors, engine=ckptio.Engine(threads=N))` for each N, rounds
alternating, after one save per engine outside the timing (its staging pinned), and a one-thread
`write()` of the same bytes from host memory as the ceiling of one writer.

    python3 bench/probe_tmpfs_save.py DIR          # prints one JSON line per save, then a summary
Env: SIZE_GIB (8), DEVICE (cuda:0, or cpu: tensors in host memory), THREADS (16,8,4,2,1), ROUNDS (2).
Each row: seconds, GB/s, CPU seconds of the process (user + system) and CPU s/GB; the first round's saves are
loaded back and compared (equal).
"""
import json
import os
import sys

import torch
from probe_first_save import timed, timed_save  # bench/ is the script's directory

DEV = os.environ.get("DEVICE", "cuda:0")
SIZE = int(float(os.environ.get("SIZE_GIB", "8")) * (1 << 30))
THREADS = [int(t) for t in os.environ.get("THREADS", "16,8,4,2,1").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "2"))


def main():
    import ckptio

    d = sys.argv[1]
    os.makedirs(d, exist_ok=True)
    n = 16
    per = SIZE // n // 2
    sd = {f"t{i}": torch.full((per,), float(i), dtype=torch.bfloat16, device=DEV) for i in range(n)}
    nbytes = per * 2 * n
    engines = {t: ckptio.Engine(threads=t) for t in THREADS}
    path = os.path.join(d, "f.safetensors")
    for t, e in engines.items():  # pins each engine's staging outside the timing
        ckptio.save({"w": sd["t0"][: 64 << 20]}, path, engine=e)
        os.unlink(path)
    host = torch.empty(nbytes, dtype=torch.uint8).fill_(7)  # one writer's ceiling: write() of host memory
    rows = []
    for r in range(ROUNDS):
        order = THREADS if r % 2 == 0 else THREADS[::-1]
        for t in order:
            row = {"what": f"ckptio.save, threads={t}", "device": DEV, "round": r,
                   **timed_save(ckptio, sd, path, engines[t])}
            if r == 0:  # the bytes, once per thread count
                back = ckptio.load(path, device=DEV)
                row["equal"] = all(torch.equal(back[k], v) for k, v in sd.items())
                del back
            st = ckptio.last_save_stats() if hasattr(ckptio, "last_save_stats") else None
            if st is not None:
                row["stats"] = {k: getattr(st, k) for k in ("bytes_written", "bytes_direct", "bytes_buffered")
                                if hasattr(st, k)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            os.unlink(path)

        def one_writer():
            with open(path, "wb") as f:
                f.write(memoryview(host.numpy()))
                os.fsync(f.fileno())

        row = {"what": "write() of host memory, one thread", "round": r, **timed(one_writer, nbytes)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        os.unlink(path)
    print("summary", json.dumps({t: [x["GBps"] for x in rows if x["what"].endswith(f"threads={t}")]
                                 for t in THREADS}), flush=True)


if __name__ == "__main__":
    main()
