"""ckptio.dcp: torch.distributed.checkpoint storage on libckptio.

    import torch.distributed.checkpoint as dcp
    import ckptio.dcp
    dcp.save(state_dict, storage_writer=ckptio.dcp.FileSystemWriter("ckpt/step100"))
    dcp.load(state_dict, storage_reader=ckptio.dcp.FileSystemReader("ckpt/step100"))
    fut = dcp.async_save(state_dict, storage_writer=ckptio.dcp.FileSystemWriter("ckpt/step200",
                                                                             cache_staged_state_dict=True))

Checkpoints are torch's own layout (``.metadata`` + ``.distcp`` files):
stock ``torch.distributed.checkpoint.FileSystemReader`` loads what
FileSystemWriter writes, and FileSystemReader loads what torch's writer
writes (TORCH_SAVE and SAFETENSORS formats, zstd-compressed items). See
docs/DCP.md.
"""

from ._reader import FileSystemReader
from ._verify import verify
from ._writer import FileSystemWriter
from ._zstd import ZStandard

__all__ = ["FileSystemWriter", "FileSystemReader", "ZStandard", "verify"]
