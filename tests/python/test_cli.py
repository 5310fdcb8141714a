"""Tests of the `ckptio` command-line tool (tools/), run as a subprocess.

The binary is found through $CKPTIO_TEST_BUILD_DIR/ckptio, then $PATH, then
build/ckptio at the repository root; every test skips when there is none.
Reference values come from the `safetensors` package and from parsing the
file header independently in Python, never from ckptio itself.
"""
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file as np_save_file  # noqa: E402

from conftest import CKPTIO_CLI, requires_cli  # noqa: E402


CKPTIO = CKPTIO_CLI
pytestmark = requires_cli
COMMANDS = ["inspect", "verify", "bench"]


def run(*args, timeout=120, env=None):
    full_env = dict(os.environ)
    full_env.pop("CKPTIO_NO_PROGRESS", None)
    if env:
        full_env.update(env)
    return subprocess.run([CKPTIO, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=full_env)


def read_header(path):
    """The header as the safetensors format defines it: (json dict, data start)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), 8 + n


@pytest.fixture
def disk_dir():
    """A directory on a disk (/var/tmp), not on a tmpfs /tmp, for bench."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="ckptio-test-", dir="/var/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def st_file(tmp_path):
    """A safetensors file written by the reference package, with metadata,
    several dtypes, a scalar and an empty tensor."""
    rng = np.random.default_rng(7)
    tensors = {
        "model.embed.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "model.layers.0.bias": rng.standard_normal((32,)).astype(np.float16),
        "model.layers.0.ids": rng.integers(-1000, 1000, size=(3, 5, 7), dtype=np.int64),
        "mask": rng.integers(0, 2, size=(17,)).astype(np.bool_),
        "step": np.array(42, dtype=np.int32),
        "empty": np.zeros((0, 4), dtype=np.uint8),
    }
    path = tmp_path / "model.safetensors"
    np_save_file(tensors, str(path), metadata={"format": "np", "note": "written by safetensors"})
    return path, tensors


# ---- help, version, usage errors ---------------------------------------------


def test_main_help_lists_every_command():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: ckptio")
    for cmd in COMMANDS:
        assert f"\n  {cmd} " in r.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_command_help(cmd):
    for args in ([cmd, "--help"], [cmd, "-h"], ["help", cmd]):
        r = run(*args)
        assert r.returncode == 0, (args, r.stderr)
        assert r.stdout.startswith(f"usage: ckptio {cmd}"), args
        assert "exit status" in r.stdout
        assert r.stderr == ""


def test_version():
    r = run("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("ckptio 0.1.0 (libckptio 0.1.0)")


@pytest.mark.parametrize("cmd", COMMANDS)
def test_unknown_option_is_usage_error(cmd):
    r = run(cmd, "--no-such-option")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.startswith("ckptio: unknown option '--no-such-option'\n")
    assert f"usage: ckptio {cmd}" in r.stderr


def test_usage_errors():
    cases = [
        ([], "ckptio: no command given"),
        (["frobnicate"], "ckptio: unknown command 'frobnicate'"),
        (["--bogus"], "ckptio: unknown option '--bogus'"),
        (["inspect"], "ckptio: no FILE given"),
        (["inspect", "a", "b"], "ckptio: one FILE at a time (got 'b' too)"),
        (["verify"], "ckptio: no FILE given"),
        (["bench", "--size"], "ckptio: option '--size' needs a value"),
        (["bench", "--size", "lots"], "ckptio: --size: 'lots' is not a size like 512M or 1G"),
        (["bench", "--size", "1.3K"], "ckptio: --size: '1.3K' is not a size"),
        (["bench", "--backend", "mmap"], "ckptio: --backend: 'mmap' is not auto, pread or io_uring"),
        (["bench", "--direct", "maybe"], "ckptio: --direct: 'maybe' is not auto, on or off"),
        (["bench", "--repeat", "0"], "ckptio: --repeat: '0' is not a count from 1 to 16"),
        (["bench", "--size", "8K", "--tensors", "4"], "each of the 4 tensors at least 4 KiB"),
        (["bench", "extra"], "ckptio: unexpected argument 'extra'"),
        (["inspect", "-x", "f"], "ckptio: unknown option '-x'"),
    ]
    for args, message in cases:
        r = run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr, (args, r.stderr)
        assert "usage: ckptio" in r.stderr, args


# ---- inspect -------------------------------------------------------------------


def test_inspect_json_matches_safetensors(st_file):
    path, tensors = st_file
    r = run("inspect", "--json", path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    header, data_start = read_header(path)

    assert doc["file"] == str(path)
    assert doc["format"] == "safetensors"
    assert doc["file_size"] == path.stat().st_size
    assert doc["data_offset"] == data_start
    with safe_open(str(path), framework="np") as f:
        assert doc["metadata"] == f.metadata()
        names = set(f.keys())
    assert doc["metadata"] == header["__metadata__"]

    listed = {t["name"]: t for t in doc["tensors"]}
    assert set(listed) == names == set(tensors)
    # File-offset order, as documented.
    offsets = [t["offset"] for t in doc["tensors"]]
    assert offsets == sorted(offsets)
    with safe_open(str(path), framework="np") as f:
        for name, t in listed.items():
            sl = f.get_slice(name)
            assert t["dtype"] == sl.get_dtype() == header[name]["dtype"]
            assert t["shape"] == list(sl.get_shape()) == header[name]["shape"]
            begin, end = header[name]["data_offsets"]
            assert t["data_offsets"] == [begin, end]
            assert t["offset"] == data_start + begin
            assert t["nbytes"] == end - begin == tensors[name].nbytes
    assert listed["mask"]["torch_dtype"] == "bool"
    assert listed["model.embed.weight"]["torch_dtype"] == "float32"

    totals = doc["totals"]
    assert totals["tensors"] == len(tensors)
    assert totals["nbytes"] == sum(a.nbytes for a in tensors.values())
    assert totals["by_dtype"] == {
        "F32": {"tensors": 1, "nbytes": 64 * 32 * 4},
        "F16": {"tensors": 1, "nbytes": 32 * 2},
        "I64": {"tensors": 1, "nbytes": 3 * 5 * 7 * 8},
        "BOOL": {"tensors": 1, "nbytes": 17},
        "I32": {"tensors": 1, "nbytes": 4},
        "U8": {"tensors": 1, "nbytes": 0},
    }


def test_inspect_json_torch_dtypes(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    sd = {
        "w": torch.randn(16, 8).to(torch.bfloat16),
        "q": torch.zeros(4, 4, dtype=torch.float8_e4m3fn),
        "u": torch.zeros(2, 3, dtype=torch.uint16),
    }
    path = tmp_path / "t.safetensors"
    save_file(sd, str(path))
    r = run("inspect", "--json", path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    got = {t["name"]: (t["dtype"], t["torch_dtype"], t["shape"]) for t in doc["tensors"]}
    assert got == {
        "w": ("BF16", "bfloat16", [16, 8]),
        "q": ("F8_E4M3", "float8_e4m3fn", [4, 4]),
        "u": ("U16", "uint16", [2, 3]),
    }
    assert doc["metadata"] == {}


def test_inspect_text(st_file):
    path, tensors = st_file
    header, data_start = read_header(path)
    r = run("inspect", path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert f"file:     {path}\n" in out
    assert "format:   safetensors\n" in out
    assert f"data section at offset {data_start}\n" in out
    assert "  format = np\n" in out
    assert "  note = written by safetensors\n" in out
    assert f"tensors: {len(tensors)}\n" in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ") and len(ln.split()) >= 4}
    emb = lines["model.embed.weight"].split()
    assert emb[1] == "F32"
    assert "[64, 32]" in lines["model.embed.weight"]
    assert "8.00 KiB" in lines["model.embed.weight"]
    assert emb[-1] == str(data_start + header["model.embed.weight"]["data_offsets"][0])
    assert "[]" in lines["step"]  # a scalar
    assert "[0, 4]" in lines["empty"]
    total = sum(a.nbytes for a in tensors.values())
    assert f"total: {len(tensors)} tensors, " in out and f"({total} bytes)" in out


def test_inspect_unaligned_file_from_reference_writer(tmp_path):
    # The reference writer pads the header to 8 bytes only: offsets are not
    # 4 KiB multiples, and inspect must report them exactly.
    path = tmp_path / "u.safetensors"
    np_save_file({"a": np.arange(3, dtype=np.uint8), "b": np.arange(5, dtype=np.float64)}, str(path))
    header, data_start = read_header(path)
    doc = json.loads(run("inspect", "--json", path).stdout)
    for t in doc["tensors"]:
        assert t["offset"] == data_start + header[t["name"]]["data_offsets"][0]
    assert data_start % 4096 != 0


def test_inspect_errors(tmp_path):
    missing = tmp_path / "missing.safetensors"
    r = run("inspect", missing)
    assert r.returncode == 1
    assert r.stderr == f"ckptio: {missing}: cannot open: No such file or directory\n"
    # A directory is a model directory, as for ckptio.load: this one holds none.
    r = run("inspect", tmp_path)
    assert r.returncode == 1
    assert f"{tmp_path}: no model.safetensors.index.json" in r.stderr and "no *.safetensors file" in r.stderr


# ---- verify ---------------------------------------------------------------------


def test_verify_ok(st_file):
    path, tensors = st_file
    r = run("verify", path)
    assert r.returncode == 0, r.stderr
    total = sum(a.nbytes for a in tensors.values())
    assert 1024 <= total < 1 << 20
    assert r.stdout == f"{path}: ok (safetensors, {len(tensors)} tensors, {total / 1024:.2f} KiB of data read)\n"
    assert r.stderr == ""
    r = run("verify", "--quiet", path)
    assert r.returncode == 0 and r.stdout == ""


def _rewrite_header(src, dst, mutate):
    header, data_start = read_header(src)
    data = Path(src).read_bytes()[data_start:]
    mutate(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    Path(dst).write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_verify_truncated(st_file, tmp_path):
    path, _ = st_file
    header, data_start = read_header(path)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(path.read_bytes()[:-3])
    r = run("verify", bad)
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.startswith(f"ckptio: {bad}: ")
    assert f"'{last}'" in r.stderr
    assert "past the end of the file" in r.stderr


def test_verify_corrupt_headers(st_file, tmp_path):
    path, _ = st_file

    def gap(h):
        h["mask"]["data_offsets"] = [h["mask"]["data_offsets"][0] + 1, h["mask"]["data_offsets"][1] + 1]

    def bad_dtype(h):
        h["step"]["dtype"] = "F17"

    def wrong_size(h):
        h["model.layers.0.ids"]["shape"] = [3, 5, 8]

    cases = [
        (gap, "mask", None),
        (bad_dtype, "step", "unknown dtype 'F17'"),
        (wrong_size, "model.layers.0.ids", "[3, 5, 8]"),
    ]
    for i, (mutate, tensor, phrase) in enumerate(cases):
        bad = tmp_path / f"bad{i}.safetensors"
        _rewrite_header(path, bad, mutate)
        r = run("verify", bad)
        assert r.returncode == 1, (mutate.__name__, r.stdout)
        assert r.stderr.startswith(f"ckptio: {bad}: "), r.stderr
        assert f"'{tensor}'" in r.stderr, r.stderr
        if phrase:
            assert phrase in r.stderr.replace("[3,5,8]", "[3, 5, 8]"), r.stderr

    bad = tmp_path / "notjson.safetensors"
    bad.write_bytes(struct.pack("<Q", 4) + b"{no}")
    r = run("verify", bad)
    assert r.returncode == 1
    assert "not valid JSON" in r.stderr and str(bad) in r.stderr

    bad = tmp_path / "trailing.safetensors"
    bad.write_bytes(path.read_bytes() + b"\0" * 5)
    r = run("verify", bad)
    assert r.returncode == 1
    assert "5 trailing bytes" in r.stderr


def test_verify_several_files(st_file, tmp_path):
    path, _ = st_file
    bad = tmp_path / "short.safetensors"
    bad.write_bytes(b"\x01\x02")
    r = run("verify", path, bad, path)
    assert r.returncode == 1
    assert r.stdout.count(f"{path}: ok") == 2
    assert f"ckptio: {bad}: " in r.stderr
    assert "neither a safetensors file nor a torch.save archive (2 bytes)" in r.stderr


def test_verify_missing_file(tmp_path):
    r = run("verify", tmp_path / "nope")
    assert r.returncode == 1
    assert "No such file or directory" in r.stderr


# ---- bench ----------------------------------------------------------------------

BENCH_ROWS = [
    "raw write",
    "raw read, O_DIRECT, cold",
    "raw read, buffered, cold",
    "raw read, page cache",
    "ckptio save, durable",
    "ckptio load, cold",
    "ckptio load, warm",
]


def test_bench_table(disk_dir):
    r = run("bench", "--size", "8M", "--tensors", "4", "--dir", disk_dir, timeout=300)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("ckptio bench: 8.00 MiB in 4 BF16 tensors of 2.00 MiB, 1 run, in ")
    lines = out.splitlines()
    for label in BENCH_ROWS:
        assert any(ln.strip().startswith(label) for ln in lines), label
    for label in ("ckptio save, durable", "ckptio load, cold ", "ckptio load, warm"):
        row = next(ln for ln in lines if ln.strip().startswith(label))
        ratio = [w for w in row.split() if w.endswith("%")]
        assert len(ratio) == 1 and float(ratio[0][:-1]) > 0, row
    # A third load where the read policy read the cold one through the page cache (test_bench_read_cache_off).
    loads = 3 if any(ln.strip().startswith("ckptio load, cold, read cache off") for ln in lines) else 2
    assert f"verified: all {loads} loads returned exactly the saved bytes" in out
    assert "cold cache: posix_fadvise(DONTNEED)" in out
    # Not a terminal: no progress bar.
    assert "\r" not in r.stderr and "\033[" not in r.stderr
    # The temporary directory is gone.
    assert list(disk_dir.iterdir()) == []


@pytest.mark.parametrize("read_cache,direct", [("on", "auto"), ("off", "auto"), ("auto", "off")])
def test_bench_read_cache_off(disk_dir, read_cache, direct):
    """Where the read policy reads the cold load through the page cache (forced here with CKPTIO_READ_CACHE=on),
    bench loads it cold once more with the policy off, all O_DIRECT, against the O_DIRECT ceiling, says why, and
    leaves the engine's setting as it was; where the cold load is O_DIRECT already (the policy off), or cannot be
    (--direct off), it does not."""
    r = run("bench", "--size", "8M", "--tensors", "4", "--dir", disk_dir, "--direct", direct, "--repeat", "2",
            timeout=300, env={"CKPTIO_READ_CACHE": read_cache})
    assert r.returncode == 0, r.stderr
    assert f", direct {direct}, read cache {read_cache}, chunk " in r.stdout.splitlines()[1]
    lines = r.stdout.splitlines()
    extra = [ln for ln in lines if ln.strip().startswith("ckptio load, cold, read cache off")]
    if read_cache == "on":
        assert len(extra) == 1 and extra[0].rstrip().endswith("raw read, O_DIRECT, cold"), extra
        assert "load cold 0% (read cache off: 100%)" in r.stdout
        assert "the cold load read through the page cache: CKPTIO_READ_CACHE=on reads every cold file" in r.stdout
        assert "verified: all 6 loads returned exactly the saved bytes" in r.stdout
        doc = json.loads(run("bench", "--size", "4M", "--tensors", "2", "--dir", disk_dir, "--json", timeout=300,
                             env={"CKPTIO_READ_CACHE": "on"}).stdout)
        res = doc["results"]
        assert list(res)[-2:] == ["ckptio_load_cold_direct", "ckptio_load_warm"]
        cold, direct = res["ckptio_load_cold"]["engine_stats"], res["ckptio_load_cold_direct"]["engine_stats"]
        assert cold["bytes_direct"] == 0 and cold["bytes_buffered"] >= 4 << 20
        assert direct["bytes_direct"] >= 4 << 20 and direct["bytes_buffered"] < direct["bytes_direct"]
        assert res["ckptio_load_cold_direct"]["ceiling"] == "raw_read_direct_cold"
        assert doc["loads_verified"] == 3 and doc["engine"]["read_cache"] == "on"
    else:
        assert extra == [] and f"load cold {100 if direct == 'auto' else 0}%, load warm" in r.stdout
        assert "the cold load read through the page cache" not in r.stdout
        assert "verified: all 4 loads returned exactly the saved bytes" in r.stdout


def test_bench_json_and_keep(disk_dir):
    r = run("bench", "--size", "4M", "--tensors", "2", "--repeat", "2", "--raw-threads", "2",
            "--dir", disk_dir, "--json", "--keep", timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["size_bytes"] == 4 << 20 and doc["tensors"] == 2 and doc["tensor_bytes"] == 2 << 20
    res = doc["results"]
    direct_row = "ckptio_load_cold_direct" in res  # the read policy cached the cold load (test_bench_read_cache_off)
    assert doc["repeat"] == 2 and doc["loads_verified"] == (6 if direct_row else 4)
    assert doc["raw"] == {"threads": 2, "block_bytes": 8 << 20, "write_direct": True, "read_direct": True}
    assert doc["engine"]["backend"] in ("pread", "io_uring")
    assert [k for k in res if k != "ckptio_load_cold_direct"] == [
        "raw_write_direct", "raw_read_direct_cold", "raw_read_buffered_cold", "raw_read_page_cache", "ckptio_save",
        "ckptio_load_cold", "ckptio_load_warm"]
    for key, row in res.items():
        assert row["gbps"] > 0 and len(row["seconds_each"]) == 2, key
        assert row["seconds"] == pytest.approx(sum(row["seconds_each"]) / 2, rel=1e-3)
    assert res["ckptio_save"]["ceiling"] == "raw_write_direct"
    assert res["ckptio_load_cold"]["ceiling"] in ("raw_read_direct_cold", "raw_read_buffered_cold")
    assert res["ckptio_load_warm"]["ceiling"] == "raw_read_page_cache"
    for key in ("ckptio_save", "ckptio_load_cold", "ckptio_load_warm"):
        ceiling = res[res[key]["ceiling"]]["gbps"]
        assert res[key]["ratio"] == pytest.approx(res[key]["gbps"] / ceiling, rel=1e-3)
        assert res[key]["engine_stats"]["bytes"] >= 4 << 20
    assert 0.0 <= doc["cache"]["resident_after_drop"] <= 1.0
    # --keep: the directory and both files stay, and stderr says where.
    kept = Path(doc["dir"])
    assert kept.parent == disk_dir
    assert f"kept: {kept}" in r.stderr
    assert sorted(p.name for p in kept.iterdir()) == ["bench.safetensors", "raw.bin"]
    assert (kept / "raw.bin").stat().st_size == 4 << 20
    # The saved file is a valid safetensors file the reference reader accepts.
    with safe_open(str(kept / "bench.safetensors"), framework="np") as f:
        assert sorted(f.keys()) == ["layers.000000.weight", "layers.000001.weight"]
        assert f.get_slice("layers.000001.weight").get_shape() == [512, 2048]
        assert f.get_slice("layers.000001.weight").get_dtype() == "BF16"
    assert run("verify", kept / "bench.safetensors").returncode == 0


def test_environment_errors_name_the_variable(st_file):
    path, _ = st_file
    r = run("inspect", path, env={"CKPTIO_THREADS": "many"})
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.startswith("ckptio: ") and "CKPTIO_THREADS" in r.stderr and "many" in r.stderr
    r = run("verify", path, env={"CKPTIO_BACKEND": "floppy"})
    assert r.returncode == 1
    assert "CKPTIO_BACKEND" in r.stderr and "floppy" in r.stderr


def test_bench_threads_outside_engine_bounds():
    r = run("bench", "--threads", "100000")
    assert r.returncode == 2
    assert "ckptio: --threads: '100000' is not a count from 0 to " in r.stderr


def test_bench_reports_io_errors(tmp_path):
    r = run("bench", "--size", "4M", "--dir", tmp_path / "does-not-exist")
    assert r.returncode == 1
    assert "cannot create a temporary directory" in r.stderr
    assert str(tmp_path / "does-not-exist") in r.stderr


def test_importing_the_package_leaves_torch_unimported():
    """The `ckptio` console script imports the package before it execs the tool: the package must not
    import torch (1-2 s) on the way, or every CLI call pays for it."""
    import sys
    code = "import sys, ckptio, ckptio.__main__; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)) + "/..").stdout
    assert "torch" not in out, out


def _help_rows():
    """(name, operands, summary) of each command row of `ckptio --help`."""
    out = run("--help").stdout
    block = out.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in block.splitlines():  # "  NAME     OPERANDS          SUMMARY": columns of 8 and 17
        rows.append((line[2:10].strip(), line[11:28].strip(), line[29:]))
    return out, rows


def test_main_help_says_what_each_command_takes():
    """Each command's row names the operands its own usage line ends with, in 80 columns, and says which
    formats it handles where the command's help does (convert: all four, DCP among them)."""
    out, rows = _help_rows()
    assert [r[0] for r in rows] == ["inspect", "verify", "convert", "clean", "bench"]
    assert all(len(line) <= 80 for line in out.splitlines()), out
    for name, operands, _ in rows:
        synopsis = run(name, "--help").stdout.splitlines()[0]
        if operands == "[OPTIONS]":  # a command that takes options only
            assert re.sub(r"\[[^]]*\]", "", synopsis).split() == ["usage:", "ckptio", name], synopsis
        else:
            assert synopsis.endswith(" " + operands), (name, operands, synopsis)
    convert = dict((r[0], r[2]) for r in rows)["convert"]
    details = run("convert", "--help").stdout
    for fmt, spelled in (("safetensors", "safetensors"), ("torch.save", "torch.save"), ("HF", "Hugging Face"),
                         ("DCP", "DCP")):
        assert fmt in convert and spelled in details, (fmt, convert)
    for word in ("FILE:", "DIR:", "ROOT:", "IN, OUT:"):  # the operands are explained below the table
        assert word in out


def test_clean_of_a_missing_directory_is_an_error_only(tmp_path):
    missing = tmp_path / "nope"
    r = run("clean", missing)
    assert r.returncode == 1
    assert r.stdout == "", "a count of what was removed from a directory that could not be read"
    assert r.stderr.startswith(f"ckptio: {missing}: ") and "No such file or directory" in r.stderr, r.stderr
    r = run("clean", tmp_path)
    assert r.returncode == 0 and r.stdout.startswith(f"{tmp_path}: removed 0 stale temporaries")


def test_bench_says_why_a_ratio_passes_100_percent(disk_dir):
    """A ratio above 100% comes with the reasons that apply to the run, in the table and in --json; none
    without such a ratio."""
    r = run("bench", "--size", "8M", "--tensors", "2", "--dir", disk_dir, "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    above = [row["label"] for row in doc["results"].values() if row.get("ratio", 0) > 1.0]
    note = doc["ceiling_note"]
    if above:
        assert note.startswith("ratios above 100% (") and "do not mean ckptio beat the disk" in note, note
        assert all(label in note for label in above), (above, note)
        assert "One run: --repeat 5 reports medians" in note
    else:
        assert note is None
    r = run("bench", "--size", "8M", "--tensors", "2", "--dir", disk_dir, timeout=300)
    table_above = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("ckptio")
                   and any(w.endswith("%") and float(w[:-1]) > 100.0 for w in ln.split())]
    assert bool(table_above) == ("\nnote: ratios above 100% (" in r.stdout), r.stdout


def test_bench_device_points_at_python(tmp_path):
    r = run("bench", "--model", tmp_path, "--device", "cuda")
    assert r.returncode == 2
    assert 'ckptio.load(path, device="cuda")' in r.stderr and "bench/bench_model_gpu.py" in r.stderr
    assert "bench_gpu.py" not in r.stderr.replace("bench_model_gpu.py", "")


def test_verify_bar_on_a_terminal_ends_as_one_line(tmp_path):
    """On a terminal the bar is labelled with the file and, finished, stays as one line; without a terminal
    nothing of it is written (test_bench_table)."""
    import pty
    import select

    path = tmp_path / "big.safetensors"
    np_save_file({"a": np.ones(20 << 20, dtype=np.float32)}, str(path))  # 80 MiB: two 64 MiB windows
    master, slave = pty.openpty()
    env = dict(os.environ, CKPTIO_THREADS="1")
    env.pop("CKPTIO_NO_PROGRESS", None)
    proc = subprocess.Popen([CKPTIO, "verify", str(path)], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(60) == 0
    os.close(master)
    text = out.decode()
    assert f"\r\033[K{path} " in text and "%  64.00 MiB / 80.00 MiB" in text, repr(text)
    final = text.rsplit("\033[K", 1)[-1]
    assert final.startswith(f"{path}: 80.00 MiB in ") and final.rstrip().endswith("GB/s)"), repr(final)
    assert final.endswith("\r\n"), "the final line is kept, ended by a newline"
