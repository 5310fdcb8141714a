"""A process's first tensor-parallel load over NCCL, then its second (model loading across a node's GPUs).

A process's first load pays one-time costs the second does not: ckptio pins its staging, torch's allocator
grows, and NCCL connects its channels and, in the first all_to_all (tensor-parallel columns are scattered),
its point-to-point peers lazily. This times the first and the second load of one process per rank:

    torchrun --standalone --nproc_per_node=N bench/probe_tp_first_load.py DIR RULE   # rank 0 prints one JSON line
RULE: vllm (rows for q/k/v/gate/up and the embedding, columns for o_proj and down_proj), cols (every matrix by
columns), rows. DIR is written by rank 0 when it holds no model (GIB GiB, default 4, Llama-shaped bf16 in 4
shards by safetensors.torch.save_file) and read from the page cache. PHASES=1 adds rank 0's milliseconds per phase
of each load (time_phases).

Measured on 2 x H200 (2026-11-27, BENCHMARKS.md "Two GPUs", raw bench/results/h200x2_2026-11-27_s11_*):
4.19 GB, first loads 0.29-0.35 s, second 0.080-0.097 s, the difference the first all_to_all (NCCL connecting its
point-to-point peers: 207-249 ms of the scatter phase). Starting that all_to_all early on a helper thread did
not pay; sending scattered tensors whole by broadcast made first loads 0.11-0.15 s. On 4 x H200 (8.55 GB,
GIB=8; BENCHMARKS.md "Four GPUs") first loads took 1.30-1.49 s by all_to_all and 0.21-0.27 s whole: whole is now
the default in groups of up to 4 ranks (CKPTIO_SCATTER=all_to_all|broadcast forces either).
"""
import glob
import json
import os
import sys
import time

import torch
import torch.distributed as dist

RULES = {
    "vllm": {"*.q_proj.weight": 0, "*.k_proj.weight": 0, "*.v_proj.weight": 0, "*.gate_proj.weight": 0,
             "*.up_proj.weight": 0, "*.o_proj.weight": 1, "*.down_proj.weight": 1, "model.embed_tokens.weight": 0},
    "cols": -1,
    "rows": 0,
}


def write_model(d, gib):
    """A Llama-8B-like stack (hidden 4096, MLP 14336, k/v 1024 rows) of `gib` GiB: the model the recorded runs
    loaded (4.19 GB at GIB=4). bench_model_gpu.make_model sizes its layers for the 14.21 GB model of the one-GPU
    runs (k/v counted as hidden x hidden), so its layer count differs here."""
    from safetensors.torch import save_file
    hidden, inter = 4096, 14336
    shapes = {"model.embed_tokens.weight": (32000, hidden)}
    layer_bytes = (2 * hidden * hidden + 2 * 1024 * hidden + 3 * inter * hidden) * 2
    for i in range(max(1, int(gib * (1 << 30) // layer_bytes))):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (1024, hidden),
                       p + "self_attn.v_proj.weight": (1024, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                       p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                       p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,)})
    names = list(shapes)
    os.makedirs(d, exist_ok=True)
    per = (len(names) + 3) // 4
    weight_map = {}
    for s in range(4):
        fname = f"model-{s + 1:05d}-of-00004.safetensors"
        sd = {n: torch.randn(shapes[n], device="cuda").to(torch.bfloat16).cpu() for n in names[s * per:(s + 1) * per]}
        save_file(sd, os.path.join(d, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in sd})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def time_phases():
    """PHASES=1: rank 0's seconds in each phase of a group load (the plan's exchange, the direct reads, the
    batches' engine), summed per load, by wrapping ckptio's own functions; returns the dict they add to."""
    from ckptio import _distributed, _group_read
    spent = {}

    def wrap(mod, name, label):
        real = getattr(mod, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                if dist.get_rank() == 0:
                    torch.cuda.synchronize()
                    spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0
        setattr(mod, name, timed)

    wrap(_distributed, "_exchange", "exchange (all_gather_object of the requests)")
    wrap(_distributed, "make_plan", "plan")
    wrap(_distributed, "_read_direct", "direct reads (allocating the tensors included)")
    wrap(_group_read, "run", "shared tensors (batches)")
    wrap(_group_read, "_status_exchange", "status all_reduce (inside batches)")
    wrap(_group_read, "_scatter", "scatter (inside batches)")
    return spent


def main():
    d, rule = sys.argv[1], sys.argv[2]
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    if rank == 0 and not glob.glob(os.path.join(d, "*.safetensors")):
        write_model(d, float(os.environ.get("GIB", "4")))
    dist.barrier()
    import ckptio
    row = {"rule": rule, "world": dist.get_world_size(), "ckptio": ckptio.__file__}
    phases = time_phases() if os.environ.get("PHASES") == "1" else None
    for k in ("first", "second"):
        if phases is not None:
            phases.clear()
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        sd = ckptio.load(d, device=f"cuda:{rank}", process_group=dist.group.WORLD, tp_dim=RULES[rule])
        torch.cuda.synchronize()
        dist.barrier()
        row[k + "_s"] = round(time.perf_counter() - t0, 4)
        total = torch.tensor([sum(t.numel() * t.element_size() for t in sd.values())], device="cuda")
        dist.all_reduce(total)
        row["GB"] = round(total.item() / 1e9, 3)
        if phases is not None:  # rank 0's
            row[k + "_phases_ms"] = {n: round(v * 1e3, 2) for n, v in phases.items()}
        del sd
    if rank == 0:
        print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
