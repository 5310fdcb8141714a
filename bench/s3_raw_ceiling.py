#!/usr/bin/env python3
"""s3_raw_ceiling.py - the raw ceiling of an S3 server (scripts/s3_server.sh's, or any endpoint for the S3 rows):
the same bytes moved by bare clients, next to which ckptio's object backend is measured.

    eval "$(scripts/s3_server.sh start)"
    python3 bench/s3_raw_ceiling.py --mib 256 --concurrency 16 --reps 3 [--api s3,swift] [--boto3]

  s3-put     one real multipart upload of the bytes per repetition, through the S3 API:
             CreateMultipartUpload and CompleteMultipartUpload (http.client), UploadPart of 16 MiB parts by
             `concurrency` curl processes at a time from files in /dev/shm; SigV4 signed here (standard library,
             UNSIGNED-PAYLOAD, path-style, region from AWS_REGION), so every request takes the server's S3 path
  s3-get     ranged GETs of 8 MiB of that multipart object, bodies to /dev/null, signed the same way, by
             `concurrency` curl processes, each GETting its consecutive share on one kept-alive connection
  swift-put  the same bytes as 16 MiB segment objects PUT through Swift's own API with a tempauth token (what
             UploadPart requests store, without the S3 layer: no SigV4 check, no XML, no SLO manifest)
  swift-get  ranged GETs of 8 MiB of the multipart object through Swift's own API
  boto3-*    boto3's transfer manager (download_fileobj / upload_fileobj, same part size and concurrency),
             when --boto3 is given and boto3 is importable
The signing is done here because curl's --aws-sigv4 cannot take an access key with a colon (tempauth's
"acct:user"). Prints GB/s and CPU seconds per GB (the clients' CPU, children included). Standard library and curl.
"""
import argparse
import datetime
import hashlib
import hmac
import http.client
import io
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote, urlsplit

MIB = 1 << 20
PART = 16 * MIB
CHUNK = 8 * MIB


def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def report(what, nbytes, wall, cpus):
    gb = nbytes / 1e9
    print(f"{what:10s} {nbytes / MIB:8.1f} MiB  {wall:6.3f} s  {gb / wall:7.3f} GB/s  {cpus / gb:6.2f} CPU s/GB",
          flush=True)


class SigV4:
    """AWS Signature Version 4 headers for one request, path-style, with an unsigned payload."""

    def __init__(self, endpoint, access, secret, region):
        u = urlsplit(endpoint)
        self.endpoint, self.host = endpoint.rstrip("/"), u.netloc
        self.access, self.secret, self.region = access, secret, region

    def headers(self, method, path, query=None):
        now = datetime.datetime.now(datetime.timezone.utc)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        canon_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                               for k, v in sorted((query or {}).items()))
        signed = "host;x-amz-content-sha256;x-amz-date"
        canon = "\n".join([method, quote(path, safe="/-_.~"), canon_query, f"host:{self.host}",
                           "x-amz-content-sha256:UNSIGNED-PAYLOAD", f"x-amz-date:{amz_date}", "", signed,
                           "UNSIGNED-PAYLOAD"])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canon.encode()).hexdigest()])
        k = ("AWS4" + self.secret).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        return {"Authorization": f"AWS4-HMAC-SHA256 Credential={self.access}/{scope}, SignedHeaders={signed}, "
                                 f"Signature={sig}",
                "x-amz-date": amz_date, "x-amz-content-sha256": "UNSIGNED-PAYLOAD"}

    def url(self, path, query=None):
        q = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted((query or {}).items()))
        return self.endpoint + quote(path, safe="/-_.~") + ("?" + q if q else "")

    def curl_args(self, method, path, query=None):
        h = self.headers(method, path, query)
        args = []
        for k, v in h.items():
            args += ["-H", f"{k}: {v}"]
        return args + [self.url(path, query)]

    def request(self, method, path, query=None, body=b""):
        """One request on a connection of its own (http.client); returns (status, body)."""
        u = urlsplit(self.endpoint)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        c = cls(u.hostname, u.port, timeout=300)
        path_q = self.url(path, query)[len(self.endpoint):]
        c.request(method, path_q, body=body, headers=self.headers(method, path, query))
        r = c.getresponse()
        data = r.read()
        c.close()
        if r.status // 100 != 2 or b"<Error>" in data:
            sys.exit(f"{method} {path_q}: HTTP {r.status} {data[:300]!r}")
        return data


def run_curl(cmd, **kw):
    """subprocess.run of a curl command; a failure names the exit status and the URL only, never the command line,
    whose headers carry the request's signature or token."""
    out = subprocess.run(cmd, **kw)
    if out.returncode:
        raise RuntimeError(f"curl exited with status {out.returncode} on {cmd[-1]}")
    return out


def s3_multipart_put(sig, path, parts, concurrency):
    """CreateMultipartUpload, the parts by parallel curl processes, CompleteMultipartUpload."""
    created = sig.request("POST", path, {"uploads": ""})
    upload_id = re.search(rb"<UploadId>([^<]+)</UploadId>", created).group(1).decode()

    def upload(part):
        n, file = part
        q = {"partNumber": str(n), "uploadId": upload_id}
        out = run_curl(["curl", "-sf", "-o", "/dev/null", "-D", "-", "-H", "Expect:", "-T", file]
                       + sig.curl_args("PUT", path, q), capture_output=True, text=True).stdout
        return re.search(r"(?im)^etag:\s*(\S+)", out).group(1)

    with ThreadPoolExecutor(concurrency) as ex:
        etags = list(ex.map(upload, parts))
    body = "<CompleteMultipartUpload>" + "".join(
        f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for (n, _), e in zip(parts, etags)) \
        + "</CompleteMultipartUpload>"
    sig.request("POST", path, {"uploadId": upload_id}, body.encode())


def ranged_gets(args_for, size, concurrency):
    """The ranges split over `concurrency` curl processes, each GETting its consecutive share one after the other
    on one kept-alive connection (--next), as a client with a connection pool does."""
    ranges = [(o, min(o + CHUNK, size) - 1) for o in range(0, size, CHUNK)]
    per = -(-len(ranges) // concurrency)

    def get(share):
        cmd = ["curl", "-sf"]
        for i, r in enumerate(share):
            cmd += (["--next"] if i else []) + ["-o", "/dev/null", "-H", f"Range: bytes={r[0]}-{r[1]}"] + args_for()
        run_curl(cmd)

    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(get, [ranges[i:i + per] for i in range(0, len(ranges), per)]))


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
    ap.add_argument("--api", default="s3,swift", help="comma-separated: s3 (SigV4), swift (tempauth)")
    ap.add_argument("--boto3", action="store_true")
    a = ap.parse_args()
    apis = set(a.api.split(","))
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    bucket = os.environ.get("CKPTIO_TEST_S3_BUCKET", "ckptio-test")
    size = a.mib * MIB
    data = bytes(range(256)) * (size // 256)
    access, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    sig = SigV4(endpoint, access, secret, os.environ.get("AWS_REGION", "us-east-1"))
    key = f"bench/raw-ceiling-{uuid.uuid4().hex[:8]}"  # its own: two runs on one bucket never delete each other's
    path = f"/{bucket}/{key}"
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        parts = []
        for i, o in enumerate(range(0, size, PART)):
            p = os.path.join(shm, f"part{i}")
            with open(p, "wb") as f:
                f.write(data[o:o + PART])
            parts.append((i + 1, p))
        # The object every GET reads: an S3 multipart upload (SLO segments), the layout ckptio's reads see.
        for rep in range(a.reps if "s3" in apis else 1):
            t0, c0 = time.monotonic(), cpu()
            s3_multipart_put(sig, path, parts, a.concurrency)
            if "s3" in apis:
                report("s3-put", size, time.monotonic() - t0, cpu() - c0)
        if "s3" in apis:
            for _ in range(a.reps):
                t0, c0 = time.monotonic(), cpu()
                ranged_gets(lambda: sig.curl_args("GET", path), size, a.concurrency)
                report("s3-get", size, time.monotonic() - t0, cpu() - c0)
        if "swift" in apis:
            token, storage = swift_token(endpoint, access, secret)
            auth = ["-H", f"X-Auth-Token: {token}"]
            for _ in range(a.reps):
                t0, c0 = time.monotonic(), cpu()
                ranged_gets(lambda: auth + [f"{storage}/{bucket}/{key}"], size, a.concurrency)
                report("swift-get", size, time.monotonic() - t0, cpu() - c0)

            def put(part):
                run_curl(["curl", "-sf", "-o", "/dev/null", "-H", "Expect:", "-T", part[1]] + auth
                         + [f"{storage}/{bucket}/{key}-seg/{part[0]:05d}"])

            for _ in range(a.reps):
                t0, c0 = time.monotonic(), cpu()
                with ThreadPoolExecutor(a.concurrency) as ex:
                    list(ex.map(put, parts))
                report("swift-put", size, time.monotonic() - t0, cpu() - c0)
            for n, _ in parts:
                subprocess.run(["curl", "-sf", "-o", "/dev/null", "-X", "DELETE"] + auth
                               + [f"{storage}/{bucket}/{key}-seg/{n:05d}"])
    if a.boto3:
        try:
            from boto3.s3.transfer import TransferConfig
        except ImportError:
            sys.exit("boto3 is not importable")
        s3 = boto3_client(endpoint)
        tc = TransferConfig(multipart_threshold=8 * MIB, multipart_chunksize=PART, max_concurrency=a.concurrency,
                            use_threads=True)
        for _ in range(a.reps):
            buf = io.BytesIO()
            t0, c0 = time.monotonic(), cpu()
            s3.download_fileobj(bucket, key, buf, Config=tc)
            report("boto3-get", size, time.monotonic() - t0, cpu() - c0)
            assert buf.getvalue() == data
        for _ in range(a.reps):
            t0, c0 = time.monotonic(), cpu()
            s3.upload_fileobj(io.BytesIO(data), bucket, key, Config=tc)
            report("boto3-put", size, time.monotonic() - t0, cpu() - c0)
    sig.request("DELETE", path)


if __name__ == "__main__":
    main()
