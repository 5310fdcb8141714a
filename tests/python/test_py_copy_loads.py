"""Copied CPU loads (``ckptio.load(path)``) of files that mix large tensors,
packed small ones and tensors at offsets a view cannot take.

- every tensor's shape and bytes as the file has them, for rows whose shapes
  and sizes repeat, alternate or agree in size only (the reader shares the
  objects of a row that repeats the last one's shape or size);
- keys= in any order, small and large, packed and not: the bytes of each,
  in the order asked;
- mmap=True beside tensors that cannot be views (offsets not a multiple of
  their element size): those are read into memory of their own, the rest
  stay views of the mapping;
- a large tensor is independent of the others: its own storage of its own
  size (torch.save of it writes its bytes, not the load's), resize_ and
  in-place ops leave the others alone;
- the memory of a copied load goes back when its tensors go (the process's
  resident memory returns to where it was before the load).
"""

import io
import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import ckptio  # noqa: E402

ST = {torch.bfloat16: "BF16", torch.float32: "F32", torch.uint8: "U8", torch.int64: "I64", torch.float16: "F16"}


def write_safetensors(path, entries):
    """A safetensors file of `entries` [(name, dtype, shape, offset)] at the
    given offsets of the data section (offsets may be unaligned); holes are
    filled with U8 tensors. Returns ({name: (dtype, shape, bytes)}, data)."""
    header, end = {}, 0
    for name, dt, shape, at in entries:
        nbytes = torch.empty(shape, dtype=dt).numel() * torch.empty((), dtype=dt).element_size()
        header[name] = {"dtype": ST[dt], "shape": list(shape), "data_offsets": [at, at + nbytes]}
        end = max(end, at + nbytes)
    spans = sorted((e["data_offsets"][0], e["data_offsets"][1]) for e in header.values())
    pos, holes = 0, 0
    for a, b in spans:
        assert a >= pos, "entries overlap"
        if a > pos:
            header[f"hole.{holes}"] = {"dtype": "U8", "shape": [a - pos], "data_offsets": [pos, a]}
            holes += 1
        pos = b
    g = torch.Generator().manual_seed(7)
    data = bytes(torch.randint(0, 256, (end,), dtype=torch.uint8, generator=g).numpy())
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    want = {}
    for name, e in header.items():
        dt = next(k for k, v in ST.items() if v == e["dtype"])
        a, b = e["data_offsets"]
        want[name] = (dt, tuple(e["shape"]), data[a:b])
    return want, data


def as_bytes(t):
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


def check(out, want, names=None):
    for name in names if names is not None else want:
        dt, shape, raw = want[name]
        t = out[name]
        assert t.dtype == dt and tuple(t.shape) == shape, (name, t.dtype, t.shape, dt, shape)
        assert as_bytes(t) == raw, name


def mixed_entries():
    """Rows whose shapes repeat, alternate, agree in size only ((2, 8) and
    (4, 4) of bf16: 32 bytes each) or in their numbers only ((4,) and
    (4, 1)), small ones back to back, large ones between them."""
    shapes = [(4, 4), (4, 4), (2, 8), (4, 4), (4,), (4, 1), (4, 1), (), (0,), (16,), (2, 8), (2, 8)]
    entries, at = [], 0
    for i in range(3000):
        shape = shapes[i % len(shapes)]
        dt = torch.bfloat16 if i % 7 else torch.float32
        at += (-at) % 4
        entries.append((f"small.{i:05d}", dt, shape, at))
        at += torch.empty(shape, dtype=dt).numel() * torch.empty((), dtype=dt).element_size()
        if i % 1000 == 999:  # a large tensor between runs of small ones
            at += (-at) % 8
            entries.append((f"large.{i}", torch.float32, (300, 257), at))
            at += 300 * 257 * 4
    return entries


def test_shapes_and_bytes_of_repeating_and_alternating_rows(tmp_path):
    path = tmp_path / "mixed.safetensors"
    want, _ = write_safetensors(path, mixed_entries())
    out = ckptio.load(path)
    assert set(out) == set(want)
    check(out, want)
    with ckptio.open(path) as f:
        for name, (dt, shape, raw) in want.items():
            assert tuple(f.info(name).shape) == shape and f.info(name).nbytes == len(raw), name


def test_keys_in_any_order(tmp_path):
    path = tmp_path / "mixed.safetensors"
    want, _ = write_safetensors(path, mixed_entries())
    names = sorted(want)
    g = torch.Generator().manual_seed(3)
    pick = [names[i] for i in torch.randperm(len(names), generator=g)[:700].tolist()]
    pick += ["large.999", "small.00001", "small.00000"]  # a large one, two neighbours in reverse
    pick = list(dict.fromkeys(pick))
    out = ckptio.load(path, keys=pick)
    assert list(out) == pick
    check(out, want, pick)


def test_mapped_beside_tensors_that_cannot_be_views(tmp_path):
    # Unaligned for their element size: an f32 at an odd offset, inside a run
    # of small ones and as a large one of its own.
    entries = [("a", torch.uint8, (3,), 0), ("b", torch.float32, (5,), 3), ("c", torch.bfloat16, (4,), 24),
               ("d", torch.float32, (2,), 32), ("big", torch.float32, (70000,), 41),
               ("e", torch.int64, (3,), 41 + 280000 + 7), ("f", torch.uint8, (9,), 41 + 280000 + 31)]
    path = tmp_path / "unaligned.safetensors"
    want, _ = write_safetensors(path, entries)
    for mmap in (True, False):
        out = ckptio.load(path, mmap=mmap)
        assert set(out) == set(want)
        check(out, want)
    out = ckptio.load(path, mmap=True)
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        ranges = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in f if line.rstrip().endswith(real)]

    def mapped(t):
        return any(lo <= t.data_ptr() < hi for lo, hi in ranges)

    for name in ("a", "c", "d", "f"):
        assert mapped(out[name]), name
    for name in ("b", "big", "e"):
        assert not mapped(out[name]), name


def test_large_tensors_are_independent(tmp_path):
    path = tmp_path / "large.safetensors"
    g = torch.Generator().manual_seed(1)
    sd = {f"w{i}": torch.randn(512, 300 + i, generator=g) for i in range(4)}
    ckptio.save(sd, path)
    out = ckptio.load(path)
    for name, t in out.items():
        assert torch.equal(t, sd[name])
        assert t.untyped_storage().nbytes() == t.numel() * 4, name  # its own storage, its own size
        buf = io.BytesIO()
        torch.save(t, buf)
        assert len(buf.getvalue()) < t.numel() * 4 + 4096, name
    before = {k: v.clone() for k, v in out.items()}
    out["w1"].mul_(2)
    out["w2"].resize_(2048, 1024)
    out["w2"].fill_(0)
    for name in ("w0", "w3"):
        assert torch.equal(out[name], before[name]), name
    assert torch.equal(out["w1"], before["w1"] * 2)


RSS_CHILD = textwrap.dedent("""
    import ctypes, gc, sys
    import ckptio

    libc = ctypes.CDLL(None)

    def rss():
        # What the allocator holds free is handed back first: the question is
        # whether the tensors' memory was freed, not what glibc keeps cached.
        libc.malloc_trim(0)
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) * 1024

    path = sys.argv[1]
    ckptio.load(path)  # the first load sets up what stays for later ones (engine, thread pool)
    gc.collect()
    base = rss()
    for _ in range(4):
        out = ckptio.load(path)
        loaded = rss()
        del out
        gc.collect()
        print(base, loaded, rss(), flush=True)
""")


def test_memory_goes_back_when_tensors_go(tmp_path):
    path = tmp_path / "rss.safetensors"
    g = torch.Generator().manual_seed(2)
    sd = {f"large.{i}": torch.randn(1 << 20, generator=g) for i in range(24)}  # 96 MiB
    sd.update({f"small.{i}": torch.randn(256, generator=g) for i in range(20000)})  # 20 MB in packs
    ckptio.save(sd, path)
    total = 24 * (4 << 20) + 20000 * 1024
    res = subprocess.run([sys.executable, "-c", RSS_CHILD, str(path)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    rows = [tuple(map(int, line.split())) for line in res.stdout.split("\n")[:-1]]
    assert len(rows) == 4, res.stdout
    for base, loaded, after in rows:
        assert loaded - base > total * 0.9, rows  # the copy is resident while held ...
        assert after - base < total * 0.05, rows  # ... and freed when dropped
