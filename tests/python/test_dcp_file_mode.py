"""A DCP save into an existing checkpoint directory keeps the checkpoint's
mode and (where permitted) owner: .metadata, the manifest, the data files
and the lock file take those of the .metadata they replace, as torch.save
and safetensors.save_file keep a file's by rewriting it in place (torch's
own DCP writer keeps them for data files it rewrites under the same names,
not for .metadata). Temporaries are created with them, never wider. A new
checkpoint gets 0666 & ~umask."""
import os
import stat
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.filesystem import SerializationFormat  # noqa: E402

import ckptio.dcp as cdcp  # noqa: E402
from ckptio.dcp import _commit  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


def save(path, v, fmt=SerializationFormat.TORCH_SAVE, **kwargs):
    sd = {"w": torch.full((1000,), float(v)), "b": torch.arange(10) * v, "step": v}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=cdcp.FileSystemWriter(path, serialization_format=fmt, thread_count=2, **kwargs),
                 no_dist=True)


def attributes(path):
    out = {}
    for n in sorted(os.listdir(path)):
        st = os.lstat(os.path.join(path, n))
        out[n] = (oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid)
    return out


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("fmt", [SerializationFormat.TORCH_SAVE, SerializationFormat.SAFETENSORS])
def test_resave_keeps_the_checkpoints_mode(tmp_path, fmt, umask022):
    path = tmp_path / "ckpt"
    save(path, 1, fmt)
    assert {m for m, _, _ in attributes(path).values()} == {"0o644"}  # new: 0666 & ~umask
    for n in os.listdir(path):
        os.chmod(path / n, 0o600)
    save(path, 2, fmt)
    got = attributes(path)
    assert any(n.endswith(".distcp") for n in got) and any(n.startswith(".ckptio-manifest-") for n in got)
    assert {m for m, _, _ in got.values()} == {"0o600"}, got
    # Bits the umask would take from a new file are kept too.
    os.chmod(path / ".metadata", 0o666)
    save(path, 3, fmt)
    assert {m for m, _, _ in attributes(path).values()} == {"0o666"}, attributes(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_resave_as_root_keeps_the_owner(tmp_path, umask022):
    path = tmp_path / "ckpt"
    save(path, 1)
    for n in os.listdir(path):
        os.chown(path / n, 4321, 4322)
        os.chmod(path / n, 0o640)
    save(path, 2)
    assert set(attributes(path).values()) == {("0o640", 4321, 4322)}, attributes(path)


def test_per_rank_save_keeps_the_mode_of_its_metadata(tmp_path, umask022):
    from torch.distributed.checkpoint.state_dict_saver import _save_state_dict

    path = tmp_path / "ckpt"

    def per_rank(v):
        writer = cdcp.FileSystemWriter(path)
        writer.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _save_state_dict({"w": torch.full((100,), float(v))}, writer, no_dist=True, use_collectives=False)

    per_rank(1)
    for n in os.listdir(path):
        os.chmod(path / n, 0o600)
    per_rank(2)
    assert {m for m, _, _ in attributes(path).values()} == {"0o600"}, attributes(path)


def test_temporaries_are_never_wider_than_the_reference(tmp_path, umask022):
    """The commit's temporary (of .metadata, of the manifest) and a data
    file's placeholder exist with the reference's mode from their creation."""
    ref_path = tmp_path / "ref"
    ref_path.write_bytes(b"")
    os.chmod(ref_path, 0o600)
    ref = _commit.reference_stat(tmp_path, "ref")
    fd, tmp = _commit._create_temporary(str(tmp_path), ".metadata", str(tmp_path / ".metadata"), ref)
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
    finally:
        os.close(fd)
    _commit.create_placeholder(tmp_path, "__0_0123456789ab_0.distcp", ref)
    assert stat.S_IMODE(os.stat(tmp_path / "__0_0123456789ab_0.distcp").st_mode) == 0o600
    assert _commit.reference_stat(tmp_path, "missing") is None
    os.symlink(ref_path, tmp_path / "link")
    assert _commit.reference_stat(tmp_path, "link") is None  # a symlink is no reference
