"""PyTorch's GPUDirect Storage tutorial, with ckptio.

The tutorial ("Accelerating torch.save and torch.load with GPUDirect
Storage") reserves space with ``torch.save`` under ``skip_data`` at 4 KiB
storage alignment, finds each storage's offset by loading under
``FakeTensorMode``, then moves the bytes with ``torch.cuda.gds.GdsFile``.
torch's GdsFile needs cuFile and a file system nvidia-fs accepts; elsewhere
it fails. ckptio.GdsFile is a drop-in that runs everywhere (cuFile where it
works, a pinned-staging pipeline otherwise, plain file I/O for CPU
storages) and says which path ran.

Part 1 is the tutorial with only the GdsFile swapped. Part 2 does the same
with ckptio alone: offsets from ckptio.open, and ckptio.save/ckptio.load
writing and reading the whole torch.save checkpoint in one call each.

    python examples/gds_tutorial.py [directory]   # uses CUDA when available
"""

import os
import sys
import tempfile

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.serialization import config as serialization_config

import ckptio

device = "cuda" if torch.cuda.is_available() else "cpu"
workdir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="ckptio-gds-")
path = os.path.join(workdir, "checkpoint.pt")

# ---- Part 1: the tutorial, with ckptio.GdsFile for torch.cuda.gds.GdsFile ------------------

serialization_config.save.storage_alignment = 4096  # GDS wants 4 KiB-aligned storages

m = torch.nn.Linear(5, 10, device=device)
sd = m.state_dict()

# Write the checkpoint without the storage bytes: this reserves their space.
with torch.serialization.skip_data():
    torch.save(sd, path)

# Offsets of each storage, from loading under FakeTensorMode (no data read).
with FakeTensorMode():
    fake_sd = torch.load(path)
for k, v in fake_sd.items():
    print(f"key={k}, offset={v.untyped_storage()._checkpoint_offset}")

f = ckptio.GdsFile(path, os.O_RDWR)
for k, v in sd.items():
    offset = fake_sd[k].untyped_storage()._checkpoint_offset
    f.save_storage(v.untyped_storage(), offset)
print(f"saved storages through the {f.last_path!r} path")

sd_loaded = torch.load(path)
for k, v in sd_loaded.items():
    assert torch.equal(v, sd[k])

# Loading is the inverse: tensors created (empty) by torch.load under
# skip_data, then filled by GdsFile at the same offsets.
with torch.serialization.skip_data():
    sd_loaded = torch.load(path)
for k, v in sd_loaded.items():
    offset = fake_sd[k].untyped_storage()._checkpoint_offset
    f.load_storage(v.untyped_storage(), offset)
    assert torch.equal(v, sd[k])
print(f"loaded storages through the {f.last_path!r} path")

# Buffer registration, as in the tutorial (device memory only).
if device == "cuda":
    for v in sd.values():
        ckptio.gds_register_buffer(v.untyped_storage())
    for v in sd.values():
        ckptio.gds_deregister_buffer(v.untyped_storage())
del f

# ---- Part 2: ckptio alone ---------------------------------------------------------------

# The offsets come straight from the file's zip directory: no FakeTensorMode.
with ckptio.open(path) as ck:
    offsets = {name: ck.info(name).offset for name in ck.keys()}
    for s in ck.storages():
        print(f"storage {s.key}: {s.nbytes} bytes at offset {s.offset} (saved from {s.location})")
assert offsets == {k: v.untyped_storage()._checkpoint_offset for k, v in fake_sd.items()}

# One call writes the whole checkpoint (4 KiB-aligned storages by default,
# bytes straight from GPU memory), and torch.load reads it.
path2 = os.path.join(workdir, "checkpoint_ckptio.pt")
ckptio.save(sd, path2, format="torch")
for k, v in torch.load(path2, weights_only=True).items():
    assert torch.equal(v.to(device), sd[k])

# One call loads it back onto the GPU (or CPU), storages going straight in.
sd_ckptio = ckptio.load(path2, device=device)
for k, v in sd_ckptio.items():
    assert torch.equal(v, sd[k]) and v.device.type == device
print(f"ckptio.save / ckptio.load round trip OK on {device}; files in {workdir}")
