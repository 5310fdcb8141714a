"""ckptio.GdsFile as a drop-in for torch.cuda.gds.GdsFile.

CPU storages run everywhere (host path); CUDA storages where a GPU exists.
File contents are checked by reading the file with plain Python I/O.
"""
import os

import pytest
import torch

import ckptio
from conftest import random_tensor, requires_cuda, tensor_bytes


def test_save_and_load_cpu_storages_at_offsets(tmp_path):
    path = str(tmp_path / "g.bin")
    a = random_tensor(torch.float32, (1024,), seed=1)
    b = random_tensor(torch.bfloat16, (2, 333), seed=2)
    f = ckptio.GdsFile(path, os.O_CREAT | os.O_RDWR)
    assert f.handle is not None
    f.save_storage(a.untyped_storage(), offset=0)
    f.save_storage(b.untyped_storage(), offset=a.nbytes)
    assert f.last_path == "host"
    data = open(path, "rb").read()
    assert data == tensor_bytes(a) + tensor_bytes(b)
    a2, b2 = torch.empty_like(a), torch.empty_like(b)
    f.load_storage(a2.untyped_storage(), offset=0)
    f.load_storage(b2.untyped_storage(), a.nbytes)
    assert tensor_bytes(a2) == tensor_bytes(a) and tensor_bytes(b2) == tensor_bytes(b)
    del f


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_new_file_respects_the_umask(tmp_path, mask):
    """A file GdsFile creates gets 0666 & ~umask, as os.open, torch's GdsFile and ckptio.save give it;
    a file that exists keeps its mode."""
    old = os.umask(mask)
    try:
        path = tmp_path / "new.bin"
        with ckptio.GdsFile(str(path), os.O_CREAT | os.O_RDWR) as f:
            f.save_storage(torch.arange(10).untyped_storage(), offset=0)
        ckptio.save({"x": torch.arange(10)}, str(tmp_path / "saved.safetensors"))
        fd = os.open(tmp_path / "plain.bin", os.O_CREAT | os.O_RDWR, 0o666)
        os.close(fd)
    finally:
        os.umask(old)
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~mask)
    assert (tmp_path / "saved.safetensors").stat().st_mode & 0o777 == path.stat().st_mode & 0o777
    assert (tmp_path / "plain.bin").stat().st_mode & 0o777 == path.stat().st_mode & 0o777
    os.chmod(path, 0o640)
    with ckptio.GdsFile(str(path), os.O_CREAT | os.O_RDWR):
        pass
    assert path.stat().st_mode & 0o777 == 0o640


def test_typed_storage_and_unaligned_offsets(tmp_path):
    path = str(tmp_path / "u.bin")
    t = torch.arange(1000, dtype=torch.int16)
    with ckptio.GdsFile(path, os.O_CREAT | os.O_WRONLY) as f:
        f.save_storage(t.untyped_storage(), offset=4097)
    data = open(path, "rb").read()
    assert len(data) == 4097 + 2000 and data[:4097] == b"\0" * 4097 and data[4097:] == tensor_bytes(t)
    back = torch.empty(1000, dtype=torch.int16)
    f = ckptio.GdsFile(path, os.O_RDONLY)
    with pytest.warns(UserWarning, match="TypedStorage is deprecated"):
        typed = back.storage()  # a TypedStorage, which torch's API also accepts
    f.load_storage(typed, 4097)
    assert torch.equal(back, t)


def test_flags_follow_os_open(tmp_path):
    path = str(tmp_path / "flags.bin")
    with pytest.raises(FileNotFoundError) as info:
        ckptio.GdsFile(path, os.O_RDWR)
    assert isinstance(info.value, ckptio.CkptioError) and path in str(info.value)
    assert not os.path.exists(path)
    with open(path, "wb") as fh:
        fh.write(b"x" * 10000)
    with ckptio.GdsFile(path, os.O_RDWR | os.O_TRUNC):
        pass
    assert os.path.getsize(path) == 0
    with pytest.raises(FileExistsError):
        ckptio.GdsFile(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    with open(path, "wb") as fh:
        fh.write(b"y" * 100)
    with ckptio.GdsFile(path, os.O_RDWR) as f:  # no O_TRUNC: in place
        f.save_storage(torch.zeros(2, dtype=torch.uint8).untyped_storage(), offset=10)
    assert open(path, "rb").read() == b"y" * 10 + b"\0\0" + b"y" * 88
    with ckptio.GdsFile(path, os.O_RDONLY) as f:
        with pytest.raises(ckptio.CkptioError):
            f.save_storage(torch.zeros(2, dtype=torch.uint8).untyped_storage(), offset=0)


def test_handle_registration_mirrors_torch(tmp_path):
    path = str(tmp_path / "r.bin")
    f = ckptio.GdsFile(path, os.O_CREAT | os.O_RDWR)
    with pytest.raises(AssertionError, match="already registered"):
        f.register_handle()
    f.deregister_handle()
    assert f.handle is None
    s = torch.ones(4).untyped_storage()
    with pytest.raises(AssertionError, match="not registered"):
        f.save_storage(s)
    with pytest.raises(AssertionError, match="not registered"):
        f.load_storage(s)
    with pytest.raises(AssertionError, match="not registered"):
        f.deregister_handle()
    f.register_handle()
    f.save_storage(s)
    assert open(path, "rb").read() == tensor_bytes(torch.ones(4))


def test_errors_are_clear(tmp_path):
    path = str(tmp_path / "e.bin")
    with open(path, "wb") as fh:
        fh.write(b"\1" * 100)
    f = ckptio.GdsFile(path, os.O_RDONLY)
    big = torch.empty(64, dtype=torch.uint8)
    with pytest.raises(ckptio.CkptioError) as info:
        f.load_storage(big.untyped_storage(), offset=50)
    assert info.value.status_name == "E_TRUNCATED" and path in str(info.value)
    with pytest.raises(TypeError, match="storage"):
        f.load_storage(big, 0)
    with pytest.raises(ValueError, match="offset"):
        f.load_storage(big.untyped_storage(), -1)
    with pytest.raises(ValueError, match="only CUDA storages"):
        ckptio.gds_register_buffer(big.untyped_storage())
    with pytest.raises(RuntimeError, match="not registered"):
        ckptio.gds_deregister_buffer(big.untyped_storage())


def test_pytorch_gds_tutorial_flow_on_cpu(tmp_path):
    """The PyTorch GDS tutorial (torch.save with skip_data at 4 KiB alignment,
    offsets from FakeTensorMode, storages written by GdsFile) with ckptio's
    GdsFile in place of torch.cuda.gds.GdsFile."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.serialization import config as serialization_config

    path = str(tmp_path / "checkpoint.pt")
    m = torch.nn.Linear(5, 10)
    sd = m.state_dict()
    old = serialization_config.save.storage_alignment
    serialization_config.save.storage_alignment = 4096
    try:
        with torch.serialization.skip_data():
            torch.save(sd, path)
    finally:
        serialization_config.save.storage_alignment = old
    with FakeTensorMode():
        fake_sd = torch.load(path)
    f = ckptio.GdsFile(path, os.O_RDWR)
    for k, v in sd.items():
        offset = fake_sd[k].untyped_storage()._checkpoint_offset
        assert offset % 4096 == 0
        f.save_storage(v.untyped_storage(), offset)
    loaded = torch.load(path)
    for k, v in loaded.items():
        assert torch.equal(v, sd[k])
    with torch.serialization.skip_data():
        empty = torch.load(path)
    for k, v in empty.items():
        offset = fake_sd[k].untyped_storage()._checkpoint_offset
        f.load_storage(v.untyped_storage(), offset)
        assert torch.equal(v, sd[k])
    del f


# ---- CUDA -------------------------------------------------------------------------------


@requires_cuda
def test_cuda_storages_round_trip(tmp_path):
    path = str(tmp_path / "c.bin")
    src1 = torch.randn(1024, device="cuda")
    src2 = torch.randn(2, 1024, device="cuda")
    f = ckptio.GdsFile(path, os.O_CREAT | os.O_RDWR)
    f.save_storage(src1.untyped_storage(), offset=0)
    f.save_storage(src2.untyped_storage(), offset=src1.nbytes)
    assert f.last_path in ("pipeline", "cufile_direct", "cufile_compat")
    assert open(path, "rb").read() == tensor_bytes(src1) + tensor_bytes(src2)
    dest1 = torch.empty(1024, device="cuda")
    dest2 = torch.empty(2, 1024, device="cuda")
    f.load_storage(dest1.untyped_storage(), offset=0)
    f.load_storage(dest2.untyped_storage(), offset=src1.nbytes)
    assert torch.equal(src1, dest1) and torch.equal(src2, dest2)
    assert f.last_path in ("pipeline", "cufile_direct", "cufile_compat")


@requires_cuda
def test_cuda_transfers_follow_the_current_stream(tmp_path):
    """Work queued on the current (non-default) stream just before a save is
    in the file; a kernel queued right after a load sees the loaded bytes."""
    path = str(tmp_path / "stream.bin")
    n = 1 << 22
    side = torch.cuda.Stream()
    f = ckptio.GdsFile(path, os.O_CREAT | os.O_RDWR)
    with torch.cuda.stream(side):
        x = torch.zeros(n, device="cuda")
        torch.cuda._sleep(50_000_000)  # keep the stream busy
        x.add_(3.0)
        f.save_storage(x.untyped_storage(), 0)
        y = torch.empty(n, device="cuda")
        f.load_storage(y.untyped_storage(), 0)
        z = y * 2
    side.synchronize()
    assert open(path, "rb").read() == tensor_bytes(torch.full((n,), 3.0))
    assert torch.equal(z.cpu(), torch.full((n,), 6.0))


@requires_cuda
def test_buffer_registration_on_cuda(tmp_path):
    path = str(tmp_path / "reg.bin")
    t = torch.arange(4096, dtype=torch.float32, device="cuda")
    s = t.untyped_storage()
    ckptio.gds_register_buffer(s)
    try:
        with pytest.raises(RuntimeError, match="already registered"):
            ckptio.gds_register_buffer(s)
        with ckptio.GdsFile(path, os.O_CREAT | os.O_RDWR) as f:
            f.save_storage(s, 0)
            back = torch.empty_like(t)
            f.load_storage(back.untyped_storage(), 0)
        assert torch.equal(back, t)
    finally:
        ckptio.gds_deregister_buffer(s)
