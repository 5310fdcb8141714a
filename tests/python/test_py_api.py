"""The package surface: version, exceptions, engines and settings, the dtype
table, format detection, the low-level File, concurrency and the GIL."""
import os
import sys
import threading
import time

import numpy as np
import pytest
import torch

import ckptio
from ckptio import _ckptio
from conftest import TORCH_DTYPES, random_tensor, tensor_bytes


def test_version_matches_the_c_header():
    header = open(os.path.join(os.path.dirname(__file__), "..", "..", "include", "ckptio", "core.h")).read()
    parts = []
    for k in ("MAJOR", "MINOR", "PATCH"):
        line = next(l for l in header.splitlines() if l.startswith(f"#define CKPTIO_VERSION_{k} "))
        parts.append(line.split()[-1])
    assert ckptio.__version__ == ".".join(parts)


def test_module_is_built_for_the_stable_abi():
    assert _ckptio.__file__.endswith(".abi3.so")


def test_every_torch_dtype_maps_through_the_c_table():
    from ckptio import _adapt

    for name, _ in TORCH_DTYPES:
        dt = getattr(torch, name)
        code = _adapt.code_of_torch_dtype(dt, "x")
        assert _adapt.torch_dtype(code, "x") == dt
    with pytest.raises(TypeError, match="not supported"):
        _adapt.code_of_torch_dtype(torch.quint8, "tensor 'q'")


def test_errors_carry_the_library_record(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")  # header length 16, file too short
    with pytest.raises(ckptio.CkptioError) as info:
        ckptio.open(path)
    e = info.value
    assert isinstance(e, OSError)
    assert e.status < 0 and e.status_name == _ckptio.status_name(e.status)
    assert e.path == str(path) and e.filename == str(path)
    assert e.message == str(e) and str(path) in e.message
    assert e.source and ".c:" in e.source


def test_engine_settings(tmp_path):
    eng = ckptio.Engine(threads=3, backend="pread", direct="off", chunk_bytes=1 << 20)
    assert eng.get("threads") == 3 and eng.get("backend") == "pread" and eng.get("direct") == "off"
    assert eng.options()["chunk_bytes"] == 1 << 20
    eng.set("threads", 1)
    assert eng.get("threads") == 1
    lo, hi = ckptio.Engine.bounds("threads")
    assert lo <= 1 <= hi
    with pytest.raises(ckptio.CkptioError) as info:
        eng.set("threads", hi + 1)
    assert info.value.status_name == "E_RANGE"
    with pytest.raises(ValueError, match="unknown engine option 'nope'"):
        ckptio.Engine(nope=1)
    with pytest.raises(ValueError, match="does not take 'fast'"):
        eng.set("backend", "fast")
    assert set(ckptio.option_names()) >= {"threads", "backend", "chunk_bytes", "direct", "sync", "gpu_path"}
    assert eng.backend() == "pread"


def test_every_setting_reads_and_writes_by_its_names():
    """Settings that take names take and give the library's names (ckptio_option_value_name), and only those;
    the others take numbers."""
    eng = ckptio.Engine(gpu_huge_slots="off", nvtx=0, gpu_path="pipeline")
    opts = eng.options()
    assert set(opts) == set(ckptio.option_names())
    assert opts["gpu_huge_slots"] == "off" and opts["nvtx"] == 0 and opts["gpu_path"] == "pipeline"
    names = {"backend": ["auto", "pread", "io_uring"], "direct": ["auto", "off", "on"],
             "gpu_path": ["auto", "cufile", "pipeline"], "read_cache": ["auto", "on", "off"],
             "gpu_huge_slots": ["auto", "off", "on"], "write_cache": ["auto", "on", "off"]}
    for name, values in names.items():
        assert ckptio.Engine.bounds(name) == (0, len(values) - 1)
        for v in values:
            if name == "backend" and v == "io_uring":
                continue  # the kernel may refuse io_uring
            eng.set(name, v)
            assert eng.get(name) == v
        with pytest.raises(ValueError, match="does not take 'staged'"):
            eng.set(name, "staged")
    for name in set(opts) - set(names):
        assert isinstance(opts[name], int), name
        with pytest.raises(TypeError, match="takes an int"):
            eng.set(name, "on")


def test_engine_stats_count_the_bytes(tmp_path, engine):
    t = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB
    path = tmp_path / "s.safetensors"
    before = engine.stats()
    ckptio.save({"t": t}, path, engine=engine)
    mid = engine.stats()
    assert mid["bytes_written"] - before["bytes_written"] >= t.numel() * 4
    ckptio.load(path, engine=engine)
    after = engine.stats()
    assert after["bytes_read"] - mid["bytes_read"] >= t.numel() * 4


def test_format_detect(tmp_path):
    st = tmp_path / "a.safetensors"
    ckptio.save({"x": torch.ones(1)}, st)
    pt = tmp_path / "a.pt"
    torch.save({"x": torch.ones(1)}, pt)
    legacy = tmp_path / "legacy.pt"
    torch.save({"x": torch.ones(1)}, legacy, _use_new_zipfile_serialization=False)
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00" * 3)
    assert _ckptio.format_detect(st) == "safetensors"
    assert _ckptio.format_detect(pt) == "torch"
    assert _ckptio.format_detect(legacy) == "torch_legacy"
    assert _ckptio.format_detect(tmp_path) == "directory"
    assert _ckptio.format_detect(junk) == "unknown"
    dcp_dir = tmp_path / "dcp"
    dcp_dir.mkdir()
    (dcp_dir / ".metadata").write_bytes(b"")
    assert _ckptio.format_detect(dcp_dir) == "dcp"
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    assert _ckptio.format_detect(hf) == "hf_index"
    assert _ckptio.format_detect(hf / "model.safetensors.index.json") == "hf_index"
    with pytest.raises(FileNotFoundError):
        _ckptio.format_detect(tmp_path / "missing")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ckptio.CkptioError, match="not a regular file or a directory"):
        _ckptio.format_detect(fifo)  # refused without waiting for a writer
    with pytest.raises(ckptio.CkptioError, match="torch.distributed.checkpoint directory"):
        ckptio.load(dcp_dir)
    with pytest.raises(ckptio.CkptioError, match="legacy"):
        ckptio.load(legacy)
    # A directory is a safetensors model (test_model_dir.py): here its one .safetensors file.
    assert list(ckptio.load(tmp_path)) == ["x"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ckptio.CkptioError, match="directory"):
        ckptio.load(empty)


def test_low_level_file_extents(tmp_path, engine):
    path = tmp_path / "raw.bin"
    src = np.arange(10000, dtype=np.uint8)
    flags = _ckptio.OPEN_READ | _ckptio.OPEN_WRITE
    with _ckptio.File(path, flags, engine) as f:
        f.write([(src.ctypes.data, 4000, 0, _ckptio.MEM_HOST),
                 (src.ctypes.data + 4000, 6000, 8192, _ckptio.MEM_HOST)])
        f.commit()
    data = path.read_bytes()
    assert len(data) == 8192 + 6000
    assert data[:4000] == src[:4000].tobytes() and data[8192:] == src[4000:].tobytes()
    dst = np.zeros(6000, dtype=np.uint8)
    with _ckptio.File(path, _ckptio.OPEN_READ, engine) as f:
        assert f.size() == 8192 + 6000
        f.read([(dst.ctypes.data, 6000, 8192, _ckptio.MEM_HOST)])
        with pytest.raises(ckptio.CkptioError) as info:
            f.read([(dst.ctypes.data, 100, 8192 + 6000 - 50, _ckptio.MEM_HOST)])
        assert info.value.status_name == "E_TRUNCATED" and str(path) in str(info.value)
    assert f.closed
    np.testing.assert_array_equal(dst, src[4000:])
    with pytest.raises(ValueError, match="closed"):
        f.read([(dst.ctypes.data, 1, 0, _ckptio.MEM_HOST)])


def test_gil_is_released_during_io(tmp_path):
    """A counter thread advances while the main thread is inside a load.

    The interpreter's switch interval is made huge, so the counter thread
    can only run when the main thread releases the GIL on its own: it does
    for the I/O (Py_BEGIN_ALLOW_THREADS), and the counter must move then.
    """
    path = tmp_path / "big.safetensors"
    n = 16 << 20
    ckptio.save({"big": torch.ones(n, dtype=torch.uint8)}, path)
    eng = ckptio.Engine(threads=1, direct="off")
    reader = _ckptio.SafetensorsReader(path, eng)
    dst = torch.empty(n, dtype=torch.uint8)
    count = 0
    stop = False

    def counter():
        nonlocal count
        while not stop:
            count += 1
            time.sleep(0)  # let the main thread back in when it wants the GIL

    old = sys.getswitchinterval()
    thread = threading.Thread(target=counter)
    thread.start()
    deltas = []
    try:
        time.sleep(0.05)
        sys.setswitchinterval(1000.0)
        for _ in range(5):
            before = count
            reader.read([(0, dst.data_ptr(), n, _ckptio.MEM_HOST)])
            deltas.append(count - before)
    finally:
        sys.setswitchinterval(old)
        stop = True
        thread.join()
        reader.close()
    assert torch.equal(dst, torch.ones(n, dtype=torch.uint8))
    assert max(deltas) > 0, f"counter thread never ran during the loads: {deltas}"


def test_concurrent_loads_and_saves_from_threads(tmp_path):
    tensors = {f"t{i}": random_tensor(torch.float32, (256, 33), seed=i) for i in range(6)}
    errors = []

    def work(i):
        try:
            p = tmp_path / f"f{i}.safetensors"
            for _ in range(5):
                ckptio.save({"x": tensors[f"t{i}"]}, p)
                got = ckptio.load(p)["x"]
                assert tensor_bytes(got) == tensor_bytes(tensors[f"t{i}"])
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_close_waits_and_double_close_is_fine(tmp_path):
    path = tmp_path / "a.safetensors"
    ckptio.save({"a": torch.ones(4)}, path)
    f = ckptio.open(path)
    f.close()
    f.close()
    assert f.closed


def test_errors_pickle_with_every_field():
    """torch.distributed pickles a failing rank's exception to report it on
    the coordinator: the fields must survive, not only the message."""
    import pickle

    with pytest.raises(ckptio.CkptioError) as info:
        ckptio.load("/nonexistent/dir/x.safetensors")
    e = info.value
    f = pickle.loads(pickle.dumps(e))
    assert type(f) is type(e) and isinstance(f, FileNotFoundError)
    for field in ("status", "status_name", "errno", "operation", "path", "offset", "subject", "message", "source",
                  "filename"):
        assert getattr(f, field) == getattr(e, field), field
    assert str(f) == str(e) and f.path == "/nonexistent/dir/x.safetensors"


def test_prepare_gpu_refuses_what_it_cannot_prepare():
    """prepare_gpu takes CUDA devices only; without a usable CUDA device it
    fails at once with the reason (the pinning itself runs in the background
    and is covered by the C simulator tests and test_py_gpu.py)."""
    with pytest.raises(ValueError, match="not a CUDA device"):
        ckptio.prepare_gpu("cpu")
    with pytest.raises(ValueError, match=">= 0"):
        ckptio.Engine().prepare_gpu(-1)
    with pytest.raises(TypeError):
        ckptio.Engine().prepare_gpu("cuda:0")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            ckptio.prepare_gpu("cuda")
        with pytest.raises(ckptio.CkptioError) as err:
            ckptio.Engine().prepare_gpu(0)
        assert "CUDA" in str(err.value) or "cuda" in str(err.value)


def test_ckptio_dcp_is_there_after_import_ckptio_and_torch_is_not_imported_before():
    """ckptio.dcp needs torch: `import ckptio` does not import it (the `ckptio` command's launcher imports
    the package), the first use of ckptio.dcp does."""
    import subprocess
    import sys

    code = ("import sys, ckptio\n"
            "before = 'torch' in sys.modules\n"
            "d = ckptio.dcp\n"
            "print(before, d is sys.modules['ckptio.dcp'], d.FileSystemWriter.__name__, callable(d.verify))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "FileSystemWriter", "True"]
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import ckptio"], capture_output=True, text=True,
                       timeout=120)
    imported = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    assert "ckptio" in imported and not [m for m in imported if m.split(".")[0] == "torch"], imported
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        ckptio.nothing
