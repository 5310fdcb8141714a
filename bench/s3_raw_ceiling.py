#!/usr/bin/env python3
"""s3_raw_ceiling.py - the raw ceiling of the local S3 test server (scripts/s3_server.sh): the same bytes
moved by bare clients, next to which ckptio's object backend (bench/probe_s3.c) is measured.

    eval "$(scripts/s3_server.sh start)"
    python3 bench/s3_raw_ceiling.py --mib 256 --concurrency 16 --reps 3 [--boto3]

  curl-get   ranged GETs of 8 MiB, `concurrency` curl processes at a time, bodies to /dev/null, through
             Swift's own API with a tempauth token (no SigV4: curl cannot sign for tempauth's "acct:user"
             access keys), of an object uploaded first with S3 multipart (the layout ckptio's reads see)
  curl-put   the same bytes as 16 MiB segment objects PUT by `concurrency` curl processes at a time (what
             UploadPart requests carry), from files in /dev/shm
  boto3-*    boto3's transfer manager (download_fileobj / upload_fileobj, same part size and
             concurrency), when --boto3 is given and boto3 is importable
Prints GB/s and CPU seconds per GB (the clients' CPU, children included). Standard library and curl.
"""
import argparse
import http.client
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

MIB = 1 << 20


def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def report(what, nbytes, wall, cpus):
    gb = nbytes / 1e9
    print(f"{what:10s} {nbytes / MIB:8.1f} MiB  {wall:6.3f} s  {gb / wall:7.3f} GB/s  {cpus / gb:6.2f} CPU s/GB",
          flush=True)


def swift_token(endpoint, user, key):
    u = urlsplit(endpoint)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("GET", "/auth/v1.0", headers={"X-Auth-User": user, "X-Auth-Key": key})
    r = c.getresponse()
    r.read()
    if r.status // 100 != 2:
        sys.exit(f"tempauth answered {r.status}")
    return r.getheader("X-Auth-Token"), r.getheader("X-Storage-Url")


def boto3_client(endpoint):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"},
                                                                  max_pool_connections=64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--boto3", action="store_true")
    a = ap.parse_args()
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    bucket = os.environ.get("CKPTIO_TEST_S3_BUCKET", "ckptio-test")
    size = a.mib * MIB
    data = bytes(range(256)) * (size // 256)
    token, storage = swift_token(endpoint, os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    key = "bench/raw-ceiling"
    s3 = boto3_client(endpoint) if a.boto3 else None
    from_boto = None
    try:
        import boto3.s3.transfer as bt  # noqa: F401
        from boto3.s3.transfer import TransferConfig
        tc = TransferConfig(multipart_threshold=8 * MIB, multipart_chunksize=16 * MIB,
                            max_concurrency=a.concurrency, use_threads=True)
        from_boto = tc
    except ImportError:
        if a.boto3:
            sys.exit("boto3 is not importable")
    # The object, uploaded with S3 multipart (boto3 when there, else Swift's API as one object).
    if s3:
        s3.upload_fileobj(io.BytesIO(data), bucket, key, Config=from_boto)
    else:
        subprocess.run(["curl", "-sf", "-X", "PUT", "-H", f"X-Auth-Token: {token}", "--data-binary", "@-",
                        f"{storage}/{bucket}/{key}"], input=data, check=True)
    chunk = 8 * MIB
    ranges = [(o, min(o + chunk, size) - 1) for o in range(0, size, chunk)]

    def get(r):
        subprocess.run(["curl", "-sf", "-o", "/dev/null", "-H", f"X-Auth-Token: {token}", "-H",
                        f"Range: bytes={r[0]}-{r[1]}", f"{storage}/{bucket}/{key}"], check=True)

    for _ in range(a.reps):
        t0, c0 = time.monotonic(), cpu()
        with ThreadPoolExecutor(a.concurrency) as ex:
            list(ex.map(get, ranges))
        report("curl-get", size, time.monotonic() - t0, cpu() - c0)
    part = 16 * MIB
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        segs = []
        for i, o in enumerate(range(0, size, part)):
            p = os.path.join(shm, f"seg{i}")
            with open(p, "wb") as f:
                f.write(data[o:o + part])
            segs.append((i, p))

        def put(seg):
            subprocess.run(["curl", "-sf", "-o", "/dev/null", "-H", f"X-Auth-Token: {token}", "-T", seg[1],
                            f"{storage}/{bucket}/{key}-seg/{seg[0]:05d}"], check=True)

        for _ in range(a.reps):
            t0, c0 = time.monotonic(), cpu()
            with ThreadPoolExecutor(a.concurrency) as ex:
                list(ex.map(put, segs))
            report("curl-put", size, time.monotonic() - t0, cpu() - c0)
        for i, _ in segs:
            subprocess.run(["curl", "-sf", "-o", "/dev/null", "-X", "DELETE", "-H", f"X-Auth-Token: {token}",
                            f"{storage}/{bucket}/{key}-seg/{i:05d}"])
    if s3:
        for _ in range(a.reps):
            buf = io.BytesIO()
            t0, c0 = time.monotonic(), cpu()
            s3.download_fileobj(bucket, key, buf, Config=from_boto)
            report("boto3-get", size, time.monotonic() - t0, cpu() - c0)
            assert buf.getvalue() == data
        for _ in range(a.reps):
            t0, c0 = time.monotonic(), cpu()
            s3.upload_fileobj(io.BytesIO(data), bucket, key, Config=from_boto)
            report("boto3-put", size, time.monotonic() - t0, cpu() - c0)
    subprocess.run(["curl", "-sf", "-o", "/dev/null", "-X", "DELETE", "-H", f"X-Auth-Token: {token}",
                    f"{storage}/{bucket}/{key}"])


if __name__ == "__main__":
    main()
