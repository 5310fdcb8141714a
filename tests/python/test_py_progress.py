"""progress= on save, load, CheckpointFile.get_tensors and load_object
(docs/PYTHON.md, "Progress"): a callable gets (done, total) bytes, first,
every few tens of milliseconds and last; True draws a bar by the rule the
CLI's bars follow (labelled with what moves, made with its total, redrawn in
place on a terminal and kept there as one final line, one line at the end
and no carriage returns elsewhere); an exception from the callable cancels
the call with the usual guarantees: no file appears, an older one stays
intact, no temporary is left, a load returns nothing."""
import io
import re
import sys
import threading

import pytest
import torch

import ckptio

N = 8 << 20  # float32 elements: 32 MiB


def _slow_engine():
    """Small O_DIRECT requests on one thread: a transfer takes many progress intervals (a save
    this small would otherwise go through the page cache at memory speed: write_cache)."""
    return ckptio.Engine(threads=1, chunk_bytes=16 << 10, backend="pread", sync=False, write_cache="off")


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


class Terminal(io.StringIO):
    """stderr as a terminal: the bar is drawn in place."""

    def isatty(self):
        return True


def _no_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)


FINAL = re.compile(r"^(save|load) (\S+): 32\.00 MiB in [0-9.]+ m?s \([0-9.]+ GB/s\)$")


def test_progress_true_off_a_terminal_writes_one_line_at_the_end(tmp_path, monkeypatch, capsys):
    """A log or a pipe gets no carriage returns and no redraws: one line per transfer when it ends, labelled
    with the path; tqdm, installed or not, is not used there."""
    monkeypatch.delenv("CKPTIO_NO_PROGRESS", raising=False)
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.ones(N)}, path, progress=True, engine=_slow_engine())
    ckptio.load(path, progress=True, engine=_slow_engine())
    err = capsys.readouterr().err
    assert "\r" not in err and "\033" not in err, repr(err[:300])
    lines = err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"save {path}: ") and re.match(r"^save .*: 32\.00 MiB in", lines[0])
    m = FINAL.match(lines[1])
    assert m and m.group(1) == "load" and m.group(2) == str(path), lines[1]


def test_progress_true_on_a_terminal_keeps_the_finished_bar(tmp_path, monkeypatch):
    _no_tqdm(monkeypatch)
    monkeypatch.delenv("CKPTIO_NO_PROGRESS", raising=False)
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.ones(N)}, path)
    ckptio.load(path, progress=True, engine=_slow_reader())
    out = term.getvalue()
    draws = out.split("\r\033[K")[1:]
    assert len(draws) >= 3, "no redraw between first and last"
    assert draws[0].startswith(f"load {path} [" + "." * 30 + "]   0%  0 B / 32.00 MiB"), draws[0]
    assert all(d.startswith(f"load {path} [") for d in draws[:-1])
    assert FINAL.match(draws[-1].rstrip("\n")) and draws[-1].endswith("\n"), draws[-1]
    assert out.count("\n") == 1, "one line stays"


def test_in_memory_transfers_are_labelled_bytes_or_stream(monkeypatch, capsys):
    monkeypatch.delenv("CKPTIO_NO_PROGRESS", raising=False)
    data = ckptio.save({"a": torch.ones(N)}, progress=True, engine=_slow_engine())
    ckptio.load(data, progress=True)
    ckptio.load(io.BytesIO(data), progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["save bytes", "load bytes", "load stream"], lines
    assert all(" in " in ln and ln.endswith("GB/s)") for ln in lines), lines
    assert "32.00 MiB" in lines[1] and "32.00 MiB" in lines[2]


def test_no_progress_setting_draws_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CKPTIO_NO_PROGRESS", "1")
    monkeypatch.setattr(sys, "stderr", Terminal())
    seen = []
    ckptio.save({"a": torch.ones(10)}, tmp_path / "m.safetensors", progress=True)
    ckptio.load(tmp_path / "m.safetensors", progress=lambda d, t: seen.append((d, t)))
    assert sys.stderr.getvalue() == "" and seen[-1] == (40, 40)  # a callable still gets its reports


def test_progress_true_uses_tqdm_on_a_terminal(tmp_path, monkeypatch):
    tqdm_auto = pytest.importorskip("tqdm.auto")
    monkeypatch.delenv("CKPTIO_NO_PROGRESS", raising=False)
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
    monkeypatch.setattr(sys, "stderr", Terminal())
    path = tmp_path / "m.safetensors"
    ckptio.save({"a": torch.ones(N)}, path, progress=True)
    (bar,) = made
    # Made with its total (never a bar of unknown size), left on screen when done.
    assert bar.kwargs["total"] == path.stat().st_size and bar.kwargs["leave"] is True
    assert bar.closed and bar.n == bar.total == path.stat().st_size
    assert bar.kwargs["unit"] == "B" and bar.kwargs["desc"] == f"save {path}"


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
