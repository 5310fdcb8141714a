"""A hostile torch.save zip whose stored records overlap.

Record k's local header sits inside the data of records 0..k-1, so n records
of S bytes each fit in about S + 46 n bytes of file while describing n * S
bytes of storages: 400 records of 1 MiB are a 1.1 MB file that torch.load
expands to 400 MiB. The zip is otherwise well formed (every local header
matches its central entry, every CRC-32 is right), so only a check for
overlapping records refuses it.

    python tests/data/make_zip_overlap.py OUT [NRECORDS [STORAGE_BYTES]]

writes one (fuzz/corpus/zip/overlapping_records.pt is 40 x 16 KiB); the
tests import overlapping_torch_zip().
"""
import collections
import io
import pickle
import struct
import sys
import zlib


class _Storage:
    def __init__(self, key: str, numel: int):
        self.key, self.numel = key, numel


class _Tensor:
    def __init__(self, storage: _Storage):
        self.storage = storage

    def __reduce__(self):
        import torch._utils

        n = self.storage.numel
        return (torch._utils._rebuild_tensor_v2, (self.storage, 0, (n,), (1,), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            import torch

            return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
        return None


def _local_header(name: bytes, crc: int, size: int) -> bytes:
    return struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, crc, size, size, len(name), 0) + name


def _central(name: bytes, crc: int, size: int, offset: int) -> bytes:
    return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0, crc, size, size, len(name), 0, 0, 0, 0,
                       0, offset) + name


def overlapping_torch_zip(nrecords: int = 400, storage_bytes: int = 1 << 20) -> bytes:
    assert storage_bytes % 4 == 0
    tensors = {f"t{k}": _Tensor(_Storage(str(k), storage_bytes // 4)) for k in range(nrecords)}
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(tensors)
    small = [(b"archive/data.pkl", buf.getvalue()), (b"archive/version", b"3\n"), (b"archive/byteorder", b"little")]
    out = bytearray()
    entries = []  # (name, crc, size, header offset)
    for name, data in small:
        crc = zlib.crc32(data)
        entries.append((name, crc, len(data), len(out)))
        out += _local_header(name, crc, len(data)) + data
    # Overlapping records: header k right after header k-1; each record's
    # data runs storage_bytes from its header on, over the later headers.
    first = len(out)
    names = [f"archive/data/{k}".encode() for k in range(nrecords)]
    offsets = []
    for name in names:
        offsets.append(len(out))
        out += _local_header(name, 0, storage_bytes)
    data_end = max(off + 30 + len(name) + storage_bytes for off, name in zip(offsets, names))
    out += bytes(range(256)) * ((data_end - len(out)) // 256) + bytes((data_end - len(out)) % 256)
    assert len(out) == data_end and first < data_end
    # CRCs from the last record back: record k's data holds the headers
    # (with their CRCs) of the records after it.
    crcs = [0] * nrecords
    for k in reversed(range(nrecords)):
        start = offsets[k] + 30 + len(names[k])
        crcs[k] = zlib.crc32(bytes(out[start:start + storage_bytes]))
        out[offsets[k] + 14:offsets[k] + 18] = struct.pack("<I", crcs[k])
    entries += [(names[k], crcs[k], storage_bytes, offsets[k]) for k in range(nrecords)]
    cd_offset = len(out)
    for name, crc, size, offset in entries:
        out += _central(name, crc, size, offset)
    cd_size = len(out) - cd_offset
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), cd_size, cd_offset, 0)
    return bytes(out)


if __name__ == "__main__":
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 16 << 10
    with open(sys.argv[1], "wb") as f:
        f.write(overlapping_torch_zip(n, size))
