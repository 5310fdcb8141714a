"""ckptio.dcp with GPU state dicts (skipped without CUDA): async save with
non-blocking staging keeps the values at save time, byte-exact round trips."""
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

import ckptio.dcp as cdcp  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("non_blocking", [True, False])
def test_async_save_from_gpu_holds_values_at_save_time(tmp_path, non_blocking):
    g = torch.Generator(device="cuda").manual_seed(3)
    sd = {"w": torch.randn(4096, 1024, device="cuda", generator=g), "b": torch.arange(1000, device="cuda"),
          "step": 1}
    expect = {k: v.clone() for k, v in sd.items() if isinstance(v, torch.Tensor)}
    writer = cdcp.FileSystemWriter(tmp_path / "a", cache_staged_state_dict=True, non_blocking_stage=non_blocking)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fut = dcp.async_save(sd, storage_writer=writer, no_dist=True)
        # Training goes on at once, on the same stream: a long kernel chain, then in-place updates.
        for _ in range(20):
            sd["w"].mul_(1.0001).add_(1.0)
        sd["b"].add_(7)
        fut.result()
    out = {"w": torch.zeros_like(sd["w"]), "b": torch.zeros_like(sd["b"]), "step": 0}
    dcp.load(out, storage_reader=cdcp.FileSystemReader(tmp_path / "a"))
    assert torch.equal(out["w"], expect["w"]) and torch.equal(out["b"], expect["b"])
    assert cdcp.verify(tmp_path / "a")["unhashed"] == 0
