"""Checkpoint files and model prefixes in object storage (s3://), against a real S3 server
(scripts/s3_server.sh; skipped without AWS_ENDPOINT_URL): ckptio.save/load/open/safe_open/get_slice of
safetensors and torch.save objects and of a Hugging Face prefix round-trip bit-exact; a save appears whole
or not at all (a cancel and Ctrl-C leave no object and no unfinished upload, the older object intact);
the server killed during an upload and during a download (through tests/s3_fault_proxy.py) fails naming
bucket and key; wrong credentials, a missing bucket or key say so; hostile keys stay names on the
server; the CLI's inspect, verify, convert (either side remote) and clean on s3:// (docs/OBJECT_STORAGE.md).
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import ckptio
from ckptio import _ckptio

from conftest import CKPTIO_CLI, REPO, requires_cli, s3_no_secret

PROXY = REPO / "tests" / "s3_fault_proxy.py"


def small_engine(**kw):
    """Short backoffs and timeouts: failure paths take seconds, not minutes."""
    opts = dict(s3_backoff_ms=20, s3_timeout_ms=2000, s3_part_bytes=5 << 20)
    opts.update(kw)
    return ckptio.Engine(**opts)


def state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"layer.0.weight": torch.randn(512, 1024, generator=g),
            "layer.0.bias": torch.randn(1024, generator=g).to(torch.bfloat16),
            "embed": torch.randint(0, 1 << 30, (3000, 7), generator=g)}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k


def keys_under(prefix):
    return sorted(k for k, _, _, _ in _ckptio.object_list(prefix + "/"))


def uploads_under(prefix):
    """Aborts and counts the unfinished multipart uploads under the prefix (what must be none)."""
    return _ckptio.object_abort_uploads(prefix + "/", 0)


def test_safetensors_and_torch_round_trip(s3_prefix):
    sd = state(1)
    url = f"{s3_prefix}/model.safetensors"
    ckptio.save(sd, url, metadata={"format": "pt"}, checksums=True)
    same(ckptio.load(url), sd)
    with ckptio.safe_open(url, framework="pt") as f:
        assert f.metadata() == {"format": "pt", "ckptio.save_id": f.metadata()["ckptio.save_id"]}
        assert torch.equal(f.get_slice("layer.0.weight")[10:20, 3:9], sd["layer.0.weight"][10:20, 3:9])
        assert f.verify()["tensors"] == 3
    # torch.save of a tree, with shared storages and values.
    tree = {"model": sd, "view": sd["embed"][5:9], "step": 7, "names": ["a", "b"]}
    pt = f"{s3_prefix}/model.pt"
    ckptio.save(tree, pt)
    back = ckptio.load(pt)
    same(back["model"], sd)
    assert back["step"] == 7 and back["names"] == ["a", "b"] and torch.equal(back["view"], tree["view"])
    assert torch.load(__import__("io").BytesIO(_ckptio.object_read(pt)), weights_only=True)["step"] == 7
    assert ckptio.open(pt).verify()["crc_checked"] > 0


def test_hf_prefix(s3_prefix):
    """A Hugging Face model under a prefix: its index and shards, opened as one model."""
    sd = state(2)
    shards = {"model-00001-of-00002.safetensors": ["layer.0.weight"],
              "model-00002-of-00002.safetensors": ["layer.0.bias", "embed"]}
    weight_map = {}
    for name, keys in shards.items():
        ckptio.save({k: sd[k] for k in keys}, f"{s3_prefix}/hf/{name}")
        weight_map.update({k: name for k in keys})
    index = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    _ckptio.object_put(f"{s3_prefix}/hf/model.safetensors.index.json", index)
    for path in (f"{s3_prefix}/hf", f"{s3_prefix}/hf/", f"{s3_prefix}/hf/model.safetensors.index.json"):
        same(ckptio.load(path), sd)
        with ckptio.open(path) as f:
            assert len(f.shards) == 2 and all(s.startswith(s3_prefix) for s in f.shards)
    # A shard gone: the error names it and the tensor; nothing is loaded.
    _ckptio.object_delete(f"{s3_prefix}/hf/model-00002-of-00002.safetensors")
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.load(f"{s3_prefix}/hf")
    assert "model-00002-of-00002.safetensors" in str(e.value) and e.value.status_name == "E_NOT_FOUND"


def test_a_failed_or_canceled_save_leaves_the_older_object(s3_prefix):
    url = f"{s3_prefix}/model.safetensors"
    old = state(3)
    ckptio.save(old, url)
    eng = small_engine(s3_concurrency=1)
    big = {"w": torch.randn(16 << 20)}  # 64 MiB: part buffers (bounded) make the writers wait for uploads

    def cancel(done, total):
        if 0 < done < total:  # mid-transfer (the final report only informs: the bytes have all moved)
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        ckptio.save(big, url, engine=eng, progress=cancel)
    same(ckptio.load(url), old)
    assert uploads_under(s3_prefix) == 0  # the canceled save aborted its upload
    # A tensor the format refuses: nothing is sent at all.
    with pytest.raises(ValueError):
        ckptio.save({"a": big["w"], "b": big["w"][:10]}, url, engine=eng)
    same(ckptio.load(url), old)


CTRL_C = textwrap.dedent("""
    import signal, sys, threading, time, os
    import torch, ckptio
    signal.signal(signal.SIGINT, signal.default_int_handler)
    url = sys.argv[1]
    eng = ckptio.Engine(s3_concurrency=1, s3_part_bytes=5 << 20)
    threading.Timer(float(sys.argv[2]), lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        ckptio.save({"w": torch.ones(96 << 20, dtype=torch.uint8)}, url, engine=eng)
        print("FINISHED", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED %.2f" % (time.monotonic() - t0), flush=True)
""")


def test_ctrl_c_aborts_the_upload(s3_prefix, tmp_path):
    url = f"{s3_prefix}/big.safetensors"
    old = state(4)
    ckptio.save(old, url)
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    out = subprocess.run([sys.executable, str(script), url, "0.5"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ckptio.__file__))))
    assert "INTERRUPTED" in out.stdout, out.stdout + out.stderr
    same(ckptio.load(url), old)  # the older object, byte for byte
    assert uploads_under(s3_prefix) == 0  # the interrupted upload was aborted, not left billed


class Proxy:
    """tests/s3_fault_proxy.py in front of the server: AWS_ENDPOINT_URL for the objects opened through() it."""

    def __init__(self, tmp_path, *rules):
        port_file = tmp_path / f"proxy-{time.monotonic_ns()}.port"
        args = [sys.executable, str(PROXY), "--upstream", os.environ["AWS_ENDPOINT_URL"], "--port-file",
                str(port_file), "--log", str(tmp_path / "proxy.log"), "--max-seconds", "120"]
        for r in rules:
            args += ["--rule", r]
        self.log = tmp_path / "proxy.log"
        self.proc = subprocess.Popen(args)
        for _ in range(200):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port_file.read_text().strip()}"

    def requests(self):
        """The requests in the log, in the order they came, each with its answer's "status" and "end" where the
        server answered it. The proxy writes a request's lines before it passes the answer on, so the log is
        complete for every request whose answer the client has."""
        return read_requests(self.log)

    def kill(self):
        """The server goes away: connections reset, new ones refused."""
        self.proc.kill()
        self.proc.wait()


def read_requests(log):
    """The fault proxy's log `log` as its requests: each answer line's status and end joined to the request
    line it answers (the latest one of that id before it: ids count from 1 in each proxy writing to the log)."""
    requests, latest = [], {}
    for line in log.read_text().splitlines():
        e = json.loads(line)
        if "answered" in e:
            latest[e["answered"]].update(status=e["status"], end=e["end"])
        else:
            latest[e["id"]] = e
            requests.append(e)
    return requests


def through(proxy, fn):
    saved = os.environ["AWS_ENDPOINT_URL"]
    os.environ["AWS_ENDPOINT_URL"] = proxy.url
    try:
        return fn()
    finally:
        os.environ["AWS_ENDPOINT_URL"] = saved


def test_server_killed_during_an_upload_and_a_download(s3_prefix, tmp_path):
    url = f"{s3_prefix}/model.safetensors"
    old = state(5)
    ckptio.save(old, url)
    big = {"w": torch.randn(6 << 20)}  # 24 MiB, 5 parts
    # The third part stalls; meanwhile the server dies.
    proxy = Proxy(tmp_path, "PUT:partNumber:stall:30:1:2")
    eng = small_engine(s3_retries=2, s3_concurrency=1)
    threading.Timer(1.0, proxy.kill).start()
    t0 = time.monotonic()
    with pytest.raises(ckptio.CkptioError) as e:
        through(proxy, lambda: ckptio.save(big, url, engine=eng))
    assert time.monotonic() - t0 < 60
    msg = str(e.value)
    assert url.split("/", 3)[2] in msg and "model.safetensors" in msg, msg
    s3_no_secret(msg)
    same(ckptio.load(url), old)  # nothing partial visible: the older object is whole
    # A download whose server dies while its data is read (the probe and the header's GETs pass).
    proxy = Proxy(tmp_path, "GET:.:stall:30:1:4")
    eng = small_engine(s3_retries=2, chunk_bytes=1 << 20)
    threading.Timer(1.0, proxy.kill).start()
    with pytest.raises(ckptio.CkptioError) as e:
        through(proxy, lambda: ckptio.load(url, engine=eng))
    msg = str(e.value)
    assert "model.safetensors: GET bytes" in msg and "gave up after 3 attempts" in msg, msg
    s3_no_secret(msg)
    assert uploads_under(s3_prefix) == 1  # the killed upload's parts: what `ckptio clean` is for (aborted here)


def test_errors_name_bucket_and_key_never_a_secret(s3_prefix, monkeypatch):
    url = f"{s3_prefix}/model.safetensors"
    ckptio.save(state(6), url)
    for path, status in ((f"{s3_prefix}/missing.safetensors", "E_NOT_FOUND"),
                         ("s3://ckptio-no-such-bucket-py/model.safetensors", "E_NOT_FOUND")):
        with pytest.raises(ckptio.CkptioError) as e:
            ckptio.load(path)
        assert e.value.status_name == status and path.split("/", 3)[3] in str(e.value), str(e.value)
        s3_no_secret(str(e.value))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-1234")
    for call in (lambda: ckptio.load(url), lambda: ckptio.save(state(7), url)):
        with pytest.raises(ckptio.CkptioError) as e:
            call()
        assert e.value.status_name == "E_PERMISSION" and "model.safetensors" in str(e.value)
        assert "403" in str(e.value) and "wrong-secret-1234" not in str(e.value)
        s3_no_secret(str(e.value))
    monkeypatch.undo()
    same(ckptio.load(url), state(6))


def test_hostile_keys_stay_names_on_the_server(s3_prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sd = state(8)
    for name in ("../escape.safetensors", "a/./b/../c.safetensors", "ctl\x01\x7f.safetensors", "x" * 900):
        url = f"{s3_prefix}/{name}"
        ckptio.save(sd, url)
        same(ckptio.load(url), sd)
    assert f"{s3_prefix.split('/', 3)[3]}/../escape.safetensors" in keys_under(s3_prefix)
    assert list(tmp_path.iterdir()) == []  # nothing reached a local path


@requires_cli
def test_cli_inspect_verify_convert_clean(s3_prefix, tmp_path):
    def cli(*args, ok=True):
        r = subprocess.run([CKPTIO_CLI, *args], capture_output=True, text=True, timeout=120)
        assert (r.returncode == 0) == ok, r.stdout + r.stderr
        s3_no_secret(r.stdout + r.stderr)
        return r.stdout + r.stderr

    sd = state(9)
    st = f"{s3_prefix}/model.safetensors"
    ckptio.save(sd, st, checksums=True)
    out = cli("inspect", "--json", st)
    assert json.loads(out)["totals"]["tensors"] == 3
    assert "checksums of 3 tensors" in cli("verify", st)
    # convert: remote -> remote, remote -> local, local -> remote, and into a prefix (a Hugging Face directory).
    cli("convert", st, f"{s3_prefix}/model.pt")
    cli("convert", f"{s3_prefix}/model.pt", str(tmp_path / "local.safetensors"))
    same(ckptio.load(str(tmp_path / "local.safetensors")), sd)
    cli("convert", str(tmp_path / "local.safetensors"), f"{s3_prefix}/back.pt")
    same(ckptio.load(f"{s3_prefix}/back.pt"), sd)
    cli("convert", "--to", "hf", "--shard-size", "1MB", st, f"{s3_prefix}/hf/")
    assert "ok" in cli("verify", f"{s3_prefix}/hf")
    same(ckptio.load(f"{s3_prefix}/hf"), sd)
    assert "has objects under it" in cli("convert", "--to", "hf", st, f"{s3_prefix}/hf", ok=False)
    # A damaged object fails verify, naming it.
    raw = bytearray(_ckptio.object_read(st))
    raw[-100] ^= 0xFF
    _ckptio.object_put(st, bytes(raw))
    out = cli("verify", st, ok=False)
    assert "model.safetensors" in out and "XXH3" in out, out
    # A killed save's unfinished upload: clean aborts it (it is younger than the default age: --min-age 0).
    f = _ckptio.File(f"{s3_prefix}/killed.safetensors", _ckptio.OPEN_WRITE, small_engine())
    buf = torch.zeros(12 << 20, dtype=torch.uint8)
    f.write([(buf.data_ptr(), buf.numel(), 0, 0)])
    out = cli("clean", s3_prefix)
    assert "aborted 0 unfinished uploads" in out, out
    out = cli("clean", "--min-age", "0", s3_prefix)
    assert "aborted 1 unfinished upload " in out, out
    assert "killed.safetensors" not in " ".join(keys_under(s3_prefix))
    del f
