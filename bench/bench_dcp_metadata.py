"""Reading a large DCP .metadata: ckptio's restricted path against pickle.loads (what torch's reader runs)
(BENCHMARKS.md, "DCP").

    python3 bench/bench_dcp_metadata.py [TENSORS] [CHUNKS]      # default 1000 x 100: 100k chunks, ~14 MB

Builds torch's Metadata for TENSORS tensors of CHUNKS chunks each (with a _StorageInfo per chunk, as
torch's FileSystemWriter records them), pickles it as torch does, then times
ckptio.dcp._metadata.metadata_from_bytes (the path of every ckptio.dcp.FileSystemReader) and pickle.loads,
alternating, REPS (2) times each. CPU only.
"""
import os
import pickle
import sys
import time

import torch
from torch.distributed.checkpoint import metadata as md
from torch.distributed.checkpoint.filesystem import _StorageInfo

from ckptio.dcp._metadata import metadata_from_bytes


def make(n_tensors: int, n_chunks: int) -> bytes:
    sdm, storage = {}, {}
    for t in range(n_tensors):
        fqn = f"model.layers.{t}.weight"
        chunks = [md.ChunkStorageMetadata(offsets=torch.Size([c * 64, 0]), sizes=torch.Size([64, 4096]))
                  for c in range(n_chunks)]
        sdm[fqn] = md.TensorStorageMetadata(properties=md.TensorProperties(dtype=torch.bfloat16),
                                            size=torch.Size([n_chunks * 64, 4096]), chunks=chunks)
        for c in range(n_chunks):
            storage[md.MetadataIndex(fqn, torch.Size([c * 64, 0]))] = _StorageInfo(
                relative_path=f"__{c}_0.distcp", offset=t * 524288, length=524288)
    return pickle.dumps(md.Metadata(state_dict_metadata=sdm, planner_data=None, storage_data=storage))


def main():
    n_tensors = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    n_chunks = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    data = make(n_tensors, n_chunks)
    print(f"{n_tensors} tensors x {n_chunks} chunks: {len(data) / 1e6:.1f} MB pickled", flush=True)
    for _ in range(int(os.environ.get("REPS", "2"))):
        t0 = time.perf_counter()
        pickle.loads(data)
        t1 = time.perf_counter()
        metadata_from_bytes(data, "bench/.metadata")
        t2 = time.perf_counter()
        print(f"pickle.loads {t1 - t0:.2f} s   ckptio {t2 - t1:.2f} s   ratio {(t2 - t1) / (t1 - t0):.2f}", flush=True)


if __name__ == "__main__":
    main()
