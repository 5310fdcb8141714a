"""ckptio.dcp: slices of scattered bytes read as covering spans, in bounded
batches, and cut on the target's device (ckptio.dcp._spans).

The reader is driven with hand-made ReadItems (one process, no process
group): the column slice of a row-major chunk that a load into another
sharding asks for, and slices of a strided chunk. Runs on the host and,
where CUDA exists, into GPU targets. The budget is made small so that the
spans split into pieces and batches; the tests assert the bytes, the bytes
read, and that every batch fits one reused buffer of the budget.
"""
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem  # noqa: E402

import ckptio  # noqa: E402
import ckptio.dcp as cdcp  # noqa: E402
from ckptio.dcp import _reader, _spans  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="needs a CUDA device"))]


class Planner:
    """What read_data asks of a planner: a destination per item, and commits."""

    def __init__(self, targets):
        self.targets = targets
        self.committed = []

    def resolve_tensor(self, req):
        return self.targets[req.dest_index.fqn]

    def commit_tensor(self, req, tensor):
        self.committed.append(req.dest_index.fqn)


def read_slices(path, slices, targets):
    """Reads `slices` {fqn: (offsets, lengths)} of the stored (single-chunk)
    tensors into `targets` with ckptio's reader; returns its stats."""
    reader = cdcp.FileSystemReader(path, broadcast=False)
    reader.set_up_storage_reader(reader.read_metadata(), True)
    items = [ReadItem(type=LoadItemType.TENSOR, dest_index=MetadataIndex(fqn, [0] * len(offs)),
                      dest_offsets=torch.Size([0] * len(offs)), storage_index=MetadataIndex(fqn, [0] * len(offs)),
                      storage_offsets=torch.Size(offs), lengths=torch.Size(lens))
             for fqn, (offs, lens) in slices.items()]
    planner = Planner(targets)
    reader.read_data(reader.prepare_local_plan(LoadPlan(items)), planner)
    assert sorted(planner.committed) == sorted(slices)
    return reader.last_read_stats


@pytest.fixture
def batches(monkeypatch):
    """Every batch of span reads: its extents (file, address, length, offset, kind)."""
    seen = []
    real = _spans._ckptio.dcp_read

    def record(extents, engine):
        seen.append(list(extents))
        return real(extents, engine)

    monkeypatch.setattr(_spans._ckptio, "dcp_read", record)
    return seen


def check_batches(seen, budget):
    """Each batch fits `budget` bytes of one buffer, reused by every batch."""
    assert len(seen) >= 2
    bases = set()
    for extents in seen:
        base = min(e[1] for e in extents)
        assert max(e[1] + e[2] for e in extents) - base <= budget, extents
        bases.add(base)
    assert len(bases) == 1, bases


@pytest.mark.parametrize("device", DEVICES)
def test_columns_of_a_row_major_chunk(tmp_path, monkeypatch, batches, device):
    """Half the columns of every row (the load of a row-sharded matrix into
    columns): more runs than MAX_RUNS, so a span, split into pieces of whole
    rows; a converting and a non-contiguous destination too."""
    rows = _spans.MAX_RUNS + 904
    g = torch.Generator().manual_seed(5)
    sd = {"e": torch.randn(rows, 16, generator=g).to(torch.bfloat16), "w": torch.randn(rows, 12, generator=g)}
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(tmp_path / "c"), no_dist=True)
    budget = 8192
    monkeypatch.setattr(_spans, "BUDGET", budget)
    wide = torch.zeros(rows, 20, device=device)
    targets = {"e": torch.zeros(rows, 8, dtype=torch.float32, device=device),  # converted from bf16
               "w": wide[:, 3:8]}  # a strided view of a larger tensor
    stats = read_slices(tmp_path / "c", {"e": ((0, 4), (rows, 8)), "w": ((0, 6), (rows, 5))}, targets)
    assert torch.equal(targets["e"].cpu(), sd["e"][:, 4:12].float())
    assert torch.equal(wide[:, 3:8].cpu(), sd["w"][:, 6:11])
    assert torch.count_nonzero(wide[:, :3]) == 0 and torch.count_nonzero(wide[:, 8:]) == 0
    check_batches(batches, budget)
    # The pieces cover each slice's span (first to last element) and nothing else.
    span = ((rows - 1) * 16 + 8) * 2 + ((rows - 1) * 12 + 5) * 4
    assert sum(e[2] for b in batches for e in b) == stats["bytes_read"]  # every item went by spans
    assert rows * 8 * 2 + rows * 5 * 4 < stats["bytes_read"] <= span, stats


@pytest.mark.parametrize("device", DEVICES)
def test_strided_chunk_read_once_in_pieces(tmp_path, monkeypatch, batches, device):
    """A chunk stored with its strides (torch's writer keeps a transposed
    tensor as it is): split along its largest stride, so its storage is read
    once, not once per piece."""
    g = torch.Generator().manual_seed(6)
    base = torch.randn(700, 40, generator=g)
    sd = {"t": base.t()}  # shape (40, 700), strides (1, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp_path / "t"), no_dist=True)
    budget = 4096
    monkeypatch.setattr(_spans, "BUDGET", budget)
    target = torch.zeros(40, 700, device=device)
    stats = read_slices(tmp_path / "t", {"t": ((0, 0), (40, 700))}, {"t": target})
    assert torch.equal(target.cpu(), sd["t"])
    check_batches(batches, budget)
    assert stats["bytes_read"] == base.numel() * 4, stats  # every stored byte once
    # A slice of it: rows 10..29, columns 100..399 (of the transposed view).
    batches.clear()
    part = torch.zeros(20, 300, device=device)
    stats = read_slices(tmp_path / "t", {"t": ((10, 100), (20, 300))}, {"t": part})
    assert torch.equal(part.cpu(), sd["t"][10:30, 100:400])
    check_batches(batches, budget)
    # Within the slice's span (the gaps between pieces are not read), beyond its own bytes.
    assert 20 * 300 * 4 < stats["bytes_read"] <= ((300 - 1) * 40 + 20) * 4, stats


def test_one_row_wider_than_the_budget_makes_a_batch_alone(tmp_path, monkeypatch, batches):
    rows = _spans.MAX_RUNS + 1
    sd = {"e": torch.arange(rows * 64, dtype=torch.int32).reshape(rows, 64)}
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(tmp_path / "c"), no_dist=True)
    monkeypatch.setattr(_spans, "BUDGET", 100)  # a row's span is 32 x 4 = 128 bytes
    target = torch.zeros(rows, 32, dtype=torch.int32)
    read_slices(tmp_path / "c", {"e": ((0, 16), (rows, 32))}, {"e": target})
    assert torch.equal(target, sd["e"][:, 16:48])
    assert len(batches) == rows and all(len(b) == 1 and b[0][2] == 128 for b in batches)


def test_a_slice_past_its_storage_is_refused(tmp_path, monkeypatch):
    """The span of a slice must lie inside its stored storage: a chunk whose
    recorded shape outgrows the bytes behind it is a format error naming the
    file, not a read of the next item's bytes."""
    rows = _spans.MAX_RUNS + 10
    sd = {"e": torch.zeros(rows, 8), "f": torch.ones(100)}
    dcp.save(sd, storage_writer=cdcp.FileSystemWriter(tmp_path / "c"), no_dist=True)
    real = _reader._Stored.__init__

    def smaller(self, code, shape, stride, storage_offset, base, storage_nbytes, memory=None):
        real(self, code, shape, stride, storage_offset, base, storage_nbytes - 4 if shape[0] == rows else
             storage_nbytes, memory)

    monkeypatch.setattr(_reader._Stored, "__init__", smaller)
    with pytest.raises(ckptio.CkptioError) as e:
        read_slices(tmp_path / "c", {"e": ((0, 4), (rows, 4))}, {"e": torch.zeros(rows, 4)})
    assert e.value.status_name == "E_FORMAT" and "of a storage of" in str(e.value), e.value
