#!/usr/bin/env python3
"""bench_object_storage.py - checkpoints in S3-compatible object storage: ckptio beside its peers and a raw
ceiling, against one server, in one run (BENCHMARKS.md "Object storage").

    eval "$(scripts/s3_server.sh start)"       # or any S3 endpoint: AWS_ENDPOINT_URL, AWS_* credentials
    pip install -r bench/requirements-object-storage.txt
    CKPTIO_TEST_S3_BUCKET=ckptio-test python3 bench/bench_object_storage.py --size 256M --reps 2

Workloads (the same bytes for every method):
  load_model   a Hugging Face directory of 4 safetensors shards under a prefix, into CPU tensors
  save_model   the same tensors written as 4 safetensors shards under a new prefix (ckptio: one directory save,
               ckptio.save(sd, "s3://.../", max_shard_size=...), which adds the index)
  load_dcp     a torch.distributed.checkpoint of the same tensors (one process), loaded in place
  save_dcp     the same state dict saved as a DCP checkpoint under a new prefix
Methods:
  ckptio       ckptio.load / ckptio.save of the prefix (a directory save); ckptio.dcp.FileSystemWriter and
               FileSystemReader
  runai        Run:ai Model Streamer with its S3 backend (SafetensorsStreamer.stream_files): loads only
  s3torch      s3torchconnector: S3Checkpoint reader/writer with safetensors.torch (model), and DCP's
               S3StorageWriter / S3StorageReader
  fsspec       torch's FsspecWriter / FsspecReader over s3fs (DCP only)
  boto3        boto3's transfer manager: download_fileobj / upload_fileobj of each shard's bytes (model only)
  ceiling      bench/s3_raw_ceiling.py's bare clients, 16 curl processes at a time: through the S3 API (SigV4
               signed by the script, UNSIGNED-PAYLOAD), parallel 8 MiB ranged GETs of a multipart object and a
               multipart upload of 16 MiB parts of the same bytes: the ratio column's reference; and through
               Swift's own API (tempauth, no S3 layer), a row of its own where the server is Swift
GPU mode (--device cuda): load_model alone, into tensors on that device, each method ending with
torch.cuda.synchronize(); the methods are ckptio (ckptio.load(prefix, device=...)), boto3 (download_fileobj,
safetensors.torch.load, then .to(device)) and local (ckptio.load of the same 4 shards from files in --dir, written
there by ckptio.save: what the same load costs without the server). Every load's tensors are checked against the
sums of the saved ones after the clock stops.
Each method runs in a process of its own (its peak RSS is its alone); the best of --reps runs is kept. What a run
of a saving method wrote is deleted after its clock stopped, and the run's prefix at the end (its unfinished
uploads aborted): a run leaves nothing on the server unless --keep is given.
Columns: GB/s (10^9 bytes of tensor data per second), ratio to the S3-API ceiling of the same direction (measured
before and after the methods, the best kept), peak RSS of the process and what of it the method added (over the
interpreter, torch and the state dict it saves), the process's CPU seconds per GB, and the server's CPU seconds per
GB (every process of the local server; only with scripts/s3_server.sh's). Results: $OUT/object_storage.json
($OUT/object_storage_gpu.json in GPU mode; bench/_common.py). GPU machine without network:
bench/bench_object_storage_gpu.sh.
"""
import argparse
import io
import json
import os
import resource
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

MiB = 1 << 20
SHARDS = 4
DEVICE = "cpu"  # --device: where loads put their tensors
LOCAL_DIR = "/var/tmp"  # --dir: where the GPU mode's local copy lives
loaded = {}  # the last load's tensors, checked after the clock stops (GPU mode)


def bucket():
    return os.environ.get("CKPTIO_TEST_S3_BUCKET", "ckptio-test")


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def peak_rss_mib():
    """This process's peak RSS (VmHWM: the address space's own, unlike ru_maxrss, which exec keeps)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def server_pids():
    """The processes of scripts/s3_server.sh's server (their command line names its state directory)."""
    port = os.environ.get("AWS_ENDPOINT_URL", "").rsplit(":", 1)[-1]
    mark = f"ckptio-s3-{os.getuid()}-{port}"
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if mark.encode() in f.read() or b"memcached" in open(f"/proc/{p}/comm", "rb").read():
                        pids.append(int(p))
            except OSError:
                pass
    return pids


def server_cpu():
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in server_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


def state(size):
    import torch

    g = torch.Generator().manual_seed(0)
    n = size // 4 // SHARDS // 4  # 4 tensors per shard, float32
    return {f"layer.{s}.{t}": torch.randn(n, generator=g) for s in range(SHARDS) for t in range(4)}


def shard_of(sd):
    names = sorted(sd)
    per = len(names) // SHARDS
    return [{k: sd[k] for k in names[i * per:(i + 1) * per]} for i in range(SHARDS)]


def url(*parts):
    return "s3://" + bucket() + "/" + "/".join(parts)


def endpoint():
    return os.environ["AWS_ENDPOINT_URL"]


OUTPUTS = ("bench-out-", "dcp-out-")  # the names the saving methods give what they write under the run's prefix


def delete_under(prefix, only_outputs=False):
    """Deletes the objects under s3://bucket/prefix/ (with only_outputs, those the saving methods wrote) and
    aborts the unfinished uploads there, several requests in flight: a run writes gigabytes that would otherwise
    stay on the server. Returns how many objects it deleted."""
    from concurrent.futures import ThreadPoolExecutor

    import ckptio

    keys = [e[0] for e in ckptio._ckptio.object_list(url(prefix) + "/") if not e[3]]  # keys from the bucket's root
    doomed = [k for k in keys if not only_outputs or k[len(prefix) + 1:].startswith(OUTPUTS)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: ckptio._ckptio.object_delete(url(k)), doomed))
    ckptio._ckptio.object_abort_uploads(url(prefix) + "/")
    return len(doomed)


# ---- the methods: each returns bytes moved ------------------------------------------------------------------

def ckptio_load_model(prefix, size):
    import ckptio

    sd = ckptio.load(url(prefix, "model"), device=DEVICE)
    loaded.update(sd)
    return sum(t.numel() * t.element_size() for t in sd.values())


def ckptio_save_model(prefix, size, sd):
    import ckptio

    # The same 4 shards (4 tensors each) as one directory save: every shard in one engine job, the index last.
    out = f"bench-out-{uuid.uuid4().hex[:8]}"
    ckptio.save(sd, url(prefix, out) + "/", max_shard_size=sum(t.nbytes for t in shard_of(sd)[0].values()))
    return size


def runai_load_model(prefix, size):
    from runai_model_streamer import SafetensorsStreamer

    os.environ.setdefault("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")  # path-style, as a custom endpoint needs

    total = 0
    files = [url(prefix, "model", f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors") for i in range(SHARDS)]
    with SafetensorsStreamer() as s:
        s.stream_files(files)
        for _, t in s.get_tensors():
            total += t.numel() * t.element_size()
    return total


def s3torch_checkpoint():
    from s3torchconnector import S3Checkpoint, S3ClientConfig

    return S3Checkpoint(region=os.environ.get("AWS_REGION", "us-east-1"), endpoint=endpoint(),
                        s3client_config=S3ClientConfig(force_path_style=True))


def s3torch_load_model(prefix, size):
    from safetensors.torch import load

    ck = s3torch_checkpoint()
    total = 0
    for i in range(SHARDS):
        with ck.reader(url(prefix, "model", f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors")) as r:
            sd = load(r.read())
        total += sum(t.numel() * t.element_size() for t in sd.values())
    return total


def s3torch_save_model(prefix, size, sd):
    from safetensors.torch import save

    ck = s3torch_checkpoint()
    out = f"bench-out-{uuid.uuid4().hex[:8]}"
    for i, part in enumerate(shard_of(sd)):
        with ck.writer(url(prefix, out, f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors")) as w:
            w.write(save(part))
    return size


def boto3_client():
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint(), config=Config(s3={"addressing_style": "path"},
                                                                      max_pool_connections=32))


def boto3_transfer():
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=16 * MiB, max_concurrency=16)


def boto3_load_model(prefix, size):
    from safetensors.torch import load

    s3, tc = boto3_client(), boto3_transfer()
    total = 0
    for i in range(SHARDS):
        buf = io.BytesIO()
        s3.download_fileobj(bucket(), f"{prefix}/model/model-{i + 1:05d}-of-{SHARDS:05d}.safetensors", buf, Config=tc)
        sd = load(buf.getvalue())
        if DEVICE != "cpu":
            sd = {k: v.to(DEVICE) for k, v in sd.items()}
            loaded.update(sd)
        total += sum(t.numel() * t.element_size() for t in sd.values())
    return total


def local_dir(prefix):
    return os.path.join(LOCAL_DIR, prefix)


def local_load_model(prefix, size):
    import ckptio

    sd = ckptio.load(local_dir(prefix), device=DEVICE)
    loaded.update(sd)
    return sum(t.numel() * t.element_size() for t in sd.values())


def boto3_save_model(prefix, size, sd):
    from safetensors.torch import save

    s3, tc = boto3_client(), boto3_transfer()
    out = f"bench-out-{uuid.uuid4().hex[:8]}"
    for i, part in enumerate(shard_of(sd)):
        s3.upload_fileobj(io.BytesIO(save(part)), bucket(), f"{prefix}/{out}/model-{i + 1:05d}.safetensors",
                          Config=tc)
    return size


def dcp_target(sd):
    import torch

    return {k: torch.empty_like(v) for k, v in sd.items()}


def ckptio_load_dcp(prefix, size, sd):
    import torch.distributed.checkpoint as dcp
    from ckptio.dcp import FileSystemReader

    out = dcp_target(sd)
    dcp.load(out, storage_reader=FileSystemReader(url(prefix, "dcp")), no_dist=True)
    return size


def ckptio_save_dcp(prefix, size, sd):
    import torch.distributed.checkpoint as dcp
    from ckptio.dcp import FileSystemWriter

    dcp.save(sd, storage_writer=FileSystemWriter(url(prefix, f"dcp-out-{uuid.uuid4().hex[:8]}")), no_dist=True)
    return size


def s3torch_dcp_io(path, write):
    from s3torchconnector import S3ClientConfig
    from s3torchconnector.dcp import S3StorageReader, S3StorageWriter

    cls = S3StorageWriter if write else S3StorageReader
    return cls(region=os.environ.get("AWS_REGION", "us-east-1"), path=path,
               s3client_config=S3ClientConfig(force_path_style=True), **({"overwrite": True} if write else {}))


def s3torch_load_dcp(prefix, size, sd):
    import torch.distributed.checkpoint as dcp

    out = dcp_target(sd)
    dcp.load(out, storage_reader=s3torch_dcp_io(url(prefix, "dcp-s3torch"), False), no_dist=True)
    return size


def s3torch_save_dcp(prefix, size, sd):
    import torch.distributed.checkpoint as dcp

    dcp.save(sd, storage_writer=s3torch_dcp_io(url(prefix, f"dcp-out-{uuid.uuid4().hex[:8]}"), True), no_dist=True)
    return size


def fsspec_io(path, write):
    from torch.distributed.checkpoint import FsspecReader, FsspecWriter

    opts = {"client_kwargs": {"endpoint_url": endpoint()}}
    return FsspecWriter(path, sync_files=False, thread_count=8, **opts) if write else FsspecReader(path, **opts)


def fsspec_load_dcp(prefix, size, sd):
    import torch.distributed.checkpoint as dcp

    out = dcp_target(sd)
    dcp.load(out, storage_reader=fsspec_io(url(prefix, "dcp"), False), no_dist=True)
    return size


def fsspec_save_dcp(prefix, size, sd):
    import torch.distributed.checkpoint as dcp

    dcp.save(sd, storage_writer=fsspec_io(url(prefix, f"dcp-out-{uuid.uuid4().hex[:8]}"), True), no_dist=True)
    return size


METHODS_GPU = {"load_model": {"ckptio": ckptio_load_model, "boto3": boto3_load_model, "local": local_load_model}}
METHODS = {
    "load_model": {"ckptio": ckptio_load_model, "runai": runai_load_model, "s3torch": s3torch_load_model,
                   "boto3": boto3_load_model},
    "save_model": {"ckptio": ckptio_save_model, "s3torch": s3torch_save_model, "boto3": boto3_save_model},
    "load_dcp": {"ckptio": ckptio_load_dcp, "s3torch": s3torch_load_dcp, "fsspec": fsspec_load_dcp},
    "save_dcp": {"ckptio": ckptio_save_dcp, "s3torch": s3torch_save_dcp, "fsspec": fsspec_save_dcp},
}


def run_one(work, method, prefix, size):
    """In this process: one timed run; prints one JSON line."""
    import warnings

    warnings.simplefilter("ignore")
    needs_sd = work in ("save_model", "load_dcp", "save_dcp")
    sd = state(size) if needs_sd else None
    fn = (METHODS if DEVICE == "cpu" else METHODS_GPU)[work][method]
    # Imports before the clock starts: what is timed is the transfer.
    import ckptio  # noqa: F401
    import ckptio.dcp  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    if method == "runai":
        os.environ.setdefault("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")
        import runai_model_streamer  # noqa: F401
    elif method == "s3torch":
        import s3torchconnector.dcp  # noqa: F401
    elif method == "boto3":
        import boto3  # noqa: F401
    elif method == "fsspec":
        import s3fs  # noqa: F401
    if DEVICE != "cpu":
        import torch

        torch.empty(1, device=DEVICE)  # the CUDA context, before the clock
    base = peak_rss_mib()  # the interpreter, torch and (for saves and DCP loads) the state dict
    c0, s0, t0 = cpu_self(), server_cpu(), time.perf_counter()
    moved = fn(prefix, size, sd) if needs_sd else fn(prefix, size)
    if DEVICE != "cpu" and torch.device(DEVICE).type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if DEVICE != "cpu":
        check_loaded(prefix)
    print(json.dumps({"seconds": wall, "bytes": moved, "cpu": cpu_self() - c0, "server_cpu": server_cpu() - s0,
                      "rss_MiB": peak_rss_mib(), "base_rss_MiB": base}), flush=True)


def sums_path(prefix):
    return os.path.join(local_dir(prefix), "sums.json")


def check_loaded(prefix):
    """The loaded tensors are on DEVICE and sum as the saved ones did (float64 sums: a missing or misplaced chunk
    changes them far beyond rounding)."""
    import torch

    with open(sums_path(prefix)) as f:
        want = json.load(f)
    if sorted(loaded) != sorted(want):
        raise SystemExit(f"loaded {len(loaded)} tensors, saved {len(want)}")
    for k, v in loaded.items():
        got = v.double().sum().item()
        if v.device.type != torch.device(DEVICE).type or \
                abs(got - want[k]) > 1e-6 * max(1.0, abs(want[k])) + 1e-3:
            raise SystemExit(f"{k}: on {v.device}, sum {got}, saved {want[k]}")


def prepare(prefix, size):
    """The model directory and the DCP checkpoints every load reads (written once, by ckptio); in GPU mode the
    model directory alone, a local copy of it and its tensors' sums."""
    import ckptio
    import torch.distributed.checkpoint as dcp
    from ckptio.dcp import FileSystemWriter

    sd = state(size)
    import json as _json

    weight_map = {}
    for i, part in enumerate(shard_of(sd)):
        name = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        ckptio.save(part, url(prefix, "model", name))
        weight_map.update({k: name for k in part})
    index = _json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    ckptio._ckptio.object_put(url(prefix, "model", "model.safetensors.index.json"), index)
    if DEVICE != "cpu":
        os.makedirs(local_dir(prefix))
        for i, part in enumerate(shard_of(sd)):
            ckptio.save(part, os.path.join(local_dir(prefix), f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"))
        with open(os.path.join(local_dir(prefix), "model.safetensors.index.json"), "wb") as f:
            f.write(index)
        with open(sums_path(prefix), "w") as f:
            _json.dump({k: v.double().sum().item() for k, v in sd.items()}, f)
        return
    dcp.save(sd, storage_writer=FileSystemWriter(url(prefix, "dcp")), no_dist=True)
    try:  # s3torchconnector reads checkpoints written by its own writer
        s3torch_save_dcp_to(url(prefix, "dcp-s3torch"), sd)
    except Exception as e:  # noqa: BLE001 - reported with the method
        _common.notes.append(f"s3torchconnector could not write its DCP checkpoint: {e}")


def s3torch_save_dcp_to(path, sd):
    import torch.distributed.checkpoint as dcp

    dcp.save(sd, storage_writer=s3torch_dcp_io(path, True), no_dist=True)


CEILING_ROWS = ("s3-get", "s3-put", "swift-get", "swift-put")


def ceiling(size, reps, api):
    """bench/s3_raw_ceiling.py on the same number of bytes through one API (s3 or swift): best GET and PUT GB/s
    and their client CPU s/GB, and the server's CPU s/GB over the script."""
    s0 = server_cpu()
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "s3_raw_ceiling.py"), "--mib",
                          str(size // MiB), "--concurrency", "16", "--reps", str(reps), "--api", api],
                         capture_output=True, text=True, timeout=1800)
    best = {}
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[0] in CEILING_ROWS:
            gb = float(f[5])
            if gb > best.get(f[0], (0, 0))[0]:
                best[f[0]] = (gb, float(f[7]))
    if not best:
        _common.notes.append(f"the {api} raw ceiling did not run: {out.stderr[-500:]}")
        return best
    # The server's CPU over the script: `reps` reads and writes of the object (the swift run also uploads it once
    # through the S3 API, for its GETs to read).
    moved = size * (2 * reps + (1 if api == "swift" else 0)) / 1e9
    best[f"{api}_server_cpu_s_per_GB"] = (server_cpu() - s0) / moved
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="256M", help="bytes of tensor data (default 256M)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated workloads or work:method pairs to run")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda[:N]: the GPU mode (load_model alone)")
    ap.add_argument("--dir", default="/var/tmp", help="the GPU mode's local copy goes in a new directory here")
    ap.add_argument("--keep", action="store_true",
                    help="leave what the run wrote on the server (by default each method's output is deleted after "
                    "it is measured, and the run's prefix at the end)")
    ap.add_argument("--one", nargs=3, metavar=("WORK", "METHOD", "PREFIX"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    size = _common.parse_size(a.size)
    global DEVICE, LOCAL_DIR
    DEVICE, LOCAL_DIR = a.device, a.dir
    if a.one:
        run_one(a.one[0], a.one[1], a.one[2], size)
        return
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    _common.log(f"preparing {size / MiB:.0f} MiB under s3://{bucket()}/{prefix} at {endpoint()}")
    try:
        measure(a, size, prefix)
    finally:
        if not a.keep:
            try:
                _common.log(f"deleted {delete_under(prefix)} objects under s3://{bucket()}/{prefix}")
            except Exception as exc:  # noqa: BLE001 - the measurement's own error, if any, is the one to see
                _common.log(f"could not delete the objects under s3://{bucket()}/{prefix}: {exc}")


def measure(a, size, prefix):
    prepare(prefix, size)
    ceil = ceiling(size, a.reps, "s3")
    if server_pids() and DEVICE == "cpu":  # Swift's own API: only scripts/s3_server.sh's server has it
        ceil.update(ceiling(size, a.reps, "swift"))
    _common.log("ceiling", ceil)
    only = [x for x in a.only.split(",") if x]
    results = []
    for work, methods in (METHODS if DEVICE == "cpu" else METHODS_GPU).items():
        for method in methods:
            if only and work not in only and f"{work}:{method}" not in only:
                continue
            best = None
            for _ in range(a.reps):
                if method == "local":
                    _common.drop_caches(local_dir(prefix))
                r = subprocess.run([sys.executable, __file__, "--size", a.size, "--device", a.device, "--dir", a.dir,
                                    "--one", work, method, prefix],
                                   capture_output=True, text=True, timeout=1800)
                if not a.keep:  # after the clock stopped: what this run wrote, a failed one's uploads too
                    delete_under(prefix, only_outputs=True)
                line = next((x for x in r.stdout.splitlines() if x.startswith("{")), None)
                if line is None:
                    err = (r.stderr.strip().splitlines() or ["no output"])[-1][:400]
                    best = best or {"error": err}
                    break
                m = json.loads(line)
                if best is None or "error" in best or m["seconds"] < best["seconds"]:
                    best = m
            row = {"work": work, "method": method, **best}
            if "seconds" in best:
                gb = best["bytes"] / 1e9
                row["GBps"] = gb / best["seconds"]
                row["cpu_s_per_GB"] = best["cpu"] / gb
                row["server_cpu_s_per_GB"] = best["server_cpu"] / gb
            results.append(row)
            _common.log(work, method, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                                       if k not in ("work", "method")})
    # The S3 ceiling again after the methods, the best of both runs kept: the other jobs on a shared machine move
    # the server's speed over the run, and a ceiling is the best the bare client reached.
    for k, v in ceiling(size, a.reps, "s3").items():
        if k in ("s3-get", "s3-put") and v[0] > ceil.get(k, (0, 0))[0]:
            ceil[k] = v
    _common.log("ceiling after the methods", ceil)
    if DEVICE != "cpu":
        _common.rmf(local_dir(prefix))
    for row in results:
        key = "s3-get" if row["work"].startswith("load") else "s3-put"
        if "GBps" in row and key in ceil:
            row["ratio_to_ceiling"] = row["GBps"] / ceil[key][0]
    meta = _common.machine()
    meta.update({"size": size, "reps": a.reps, "endpoint": endpoint(), "server": "OpenStack Swift s3api "
                 "(scripts/s3_server.sh)" if server_pids() else "external",
                 "ceiling": {k: ({"GBps": v[0], "cpu_s_per_GB": v[1]} if isinstance(v, tuple) else v)
                             for k, v in ceil.items()}, "proxy_workers": os.environ.get("CKPTIO_TEST_S3_WORKERS", "1"),
                 "ckptio_sign_payload": os.environ.get("CKPTIO_S3_SIGN_PAYLOAD", "auto"), "device": DEVICE,
                 "object_workers": os.environ.get("CKPTIO_TEST_S3_OBJECT_WORKERS", "0")})
    if DEVICE != "cpu":
        meta["local_file_system"] = _common.machine(a.dir).get("file_system", "")
    for mod in ("runai_model_streamer", "s3torchconnector", "s3fs", "boto3", "swift"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    print(f"\n{'work':11s} {'method':8s} {'GB/s':>6s} {'ceil%':>6s} {'RSS MiB':>8s} {'+MiB':>6s} {'CPU s/GB':>9s} "
          f"{'server s/GB':>11s}")
    for r in results:
        if "GBps" in r:
            ratio = f"{100 * r['ratio_to_ceiling']:5.0f}%" if "ratio_to_ceiling" in r else "     -"
            print(f"{r['work']:11s} {r['method']:8s} {r['GBps']:6.3f} {ratio} {r['rss_MiB']:8.0f} "
                  f"{r['rss_MiB'] - r['base_rss_MiB']:6.0f} {r['cpu_s_per_GB']:9.2f} {r['server_cpu_s_per_GB']:11.2f}")
        else:
            print(f"{r['work']:11s} {r['method']:8s} failed: {r['error']}")
    for k, v in ceil.items():
        if isinstance(v, tuple):
            via = "curl via S3 API (SigV4)" if k.startswith("s3") else "curl via Swift API"
            print(f"ceiling {k:9s} ({via}): {v[0]:.3f} GB/s, {v[1]:.2f} client CPU s/GB")
        else:
            print(f"ceiling {k}: {v:.2f} (reads and writes together)")
    name = "object_storage.json" if DEVICE == "cpu" else "object_storage_gpu.json"
    print("results:", _common.write_result(name, meta, results))
    _common.print_notes()


if __name__ == "__main__":
    main()
