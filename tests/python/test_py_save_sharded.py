"""ckptio.save of a state dict as a Hugging Face directory (max_shard_size, a path ending in "/", an
existing directory): the split, names, index and per-shard metadata equal huggingface_hub's
save_torch_state_dict (compared with it when installed, else with hand-computed cases of its rule, an
oversize tensor included); ckptio.load, safetensors.torch.load_file of each shard and transformers'
from_pretrained read it bit-exact; a progress callback that raises leaves no index, no shard and an older
model intact; an existing model is refused unless overwrite=True; shard sizes as huggingface_hub parses
them, and bad ones refused with a clear error; tied tensors refused as by ckptio.save; s3:// round-trip
against a real server (docs/PYTHON.md "Sharded directories").
"""
import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import ckptio
from ckptio import _ckptio

from conftest import reference_split, requires_s3


def state(sizes, seed=0):
    """name -> uint8 tensor of each size, in order (the split follows the dict's order)."""
    g = torch.Generator().manual_seed(seed)
    return {f"t{i:02d}.w": torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8) for i, n in enumerate(sizes)}


def hf_rule(sizes, limit):
    """huggingface_hub's split by tensor index: shard number (1-based) per tensor, and the shard count."""
    shards = reference_split(list(enumerate(sizes)), limit)
    return {i: k + 1 for k, members in enumerate(shards) for i in members}, len(shards)


def files(d):
    return sorted(os.listdir(d))


def same(a, b):
    assert list(a) == list(b) or sorted(a) == sorted(b)
    for k in b:
        assert torch.equal(a[k], b[k]), k


CASES = [([6, 6, 2, 6, 2, 2], 10), ([3, 12, 4, 5, 1, 0], 10), ([100] * 7, 250), ([1, 2, 3], 1000), ([50, 60], 40)]


@pytest.mark.parametrize("sizes,limit", CASES)
def test_split_names_index_as_huggingface_hub(tmp_path, sizes, limit):
    sd = state(sizes)
    ckptio.save(sd, tmp_path / "c", max_shard_size=limit)
    shard_of, n = hf_rule(sizes, limit)
    if n == 1:
        assert files(tmp_path / "c") == ["model.safetensors"]
    else:
        index = json.loads((tmp_path / "c" / "model.safetensors.index.json").read_text())
        want = {f"t{i:02d}.w": f"model-{shard_of[i]:05d}-of-{n:05d}.safetensors" for i in range(len(sizes))}
        assert index == {"metadata": {"total_size": sum(sizes)}, "weight_map": want}
        assert list(index["weight_map"]) == sorted(want)  # keys sorted, as transformers writes them
        assert files(tmp_path / "c") == sorted(set(want.values())) + ["model.safetensors.index.json"]
    for f in files(tmp_path / "c"):
        if f.endswith(".safetensors"):
            with safe_open(str(tmp_path / "c" / f), "pt") as g:
                assert g.metadata() == {"format": "pt"}
                for k in g.keys():
                    assert torch.equal(g.get_tensor(k), sd[k])
    same(ckptio.load(tmp_path / "c"), sd)


@pytest.mark.parametrize("sizes,limit", CASES)
def test_same_as_huggingface_hub(tmp_path, sizes, limit):
    hub = pytest.importorskip("huggingface_hub")
    sd = state(sizes)
    (tmp_path / "hub").mkdir()
    hub.save_torch_state_dict(sd, tmp_path / "hub", max_shard_size=limit, metadata={"k": "v"})
    ckptio.save(sd, tmp_path / "ck", max_shard_size=limit, metadata={"k": "v"})
    assert files(tmp_path / "ck") == files(tmp_path / "hub")
    for f in files(tmp_path / "hub"):
        if f.endswith(".json"):
            assert json.loads((tmp_path / "ck" / f).read_text()) == json.loads((tmp_path / "hub" / f).read_text())
        else:
            with safe_open(str(tmp_path / "ck" / f), "pt") as a, safe_open(str(tmp_path / "hub" / f), "pt") as b:
                assert a.metadata() == b.metadata() and sorted(a.keys()) == sorted(b.keys())
            same(load_file(tmp_path / "ck" / f), load_file(tmp_path / "hub" / f))


def test_readers_of_the_result(tmp_path):
    """ckptio.load and safetensors' load_file of each shard."""
    g = torch.Generator().manual_seed(1)
    sd = {"embed": torch.randn(300, 64, generator=g).bfloat16(), "w1": torch.randn(64, 64, generator=g),
          "b1": torch.randn(64, generator=g).half(), "mask": torch.rand(77, generator=g) > 0.5,
          "big": torch.randn(200, 100, generator=g)}
    ckptio.save(sd, str(tmp_path / "m") + "/", max_shard_size="40KB")
    assert len([f for f in files(tmp_path / "m") if f.startswith("model-")]) > 2
    same(ckptio.load(tmp_path / "m"), sd)
    merged = {}
    for f in files(tmp_path / "m"):
        if f.endswith(".safetensors"):
            merged.update(load_file(tmp_path / "m" / f))
    same(merged, sd)


def test_transformers_from_pretrained(tmp_path):
    """A tiny GPT-2 saved by ckptio.save in shards (its tied lm_head left out, as save_pretrained leaves it)
    loads through transformers' from_pretrained bit-exact."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0,
                                  eos_token_id=0)
    torch.manual_seed(0)
    sd = {k: v for k, v in transformers.GPT2LMHeadModel(cfg).state_dict().items() if k != "lm_head.weight"}
    ckptio.save(sd, tmp_path / "gpt2", max_shard_size="20KB")
    cfg.save_pretrained(tmp_path / "gpt2")
    assert (tmp_path / "gpt2" / "model.safetensors.index.json").exists()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2").state_dict()
    same({k: loaded[k] for k in sd}, sd)
    assert torch.equal(loaded["lm_head.weight"], sd["transformer.wte.weight"])


@pytest.mark.parametrize("size,want", [("5GB", 5 * 10**9), ("500MB", 500 * 10**6), (" 1.5gb ", 15 * 10**8),
                                       ("10KB", 10**4), ("2TB", 2 * 10**12), (12345, 12345)])
def test_size_strings_as_huggingface_hub(size, want):
    from ckptio import _sharded

    assert _sharded.parse_size(size, "x") == want
    hub = pytest.importorskip("huggingface_hub.serialization._base")
    if isinstance(size, str):
        assert hub.parse_size_to_int(size) == want


@pytest.mark.parametrize("bad,error", [(0, "must be positive"), (-5, "must be positive"), ("0GB", "must be positive"),
                                       ("5 gigabytes", "no unit"), ("GB", "is not a number"), ("abcMB", "not a number"),
                                       ("5", "no unit"), (True, "must be an int"), (1.5, "must be an int"),
                                       ("nanGB", "not a finite size")])
def test_bad_shard_size(tmp_path, bad, error):
    with pytest.raises((ValueError, TypeError), match=error):
        ckptio.save(state([4]), tmp_path / "bad", max_shard_size=bad)
    assert not (tmp_path / "bad").exists()


def test_directory_targets_and_options(tmp_path):
    sd = state([10, 20])
    ckptio.save(sd, str(tmp_path / "slash") + "/")  # a path ending in "/": default 5GB, one file
    assert files(tmp_path / "slash") == ["model.safetensors"]
    (tmp_path / "existing").mkdir()
    ckptio.save(sd, tmp_path / "existing")  # an existing directory
    assert files(tmp_path / "existing") == ["model.safetensors"]
    same(ckptio.load(tmp_path / "existing"), sd)
    with pytest.raises(ValueError, match="4 KiB-aligned"):
        ckptio.save(sd, tmp_path / "x", max_shard_size=10, format="torch")
    with pytest.raises(ValueError, match="checksum"):
        ckptio.save(sd, tmp_path / "x", max_shard_size=10, checksums=True)
    with pytest.raises(ValueError, match="give its path"):
        ckptio.save(sd, None, max_shard_size=10)
    with pytest.raises(ValueError, match="overwrite applies to a directory"):
        ckptio.save(sd, tmp_path / "f.safetensors", overwrite=True)
    with pytest.raises(ValueError, match="share memory"):  # tied tensors: as ckptio.save of one file
        w = torch.zeros(8)
        ckptio.save({"a": w, "b": w}, tmp_path / "tied", max_shard_size=10)
    with pytest.raises(TypeError, match="not a tensor"):
        ckptio.save({"a": w, "step": 3}, tmp_path / "vals", max_shard_size=10)
    assert not (tmp_path / "tied").exists() and not (tmp_path / "vals").exists()


def test_existing_model_refused_unless_overwrite(tmp_path):
    d = tmp_path / "m"
    old = state([100, 100, 100], seed=1)
    ckptio.save(old, d, max_shard_size=150)
    (d / "config.json").write_text("{}")
    new = state([100, 100, 100], seed=2)
    with pytest.raises(ckptio.CkptioFileExistsError, match="already holds a model"):
        ckptio.save(new, d, max_shard_size=150)
    same(ckptio.load(d), old)
    ckptio.save(new, d, max_shard_size=250, overwrite=True)
    same(ckptio.load(d), new)
    assert files(d) == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                        "model.safetensors.index.json"]


def test_cancel_leaves_no_index_and_the_older_model(tmp_path):
    d = tmp_path / "m"
    old = state([1 << 20], seed=3)
    ckptio.save(old, str(d) + "/")  # an older model of one file
    new = state([4 << 20] * 4, seed=4)

    def stop(done, total):
        if done > 0:
            raise KeyboardInterrupt

    engine = ckptio.Engine(threads=1, chunk_bytes=16 << 10, backend="pread", sync=False, write_cache="off")
    with pytest.raises(KeyboardInterrupt):
        ckptio.save(new, d, max_shard_size=5 << 20, overwrite=True, progress=stop, engine=engine)
    assert files(d) == ["model.safetensors"]
    same(ckptio.load(d), old)


@requires_s3
def test_s3_round_trip(s3_prefix):
    sd = state([3 << 20, 5 << 20, 2 << 20, 6 << 20], seed=5)
    engine = ckptio.Engine(s3_part_bytes=5 << 20)
    assert ckptio.save(sd, s3_prefix + "/", max_shard_size="8MB", engine=engine) is None
    keys = sorted(k.rsplit("/", 1)[-1] for k, _, _, _ in _ckptio.object_list(s3_prefix + "/"))
    assert keys == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                    "model-00003-of-00003.safetensors", "model.safetensors.index.json"]
    same(ckptio.load(s3_prefix, engine=engine), sd)
    with pytest.raises(ckptio.CkptioFileExistsError, match="already holds a model"):
        ckptio.save(sd, s3_prefix + "/", engine=engine)
    new = state([3 << 20, 5 << 20, 2 << 20, 6 << 20], seed=6)
    ckptio.save(new, s3_prefix + "/", overwrite=True, engine=engine)  # 5GB: one file, the shards removed
    keys = sorted(k.rsplit("/", 1)[-1] for k, _, _, _ in _ckptio.object_list(s3_prefix + "/"))
    assert keys == ["model.safetensors"]
    same(ckptio.load(s3_prefix, engine=engine), new)
    bucket = s3_prefix[len("s3://"):].split("/", 1)[0]
    for key, _, _, _ in _ckptio.object_list(s3_prefix + "/"):
        _ckptio.object_delete(f"s3://{bucket}/{key}")
