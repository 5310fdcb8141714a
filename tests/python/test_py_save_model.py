"""ckptio.save_model / load_model against safetensors.torch.save_model /
load_model: the same files (byte for byte with align=8), each loads the
other's, the same (missing, unexpected) and the same strict errors, ties
restored; a transformers GPT-2 (tied lm_head / wte) round trip."""
import json
import struct

import pytest
import torch

import ckptio
from conftest import requires_cuda

st_torch = pytest.importorskip("safetensors.torch")


class TwoTies(torch.nn.Module):
    """Two groups of tied weights, a buffer, a non-persistent buffer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.head = torch.nn.Linear(8, 20, bias=False)
        self.head.weight = self.emb.weight
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.register_buffer("steps", torch.tensor(3))
        self.register_buffer("scratch", torch.zeros(4), persistent=False)

    def forward(self, x):
        return self.head(self.b(self.a(self.emb(x))))


def _header(data: bytes):
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _same_params(m1, m2):
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    for k in s1:
        assert torch.equal(s1[k], s2[k]), k


def test_files_match_safetensors(tmp_path):
    torch.manual_seed(0)
    m = TwoTies()
    st_torch.save_model(m, tmp_path / "ref.safetensors")
    ckptio.save_model(m, tmp_path / "ck.safetensors", align=8)
    ref, ck = (tmp_path / "ref.safetensors").read_bytes(), (tmp_path / "ck.safetensors").read_bytes()
    # Two dropped names: safetensors writes its metadata in a random order
    # (a Rust HashMap), so compare the parsed header and the data bytes.
    assert _header(ref) == _header(ck)
    hdr, _ = _header(ck)
    assert hdr["__metadata__"] == {"head.weight": "emb.weight", "b.weight": "a.weight"}
    assert "head.weight" not in hdr and "b.weight" not in hdr and "scratch" not in hdr


def test_single_tie_is_byte_identical_and_keeps_user_metadata(tmp_path):
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    m[1].weight = m[0].weight
    st_torch.save_model(m, tmp_path / "ref.safetensors")
    ckptio.save_model(m, tmp_path / "ck.safetensors", align=8)
    assert (tmp_path / "ref.safetensors").read_bytes() == (tmp_path / "ck.safetensors").read_bytes()
    assert ckptio.save_model(m, align=8) == st_torch.save(
        {"0.weight": m[0].weight.detach()}, metadata={"1.weight": "0.weight"})
    # A caller's entry of a dropped name is kept, as safetensors does.
    ckptio.save_model(m, tmp_path / "meta.safetensors", metadata={"1.weight": "mine"})
    assert ckptio.open(tmp_path / "meta.safetensors").metadata() == {"1.weight": "mine"}


@pytest.mark.parametrize("writer", ["ckptio", "safetensors"])
@pytest.mark.parametrize("reader", ["ckptio", "safetensors"])
def test_cross_load_restores_ties(tmp_path, writer, reader):
    torch.manual_seed(2)
    m = TwoTies()
    path = tmp_path / "m.safetensors"
    (ckptio.save_model if writer == "ckptio" else st_torch.save_model)(m, path)
    fresh = TwoTies()
    got = (ckptio.load_model if reader == "ckptio" else st_torch.load_model)(fresh, path)
    assert got == (set(), [])
    _same_params(m, fresh)
    assert fresh.head.weight is fresh.emb.weight and fresh.b.weight is fresh.a.weight
    x = torch.tensor([[1, 2, 3]])
    assert torch.equal(m(x), fresh(x))


def _both_load(tmp_path, model_factory, sd, **kwargs):
    """(result or exception text) of safetensors' and ckptio's load_model."""
    path = tmp_path / "x.safetensors"
    st_torch.save_file(sd, path)
    out = []
    for load in (st_torch.load_model, ckptio.load_model):
        m = model_factory()
        try:
            missing, unexpected = load(m, path, **kwargs)
            out.append((sorted(missing), sorted(unexpected), type(missing).__name__, type(unexpected).__name__))
        except RuntimeError as exc:
            out.append(str(exc))
    return out


def test_missing_and_unexpected_match_safetensors(tmp_path):
    torch.manual_seed(3)
    full = {k: v.clone() for k, v in TwoTies().state_dict().items() if k not in ("head.weight", "b.weight")}
    partial = dict(full)
    del partial["a.bias"]
    partial["extra.weight"] = torch.ones(2)
    partial["emb.extra"] = torch.ones(2)
    for strict in (True, False):
        ref, mine = _both_load(tmp_path, TwoTies, partial, strict=strict)
        assert ref == mine
    ref, mine = _both_load(tmp_path, TwoTies, partial, strict=True)
    assert ref.startswith("Error(s) in loading state_dict for TwoTies:") and '"a.bias"' in ref
    # Both names of a tie in the file: the extra one is "unexpected", as in safetensors.
    both = dict(full)
    both["head.weight"] = full["emb.weight"].clone()
    assert _both_load(tmp_path, TwoTies, both, strict=False)[0] == _both_load(tmp_path, TwoTies, both,
                                                                            strict=False)[1]
    # A shape mismatch is load_state_dict's error in both.
    bad = dict(full)
    bad["a.bias"] = torch.ones(3)
    ref, mine = _both_load(tmp_path, TwoTies, bad)
    assert isinstance(ref, str) and ref == mine and "size mismatch for a.bias" in ref


def test_dtype_conversion_and_custom_loading_go_through_load_state_dict(tmp_path):
    """Tensors whose dtype differs from the model's are copied (converted) by
    load_state_dict; modules with their own _load_from_state_dict (BatchNorm)
    get it called."""
    torch.manual_seed(4)
    src = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    sd = {k: (v.to(torch.float16) if v.is_floating_point() else v) for k, v in src.state_dict().items()}
    path = tmp_path / "half.safetensors"
    st_torch.save_file(sd, path)
    for load in (st_torch.load_model, ckptio.load_model):
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        assert load(m, path) == (set(), [])
        for k, v in m.state_dict().items():
            assert v.dtype == src.state_dict()[k].dtype and torch.equal(v, sd[k].to(v.dtype)), k


def test_reads_straight_into_the_model(tmp_path):
    """A plain model's matching tensors are filled in place, in one read."""
    torch.manual_seed(5)
    m = TwoTies()
    path = tmp_path / "m.safetensors"
    ckptio.save_model(m, path)
    fresh = TwoTies()
    ptrs = {k: v.data_ptr() for k, v in fresh.state_dict().items()}
    eng = ckptio.Engine()
    handed = []
    real = fresh.load_state_dict
    fresh.load_state_dict = lambda sd, strict=True: (handed.append(dict(sd)), real(sd, strict=strict))[1]
    ckptio.load_model(fresh, path, engine=eng)
    assert handed == [{}], "tensors went through load_state_dict instead of straight into the model"
    assert {k: v.data_ptr() for k, v in fresh.state_dict().items()} == ptrs
    data_offset = len(path.read_bytes()) - len(_header(path.read_bytes())[1])
    assert eng.stats()["bytes_read"] == data_offset + sum(v.numel() * v.element_size() for k, v in
                                                          m.state_dict().items() if k not in ("head.weight", "b.weight"))
    _same_params(m, fresh)


def test_torch_format_and_bytes(tmp_path):
    torch.manual_seed(6)
    m = TwoTies()
    ckptio.save_model(m, tmp_path / "m.pt")
    sd = torch.load(tmp_path / "m.pt", weights_only=True)
    assert "head.weight" in sd and sd["head.weight"].data_ptr() == sd["emb.weight"].data_ptr()
    fresh = TwoTies()
    assert ckptio.load_model(fresh, tmp_path / "m.pt") == (set(), [])
    _same_params(m, fresh)
    data = ckptio.save_model(m)
    assert isinstance(data, bytes)
    fresh = TwoTies()
    assert ckptio.load_model(fresh, data) == (set(), [])
    _same_params(m, fresh)


def test_gpt2_round_trip(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=512, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(7)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    path = tmp_path / "gpt2.safetensors"
    ckptio.save_model(model, path)
    st_torch.save_model(model, tmp_path / "ref.safetensors")
    assert _header((tmp_path / "ref.safetensors").read_bytes())[0]["__metadata__"] == \
        ckptio.open(path).metadata()
    x = torch.randint(0, 512, (2, 16))
    for load in (ckptio.load_model, st_torch.load_model):
        fresh = transformers.GPT2LMHeadModel(cfg).eval()
        assert load(fresh, path) == (set(), [])
        assert fresh.lm_head.weight is fresh.transformer.wte.weight
        with torch.no_grad():
            assert torch.equal(model(x).logits, fresh(x).logits)


@requires_cuda
def test_load_model_into_cuda(tmp_path):
    torch.manual_seed(8)
    m = TwoTies()
    path = tmp_path / "m.safetensors"
    ckptio.save_model(m, path)
    fresh = TwoTies().cuda()
    assert ckptio.load_model(fresh, path, device="cuda") == (set(), [])
    assert fresh.head.weight is fresh.emb.weight
    for k, v in m.state_dict().items():
        assert torch.equal(v, fresh.state_dict()[k].cpu()), k
