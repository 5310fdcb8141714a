"""model_nccl_check.py - every byte of a model read once per node, on NCCL (one GPU per rank).

    torchrun --standalone --nproc_per_node=2 tests/gpu/model_nccl_check.py --dir /tmp/x --out $OUT [--size-mb 1024]
    torchrun --standalone --nproc_per_node=2 tests/gpu/model_nccl_check.py --dir /tmp/x --backend gloo --device cpu

Rank 0 writes a Llama-shaped model (bf16 weights, f32 norms, random bit
patterns) as a Hugging Face directory with ``safetensors.torch.save_file``
(4 shards + index: data not 4 KiB aligned). Every rank then loads it with
``ckptio.load(path, device=f"cuda:{rank}", process_group=pg)`` and the
tensor-parallel forms (rows, columns, a vLLM-like rule, per-rank slices,
several batches), and every byte of every result is compared, on the CPU,
with what ``safetensors.torch.load_file`` gives the same rank (cut with
``torch.tensor_split`` / indexing). The bytes read from storage over all ranks
must equal the bytes the ranks need (the model's bytes for replicas and the
TP forms); a read failure injected on one rank must end every rank with the
same CkptioError. Timings (files in the page cache: every load after the
first) are printed beside every rank loading the whole model itself.

Prints one "PASS name" / "FAIL name: why" line per check (rank 0; other
ranks print their own failures) and "time ..." lines, writes
model_nccl_check.json to --out. Exit status 1 when any check failed.
NCCL_NVLS_ENABLE=0 is expected in the environment on shared hosts.
"""
import argparse
import fnmatch
import json
import os
import shutil
import sys
import warnings

import torch
import torch.distributed as dist

if not os.environ.get("CKPTIO_TEST_INSTALLED"):  # else: the installed package, never the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import ckptio  # noqa: E402
from ckptio import _distributed, _errors  # noqa: E402
from nccl_checks import Checks, summed  # noqa: E402 - beside this script (torchrun puts it on sys.path)

warnings.filterwarnings("ignore")
DEVICE = torch.device("cpu")


def shapes(size_mb):
    """A Llama-shaped model of about size_mb (hidden 1024, MLP 2816, vocab 32000)."""
    hidden, inter, vocab = 1024, 2816, 32000
    per_layer = (4 * hidden * hidden + 3 * hidden * inter) * 2
    layers = max(1, int((size_mb * 1e6 - 2 * vocab * hidden * 2) // per_layer))
    out = {"model.embed_tokens.weight": ((vocab, hidden), torch.bfloat16),
           "lm_head.weight": ((vocab, hidden), torch.bfloat16), "model.norm.weight": ((hidden,), torch.float32)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{n}.weight"] = ((hidden, hidden), torch.bfloat16)
        out[p + "mlp.gate_proj.weight"] = ((inter, hidden), torch.bfloat16)
        out[p + "mlp.up_proj.weight"] = ((inter, hidden), torch.bfloat16)
        out[p + "mlp.down_proj.weight"] = ((hidden, inter), torch.bfloat16)
        out[p + "input_layernorm.weight"] = ((hidden,), torch.float32)
        out[p + "post_attention_layernorm.weight"] = ((hidden,), torch.float32)
    return out


def write_model(path, size_mb, shards=4):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(11)
    spec = shapes(size_mb)
    names = list(spec)
    weight_map = {}
    per = (len(names) + shards - 1) // shards
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {}
        for n in names[s * per:(s + 1) * per]:
            shape, dtype = spec[n]
            numel = 1
            for d in shape:
                numel *= d
            raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=g)
            part[n] = raw.view(dtype).reshape(shape)
        save_file(part, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


# vLLM's split of a Llama layer: column-parallel (dim 0) and row-parallel (dim 1) weights.
VLLM_RULE = {"*.q_proj.weight": 0, "*.k_proj.weight": 0, "*.v_proj.weight": 0, "*.gate_proj.weight": 0,
             "*.up_proj.weight": 0, "*.o_proj.weight": 1, "*.down_proj.weight": 1,
             "model.embed_tokens.weight": 0, "lm_head.weight": 0}


def same(a, b):
    a = a.cpu().contiguous().reshape(-1)
    b = b.contiguous().reshape(-1)
    return a.dtype == b.dtype and a.numel() == b.numel() and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def main():
    global DEVICE
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--size-mb", dest="size_mb", type=int, default=1024)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        # No torch.cuda.set_device: ckptio must put its collectives on the load's device itself.
        DEVICE = torch.device("cuda", local_rank)
    dist.init_process_group(args.backend)
    pg = dist.group.WORLD
    rank, world = dist.get_rank(), dist.get_world_size()
    checks = Checks(rank, DEVICE, ' of model bytes')
    path = os.path.abspath(args.dir)
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        write_model(path, args.size_mb)
    dist.barrier()
    from safetensors.torch import load_file

    ref = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            ref.update(load_file(os.path.join(path, name)))
    total = sum(t.numel() * t.element_size() for t in ref.values())
    if rank == 0:
        print(f"== {world} ranks, backend {args.backend}, device {args.device}, torch {torch.__version__}, "
              f"model {total / 1e6:.0f} MB in {len(ref)} tensors", flush=True)
    dev = str(DEVICE)

    def tp_ref(name, dim):
        t = ref[name]
        return t if dim is None else torch.tensor_split(t, world, dim % t.dim())[rank]

    def verify(got, want_dim, expect_read=total):
        bad = [n for n in ref if n not in got or not same(got[n], tp_ref(n, want_dim(n)))]
        st = ckptio.last_load_stats()
        on_device = all(t.device == DEVICE for t in got.values())
        read = summed(st.bytes_read, DEVICE)
        if bad:
            return f"not byte-exact: {bad[:5]} ({len(bad)})"
        if not on_device:
            return "a tensor is not on " + dev
        if expect_read is not None and read != expect_read:
            return f"bytes read over all ranks {read}, expected {expect_read} ({st})"
        if rank == 0:
            print(f"   rank 0: {st}", flush=True)
        return True

    whole = lambda n: None  # noqa: E731
    rows = lambda n: 0 if ref[n].dim() >= 2 else None  # noqa: E731
    cols = lambda n: -1 if ref[n].dim() >= 2 else None  # noqa: E731

    def vllm(n):
        return next((d for p, d in VLLM_RULE.items() if fnmatch.fnmatchcase(n, p)), None)

    checks.check("replicas: ckptio.load(process_group=)", lambda: verify(checks.timed(
        "replicas, read once", total, lambda: ckptio.load(path, device=dev, process_group=pg)), whole))
    checks.check("replicas, 64 MB batches", lambda: verify(ckptio.open(path).get_slices(
        {n: ... for n in ref}, device=dev, process_group=pg, batch_bytes=64 << 20), whole))
    checks.check("tp rows (tp_dim=0)", lambda: verify(checks.timed(
        "tp rows", total, lambda: ckptio.load(path, device=dev, process_group=pg, tp_dim=0)), rows))
    checks.check("tp columns (tp_dim=-1)", lambda: verify(checks.timed(
        "tp columns", total, lambda: ckptio.load(path, device=dev, process_group=pg, tp_dim=-1), again=True), cols))
    checks.check("tp vLLM rule", lambda: verify(checks.timed(
        "tp vLLM rule", total, lambda: ckptio.load(path, device=dev, process_group=pg, tp_dim=VLLM_RULE)), vllm))

    def per_rank_slices():
        names = sorted(ref)
        req = [(n, slice(rank, None, world) if ref[n].dim() == 1 else (slice(None), slice(7 * rank, 7 * rank + 300)))
               for n in names[rank::2]]
        req.append(("model.norm.weight", ...))
        with ckptio.open(path) as f:
            got = f.get_slices(req, device=dev, process_group=pg)
        bad = [n for (n, i), t in zip(req, got) if not same(t, ref[n][i] if i is not ... else ref[n])]
        return f"not byte-exact: {bad[:5]}" if bad else True

    checks.check("per-rank slices (get_slices)", per_rank_slices)

    def injected_failure():
        real, calls = _distributed._read_boxes, [0]

        def failing(reader, targets):
            calls[0] += 1
            raise _errors.make_error(ckptio._ckptio.E_IO, "E_IO", 5, 0, "pread", "/injected", 0, None,
                                     "/injected: pread: injected on rank 1")

        if rank == 1:
            _distributed._read_boxes = failing
        try:
            ckptio.load(path, device=dev, process_group=pg, tp_dim=0)
            return "no error"
        except ckptio.CkptioError as e:
            msg = str(e)
        finally:
            _distributed._read_boxes = real
        texts = [None] * world
        if DEVICE.type == "cuda":
            with torch.cuda.device(DEVICE):
                dist.all_gather_object(texts, msg)
        else:
            dist.all_gather_object(texts, msg)
        if len(set(texts)) != 1 or "injected on rank 1" not in msg:
            return f"the ranks' errors differ or miss the cause: {texts}"
        return True

    if world >= 2:
        checks.check("a read failure on rank 1 ends every rank with the same error", injected_failure)
    def each_rank_alone():
        got = checks.timed("every rank reads everything", total, lambda: ckptio.load(path, device=dev))
        return all(same(t, ref[n]) for n, t in got.items())

    checks.check("every rank loads the whole model itself (no group)", each_rank_alone)

    failed = [k for k, v in checks.results.items() if not v]
    if rank == 0:
        print(f"== {len(checks.results) - len(failed)} passed, {len(failed)} failed", flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "model_nccl_check.json"), "w") as f:
                json.dump({"world": world, "backend": args.backend, "device": args.device, "torch": torch.__version__,
                           "model_bytes": total, "checks": checks.results, "seconds": checks.times}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
