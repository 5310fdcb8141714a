"""_ckptio.object_read (the whole object into bytes), counted in the fault proxy's log: its open is the
GET of the object's first MiB, no HEAD."""

from __future__ import annotations

import os

import pytest

from ckptio import _ckptio

from test_s3_files import Proxy, through


def read_through_proxy(tmp_path, url, **kw):
    proxy = Proxy(tmp_path)
    try:
        data = through(proxy, lambda: _ckptio.object_read(url, **kw))
    finally:
        proxy.kill()
    return data, [(e["method"], e["range"]) for e in proxy.requests()]


@pytest.mark.parametrize("size", [0, 1000, 1 << 20, (1 << 20) + 12345])
def test_object_read_is_its_gets_without_a_head(s3_prefix, tmp_path, size):
    """An object of up to 1 MiB is one GET; a larger one a second GET of the rest; the bytes are the object's.
    An empty one: a server answers the ranged GET either with 416 (then the HEAD tells the size) or with a
    whole, empty 200 (its size then known)."""
    url = f"{s3_prefix}/blob"
    body = os.urandom(size)
    _ckptio.object_put(url, body)
    data, requests = read_through_proxy(tmp_path, url)
    assert data == body
    if size == 0:
        assert requests in ([("GET", "bytes=0-1048575"), ("HEAD", "")], [("GET", "bytes=0-1048575")]), requests
    elif size <= 1 << 20:
        assert requests == [("GET", "bytes=0-1048575")], requests
    else:
        assert requests == [("GET", "bytes=0-1048575"), ("GET", f"bytes=1048576-{size - 1}")], requests


def test_object_read_refuses_an_object_over_max_bytes(s3_prefix, tmp_path):
    """max_bytes bounds what is read: a larger object is refused after its first GET (of max_bytes)."""
    url = f"{s3_prefix}/blob"
    _ckptio.object_put(url, os.urandom(5000))
    with pytest.raises(ValueError, match="larger than the 4096 bytes"):
        read_through_proxy(tmp_path, url, max_bytes=4096)
    assert _ckptio.object_read(url, max_bytes=5000) is not None
