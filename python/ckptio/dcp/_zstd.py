"""ckptio.dcp.ZStandard: the "stream.zstd/1" transform for FileSystemWriter's
``_extensions``, with compression in libckptio (no zstandard/pyzstd module
needed). Its descriptor is torch's, so torch's reader (with zstandard or
pyzstd installed) decompresses the items, and ckptio's reader always can."""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint._extension import StreamTransformExtension

# The descriptor of the one transform ckptio applies itself, in .metadata.
ZSTD_DESCRIPTOR = "stream.zstd/1"


class ZStandard(StreamTransformExtension):
    @staticmethod
    def registry_name() -> str:
        return "stream.zstd"

    @staticmethod
    def from_descriptor(version: str) -> "ZStandard":
        if version.partition(".")[0] != "1":
            raise ValueError(f"Unknown extension version {version!r} of stream.zstd")
        return ZStandard()

    def get_descriptor(self) -> str:
        return f"{self.registry_name()}/1"

    def transform_to(self, output):
        raise NotImplementedError("ckptio.dcp.ZStandard compresses inside ckptio.dcp.FileSystemWriter only; "
                                  "use torch's ZStandard with torch's writer")

    def transform_from(self, input):
        raise NotImplementedError("ckptio.dcp.ZStandard decompresses inside ckptio.dcp.FileSystemReader only; "
                                  "use torch's ZStandard with torch's reader")


def descriptor_of(ext: Any) -> str:
    """The descriptor of an extension given to FileSystemWriter (ckptio's or
    torch's ZStandard); any other is refused."""
    name = getattr(ext, "registry_name", None)
    desc = ext.get_descriptor() if hasattr(ext, "get_descriptor") else None
    if name is None or name() != "stream.zstd" or desc is None or desc.partition("/")[2].partition(".")[0] != "1":
        raise ValueError(f"ckptio.dcp supports only the zstd stream transform (stream.zstd/1), not {ext!r}")
    return ZSTD_DESCRIPTOR


__all__ = ["ZStandard"]
