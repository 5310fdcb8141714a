"""How a DCP load from object storage opens its checkpoint, counted in the fault proxy's log: the
requests before the first data GET, which of them are in flight together, and that the version those
requests pinned is the one every later GET asks for."""

from __future__ import annotations


import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptio
from ckptio import _ckptio
from ckptio.dcp import FileSystemReader, FileSystemWriter
from ckptio.dcp import _objects
from torch.distributed.checkpoint.api import CheckpointException

from test_s3_files import Proxy, through

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def state(seed):
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(256, 1024, generator=g) for i in range(6)}


def save(sd, url):
    dcp.save(sd, storage_writer=FileSystemWriter(url, thread_count=3), no_dist=True)


def load_through_proxy(tmp_path, url, sd, *rules):
    proxy = Proxy(tmp_path, *rules)
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    try:
        through(proxy, lambda: dcp.load(out, storage_reader=FileSystemReader(url), no_dist=True))
    finally:
        proxy.kill()
    return out, proxy.requests()


def test_open_is_one_metadata_get_beside_one_listing(s3_prefix, tmp_path):
    """Before the first GET of a data object: one GET of .metadata (no HEAD: its first bytes tell its size)
    and, in flight at the same time, one listing of the prefix that gives every data object's size and
    ETag (no HEAD of a data object either): two requests in one round trip, where there were a HEAD and a
    GET of .metadata and then a HEAD per data object. The bytes are the saved ones."""
    sd = state(1)
    url = f"{s3_prefix}/ckpt"
    save(sd, url)
    names = [k.rsplit("/", 1)[-1] for k, *_ in _ckptio.object_list(url + "/")]
    assert sum(n.endswith(".distcp") for n in names) == 3, names
    out, log = load_through_proxy(tmp_path, url, sd)
    for k in sd:
        assert torch.equal(out[k], sd[k]), k
    first_data = min(e["start"] for e in log if e["method"] == "GET" and ".distcp" in e["target"])
    before = [e for e in log if e["start"] < first_data]
    assert not [e for e in log if e["method"] == "HEAD"], [(e["method"], e["target"]) for e in log]
    md = [e for e in before if e["method"] == "GET" and e["target"].split("?")[0].endswith("/.metadata")]
    listing = [e for e in before if e["method"] == "GET" and "list-type" in e["target"]]
    assert len(md) == 1 and len(listing) == 1 and len(before) == 2, [(e["method"], e["target"]) for e in before]
    assert listing[0]["start"] < md[0]["end"] and md[0]["start"] < listing[0]["end"], "one after the other"


def test_a_data_object_replaced_after_the_listing_is_stale(s3_prefix, monkeypatch):
    """The listed ETag pins a data object as a HEAD's would: its GETs name it in If-Match, so an object
    replaced between the listing and the read fails with E_STALE instead of mixing two versions."""
    sd = state(2)
    url = f"{s3_prefix}/ckpt"
    save(sd, url)
    listed_get = _objects.PrefixListing.get
    replaced = []

    def get_then_replace(self, name):
        found = listed_get(self, name)
        if found is not None and not replaced:
            data = _ckptio.object_read(f"{url}/{name}")
            _ckptio.object_put(f"{url}/{name}", data[:-1] + bytes([data[-1] ^ 1]))
            replaced.append(name)
        return found

    monkeypatch.setattr(_objects.PrefixListing, "get", get_then_replace)
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    with pytest.raises(CheckpointException) as e:
        dcp.load(out, storage_reader=FileSystemReader(url), no_dist=True)
    failure = next(iter(e.value.failures.values()))
    failure = failure[0] if isinstance(failure, tuple) else failure
    assert replaced and isinstance(failure, ckptio.CkptioError), repr(failure)
    assert failure.status_name == "E_STALE" and replaced[0] in str(failure), str(failure)


def test_a_listing_with_other_etags_than_the_gets_opens_with_heads(s3_prefix, tmp_path):
    """A server whose listings give other ETags than its GETs (some gateways, encryption modes): the
    listing's entry for .metadata does not name the ETag its GET answered with, so no listed ETag is
    used (every data GET naming one would fail E_STALE): each data object opens with its HEAD and the
    load is whole."""
    sd = state(4)
    url = f"{s3_prefix}/ckpt"
    save(sd, url)
    out, log = load_through_proxy(tmp_path, url, sd, "GET:list-type=2:etags:100")
    for k in sd:
        assert torch.equal(out[k], sd[k]), k
    assert [e["action"] for e in log if "list-type" in e["target"]] == ["etags"], log
    heads = sorted(e["target"].split("?")[0].rsplit("/", 1)[-1] for e in log if e["method"] == "HEAD")
    assert len(heads) == 3 and all(h.endswith(".distcp") for h in heads), heads


def test_an_unlistable_prefix_opens_with_heads(s3_prefix, monkeypatch):
    """Where the prefix cannot be listed (no permission to list), each data object opens with its HEAD as
    before and the load is whole."""
    sd = state(3)
    url = f"{s3_prefix}/ckpt"
    save(sd, url)
    real_list = _ckptio.object_list

    def refuse(u, *a, **kw):
        if kw.get("etags"):
            raise ckptio.CkptioError(_ckptio.E_PERMISSION, "listing refused")
        return real_list(u, *a, **kw)

    monkeypatch.setattr(_ckptio, "object_list", refuse)
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(out, storage_reader=FileSystemReader(url), no_dist=True)
    for k in sd:
        assert torch.equal(out[k], sd[k]), k
