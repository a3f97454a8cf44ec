"""CPU torch tensors as message payloads: through DLPack, no copy on either side, a tensor again
on arrival (numpy where torch is missing)."""

from __future__ import annotations

import numpy as np
import pytest

from aionet.codecs.serialize import Serializer
from aionet.errors import SerializationError

torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
MiB = 2**20


def test_large_tensor_travels_without_copies_and_arrives_a_tensor() -> None:
    ser = Serializer()
    t = torch.arange(MiB, dtype=torch.float32).reshape(1024, 1024)
    frames = ser.dumps({"grad": t, "step": 3})
    assert len(frames) == 2
    assert np.shares_memory(np.frombuffer(frames[1], np.uint8), t.numpy())  # sender: a view of the tensor
    received = [frames[0], bytearray(frames[1])]
    out = ser.loads(received)["grad"]
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (1024, 1024)
    assert np.shares_memory(out.numpy(), np.frombuffer(received[1], np.uint8))  # receiver: no copy
    assert torch.equal(out, t)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.bool, torch.complex64, torch.float16])
def test_small_tensors_of_numpy_dtypes_round_trip(dtype) -> None:
    t = (torch.arange(12) % 2).to(dtype).reshape(3, 4).t()  # a transposed (strided) view too
    out = Serializer().loads(Serializer().dumps(t))
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and torch.equal(out, t)


def test_tensors_needing_grad_travel_detached() -> None:
    t = torch.ones(4, requires_grad=True)
    out = Serializer().loads(Serializer().dumps([t]))[0]
    assert torch.equal(out, torch.ones(4)) and not out.requires_grad


def test_bfloat16_is_refused_with_the_conversion_to_make() -> None:
    with pytest.raises(SerializationError, match=r"bfloat16.*convert"):
        Serializer().dumps(torch.ones(2, dtype=torch.bfloat16))


def test_a_tensor_off_the_cpu_without_a_node_names_the_fix() -> None:
    """Between nodes a CUDA tensor takes the device path (tested on a GPU); a bare serializer,
    or a device that is not CUDA, refuses it and says to send ``t.cpu()``."""
    with pytest.raises(SerializationError, match=r"meta torch tensors travel only between nodes.*t\.cpu\(\)"):
        Serializer().dumps(torch.ones(2, device="meta"))
