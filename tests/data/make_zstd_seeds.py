"""Seeds for the fuzzers on sizes a file declares beyond what it holds.

* fuzz/corpus/dcp_zstd_item/: stored zstd items (fuzz/fuzz_dcp_zstd_item.c):
  real items of tests/data/dcp/zstd (libzstd's frames), frames made of raw
  and RLE blocks around torch.save archives (C order, transposed, expanded),
  an honest archive of 4 MiB of zeros in 1 KB of frames, zeros that are no
  archive, and frames whose header declares another size than they hold.
* fuzz/corpus/zip/expanded_view.pt: a 1.5 KB torch.save of a view that
  reaches 4 MiB through a stride of 0 (torch's expand).
* fuzz/corpus/dcp_metadata/many_zstd_transforms.metadata: an item whose
  transform_descriptors list stream.zstd/1 a thousand times.

    python tests/data/make_zstd_seeds.py

tests/python/test_dcp_hostile.py builds its frames with frame() and
zeros_archive_edges(). Frames are written by hand (no zstd module needed): raw blocks carry bytes
as they are, RLE blocks one byte repeated, 4 bytes per 128 KiB.
"""
import io
import os
import pickle
import struct
import sys
import zipfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
BLOCK = 128 << 10


def frame(pieces, declare=None) -> bytes:
    """A zstd frame: bytes pieces as raw blocks, int pieces as that many zero
    bytes in RLE blocks; the content size `declare` in its header, or none."""
    blocks = []
    for p in pieces:
        if isinstance(p, int):
            for start in range(0, p, BLOCK):
                blocks.append(((min(BLOCK, p - start) << 3) | (1 << 1), b"\0"))
        else:
            for start in range(0, max(len(p), 1), BLOCK):
                part = p[start:start + BLOCK]
                blocks.append((len(part) << 3, part))
    if declare is None:
        out = [struct.pack("<IBB", 0xFD2FB528, 0x00, 7 << 3)]
    else:
        out = [struct.pack("<IBBQ", 0xFD2FB528, 0xC0, 7 << 3, declare)]
    for i, (header, payload) in enumerate(blocks):
        out.append(struct.pack("<I", header | (i == len(blocks) - 1))[:3] + payload)
    return b"".join(out)


def saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def zeros_archive_edges(numel: int, path: str):
    """torch.save(torch.zeros(numel)) as (bytes before the storage, storage
    length, bytes after it), the storage never held: written to the scratch
    file `path` with torch's skip_data (a sparse file) from an untouched
    torch.empty, then removed."""
    with torch.serialization.skip_data():
        torch.save(torch.empty(numel), path)
    with zipfile.ZipFile(path) as z:
        rec = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    with open(path, "rb") as f:
        f.seek(rec.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        start = rec.header_offset + 30 + name_len + extra_len
        f.seek(0)
        head = f.read(start)
        f.seek(start + rec.file_size)
        tail = f.read()
    os.unlink(path)
    return head, rec.file_size, tail


def write(sub: str, name: str, data: bytes) -> None:
    os.makedirs(os.path.join(CORPUS, sub), exist_ok=True)
    with open(os.path.join(CORPUS, sub, name), "wb") as f:
        f.write(data)


def main() -> int:
    items = "dcp_zstd_item"
    fixture = os.path.join(ROOT, "tests", "data", "dcp", "zstd")
    with open(os.path.join(fixture, ".metadata"), "rb") as f:
        md = pickle.load(f)
    for key, info in md.storage_data.items():
        if key.fqn in ("w", "s"):
            with open(os.path.join(fixture, info.relative_path), "rb") as f:
                f.seek(info.offset)
                write(items, f"fixture_{key.fqn}.zst", f.read(info.length))
    m = torch.arange(48.0).reshape(6, 8)
    write(items, "c_order.zst", frame([saved(m)]))
    write(items, "c_order_declared.zst", frame([saved(m)], declare=len(saved(m))))
    write(items, "transposed.zst", frame([saved(m.t())]))
    write(items, "expanded.zst", frame([saved(torch.arange(4.0).expand(5, 4))]))
    write(items, "int64_scalar.zst", frame([saved(torch.tensor(7))]))
    head, n, tail = zeros_archive_edges(1 << 20, os.path.join(CORPUS, ".edges.pt"))
    write(items, "zeros_4mib_archive.zst", frame([head, n, tail]))
    write(items, "zeros_not_an_archive.zst", frame([32 << 20]))
    write(items, "declares_less.zst", frame([saved(m)], declare=100))
    write(items, "declares_more.zst", frame([1 << 20], declare=(1 << 20) + 1))
    write("zip", "expanded_view.pt", saved({"w": torch.ones(4).expand(1 << 18, 4)}))

    with open(os.path.join(ROOT, "fuzz", "corpus", "dcp_metadata", "fixture_zstd.metadata"), "rb") as f:
        md = pickle.load(f)
    next(v for k, v in md.storage_data.items() if k.fqn == "w").transform_descriptors = ["stream.zstd/1"] * 1000
    write("dcp_metadata", "many_zstd_transforms.metadata", pickle.dumps(md, protocol=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
