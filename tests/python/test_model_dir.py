"""Hugging Face model directories, slices and the safe_open drop-in.

Directories are written by the ``safetensors`` package itself (data not
4 KiB-aligned); every result is compared with what safetensors' own
``load_file`` / ``safe_open(...).get_slice(...)`` give, byte for byte.
"""
import json
import os
import pickle
import random

import numpy as np
import pytest
import torch
from safetensors import safe_open as st_safe_open
from safetensors.torch import load_file, save_file

import ckptio
from conftest import CKPTIO_CLI, requires_cli, requires_cuda

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn,
          torch.float8_e5m2, torch.float8_e8m0fnu]
SHAPES = [(), (7,), (5, 6), (3, 4, 5), (2, 3, 4, 5)]


def random_tensor(dtype, shape, seed):
    """Random bytes: every bit pattern (NaNs included), compared as bytes."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) if shape else 1
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same_bytes(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(flat_bytes(a), flat_bytes(b))


def flat_bytes(t):
    out = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
    out.copy_(t.reshape(-1))
    return out.view(torch.uint8)


def write_hf_dir(path, tensors, shards, metadata=None):
    """tensors split round-robin into `shards` files written by safetensors, plus the index."""
    os.makedirs(path, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, os.path.join(path, fname), metadata=metadata if metadata is not None else {"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return weight_map


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    tensors = {}
    seed = 0
    for dt in DTYPES:
        for shape in SHAPES:
            seed += 1
            tensors[f"t.{str(dt).split('.')[-1]}.{len(shape)}d"] = random_tensor(dt, shape, seed)
    tensors["empty"] = torch.zeros((0, 4))
    write_hf_dir(str(d), tensors, 3)
    return str(d), tensors


def reference(directory):
    """What safetensors itself loads from every shard."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, name)))
    return out


# ---- directories -----------------------------------------------------------------------------


def test_load_directory_and_index(model_dir):
    d, tensors = model_dir
    ref = reference(d)
    for path in (d, os.path.join(d, "model.safetensors.index.json")):
        sd = ckptio.load(path)
        assert sorted(sd) == sorted(tensors)
        for name, t in ref.items():
            assert same_bytes(sd[name], t), name
    with ckptio.open(d) as f:
        assert f.format == "safetensors"
        assert f.keys() == sorted(tensors)
        assert len(f.shards) == 3 and all(os.path.dirname(s) == d for s in f.shards)
        assert f.metadata() == {"format": "pt"}
        # offset_keys: shard by shard, in file order inside each.
        order = f.offset_keys()
        shard_of = [f.shards.index(f.info(n).file) for n in order]
        assert shard_of == sorted(shard_of)
        info = f.info("t.float32.2d")
        assert info.file.endswith(".safetensors") and info.nbytes == 5 * 6 * 4
        with open(info.file, "rb") as fh:
            fh.seek(info.offset)
            assert fh.read(info.nbytes) == tensors["t.float32.2d"].numpy().tobytes()
        got = f.get_tensors(["t.bfloat16.3d", "t.int8.1d"])
        assert same_bytes(got["t.bfloat16.3d"], tensors["t.bfloat16.3d"])


def test_one_plan_for_a_whole_directory(model_dir):
    d, tensors = model_dir
    engine = ckptio.Engine()
    with ckptio.open(d, engine=engine) as f:
        calls = []
        real = f._reader

        class Counting:
            def __getattr__(self, name):
                return getattr(real, name)

            def read_runs(self, runs):
                calls.append(sum(run[1] for run in runs))
                return real.read_runs(runs)

        f._reader = Counting()
        before = engine.stats()["bytes_read"]
        f.get_tensors()
        f._reader = real
    assert calls == [len(tensors)]  # every tensor of every shard in one ckptio_model_read
    assert engine.stats()["bytes_read"] - before == sum(t.numel() * t.element_size() for t in tensors.values())


def test_unaligned_data_through_o_direct(model_dir):
    d, tensors = model_dir
    engine = ckptio.Engine(direct="on", direct_min_bytes=0)
    try:
        sd = ckptio.load(d, engine=engine)
    except ckptio.CkptioError as e:
        if e.status_name == "E_UNSUPPORTED":
            pytest.skip(f"O_DIRECT refused here: {e}")
        raise
    st = engine.stats()
    assert st["bytes_direct"] > 0 and st["bytes_bounced"] > 0
    for name, t in tensors.items():
        assert same_bytes(sd[name], t), name


def test_directory_forms(tmp_path):
    a = {"a": torch.arange(4.0)}
    b = {"b": torch.arange(3, dtype=torch.int32)}
    single = tmp_path / "single"
    single.mkdir()
    save_file(a, single / "model.safetensors")
    assert list(ckptio.load(single)) == ["a"]
    several = tmp_path / "several"
    several.mkdir()
    save_file(a, several / "x.safetensors")
    save_file(b, several / "y.safetensors")
    assert sorted(ckptio.load(several)) == ["a", "b"]
    save_file(a, several / "z.safetensors")
    with pytest.raises(ckptio.CkptioError, match="two files") as e:
        ckptio.load(several)
    assert "x.safetensors" in str(e.value) and "z.safetensors" in str(e.value)


# ---- hostile directories ----------------------------------------------------------------------


def small_dir(path):
    tensors = {"a": torch.arange(6.0), "b": torch.ones(2, 3, dtype=torch.bfloat16), "c": torch.zeros(5)}
    write_hf_dir(str(path), tensors, 2)
    return path


def set_map(path, weight_map):
    with open(path / "model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": weight_map}, f)


def test_missing_shard_names_index_tensor_shard(tmp_path):
    d = small_dir(tmp_path / "m")
    os.unlink(d / "model-00002-of-00002.safetensors")
    with pytest.raises(ckptio.CkptioFileNotFoundError) as e:
        ckptio.load(d)
    msg = str(e.value)
    assert "model.safetensors.index.json" in msg and "'b'" in msg and "model-00002-of-00002.safetensors" in msg


def test_tensor_in_two_shards(tmp_path):
    d = small_dir(tmp_path / "m")
    save_file({"a": torch.arange(6.0), "b": torch.ones(2, 3, dtype=torch.bfloat16)},
              d / "model-00002-of-00002.safetensors")
    with pytest.raises(ckptio.CkptioError, match="two shards") as e:
        ckptio.open(d)
    assert e.value.status_name == "E_FORMAT" and "'a'" in str(e.value)


def test_index_naming_absent_tensor(tmp_path):
    d = small_dir(tmp_path / "m")
    wm = json.load(open(d / "model.safetensors.index.json"))["weight_map"]
    wm["ghost"] = "model-00001-of-00002.safetensors"
    set_map(d, wm)
    with pytest.raises(ckptio.CkptioError, match="'ghost' is mapped to shard 'model-00001-of-00002.safetensors', "
                       "which does not hold it"):
        ckptio.open(d)


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors", "..", "."])
def test_traversal_names_refused(tmp_path, name):
    d = small_dir(tmp_path / "m")
    save_file({"a": torch.arange(6.0)}, tmp_path / "outside.safetensors")
    set_map(d, {"a": name})
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.open(d)
    assert e.value.status_name == "E_DISALLOWED" and "own directory" in str(e.value)


def test_duplicate_json_keys_refused(tmp_path):
    d = small_dir(tmp_path / "m")
    (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "a": "model-00002-of-00002.safetensors"}}')
    with pytest.raises(ckptio.CkptioError, match="duplicate") as e:
        ckptio.open(d)
    assert e.value.status_name == "E_FORMAT"


def test_symlinked_shard_escaping(tmp_path):
    d = small_dir(tmp_path / "m")
    outside = tmp_path / "elsewhere.safetensors"
    os.rename(d / "model-00001-of-00002.safetensors", outside)
    os.symlink(outside, d / "model-00001-of-00002.safetensors")
    with pytest.raises(ckptio.CkptioError, match="symlink") as e:
        ckptio.load(d)
    assert e.value.status_name == "E_DISALLOWED"
    sd = ckptio.load(d, allow_symlinks=True)  # the hub cache layout, on request
    assert torch.equal(sd["a"], torch.arange(6.0))


# ---- slices -----------------------------------------------------------------------------------


def random_index(shape, rng):
    """A basic index: ints (negative too), slices with steps, ..., None."""
    items = []
    dims = list(shape)
    use_ellipsis = rng.random() < 0.2 and dims
    if use_ellipsis:
        cut = rng.randint(0, len(dims))
        keep = dims[:cut]
    else:
        keep = dims[:rng.randint(0, len(dims))] if dims else []
    for n in keep:
        r = rng.random()
        if r < 0.25 and n:
            items.append(rng.randint(-n, n - 1))
        elif r < 0.35:
            items.append(None)
            items.append(slice(None))
        else:
            a = rng.randint(-n - 2, n + 2)
            b = rng.randint(-n - 2, n + 2)
            step = rng.choice([None, 1, 1, 2, 3])
            items.append(slice(rng.choice([a, None]), rng.choice([b, None]), step))
    if use_ellipsis:
        items.append(Ellipsis)
    return tuple(items) if len(items) != 1 or rng.random() < 0.5 else items[0]


def test_slices_match_safetensors_every_dtype_and_rank(model_dir):
    d, tensors = model_dir
    index = os.path.join(d, "model.safetensors.index.json")
    wm = json.load(open(index))["weight_map"]
    rng = random.Random(7)
    with ckptio.safe_open(d, framework="pt") as f:
        for name, t in tensors.items():
            with st_safe_open(os.path.join(d, wm[name]), framework="pt") as g:
                ours, theirs = f.get_slice(name), g.get_slice(name)
                assert ours.get_shape() == theirs.get_shape() and type(ours.get_shape()) is list
                assert ours.get_dtype() == theirs.get_dtype()
                cases = [Ellipsis, (), slice(None)] + [random_index(t.shape, rng) for _ in range(12)]
                for idx in cases:
                    try:
                        want = theirs[idx]
                    except Exception as exc:  # torch's own errors, raised the same way by ckptio
                        with pytest.raises(type(exc)):
                            ours[idx]
                        continue
                    got = ours[idx]
                    assert same_bytes(got, want), f"{name}[{idx!r}]"


def test_slice_edges_and_errors(model_dir):
    d, tensors = model_dir
    t = tensors["t.float32.3d"]  # (3, 4, 5)
    with ckptio.safe_open(d) as f:
        s = f.get_slice("t.float32.3d")
        for idx in [(slice(1, 2),), (slice(None), slice(1, 3)), (Ellipsis, 1), -1, (0, -2, slice(3, None)),
                    slice(2, 1), slice(0, 10), (slice(None), slice(4, 4)), (None, 1), np.int64(2)]:
            assert same_bytes(s[idx], t[idx]), idx
        with pytest.raises(IndexError):
            s[3]
        with pytest.raises(IndexError):
            s[-4]
        with pytest.raises(IndexError):
            s[1, 2, 3, 4]
        with pytest.raises(ValueError, match="step must be greater than zero"):
            s[::-1]
        with pytest.raises(IndexError):
            f.get_slice("t.float32.0d")[:]
        assert same_bytes(f.get_slice("t.float32.0d")[...], tensors["t.float32.0d"])
        assert same_bytes(s[[0, 2]], t[[0, 2]])  # advanced indexing: whole tensor, then the index
        with pytest.raises(KeyError):
            f.get_slice("nope")


def test_slice_reads_only_covered_bytes(model_dir):
    d, tensors = model_dir
    engine = ckptio.Engine()
    with ckptio.open(d, engine=engine) as f:
        before = engine.stats()["bytes_read"]
        rows = f.get_slice("t.float64.3d")[1:3]
        cols = f.get_slice("t.int32.2d")[:, 2:4]
        read = engine.stats()["bytes_read"] - before
    assert same_bytes(rows, tensors["t.float64.3d"][1:3]) and same_bytes(cols, tensors["t.int32.2d"][:, 2:4])
    assert read == rows.numel() * 8 + cols.numel() * 4


def test_batched_slices_one_call_and_split(model_dir):
    d, tensors = model_dir
    requests = {"t.bfloat16.2d": (slice(None), slice(3, None)), "t.float16.4d": (1, Ellipsis, slice(1, 3)),
                "t.int64.1d": slice(2, 5), "t.float32.0d": Ellipsis, "t.uint8.3d": (slice(None, None, 2), 1)}
    with ckptio.open(d) as f:
        calls = []
        real = f._reader

        class Counting:
            def __getattr__(self, name):
                return getattr(real, name)

            def read_slices(self, targets):
                calls.append(len(targets))
                return real.read_slices(targets)

        f._reader = Counting()
        got = f.get_slices(requests)
        assert calls == [len(requests)]
        for name, idx in requests.items():
            assert same_bytes(got[name], tensors[name][idx]), name
        # The same requests as plain data, split between two "ranks" and read separately.
        plan = f.plan_slices(list(requests.items()))
        plan = pickle.loads(pickle.dumps(plan))
        assert plan[0].nbytes == 5 * 3 * 2
        first, second = f.read_slices(plan[::2]), f.read_slices(plan[1::2])
        f._reader = real
    merged = [None] * len(plan)
    merged[::2], merged[1::2] = first, second
    for (name, idx), t in zip(requests.items(), merged):
        assert same_bytes(t, tensors[name][idx]), name


def test_float4_slices(tmp_path):
    raw = torch.randint(0, 256, (4, 6), dtype=torch.uint8)
    t = raw.view(torch.float4_e2m1fn_x2)
    save_file({"f4": t}, tmp_path / "f4.safetensors")
    with ckptio.safe_open(tmp_path / "f4.safetensors") as f:
        s = f.get_slice("f4")
        assert s.get_shape() == [4, 12] and s.get_dtype() == "F4"  # safetensors counts 4-bit values
        for idx in [(slice(1, 3),), (slice(None), slice(2, 5)), (1, slice(None, None, 2)), -1]:
            assert torch.equal(s[idx].view(torch.uint8), t[idx].contiguous().view(torch.uint8)), idx


def test_numpy_framework(model_dir):
    d, tensors = model_dir
    with ckptio.safe_open(d, framework="np") as f:
        a = f.get_slice("t.int16.3d")[1:, ::2]
        assert isinstance(a, np.ndarray)
        assert np.array_equal(a, tensors["t.int16.3d"].numpy()[1:, ::2])
        assert np.array_equal(f.get_tensor("t.float32.1d"), tensors["t.float32.1d"].numpy())


@requires_cuda
def test_slices_to_gpu(model_dir):
    d, tensors = model_dir
    with ckptio.safe_open(d, device="cuda:0") as f:
        for name in ["t.bfloat16.2d", "t.float32.4d", "t.int8.3d"]:
            t = tensors[name]
            idx = (slice(None), slice(1, -1))
            got = f.get_slice(name)[idx]
            assert got.device.type == "cuda"
            assert same_bytes(got.cpu(), t[idx])
    sd = ckptio.load(d, device="cuda")
    for name, t in tensors.items():
        assert same_bytes(sd[name].cpu(), t), name


# ---- the safe_open drop-in --------------------------------------------------------------------


def test_safe_open_matches_safetensors_api(tmp_path):
    tensors = {"z": torch.arange(3.0), "a": torch.ones(2, 2), "m": torch.zeros(4, dtype=torch.int8)}
    for md, path in [(None, tmp_path / "none.safetensors"), ({}, tmp_path / "empty.safetensors"),
                     ({"k": "v"}, tmp_path / "kv.safetensors")]:
        save_file(tensors, path, metadata=md)
        with st_safe_open(path, framework="pt") as g, ckptio.safe_open(path, framework="pt") as f:
            assert f.metadata() == g.metadata()
            assert f.keys() == g.keys() and f.offset_keys() == g.offset_keys()
            ours, theirs = f.get_tensors(), g.get_tensors()
            assert list(ours) == list(theirs)
            for k in theirs:
                assert torch.equal(ours[k], theirs[k]) and torch.equal(f.get_tensor(k), g.get_tensor(k))
        for method in ("keys", "metadata", "offset_keys", "get_tensors"):
            with pytest.raises(ValueError, match="File is closed"):
                getattr(f, method)()
        with pytest.raises(ValueError, match="File is closed"):
            f.get_tensor("a")
    assert ckptio.safe_open(path, "pt", device="cpu").get_tensor("z").device.type == "cpu"


# ---- real code: transformers ------------------------------------------------------------------


def tiny_models():
    transformers = pytest.importorskip("transformers")
    llama = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    gpt2 = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    return [(transformers.LlamaForCausalLM, llama), (transformers.GPT2LMHeadModel, gpt2)]


@pytest.mark.parametrize("which", [0, 1], ids=["llama", "gpt2"])
def test_transformers_round_trip(tmp_path, which):
    cls, config = tiny_models()[which]
    torch.manual_seed(which)
    model = cls(config).eval()
    out = tmp_path / "model"
    model.save_pretrained(out, max_shard_size="100KB", safe_serialization=True)
    shards = sorted(p.name for p in out.iterdir() if p.suffix == ".safetensors")
    assert len(shards) > 2 and (out / "model.safetensors.index.json").exists()

    ref = reference(str(out))  # safetensors' own loading
    sd = ckptio.load(out)
    assert sorted(sd) == sorted(ref)
    for k in ref:
        assert same_bytes(sd[k], ref[k]), k

    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    mine = cls(config).eval()
    missing, unexpected = mine.load_state_dict(sd, strict=False)
    assert not unexpected
    assert set(missing) <= {"lm_head.weight"}  # tied to the embedding, not saved
    mine.tie_weights()
    theirs = cls.from_pretrained(out).eval()
    with torch.no_grad():
        a, b, c = model(ids).logits, mine(ids).logits, theirs(ids).logits
    assert torch.equal(a, b) and torch.equal(b, c)

    # The same through the safe_open drop-in, as code written for safetensors does it.
    sd2 = {}
    for name in shards:
        with ckptio.safe_open(out / name, framework="pt", device="cpu") as f:
            assert f.metadata() == {"format": "pt"}
            for k in f.keys():
                sd2[k] = f.get_tensor(k)
    assert all(same_bytes(sd2[k], ref[k]) for k in ref)


# ---- the CLI ------------------------------------------------------------------------------------


@requires_cli
def test_cli_bench_model_and_inspect(model_dir):
    import subprocess

    d, tensors = model_dir
    r = subprocess.run([CKPTIO_CLI, "bench", "--model", d, "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["shards"] == 3 and doc["tensors"] == len(tensors) and doc["loads_verified"] == 2
    assert doc["tensor_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert set(doc["gbps"]) == {"raw_read_direct", "raw_read_cached", "load_cold", "load_warm"}
    r = subprocess.run([CKPTIO_CLI, "bench", "--model", d, "--device", "cuda:0"], capture_output=True, text=True)
    assert r.returncode == 2 and "cpu" in r.stderr
    # inspect/verify parse the index with the library's parser: the same refusals.
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    bad = os.path.join(os.path.dirname(d), "bad-index")
    os.makedirs(bad, exist_ok=True)
    with open(os.path.join(bad, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"x": "../" + os.path.basename(d) + "/" + next(iter(index["weight_map"].values()))}},
                  f)
    r = subprocess.run([CKPTIO_CLI, "verify", bad], capture_output=True, text=True)
    assert r.returncode == 1 and "own directory" in r.stderr, r.stderr
