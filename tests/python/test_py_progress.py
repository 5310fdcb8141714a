"""progress= on save, load, CheckpointFile.get_tensors and load_object
(docs/PYTHON.md, "Progress"): a callable gets (done, total) bytes, first,
every few tens of milliseconds and last; True draws a bar (tqdm, or one
line on stderr without it); an exception from the callable cancels the call
with the usual guarantees: no file appears, an older one stays intact, no
temporary is left, a load returns nothing."""
import sys
import threading

import pytest
import torch

import ckptio

N = 8 << 20  # float32 elements: 32 MiB


def _slow_engine():
    """Small requests on one thread: a transfer takes many progress intervals."""
    return ckptio.Engine(threads=1, chunk_bytes=16 << 10, backend="pread", sync=False)


def _slow_reader():
    """4 KiB O_DIRECT requests on one thread: a load spans many progress
    intervals even when the page cache holds the file."""
    return ckptio.Engine(threads=1, chunk_bytes=4096, backend="pread", direct="on")


def _check_reports(seen, total):
    assert seen, "progress was never called"
    assert seen[0][0] == 0, f"first report {seen[0]} is not at 0 bytes"
    assert seen[-1] == (total, total), f"last report {seen[-1]}, want ({total}, {total})"
    dones = [d for d, _ in seen]
    assert dones == sorted(dones), "done went backwards"
    totals = [t for _, t in seen]
    # A call of several plans whose sizes are not known up front adds each
    # plan's bytes when it starts (a torch save knows both of its own: one total).
    assert totals == sorted(totals) and all(d <= t for d, t in seen), seen


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_save_and_load_report_bytes(tmp_path, fmt):
    path = tmp_path / ("m.safetensors" if fmt == "safetensors" else "m.pt")
    sd = {"a": torch.randn(N), "b": torch.arange(1000)}
    seen = []
    ckptio.save(sd, path, progress=lambda d, t: seen.append((d, t)), engine=_slow_engine())
    size = path.stat().st_size
    # Every byte of the file is counted (torch: the data, then the archive's
    # directory, as one save), out of one total, and only the last report is done.
    _check_reports(seen, size)
    assert {t for _, t in seen} == {size}, sorted({t for _, t in seen})
    assert [d for d, t in seen].count(size) == 1, "done == total before the end"
    assert len(seen) >= 3, "no report between first and last"
    seen.clear()
    got = ckptio.load(path, progress=lambda d, t: seen.append((d, t)), engine=_slow_engine())
    assert torch.equal(got["a"], sd["a"]) and torch.equal(got["b"], sd["b"])
    _check_reports(seen, 4 * N + 8000)


def test_handle_bulk_reads_report(tmp_path):
    st, pt = tmp_path / "m.safetensors", tmp_path / "m.pt"
    sd = {"a": torch.randn(N), "b": torch.ones(10)}
    ckptio.save(sd, st)
    ckptio.save(sd, pt)
    seen = []
    with ckptio.open(st, engine=_slow_engine()) as f:
        out = f.get_tensors(["a"], progress=lambda d, t: seen.append((d, t)))
    _check_reports(seen, 4 * N)
    assert torch.equal(out["a"], sd["a"])
    seen.clear()
    with ckptio.open(pt, engine=_slow_engine()) as f:
        obj = f.load_object(progress=lambda d, t: seen.append((d, t)))
    _check_reports(seen, 4 * N + 40)
    assert torch.equal(obj["a"], sd["a"])


def test_progress_on_another_thread(tmp_path):
    """The callable runs on the calling thread, main or not."""
    path = tmp_path / "m.safetensors"
    seen, threads = [], set()

    def work():
        ckptio.save({"a": torch.ones(N)}, path, engine=_slow_engine(),
                    progress=lambda d, t: (seen.append((d, t)), threads.add(threading.get_ident())))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    _check_reports(seen, path.stat().st_size)
    assert threads == {t.ident}


class Stop(Exception):
    pass


@pytest.mark.parametrize("exc", [KeyboardInterrupt, Stop])
@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
@pytest.mark.parametrize("when", ["first", "middle"])
def test_raising_cancels_a_save_and_keeps_the_old_file(tmp_path, exc, fmt, when):
    path = tmp_path / ("m.safetensors" if fmt == "safetensors" else "m.pt")
    old = {"a": torch.arange(100.0)}
    ckptio.save(old, path)
    before = path.read_bytes()
    calls = []

    def stop(done, total):
        calls.append(done)
        if when == "first" or 0 < done < total:
            raise exc("stop")

    with pytest.raises(exc):
        ckptio.save({"a": torch.ones(N)}, path, engine=_slow_engine(), progress=stop)
    if when == "middle":
        assert len(calls) >= 2 and 0 < calls[-1] < 4 * N
    assert path.read_bytes() == before, "the older checkpoint changed"
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "a temporary was left"
    assert torch.equal(ckptio.load(path)["a"], old["a"])


def test_raising_cancels_a_save_to_a_new_name(tmp_path):
    def stop(done, total):
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ckptio.save({"a": torch.ones(N)}, tmp_path / "new.safetensors", engine=_slow_engine(), progress=stop)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_raising_cancels_a_load(tmp_path, fmt):
    path = tmp_path / ("m.safetensors" if fmt == "safetensors" else "m.pt")
    ckptio.save({"a": torch.ones(N)}, path)
    eng = _slow_reader()
    calls = []

    def stop(done, total):
        calls.append(done)
        if 0 < done < total:
            raise KeyboardInterrupt

    before = eng.stats()["bytes_read"]
    with pytest.raises(KeyboardInterrupt):
        ckptio.load(path, engine=eng, progress=stop)
    assert eng.stats()["bytes_read"] - before < 4 * N, "the load ran to the end"
    # The engine and the default slot are usable afterwards, without progress.
    assert torch.equal(ckptio.load(path, engine=eng)["a"], torch.ones(N))


def test_progress_true_without_tqdm_draws_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.ones(N)}, path, progress=True, engine=_slow_engine())
    ckptio.load(path, progress=True, engine=_slow_engine())
    err = capsys.readouterr().err
    lines = err.split("\n")
    assert lines[-1] == "" and len(lines) == 3, repr(err[-300:])
    assert lines[0].startswith("\rsave m.safetensors [") and lines[0].rsplit("\r", 1)[-1].startswith(
        "save m.safetensors [" + "#" * 30 + "] 100%"), repr(lines[0][-200:])
    assert lines[1].rsplit("\r", 1)[-1].startswith("load m.safetensors [" + "#" * 30 + "] 100%  32.0 MiB / 32.0 MiB")


def test_progress_true_uses_tqdm(tmp_path, monkeypatch):
    tqdm_auto = pytest.importorskip("tqdm.auto")
    made = []

    class Recorder:
        def __init__(self, **kwargs):
            self.kwargs, self.total, self.n, self.closed = kwargs, kwargs.get("total"), 0, False
            made.append(self)

        def update(self, k):
            self.n += k

        def close(self):
            self.closed = True

    monkeypatch.setattr(tqdm_auto, "tqdm", Recorder)
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.ones(N)}, path, progress=True)
    (bar,) = made
    assert bar.closed and bar.n == bar.total == path.stat().st_size
    assert bar.kwargs["unit"] == "B" and bar.kwargs["desc"] == "save m.safetensors"


def test_bad_progress_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="progress must be"):
        ckptio.save({"a": torch.ones(2)}, tmp_path / "m.safetensors", progress="yes")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_raising_after_the_last_byte_leaves_a_whole_file(tmp_path, fmt):
    """Only the last report comes after every byte moved: the save commits
    (as with a signal then) and the exception follows; never a partial file."""
    path = tmp_path / ("m.safetensors" if fmt == "safetensors" else "m.pt")

    def at_the_end(done, total):
        if done == total:
            raise Stop("done")

    with pytest.raises(Stop):
        ckptio.save({"a": torch.ones(N)}, path, engine=_slow_engine(), progress=at_the_end)
    assert not [p.name for p in tmp_path.iterdir() if "ckptio-tmp" in p.name]
    if fmt == "safetensors":
        assert torch.equal(ckptio.load(path)["a"], torch.ones(N))
    else:  # the data's end is not the save's: the directory is written too
        assert torch.equal(torch.load(path, weights_only=True)["a"], torch.ones(N))
