"""Tensors and names a checkpoint cannot hold: every error names the tensor
and the file and says what to save instead (safetensors names the tensor;
ckptio also names the file and covers the cases where safetensors and
torch fail with internal errors). Names with lone surrogates are kept in
torch.save files exactly as pickle keeps them."""
import warnings

import pytest
import torch

import ckptio


def _sparse_coo():
    return torch.eye(3).to_sparse()


def _sparse_csr():
    return torch.eye(3).to_sparse_csr()


def _meta():
    return torch.empty(3, device="meta")


def _quantized():
    return torch.quantize_per_tensor(torch.rand(4), 0.1, 10, torch.quint8)


def _nested():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype feature
        return torch.nested.nested_tensor([torch.rand(2), torch.rand(3)])


# (make, exception type, words the message must hold besides the names)
CASES = {
    "sparse_coo": (_sparse_coo, TypeError, ["sparse tensor", "torch.sparse_coo", "t.to_dense()"]),
    "sparse_csr": (_sparse_csr, TypeError, ["sparse tensor", "torch.sparse_csr", "t.to_dense()"]),
    "meta": (_meta, ValueError, ["meta device", "no data", "to_empty"]),
    "quantized": (_quantized, TypeError, ["quantized", "torch.quint8", "t.dequantize()"]),
    "nested": (_nested, TypeError, ["nested tensor", "t.unbind()"]),
}


def _no_file_left(tmp_path, path):
    assert not path.exists()
    assert not [p.name for p in tmp_path.iterdir() if "ckptio-tmp" in p.name]


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_unsavable_tensor_is_named_with_the_file(tmp_path, case, fmt):
    make, exc_type, words = CASES[case]
    path = tmp_path / f"model.{fmt}"
    sd = {"block": {"ok": torch.ones(2), "w": make()}}
    with pytest.raises(exc_type) as info:
        ckptio.save(sd, path, format=fmt)
    msg = str(info.value)
    assert msg.startswith(f"{path}: tensor 'block.w' "), msg
    for w in words:
        assert w in msg, (w, msg)
    _no_file_left(tmp_path, path)


def test_tensor_without_readable_memory_is_named(tmp_path):
    try:
        t = torch.rand(2, 2).to_mkldnn()
    except RuntimeError:
        pytest.skip("this torch build has no mkldnn tensors")
    for fmt in ("safetensors", "torch"):
        path = tmp_path / f"m.{fmt}"
        with pytest.raises(TypeError, match=rf"^{path}: tensor 'x' is a non-strided tensor \(torch._mkldnn\)"):
            ckptio.save({"x": t}, path, format=fmt)
        _no_file_left(tmp_path, path)


# Nested and sparse CSR tensors fail in torch's own save planner (sizes,
# strides) before any storage writer sees them, with torch's writer too.
@pytest.mark.parametrize("case", ["meta", "quantized", "sparse_coo"])
def test_dcp_writer_names_the_tensor(tmp_path, case):
    import torch.distributed.checkpoint as dcp

    import ckptio.dcp

    make, exc_type, words = CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # single-process dcp.save
        with pytest.raises(BaseException) as info:
            dcp.save({"m": {"w": make()}}, storage_writer=ckptio.dcp.FileSystemWriter(str(tmp_path)),
                     no_dist=True)
    wrapped = [f[0] for f in info.value.failures.values()]  # torch's CheckpointException
    assert len(wrapped) == 1 and isinstance(wrapped[0], exc_type), wrapped
    msg = str(wrapped[0])
    assert msg.startswith("tensor 'm.w' "), msg
    for w in words:
        assert w in msg, (w, msg)


SURROGATE = "emb\udc80.weight"  # a name decoded with errors="surrogateescape"


def test_safetensors_refuses_a_surrogate_name_naming_it(tmp_path):
    path = tmp_path / "m.safetensors"
    with pytest.raises(ValueError) as info:
        ckptio.save({SURROGATE: torch.ones(2)}, path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: tensor name 'emb\\udc80.weight' holds the lone surrogate '\\udc80' (U+DC80) "
                          "at position 3"), msg
    assert "format='torch'" in msg
    _no_file_left(tmp_path, path)
    with pytest.raises(ValueError, match=r"metadata key 'k\\ud800' holds the lone surrogate"):
        ckptio.save({"w": torch.ones(2)}, path, metadata={"k\ud800": "v"})
    with pytest.raises(ValueError, match=r"metadata value of 'k': 'v\\udfff' holds the lone surrogate"):
        ckptio.save({"w": torch.ones(2)}, path, metadata={"k": "v\udfff"})
    _no_file_left(tmp_path, path)


def test_torch_format_keeps_surrogates_as_torch_does(tmp_path):
    sd = {SURROGATE: torch.arange(3.0), "extra": {"note\ud800": "v\udc80"}}
    ours, theirs = tmp_path / "ckptio.pt", tmp_path / "torch.pt"
    ckptio.save(sd, ours, format="torch")
    torch.save(sd, theirs)
    for path in (ours, theirs):
        for got in (torch.load(path, weights_only=True), ckptio.load(path)):
            assert list(got) == [SURROGATE, "extra"]
            assert torch.equal(got[SURROGATE], sd[SURROGATE])
            assert got["extra"] == {"note\ud800": "v\udc80"}
        with ckptio.open(path) as f:
            assert SURROGATE in f.keys()
            assert torch.equal(f.get_tensor(SURROGATE), sd[SURROGATE])


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
@pytest.mark.parametrize("case,words", [("sparse_coo", "torch.sparse_coo tensor"),
                                        ("sparse_csr", "torch.sparse_csr tensor"),
                                        ("quantized", "quantized tensor (torch.quint8)"),
                                        ("nested", "nested tensor"),
                                        ("meta", "cannot read into a tensor on meta")])
def test_unreadable_destination_is_named_with_the_file(tmp_path, fmt, case, words):
    """load(out=...) into a tensor ckptio cannot fill: the error names the
    tensor and the file (torch's own errors for sparse CSR and nested
    destinations name neither)."""
    path = tmp_path / f"model.{fmt}"
    ckptio.save({"w": torch.ones(3)}, path, format=fmt)
    with pytest.raises((TypeError, ValueError)) as info:
        ckptio.load(path, out={"w": CASES[case][0]()})
    msg = str(info.value)
    assert msg.startswith(f"{path}: tensor 'w'") and words in msg, msg
