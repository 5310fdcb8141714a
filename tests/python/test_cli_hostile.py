"""Hostile and unusual inputs and names, through the CLI and the package.

- one format detector: every valid safetensors file is one, whatever its
  header length (N = 128 mod 256 starts the file with 0x80, like a pickle);
- writers refuse what readers refuse (a 1 MiB key in a torch file);
- names from files reach the terminal quoted;
- a torch zip whose records overlap (1.1 MB describing 400 MiB) is refused;
- an input truncated while `ckptio convert` copies it is an error naming
  it, never a SIGBUS, and leaves no temporary;
- torch keys that collide once flattened ('a.b' beside a -> b, 1 beside
  '1') are refused naming both paths, never silently dropped.
"""
import importlib.util
import json
import os
import signal
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import ckptio
from conftest import CKPTIO_CLI, REPO

pytestmark = pytest.mark.skipif(CKPTIO_CLI is None, reason="ckptio binary not built (set CKPTIO_TEST_BUILD_DIR)")


def run(*args, env=None):
    return subprocess.run([CKPTIO_CLI, *map(str, args)], capture_output=True, text=True, timeout=120,
                          env=env, errors="surrogateescape")


def _temporaries(d: Path):
    return [p.name for p in d.iterdir() if ".ckptio-tmp-" in p.name]


# ---- one format detector ----------------------------------------------------------------------

TENSOR = np.arange(4, dtype=np.float32)


def _safetensors_with_header_length(path: Path, n: int) -> None:
    text = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, separators=(",", ":"))
    assert len(text) <= n
    path.write_bytes(struct.pack("<Q", n) + text.encode().ljust(n, b" ") + TENSOR.tobytes())


def test_header_length_128_mod_256_everywhere(tmp_path):
    src = tmp_path / "h384.safetensors"
    _safetensors_with_header_length(src, 384)
    assert src.read_bytes()[0] == 0x80  # what sent it to the torch reader
    r = run("inspect", src)
    assert r.returncode == 0, r.stderr
    assert "format:   safetensors" in r.stdout and "\n  t     F32    [4]" in r.stdout
    r = run("verify", src)
    assert r.returncode == 0 and r.stdout.startswith(f"{src}: ok (safetensors, 1 tensor"), r.stderr
    out = tmp_path / "h384.pt"
    r = run("convert", src, out)
    assert r.returncode == 0, r.stderr
    assert torch.equal(torch.load(out, weights_only=True)["t"], torch.from_numpy(TENSOR))
    np.testing.assert_array_equal(ckptio.load(src, framework="numpy")["t"], TENSOR)
    assert ckptio.open(src).format == "safetensors"


def test_every_header_length_residue(tmp_path):
    """All 256 residues of the header length mod 256: verify (CLI, all files in one run: one line each) and
    load (package)."""
    paths = []
    for n in range(64, 64 + 256):
        path = tmp_path / f"h{n % 256}.safetensors"
        _safetensors_with_header_length(path, n)
        paths.append(path)
        np.testing.assert_array_equal(ckptio.load(path, framework="numpy")["t"], TENSOR)
    r = run("verify", *paths)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    ok = {line.split(": ok", 1)[0] for line in r.stdout.splitlines() if ": ok (" in line}
    assert ok == {str(p) for p in paths}, r.stdout


def test_unknown_and_directory_messages(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"#!/bin/sh\necho hi\n")
    for cmd in ("inspect", "verify"):
        r = run(cmd, junk)
        assert r.returncode == 1
        assert r.stderr == (f"ckptio: {junk}: not a checkpoint ckptio can read: neither a safetensors file nor a "
                            "torch.save archive (18 bytes)\n")
    r = run("convert", junk, tmp_path / "out.pt")
    assert r.returncode == 1 and "neither a safetensors file nor a torch.save archive" in r.stderr
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run("inspect", fifo)  # refused at once: the detector never waits for a writer
    assert r.returncode == 1 and "not a regular file or a directory" in r.stderr


# ---- writers refuse what readers refuse --------------------------------------------------------


def test_torch_writer_refuses_names_the_reader_refuses(tmp_path):
    path = tmp_path / "long.pt"
    with pytest.raises(ckptio.CkptioError, match="tensor name longer than 64 KiB"):
        ckptio.save({"k" * 2 ** 20: torch.ones(2)}, path, format="torch")
    assert not path.exists() and not _temporaries(tmp_path)
    ok = {"k" * 60000: torch.ones(2)}
    ckptio.save(ok, path, format="torch")
    assert list(ckptio.open(path).keys()) == list(ok)
    r = run("verify", path)
    assert r.returncode == 0, r.stderr


# ---- quoted human output ------------------------------------------------------------------------

HOSTILE_NAME = "evil\x1b]0;pwned\x07\n\x1b[31mred\u009b2J\u202eend"
QUOTED_NAME = "evil\\x1b]0;pwned\\x07\\n\\x1b[31mred\\u009b2J\\u202eend"


def _has_raw_controls(text: str) -> bool:
    return any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) <= 0x9F or c == "\u202e" for c in text)


def test_inspect_and_verify_quote_names(tmp_path):
    path = tmp_path / "m.safetensors"
    ckptio.save({HOSTILE_NAME: torch.ones(3), "plain": torch.zeros(2)}, path,
                metadata={"note\x1b[2J": "line1\nline2\x07", "utf8": "Grüße ✓"})
    r = run("inspect", path)
    assert r.returncode == 0, r.stderr
    assert not _has_raw_controls(r.stdout), r.stdout
    assert QUOTED_NAME in r.stdout
    assert "  note\\x1b[2J = line1\\nline2\\x07\n" in r.stdout
    assert "  utf8 = Grüße ✓\n" in r.stdout  # printable non-ASCII is left as it is
    assert len([ln for ln in r.stdout.splitlines() if "pwned" in ln]) == 1
    # --json keeps the exact names (escaped by the JSON encoder).
    doc = json.loads(run("inspect", "--json", path).stdout)
    assert HOSTILE_NAME in [t["name"] for t in doc["tensors"]]
    # File names too, in result lines and errors.
    odd = tmp_path / "a\nb\x1b[1m.safetensors"
    odd.write_bytes(path.read_bytes())
    r = run("verify", odd)
    assert r.returncode == 0 and r.stdout.startswith(f"{tmp_path}/a\\nb\\x1b[1m.safetensors: ok"), r.stdout
    odd.write_bytes(b"\x01\x02")
    r = run("verify", odd)
    assert r.returncode == 1 and not _has_raw_controls(r.stderr) and "a\\nb\\x1b[1m" in r.stderr
    latin1 = tmp_path / os.fsdecode(b"caf\xe9.safetensors")  # not UTF-8
    latin1.write_bytes(path.read_bytes())
    r = run("verify", latin1)
    assert r.returncode == 0 and r.stdout.startswith(f"{tmp_path}/caf\\xe9.safetensors: ok"), r.stdout


def test_errors_quote_names(tmp_path):
    path = tmp_path / "m.pt"
    torch.save({HOSTILE_NAME: torch.ones(2, dtype=torch.complex128)}, path)  # no safetensors dtype
    r = run("convert", path, tmp_path / "out.safetensors")
    assert r.returncode == 1
    assert QUOTED_NAME in r.stderr and not _has_raw_controls(r.stderr.rstrip("\n")), r.stderr


# ---- overlapping zip records -------------------------------------------------------------------


def _overlap_module():
    spec = importlib.util.spec_from_file_location("make_zip_overlap", REPO / "tests" / "data" / "make_zip_overlap.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_overlapping_zip_records_are_refused(tmp_path):
    path = tmp_path / "bomb.pt"
    path.write_bytes(_overlap_module().overlapping_torch_zip(400, 1 << 20))
    assert path.stat().st_size < 1_200_000  # describes 400 MiB of storages
    for cmd in ("inspect", "verify"):
        r = run(cmd, path)
        assert r.returncode == 1
        assert "archive/data/1: record overlaps record 'archive/data/0'" in r.stderr, r.stderr
    with pytest.raises(ckptio.CkptioError, match="must not share bytes"):
        ckptio.load(path)
    # The same file in the fuzz corpus (smaller) is refused too.
    corpus = REPO / "fuzz" / "corpus" / "zip" / "overlapping_records.pt"
    assert run("verify", corpus).returncode == 1


def test_shared_dict_with_a_long_key_is_refused_in_bounded_memory(tmp_path):
    # torch.save memoizes the dict: 100 KB of file name one 60 KB key under 20000 paths, 1.2 GB of
    # names (2.3 GB peak and 10 s in `ckptio inspect` before). Names are bounded by the pickle's size.
    path = tmp_path / "names.pt"
    torch.save([{"k" * 60000: torch.zeros(1)}] * 20000, path)
    assert path.stat().st_size < 200_000
    runner = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True);"
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.stderr.write(r.stderr)")
    r = subprocess.run([os.sys.executable, "-c", runner, CKPTIO_CLI, "inspect", str(path)], capture_output=True,
                       text=True, timeout=120)
    # Refused by the count of paths a shared tensor is named along, or failing that by the names' budget.
    assert "shared objects" in r.stderr and ("along 20000 paths" in r.stderr or "take more than" in r.stderr), r.stderr
    assert int(r.stdout.strip()) < 300 << 10, r.stdout
    with pytest.raises(ckptio.CkptioError, match="shared objects"):
        ckptio.load(path)
    # An honest nested state dict of the same tensors, each under its own short path, loads.
    honest = tmp_path / "honest.pt"
    torch.save([{"k" * 60: torch.zeros(1)} for _ in range(2000)], honest)
    assert run("inspect", honest).returncode == 0


# ---- an input truncated during convert ---------------------------------------------------------


def _shim():
    build = Path(os.environ.get("CKPTIO_TEST_BUILD_DIR", REPO / "build"))
    shim = build / "libckptio_test_truncate_shim.so"
    if not shim.is_file():
        pytest.skip("tests/shim/truncate_on_create.c not built")
    return shim


@pytest.mark.parametrize("direction", ["safetensors_to_torch", "torch_to_safetensors"])
def test_convert_input_truncated_while_copying(tmp_path, direction):
    """The input shrinks the moment the output's temporary is created (an
    LD_PRELOAD shim, so exactly then, every run): after the input was opened
    and validated, before its tensor bytes are copied."""
    tensors = {f"t{i}": torch.full((1 << 18,), float(i)) for i in range(4)}  # 1 MiB each
    src_dir, out_dir = tmp_path / "in", tmp_path / "out"
    src_dir.mkdir()
    out_dir.mkdir()
    if direction == "safetensors_to_torch":
        src, out = src_dir / "m.safetensors", out_dir / "m.pt"
        ckptio.save(tensors, src)
    else:
        src, out = src_dir / "m.pt", out_dir / "m.safetensors"
        torch.save(tensors, src)
    keep = src.stat().st_size // 3  # the first tensors stay readable, the rest are gone
    env = dict(os.environ, LD_PRELOAD=str(_shim()), CKPTIO_TEST_TRUNCATE_ON=".ckptio-tmp-",
               CKPTIO_TEST_TRUNCATE_PATH=str(src), CKPTIO_TEST_TRUNCATE_SIZE=str(keep))
    r = run("convert", src, out, env=env)
    assert r.returncode != -signal.SIGBUS and r.returncode != 128 + signal.SIGBUS, "died of SIGBUS"
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert src.stat().st_size == keep  # the shim did shrink it
    assert r.stderr.startswith(f"ckptio: {src}: "), r.stderr
    assert "but the file has only" in r.stderr, r.stderr  # "extent 0 needs bytes [a, b) but the file has only N bytes"
    assert not out.exists()
    assert _temporaries(out_dir) == []


def test_convert_streams_both_directions(tmp_path):
    """The converted files are the ones the in-memory writers produce."""
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(10, dtype=torch.int64), "e": torch.zeros(0),
               "h": torch.randn(7).to(torch.bfloat16)}
    st = tmp_path / "m.safetensors"
    ckptio.save(tensors, st)
    pt = tmp_path / "m.pt"
    assert run("convert", "--quiet", st, pt).returncode == 0
    back = torch.load(pt, weights_only=True)
    assert list(back) == ckptio.open(st).offset_keys()  # the safetensors file's order
    for k, v in tensors.items():
        assert torch.equal(back[k], v)
    r = run("verify", pt)
    assert r.returncode == 0 and "0 without CRC" in r.stdout, r.stdout
    # torch -> safetensors, with a strided view gathered.
    src = tmp_path / "views.pt"
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    torch.save({"t": base.t(), "row": base[1]}, src)
    out = tmp_path / "views.safetensors"
    r = run("convert", src, out)
    assert r.returncode == 0, r.stderr
    got = ckptio.load(out)
    assert torch.equal(got["t"], base.t().contiguous()) and torch.equal(got["row"], base[1])


# ---- keys that collide once flattened ----------------------------------------------------------


@pytest.mark.parametrize("tree,paths", [
    ({"a.b": torch.ones(2), "a": {"b": torch.zeros(3)}}, "at ['a.b'] and at ['a']['b']"),
    ({1: torch.ones(2), "1": torch.zeros(3)}, "at [1] and at ['1']"),
])
def test_flattened_key_collisions_are_refused(tmp_path, tree, paths):
    path = tmp_path / "c.pt"
    torch.save(tree, path)
    with pytest.raises(ckptio.CkptioError, match="two different tensors have this dotted name") as e:
        ckptio.open(path)
    assert paths in str(e.value)
    r = run("inspect", path)
    assert r.returncode == 1 and paths in r.stderr
    # The writer refuses the same tree: ckptio never writes what it cannot read.
    with pytest.raises(ckptio.CkptioError, match="two different tensors have this dotted name"):
        ckptio.save(tree, tmp_path / "w.pt", format="torch")
    assert not (tmp_path / "w.pt").exists()


def test_same_tensor_under_colliding_paths_is_kept(tmp_path):
    t = torch.arange(4.0)
    tree = {"a.b": t, "a": {"b": t}}
    path = tmp_path / "same.pt"
    torch.save(tree, path)
    with ckptio.open(path) as f:
        assert f.keys() == ["a.b"] and torch.equal(f.get_tensor("a.b"), t)
    back = ckptio.load(path)
    assert torch.equal(back["a.b"], t) and torch.equal(back["a"]["b"], t)
    ckptio.save(tree, tmp_path / "w.pt", format="torch")
    back = torch.load(tmp_path / "w.pt", weights_only=True)
    assert torch.equal(back["a"]["b"], t)
