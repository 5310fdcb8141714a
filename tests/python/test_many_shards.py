"""Descriptors stay bounded whatever a checkpoint's file count (docs/MODELS.md "Many shards").

A Hugging Face directory of 1,500 shards loads, through ckptio.load (also mapped), ckptio.safe_open and the CLI,
in a process limited to 256 descriptors (RLIMIT_NOFILE, set in a subprocess): every value is
checked. A DCP directory of 100 data files verifies (CLI) and loads (ckptio.dcp's reader) under a
limit of 48. Before, each open shard held two descriptors for the life of the model, so ~510 shards
exhausted the usual 1,024, and a DCP reader opened every data file of a load at once.
"""
import json
import os
import resource
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from conftest import CKPTIO_CLI

SHARDS = 1500
LIMIT = 256


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("many")
    weight_map = {}
    for k in range(SHARDS):
        name = f"model-{k + 1:05d}-of-{SHARDS:05d}.safetensors"
        # Odd sizes: reads of every alignment; two tensors per shard, one of them a slice source.
        save_file({f"a{k}": torch.arange(37, dtype=torch.float32) + k, f"b{k}": torch.full((3, 5), k)}, d / name)
        weight_map[f"a{k}"] = weight_map[f"b{k}"] = name
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def _limited(limit):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return apply


def test_load_under_a_low_descriptor_limit(many_shards):
    script = textwrap.dedent("""
        import json, resource, sys
        import torch, ckptio
        d = sys.argv[1]
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == int(sys.argv[2])
        sd = ckptio.load(d)
        n = int(sys.argv[3])
        assert len(sd) == 2 * n
        for k in range(n):
            assert torch.equal(sd[f"a{k}"], torch.arange(37, dtype=torch.float32) + k), k
            assert torch.equal(sd[f"b{k}"], torch.full((3, 5), k)), k
        with ckptio.safe_open(d, framework="pt") as f:
            assert len(list(f.keys())) == 2 * n
            for k in (0, 700, n - 1):
                assert torch.equal(f.get_slice(f"b{k}")[1:, 2:4], torch.full((2, 2), k))
            got = {name: f.get_tensor(name) for name in f.keys()}  # every shard, one call at a time
        assert all(torch.equal(got[k], sd[k]) for k in sd)
        mapped = ckptio.load(d, mmap=True)  # every shard mapped at once, no descriptor held
        assert mapped.keys() == sd.keys() and all(torch.equal(mapped[k], sd[k]) for k in sd)
        print(json.dumps({"tensors": len(sd)}))
    """)
    p = subprocess.run([sys.executable, "-c", script, str(many_shards), str(LIMIT), str(SHARDS)], capture_output=True,
                       text=True, timeout=300, preexec_fn=_limited(LIMIT))
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"tensors": 2 * SHARDS}


@pytest.mark.skipif(CKPTIO_CLI is None, reason="no ckptio command")
def test_cli_under_a_low_descriptor_limit(many_shards, tmp_path):
    r = subprocess.run([CKPTIO_CLI, "verify", str(many_shards)], capture_output=True, text=True, timeout=300,
                       preexec_fn=_limited(LIMIT))
    assert r.returncode == 0 and f"{SHARDS} shards, {2 * SHARDS} tensors" in r.stdout, r.stderr
    # A DCP directory of many data files: verify reads them all, a few at a time.
    import torch.distributed.checkpoint as dcp

    import ckptio.dcp

    d = tmp_path / "dcp"
    sd = {f"t{i}": torch.full((16,), float(i)) for i in range(200)}
    dcp.save(sd, storage_writer=ckptio.dcp.FileSystemWriter(d, thread_count=100, sync_files=False), no_dist=True)
    assert len([n for n in os.listdir(d) if n.endswith(".distcp")]) >= 90
    r = subprocess.run([CKPTIO_CLI, "verify", str(d)], capture_output=True, text=True, timeout=300,
                       preexec_fn=_limited(48))
    assert r.returncode == 0 and "200 of 200 items matched" in r.stdout, r.stderr
    # And ckptio.dcp's reader loads it there, every value checked.
    script = textwrap.dedent("""
        import sys, warnings
        warnings.filterwarnings("ignore")
        import torch, ckptio.dcp
        import torch.distributed.checkpoint as dcp
        sd = {f"t{i}": torch.zeros(16) for i in range(200)}
        dcp.load(sd, storage_reader=ckptio.dcp.FileSystemReader(sys.argv[1]), no_dist=True)
        assert all(torch.equal(sd[f"t{i}"], torch.full((16,), float(i))) for i in range(200))
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", script, str(d)], capture_output=True, text=True, timeout=300,
                       preexec_fn=_limited(48))
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]
