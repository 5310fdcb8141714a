"""A process's first tensor-parallel load over NCCL, then its second (model loading across a node's GPUs).

A process's first load pays one-time costs the second does not: ckptio pins its staging, torch's allocator
grows, and NCCL connects its channels and, in the first all_to_all (tensor-parallel columns are scattered),
its point-to-point peers lazily. This times the first and the second load of one process per rank:

    torchrun --standalone --nproc_per_node=N bench/probe_tp_first_load.py DIR RULE   # rank 0 prints one JSON line
RULE: vllm (rows for q/k/v/gate/up and the embedding, columns for o_proj and down_proj), cols (every matrix by
columns), rows. DIR is written by rank 0 when it holds no model (GIB GiB, default 4, Llama-shaped bf16 in 4
shards by safetensors.torch.save_file) and read from the page cache.

Measured on 2 x H200 (2026-11-27, BENCHMARKS.md, raw bench/results/h200x2_2026-11-27_s11_tp_first_load.jsonl):
4.19 GB, first loads 0.32-0.34 s, second 0.085-0.097 s. A trial build that started the first all_to_all on a
helper thread right after planning, beside the direct reads, changed nothing measurable (first loads 0.326
against 0.340 s with the vLLM rule, 0.326 against 0.323 by columns; medians of 4) and was not kept.
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
    for k in ("first", "second"):
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
        del sd
    if rank == 0:
        print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
