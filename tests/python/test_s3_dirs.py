"""DCP checkpoints and checkpoint managers in object storage (s3://), against a real S3 server
(scripts/s3_server.sh; skipped without AWS_ENDPOINT_URL): ckptio.dcp's save/load/async_save round-trip
bit-exact and verify; data objects first, .metadata last, so a save killed before its .metadata leaves
the older checkpoint whole and a reader never takes the partial one; the lease keeps a second saver
out, and a saver whose lease was taken over commits nothing; CheckpointManager saves, resumes from the
newest step that verifies, keeps K steps and cleans a crashed step; two gloo ranks load a model prefix
reading each byte once and save and load a DCP checkpoint together (docs/OBJECT_STORAGE.md).
"""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptio
from ckptio import _ckptio
from ckptio.dcp import FileSystemReader, FileSystemWriter
from ckptio.dcp import _writer as dcp_writer
from torch.distributed.checkpoint.api import CheckpointException

from conftest import CKPTIO_CLI, requires_cli, s3_no_secret

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def model_state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(700, 300, generator=g), "b": torch.randn(300, generator=g).bfloat16()},
            "step": seed, "names": ["x", "y"]}


def empty_like(sd):
    return {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()}, "step": -1, "names": []}


def same(a, b):
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["step"] == b["step"] and a["names"] == b["names"]


def keys_under(prefix):
    return sorted(k.rsplit("/", 1)[-1] for k, _, _, _ in _ckptio.object_list(prefix + "/"))


def save(sd, url, **kw):
    """dcp.save, then the lease's release, which a committed save leaves to a thread of its own."""
    writer = FileSystemWriter(url, **kw)
    dcp.save(sd, storage_writer=writer, no_dist=True)
    writer.wait_cleanup()


def load(url, sd=None):
    out = empty_like(sd or model_state())
    dcp.load(out, storage_reader=FileSystemReader(url), no_dist=True)
    return out


def wait_until_older(url):
    """Waits until every object under `url` is older than a lease taken from now on by the server's whole
    seconds: a probe written now is listed at least 2 s after the newest of them (a listing truncates
    Last-Modified to the second, or rounds it up, as Swift's does), so the next lease's `since` (the
    server's clock, whole seconds) is later than each."""
    newest = max(t for k, _, t, _ in _ckptio.object_list(url + "/"))
    probe = f"{url}-probe"
    for _ in range(100):
        _ckptio.object_put(probe, b"")
        (listed,) = [t for k, _, t, _ in _ckptio.object_list(probe) if k.endswith("-probe")]
        if listed >= newest + 2:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the server's clock did not pass {newest} + 2 s")
    _ckptio.object_delete(probe)


def test_dcp_save_load_async_and_overwrite(s3_prefix):
    url = f"{s3_prefix}/ckpt"
    sd = model_state(1)
    save(sd, url)
    same(load(url), sd)
    assert ckptio.dcp.verify(url)["checked"] > 0
    names = keys_under(url)
    assert ".metadata" in names and any(n.endswith(".distcp") for n in names)
    assert ".ckptio-dcp.lock" not in names  # the lease goes with the save
    # async_save, replacing the checkpoint: the older save's objects go once a newer lease is taken.
    wait_until_older(url)  # the lease's time has whole seconds: objects of the same second are kept
    sd2 = model_state(2)
    fut = dcp.async_save(sd2, storage_writer=FileSystemWriter(url), no_dist=True)
    (fut.result() if hasattr(fut, "result") else fut.upload_completion.result())
    same(load(url), sd2)
    tokens = {n.split("_")[2] for n in keys_under(url) if n.endswith(".distcp")}
    assert len(tokens) == 1, keys_under(url)


def save_killed_at(stage, sd, url, monkeypatch):
    """save() stopped at the writer's crash point `stage` (_writer._crash)."""
    def crash(at):
        if at == stage:
            raise RuntimeError("killed between the data and the metadata")

    monkeypatch.setattr(dcp_writer, "_crash_point", crash)
    try:
        with pytest.raises((Exception, CheckpointException), match="killed between"):
            save(sd, url)
    finally:
        monkeypatch.setattr(dcp_writer, "_crash_point", None)


def test_a_save_killed_before_its_metadata(s3_prefix, monkeypatch):
    url = f"{s3_prefix}/ckpt"
    old = model_state(3)
    save(old, url)
    before = keys_under(url)
    # Killed once its data is written, its objects' completion handed to the commit: their uploads go.
    save_killed_at("data_committed", model_state(4), url, monkeypatch)
    # (its lease stays until the save's thread has left torch's code: a failure on another rank ends it there)
    assert [n for n in keys_under(url) if n != ".ckptio-dcp.lock"] == before
    assert _ckptio.object_abort_uploads(f"{url}/", 0) == 0
    same(load(url), old)
    # Killed once its data objects and manifest are stored, before its .metadata.
    save_killed_at("manifest_written", model_state(4), url, monkeypatch)
    assert len(keys_under(url)) > len(before)  # the new save's data objects are there ...
    same(load(url), old)  # ... but .metadata is the older one's: the older checkpoint loads whole
    assert ckptio.dcp.verify(url)["checked"] > 0
    # A first save killed the same way: no .metadata, so no checkpoint at all.
    fresh = f"{s3_prefix}/fresh"
    save_killed_at("data_committed", model_state(5), fresh, monkeypatch)
    assert ".metadata" not in keys_under(fresh)
    with pytest.raises((Exception, CheckpointException)):
        load(fresh)
    assert _ckptio.format_detect(fresh) == "directory"  # not a DCP checkpoint


def test_two_savers(s3_prefix, monkeypatch):
    url = f"{s3_prefix}/ckpt"
    save(model_state(6), url)
    # Another saver holds the directory's lease: this one writes nothing and says so.
    other = _ckptio.dcp_lock_acquire(url, None, False, 0.0)
    with pytest.raises((Exception, CheckpointException)) as e:
        save(model_state(7), url, dir_busy="error")
    assert "another save holds the directory" in str(e.value)
    _ckptio.dcp_lock_release(other)
    # A saver whose lease another took over (it lapsed) before its .metadata: it commits nothing.
    def take_over(stage):
        if stage == "data_committed":
            lease = (b"ckptio-lease 1\nowner 0123456789abcdef0123456789abcdef\nsince 1\nttl_ms 60000\n")
            _ckptio.object_put(f"{url}/.ckptio-dcp.lock", lease)

    monkeypatch.setattr(dcp_writer, "_crash_point", take_over)
    with pytest.raises((Exception, CheckpointException)) as e:
        save(model_state(8), url)
    monkeypatch.setattr(dcp_writer, "_crash_point", None)
    assert "no longer this save's" in str(e.value) and "commits nothing more" in str(e.value)
    s3_no_secret(str(e.value))
    _ckptio.object_delete(f"{url}/.ckptio-dcp.lock")
    same(load(url), model_state(6))  # never a checkpoint that mixes the two


def test_a_saver_that_loses_the_lease_while_its_data_upload(s3_prefix, monkeypatch):
    """The lease is read back by the check before .metadata, while the data upload: a saver whose lease
    another save took meanwhile (here one whose look came before this saver's write was visible: it
    saves a whole checkpoint during this one's upload) commits nothing, even with dir_busy="wait",
    removes its own objects, and leaves the other's checkpoint whole."""
    url = f"{s3_prefix}/ckpt"
    save(model_state(10), url)
    tokens = []
    new_token = FileSystemWriter._new_token
    monkeypatch.setattr(FileSystemWriter, "_new_token", lambda self: tokens.append(new_token(self)) or tokens[-1])

    def winner_saves_meanwhile(stage):
        if stage != "data_committed":
            return
        monkeypatch.setattr(dcp_writer, "_crash_point", None)
        _ckptio.object_delete(f"{url}/.ckptio-dcp.lock")  # the other saver's look did not see this one's lease
        save(model_state(11), url)

    monkeypatch.setattr(dcp_writer, "_crash_point", winner_saves_meanwhile)
    with pytest.raises((Exception, CheckpointException)) as e:
        save(model_state(12), url, dir_busy="wait")
    monkeypatch.setattr(dcp_writer, "_crash_point", None)
    assert "no longer this save's" in str(e.value) and "commits nothing more" in str(e.value), str(e.value)
    s3_no_secret(str(e.value))
    same(load(url), model_state(11))  # the winner's checkpoint, whole
    assert ckptio.dcp.verify(url)["checked"] > 0
    left = keys_under(url)
    loser, winner = tokens  # this save's token, then the one of the save during its upload
    assert [n for n in left if winner in n] and not [n for n in left if loser in n], left  # its objects went
    assert f".ckptio-manifest-{winner}.json" in left and ".ckptio-dcp.lock" not in left, left
    assert metadata_tokens(url) == {winner}  # .metadata names the winner's objects only


def metadata_tokens(url):
    """The save tokens of the data objects .metadata names (each of which must be there)."""
    md = FileSystemReader(url).read_metadata()
    files = {info.relative_path for info in md.storage_data.values()}
    assert files <= set(keys_under(url)), files
    return _tokens(files)


def test_a_saver_that_loses_the_lease_after_its_first_check(s3_prefix, monkeypatch):
    """Another save takes the lease after this saver's first check passed, while its second check
    starts beside its .metadata PUT, and writes a data object of its own: whether this saver then
    stops (its second check saw the other lease: nothing deleted) or commits (the check read the lease
    before it was taken), the other's object stays (the cleanup keeps objects newer than the lease this
    saver took), the other's lease is left as it is, and the .metadata in place names the objects of
    one save, every one of them there."""
    url = f"{s3_prefix}/ckpt"
    save(model_state(13), url)
    (older,) = _tokens(keys_under(url))
    time.sleep(2.1)  # the older save's objects are removable by the server's whole seconds
    lease = b"ckptio-lease 1\nowner 0123456789abcdef0123456789abcdef\nsince 1\nttl_ms 60000\n"
    others = "__0_0123456789ab_0.distcp"

    def take_over(stage):
        if stage == "manifest_written":  # the first check passed; the second runs
            _ckptio.object_put(f"{url}/.ckptio-dcp.lock", lease)
            _ckptio.object_put(f"{url}/{others}", b"the other save's data")

    monkeypatch.setattr(dcp_writer, "_crash_point", take_over)
    try:
        save(model_state(14), url)
    except (Exception, CheckpointException) as e:
        assert "no longer this save's" in str(e), str(e)
    monkeypatch.setattr(dcp_writer, "_crash_point", None)
    assert _ckptio.object_read(f"{url}/{others}") == b"the other save's data"
    assert _ckptio.object_read(f"{url}/.ckptio-dcp.lock") == lease  # the other's lease, untouched
    (named,) = metadata_tokens(url)
    same(load(url), model_state(13 if named == older else 14))


def save_per_rank(sd, url, **kw):
    """A save without collectives: every rank commits its own __{rank}.metadata and removes nothing."""
    from torch.distributed.checkpoint.state_dict_saver import _save_state_dict

    writer = FileSystemWriter(url, **kw)
    writer.reset()
    _save_state_dict(sd, writer, no_dist=True, use_collectives=False)


class RankZeroReader(FileSystemReader):
    """Loads the checkpoint __0.metadata describes (torch's loader reads .metadata)."""

    def read_metadata(self, *args, **kwargs):
        return super().read_metadata(rank=0)


def test_a_save_without_collectives_beside_a_save_with_a_cleanup(s3_prefix, monkeypatch):
    """A save without collectives (__{rank}.metadata, no cleanup of its own) whose data objects are
    written while another save with a cleanup takes the lease and commits over an older checkpoint: its
    mark (.ckptio-dcp-shared-OWNER) keeps its objects and its uploads from that cleanup, so both
    checkpoints load bit-exact afterwards and the older save's objects are gone; the mark goes with
    the save."""
    url = f"{s3_prefix}/ckpt"
    save(model_state(20), url)
    (older,) = _tokens(keys_under(url))
    time.sleep(2.1)  # older than the mark below by the server's whole seconds
    marks = []

    def other_save_meanwhile(stage):
        if stage != "data_committed":
            return
        monkeypatch.setattr(dcp_writer, "_crash_point", None)
        marks.extend(n for n in keys_under(url) if n.startswith(".ckptio-dcp-shared-"))
        time.sleep(2.1)  # this save's objects are older than the other's lease by the server's whole seconds
        save(model_state(22), url)

    monkeypatch.setattr(dcp_writer, "_crash_point", other_save_meanwhile)
    save_per_rank(model_state(21), url)
    monkeypatch.setattr(dcp_writer, "_crash_point", None)
    left = keys_under(url)
    assert not [n for n in left if older in n], left  # the older save's objects went
    assert not [n for n in left if n.startswith(".ckptio-dcp-shared-")], left  # the mark went with the save
    same(load(url), model_state(22))
    out = empty_like(model_state())
    dcp.load(out, storage_reader=RankZeroReader(url), no_dist=True)  # every object it names is there
    same(out, model_state(21))
    assert len(_tokens(left)) == 2 and all(f".ckptio-manifest-{t}.json" in left for t in _tokens(left)), left
    assert len(marks) == 1, marks  # the mark was there while its data objects were written


@requires_cli
def test_manager_save_resume_retention_clean(s3_prefix, monkeypatch):
    root = f"{s3_prefix}/run"
    with ckptio.CheckpointManager(root, keep_last=2, async_save=False) as m:
        for step in (10, 20, 30):
            m.save(step, model_state(step))
        assert m.all_steps() == [20, 30]
    # A save killed before its commit marker leaves a partial step; a damaged newest step is skipped too.
    def crash(stage):
        if stage == "metadata_committed":
            raise RuntimeError("killed before the marker")

    with ckptio.CheckpointManager(root, keep_last=2, async_save=False) as m:
        monkeypatch.setattr(dcp_writer, "_crash_point", crash)
        with pytest.raises((Exception, CheckpointException)):
            m.save(40, model_state(40))
        monkeypatch.setattr(dcp_writer, "_crash_point", None)
    step30 = f"{root}/step_00000030"
    data = [n for n in keys_under(step30) if n.endswith(".distcp")][0]
    raw = bytearray(_ckptio.object_read(f"{step30}/{data}"))
    raw[len(raw) // 3] ^= 0x10
    _ckptio.object_put(f"{step30}/{data}", bytes(raw))
    out = subprocess.run([CKPTIO_CLI, "inspect", root], capture_output=True, text=True, timeout=60)
    assert "40  partial" in out.stdout and "30  complete" in out.stdout, out.stdout + out.stderr
    with ckptio.CheckpointManager(root, keep_last=2) as m:
        st = empty_like(model_state())
        assert m.load(st) == 20  # 40 is partial, 30 fails the full check
        same(st, model_state(20))
    out = subprocess.run([CKPTIO_CLI, "clean", root], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "removed 1 partial step (40)" in out.stdout, out.stdout + out.stderr
    assert "step_00000040" not in " ".join(keys_under(root))
    assert _ckptio.object_abort_uploads(f"{root}/", 0) == 0


WORKER = textwrap.dedent("""
    import datetime, json, sys, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    import ckptio
    from ckptio.dcp import FileSystemReader, FileSystemWriter
    rank, world, store, model, ckpt = int(sys.argv[1]), 2, sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    sd = ckptio.load(model, process_group=dist.group.WORLD)
    stats = ckptio.last_load_stats()
    want = ckptio.load(model) if rank == 0 else None
    ok = rank != 0 or all(torch.equal(sd[k], want[k]) for k in want)
    mine = {"w": torch.full((64, 32), float(rank)), "shared": torch.arange(100)}
    dcp.save({"r%d" % rank: mine["w"], "shared": mine["shared"]}, storage_writer=FileSystemWriter(ckpt))
    out = {"r%d" % rank: torch.zeros(64, 32), "shared": torch.zeros(100, dtype=torch.long)}
    dcp.load(out, storage_reader=FileSystemReader(ckpt))
    ok = ok and torch.equal(out["r%d" % rank], mine["w"]) and torch.equal(out["shared"], mine["shared"])
    print("RESULT " + json.dumps({"ok": bool(ok), "bytes_read": stats.bytes_read, "loaded": stats.bytes_loaded}))
    dist.destroy_process_group()
""")


def test_two_ranks_read_each_byte_once_and_save_together(s3_prefix, tmp_path):
    g = torch.Generator().manual_seed(9)
    sd = {f"layer.{i}.weight": torch.randn(256, 256, generator=g) for i in range(6)}
    model = f"{s3_prefix}/model"
    ckptio.save(dict(list(sd.items())[:3]), f"{model}/model-00001-of-00002.safetensors")
    ckptio.save(dict(list(sd.items())[3:]), f"{model}/model-00002-of-00002.safetensors")
    wm = {k: f"model-0000{1 if i < 3 else 2}-of-00002.safetensors" for i, k in enumerate(sd)}
    _ckptio.object_put(f"{model}/model.safetensors.index.json", json.dumps({"weight_map": wm}).encode())
    (tmp_path / "worker.py").write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ckptio.__file__)), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(r), str(tmp_path / "store"), model,
                               f"{s3_prefix}/dcp"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(2)]
    outs = []
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    lines = [[line for line in out.splitlines() if line.startswith("RESULT ")] for out in outs]
    assert all(lines), "\n".join(out[-3000:] for out in outs)
    results = [json.loads(found[0][7:]) for found in lines]
    total = sum(t.numel() * 4 for t in sd.values())
    assert all(r["ok"] for r in results), outs
    assert sum(r["bytes_read"] for r in results) == total  # each byte read once across the two ranks
    assert all(0 < r["bytes_read"] < total and r["loaded"] == total for r in results)
    assert ckptio.dcp.verify(f"{s3_prefix}/dcp")["checked"] >= 3


def proxy_gets(tmp_path):
    """(start, end, first byte, length) of the ranged GETs of data objects in the fault proxy's log."""
    from test_s3_files import read_requests

    gets = []
    for e in read_requests(tmp_path / "proxy.log"):
        if e["method"] == "GET" and ".distcp" in e["target"] and e["range"].startswith("bytes="):
            first, last = (int(x) for x in e["range"][6:].split("-"))
            gets.append((e["start"], e["end"], first, last - first + 1))
    return gets


def load_through_proxy(tmp_path, url, sd, **reader):
    from test_s3_files import Proxy, through

    proxy = Proxy(tmp_path)
    try:
        out = {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()}, "step": -1, "names": []}
        through(proxy, lambda: dcp.load(out, storage_reader=FileSystemReader(url, **reader), no_dist=True))
    finally:
        proxy.kill()
    same(sd, out)
    return proxy_gets(tmp_path)


def test_item_headers_are_read_together(s3_prefix, tmp_path):
    """A DCP load from object storage reads the torch.save items' headers (their first and last 64 KiB,
    what libckptio's header read takes) in one engine plan: those ranged GETs are in flight together,
    as the proxy's log of each request's start and end shows, not one round trip after another; and the
    tail of an item and the head of the next, which lie back to back, come in one GET."""
    g = torch.Generator().manual_seed(7)
    sd = {"model": {f"w{i}": torch.randn(512, 512, generator=g) for i in range(12)}, "step": 1, "names": []}
    url = f"{s3_prefix}/ckpt"
    save(sd, url)
    gets = load_through_proxy(tmp_path, url, sd)
    # Header reads come before the data (each item's storage is 1 MiB, one GET of its own).
    data_from = min(s for s, _, _, n in gets if n >= 1 << 20)
    heads = [(s, e) for s, e, _, n in gets if n < 1 << 20 and s < data_from]
    # 12 items: a head and a tail each, neighbours' merged: 13 GETs (24 one window at a time); and maybe
    # the data plan's GET of the byte items, when it starts before the first of the tensors' GETs.
    assert 1 <= len(heads) <= 14, gets
    in_flight = max(sum(1 for s, e in heads if s <= start < e) for start, _ in heads)
    assert in_flight >= 2, f"the {len(heads)} header GETs went one after another"


def test_data_gets_are_cut_from_each_tensor(s3_prefix, tmp_path):
    """The engine cuts an object's extent into ranged GETs of the chunk size counted from the extent's
    start (not at multiples of the chunk in the object, which left a GET of a few KiB at each boundary a
    tensor straddles), a remainder of less than a quarter chunk riding with the last GET."""
    g = torch.Generator().manual_seed(8)
    # 2 MiB and 2 MiB + 64 KiB tensors (float32): two GETs of 1 MiB each, the second one 1 MiB + 64 KiB.
    sd = {"model": {"a": torch.randn(512, 1024, generator=g), "b": torch.randn(528, 1024, generator=g)},
          "step": 2, "names": []}
    url = f"{s3_prefix}/ckpt"
    save(sd, url)
    gets = load_through_proxy(tmp_path, url, sd, engine=ckptio.Engine(chunk_bytes=1 << 20))
    data = sorted(n for _, _, _, n in gets if n >= 1 << 20)
    assert data == [1 << 20, 1 << 20, 1 << 20, (1 << 20) + (64 << 10)], gets
    # Besides: the headers' windows (two items back to back: three GETs) and the two byte items, which
    # lie side by side and come in one GET.
    assert len(gets) - len(data) <= 4, gets


def test_small_items_come_in_few_gets(s3_prefix, tmp_path):
    """Small items (packed back to back by the writer) and byte items are read as one range per few MiB
    of an object and copied to their tensors, bit-exact whatever their dtypes, not one GET each."""
    g = torch.Generator().manual_seed(9)
    dtypes = (torch.float32, torch.bfloat16, torch.int64, torch.float16, torch.uint8)
    model = {f"t{i}": (torch.randn(16 + 7 * i, generator=g) * 100).to(dtypes[i % len(dtypes)]) for i in range(40)}
    sd = {"model": model, "step": 3, "names": ["a", "b"]}
    url = f"{s3_prefix}/ckpt"
    save(sd, url)
    gets = load_through_proxy(tmp_path, url, sd)
    # The header round (40 small items: their windows are the items, side by side) and the data plan:
    # a few GETs each, where one per item made 80.
    assert len(gets) <= 6, gets



def test_verify_reads_items_together(s3_prefix, tmp_path):
    """ckptio.dcp.verify (the manager's FULL check too) reads the items it hashes in one engine plan per
    64 MiB of a file, neighbouring ranges as one (chunk-sized GETs in flight together), not one item or
    part after another; a flipped byte still fails naming its item."""
    from test_s3_files import Proxy, through

    g = torch.Generator().manual_seed(10)
    sd = {"model": {f"w{i}": torch.randn(512, 512, generator=g) for i in range(12)}, "step": 1, "names": []}
    url = f"{s3_prefix}/ckpt"
    save(sd, url)
    proxy = Proxy(tmp_path)
    try:
        report = through(proxy, lambda: ckptio.dcp.verify(url))
    finally:
        proxy.kill()
    assert report["checked"] == 14, report
    gets = [(s, e) for s, e, _, n in proxy_gets(tmp_path)]
    # 12 items of 1 MiB back to back: a few GETs (a batch per run of items in the manifest's order that
    # ascends in the file) where one GET per item (or per part) went one after another; besides, the
    # byte items (hashed, then read for the restricted unpickler).
    assert sum(1 for _, _, _, n in proxy_gets(tmp_path) if n >= 1 << 20) <= 4, gets
    assert len(gets) <= 6, gets
    in_flight = max(sum(1 for s, e in gets if s <= start < e) for start, _ in gets)
    assert in_flight >= 2, f"the {len(gets)} GETs of the items went one after another"
    # A flipped byte in the last item: E_CHECKSUM naming it.
    name = next(k for k in keys_under(url) if k.endswith(".distcp"))
    data = bytearray(_ckptio.object_read(f"{url}/{name}"))
    data[-200] ^= 0xFF
    _ckptio.object_put(f"{url}/{name}", bytes(data))
    with pytest.raises(ckptio.CkptioError) as e:
        ckptio.dcp.verify(url)
    assert e.value.status_name == "E_CHECKSUM" and "model.w11" in str(e.value), str(e.value)


def test_records_between_the_windows_get_larger_windows_together(s3_prefix, tmp_path, monkeypatch):
    """Items whose zip records the first windows miss (here: windows of 512 bytes, shorter than the pickle)
    get larger windows, all in one more plan, not libckptio's header read one item after another (a probe
    of the first bytes, then the records: round trips per item)."""
    from ckptio.dcp import _reader

    monkeypatch.setattr(_reader, "HEADER_WINDOW", 512)
    g = torch.Generator().manual_seed(11)
    sd = {"model": {f"w{i}": torch.randn(512, 512, generator=g) for i in range(12)}, "step": 1, "names": []}
    url = f"{s3_prefix}/ckpt"
    save(sd, url)
    gets = load_through_proxy(tmp_path, url, sd)
    probes = [n for _, _, _, n in gets if n <= 64]
    assert not probes, gets
    # The first windows (13 GETs at most), the larger ones (whole items of 1 MiB, 4 MiB per GET), the data.
    assert len(gets) <= 13 + 4 + 12 + 1, gets


def test_commit_round_trips_run_together(s3_prefix, tmp_path):
    """A save over an older checkpoint, as the proxy's log of each request's start and end shows it: the
    lease's check runs beside the manifest's PUT and the .metadata PUT waits for it; the listing of the
    prefix runs beside the .metadata PUT; a second check ends before the first delete; the older save's
    objects are deleted together, and only after the .metadata is in place. The answer "no conditional
    writes" is remembered per endpoint and bucket: the proxy is another endpoint with a bucket of the same
    name, so its first save asks again; its second takes the lease with one PUT. (The first attempt of
    the second save's manifest and .metadata PUTs stalls 0.3 s, so "beside" does not depend on how fast a
    thread starts.)"""
    from test_s3_files import Proxy, through

    url = f"{s3_prefix}/ckpt"
    g = torch.Generator().manual_seed(5)
    sd = {f"w{i}": torch.randn(256, 256, generator=g) for i in range(8)}
    save(sd, url, thread_count=4)  # directly: this endpoint's answer is known from here on
    proxy = Proxy(tmp_path, r"PUT:\.ckptio-manifest-:stall:0.3:1:1", r"PUT:/\.metadata$:stall:0.3:1:1")
    try:
        through(proxy, lambda: save(sd, url, thread_count=4))  # four data objects
        first = proxy.requests()
        time.sleep(2.1)  # older than the next lease by the server's whole seconds (listings round up)
        through(proxy, lambda: save(sd, url, thread_count=4))
    finally:
        proxy.kill()
    log = proxy.requests()[len(first):]

    def spans(method, pick, entries=log):
        return [(e["start"], e["end"]) for e in entries if e["method"] == method and pick(e["target"]) and "end" in e]

    def together(a, b):
        return a[0] < b[1] and b[0] < a[1]

    lock_puts = lambda entries: spans("PUT", lambda t: t.endswith("/.ckptio-dcp.lock"), entries)  # noqa: E731
    try:
        _ckptio.object_put(f"{s3_prefix}/probe", b"x", if_absent=True)
        conditional = True
    except ckptio.CkptioError as e:
        conditional = e.status_name != "E_UNSUPPORTED"
    # Without conditional writes (Swift), the proxy's first save asks again (501), then writes unconditionally.
    assert len(lock_puts(first)) == (1 if conditional else 2), first
    manifest = spans("PUT", lambda t: ".ckptio-manifest-" in t)
    metadata = spans("PUT", lambda t: t.endswith("/.metadata"))
    checks = spans("GET", lambda t: t.endswith("/.ckptio-dcp.lock"))
    listing = spans("GET", lambda t: "delimiter=" in t)
    deletes = spans("DELETE", lambda t: ".distcp" in t)
    # The older saves' objects: the first save's too when the save after it was in the same second.
    assert len(manifest) == 1 and len(metadata) == 1 and listing and len(deletes) in (4, 8), log
    assert len(lock_puts(log)) == 1, log  # not asked again at this endpoint and bucket
    first_check = [c for c in checks if c[0] < manifest[0][1] and c[1] <= metadata[0][0]]
    assert first_check, log
    assert any(x[0] < metadata[0][1] for x in listing), log
    assert all(d[0] >= metadata[0][1] for d in deletes), log
    # The second check: started beside the .metadata PUT, ended before any delete began.
    assert any(c[0] >= first_check[0][1] and c[0] < metadata[0][1] and c[1] <= min(d[0] for d in deletes)
               for c in checks), log
    assert max(sum(1 for d in deletes if together(d, e)) for e in deletes) >= 2, log
    same_state = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(same_state, storage_reader=FileSystemReader(url), no_dist=True)
    assert all(torch.equal(same_state[k], sd[k]) for k in sd)
    assert len(_tokens(keys_under(url))) == 1


def test_a_dcp_save_streams_through_few_part_buffers(s3_prefix):
    """The zeros of each item's alignment are written into a data object, not left as a hole to fill at its
    commit: with one part in flight and buffers for three, a data file of tensors of one part each goes out part
    by part as it is written (each part holding the gap between two items used to wait for the commit, and this
    save failed "roughly in order"); it loads bit-exact and verifies."""
    url = f"{s3_prefix}/ckpt"
    g = torch.Generator().manual_seed(8)
    sd = {f"w{i}": torch.randn(5 << 18, generator=g) for i in range(8)}  # 8 x 5 MiB
    eng = ckptio.Engine(s3_part_bytes=5 << 20, s3_concurrency=1, threads=1, chunk_bytes=1 << 20)
    dcp.save(sd, storage_writer=FileSystemWriter(url, engine=eng), no_dist=True)
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(out, storage_reader=FileSystemReader(url), no_dist=True)
    assert all(torch.equal(out[k], sd[k]) for k in sd)
    assert ckptio.dcp.verify(url)["checked"] == len(sd)


def test_a_dcp_save_whose_data_object_is_refused_keeps_the_older_checkpoint(s3_prefix, tmp_path):
    """The commit completes the data objects beside the manifest's PUT (docs/OBJECT_STORAGE.md): a
    CompleteMultipartUpload the server refuses fails the save with the server's code and the key, before any
    .metadata; the older checkpoint loads whole, and nothing of the failed save is left: no data object, no
    manifest, no upload."""
    from test_s3_files import uploads_under

    url = f"{s3_prefix}/ckpt"
    save(model_state(21), url)
    before = keys_under(url)
    g = torch.Generator().manual_seed(9)
    big = {"w": torch.randn(6 << 20, generator=g)}  # 24 MiB: a multipart upload
    with pytest.raises((Exception, CheckpointException)) as e:
        save_through_proxy(tmp_path, big, url, "POST:uploadId=:error:400/InvalidPart:1")
    assert "InvalidPart" in str(e.value) and ".distcp" in str(e.value), str(e.value)
    same(load(url), model_state(21))
    assert keys_under(url) == before
    assert uploads_under(s3_prefix) == 0


DCP_CTRL_C = textwrap.dedent("""
    import os, signal, sys, threading, time
    import torch, torch.distributed.checkpoint as dcp
    from ckptio.dcp import FileSystemWriter, _commit
    signal.signal(signal.SIGINT, signal.default_int_handler)
    commit = _commit.commit

    def interrupted(*args, **kwargs):  # Ctrl-C while the commit waits for the data object's last part
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        return commit(*args, **kwargs)

    _commit.commit = interrupted
    t0 = time.monotonic()
    try:
        dcp.save({"w": torch.ones(24 << 20, dtype=torch.uint8)}, storage_writer=FileSystemWriter(sys.argv[1]),
                 no_dist=True)
        print("FINISHED", flush=True)
    except BaseException as e:  # torch wraps what finish() raises in a CheckpointException
        print("INTERRUPTED %.2f" % (time.monotonic() - t0) if "KeyboardInterrupt" in repr(e) + str(e) else repr(e),
              flush=True)
""")


def test_ctrl_c_while_the_commit_waits_for_the_data_object(s3_prefix, tmp_path):
    """The coordinator's data object is completed by the commit, so the save's wait for its last part runs in
    finish(): Ctrl-C there (the part held back 5 s by the proxy) ends the save at once with KeyboardInterrupt,
    aborts the upload and commits nothing; the older checkpoint loads whole."""
    from test_s3_files import Proxy, uploads_under

    url = f"{s3_prefix}/ckpt"
    save(model_state(22), url)
    before = keys_under(url)
    script = tmp_path / "dcp_ctrl_c.py"
    script.write_text(DCP_CTRL_C)
    proxy = Proxy(tmp_path, "PUT:partNumber=2&:delay:5:1")
    try:
        out = subprocess.run([sys.executable, str(script), url], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, AWS_ENDPOINT_URL=proxy.url,
                                      PYTHONPATH=os.path.dirname(os.path.dirname(ckptio.__file__))))
    finally:
        proxy.kill()
    assert "INTERRUPTED" in out.stdout, out.stdout + out.stderr
    assert float(out.stdout.split()[1]) < 4, out.stdout  # not after the held-back part
    same(load(url), model_state(22))
    assert keys_under(url) == before
    assert uploads_under(s3_prefix) == 0


def save_through_proxy(tmp_path, sd, url, *rules):
    """save() through the fault proxy with `rules`; the proxy's log of its requests (JSON entries)."""
    from test_s3_files import Proxy, through

    proxy = Proxy(tmp_path, *rules)
    try:
        through(proxy, lambda: save(sd, url))
    finally:
        proxy.kill()
    return proxy.requests()


def test_lease_released_beside_the_removal(s3_prefix, tmp_path):
    """The lease's release (its GET and DELETE) runs beside the removal of the older save's objects, not after
    it: it starts once the .metadata PUT was answered and the second check passed, and ends on a thread of its
    own, which the writer's wait_cleanup() and this process's next save wait for (the next saver finds the
    prefix free). The older data object's first DELETE stalls 0.5 s, so "beside" does not depend on how fast a
    thread starts."""
    url = f"{s3_prefix}/ckpt"
    g = torch.Generator().manual_seed(6)
    sd = {f"w{i}": torch.randn(128, 128, generator=g) for i in range(4)}
    save(sd, url)
    time.sleep(2.1)  # older than the next lease by the server's whole seconds (listings round up)
    log = save_through_proxy(tmp_path, sd, url, r"DELETE:\.distcp$:stall:0.5:1")
    lock = [e for e in log if e["target"].split("?")[0].endswith("/.ckptio-dcp.lock")]
    metadata = [e for e in log if e["method"] == "PUT" and e["target"].endswith("/.metadata")]
    data_deletes = [e for e in log if e["method"] == "DELETE" and e["target"].endswith(".distcp")]
    release = [e for e in lock if e["method"] == "DELETE"]
    checks = [e for e in lock if e["method"] == "GET" and metadata and metadata[0]["start"] <= e["start"]]
    assert len(metadata) == 1 and len(release) == 1 and len(data_deletes) >= 2, log
    assert "end" in release[0] and checks, log
    second_check = checks[0]
    # The protocol's order stands: the release after .metadata is in place and after the second check...
    assert release[0]["start"] >= metadata[0]["end"] and release[0]["start"] >= second_check["end"], log
    # ... and before the older data object's DELETE (stalled, then retried) was answered.
    removal_end = max(e["end"] for e in data_deletes if "end" in e)
    assert release[0]["start"] < removal_end, log
    # The removal did not wait for the release either (the release holds no lock a removal needs).
    assert min(e["start"] for e in data_deletes) < release[0]["end"], log
    assert ".ckptio-dcp.lock" not in keys_under(url)
    assert len(_tokens(keys_under(url))) == 1
    save(sd, url, dir_busy="error")  # free at once


def test_old_uploads_listed_beside_the_listing(s3_prefix, tmp_path):
    """The cleanup lists the prefix's unfinished uploads beside its listing of the objects, not after it; which
    of them it aborts still waits for that listing (the time it gives), and the upload a killed save left is
    aborted. The listing's first attempt stalls 0.3 s at the proxy, so "beside" does not depend on how fast a
    thread starts."""
    from test_s3_files import small_engine

    url = f"{s3_prefix}/ckpt"
    sd = model_state(3)
    save(sd, url)
    killed = _ckptio.File(f"{url}/__0_0123456789ab_0.distcp", _ckptio.OPEN_WRITE, small_engine())
    buf = torch.zeros(12 << 20, dtype=torch.uint8)
    killed.write([(buf.data_ptr(), buf.numel(), 0, 0)])  # two parts sent: the upload is open, never completed
    time.sleep(3.5)  # the upload older than the next lease by the server's whole seconds
    log = save_through_proxy(tmp_path, sd, url, r"GET:list-type=2:stall:0.3:1")
    listing = [e for e in log if e["method"] == "GET" and "list-type=2" in e["target"]]
    uploads = [e for e in log if e["method"] == "GET" and "uploads=" in e["target"]]
    aborts = [e for e in log if e["method"] == "DELETE" and "uploadId=" in e["target"]]
    manifest = [e for e in log if e["method"] == "PUT" and ".ckptio-manifest-" in e["target"]]
    assert listing and listing[0]["action"] == "stall" and uploads and aborts and manifest, log
    listed = max(e["end"] for e in listing if "end" in e)
    assert manifest[0]["end"] <= uploads[0]["start"] < listed, log  # once the first check passed
    assert all(a["start"] >= listed for a in aborts), log
    assert _ckptio.object_abort_uploads(f"{url}/", 0) == 0  # the killed save's upload was aborted
    same(load(url), sd)
    del killed


def _tokens(names):
    """The save tokens of the data objects among `names` (__{rank}_{token}_{n}.distcp)."""
    return {n.split("_")[3] for n in names if n.startswith("__") and n.endswith(".distcp")}


def test_a_mark_released_after_the_cleanups_listing_keeps_every_object(s3_prefix, tmp_path):
    """A save without collectives commits (its __0.metadata PUT) and drops its mark between a cleanup's
    listing and that cleanup's read of the mark: the listing shows the data object but not the metadata that
    references it, so the cleanup must keep everything this round rather than take the data for an older
    save's. The mark's GET stalls 3 s at the fault proxy (the client retries it) while that happens."""
    import threading

    from test_s3_files import Proxy, through

    d = f"{s3_prefix}/ckpt"
    mark = _ckptio.dcp_lock_acquire(d, None, True, 0.0)  # a save without collectives: its mark
    data = "__0_dddddddddddd_0.distcp"
    _ckptio.object_put(f"{d}/{data}", b"x" * 100)

    def commit_meanwhile():
        time.sleep(1.0)  # inside the stalled GET of the mark, after the listing
        _ckptio.object_put(f"{d}/__0.metadata", b"m")
        _ckptio.dcp_lock_release(mark)

    proxy = Proxy(tmp_path, "GET:ckptio-dcp-shared-:stall:3:1")
    other = threading.Thread(target=commit_meanwhile)
    try:
        other.start()
        stale, _ = through(proxy, lambda: _ckptio.dcp_stale_files(d, [], None))
    finally:
        other.join()
        proxy.kill()
    assert data not in stale, stale
