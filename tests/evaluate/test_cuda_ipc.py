"""Taking back what the judge shared by CUDA IPC once its receiver is dead, on counter files laid
out as torch lays them (``at::RefcountedMapAllocator``: a 64-byte header, then int64 counters).
The GPU side (memory really freed after a candidate killed holding its sets) is in
``tests/gpu/test_judge_memory_gpu.py``."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from krex_lab.evaluate import cuda_ipc


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(cuda_ipc, "SHM_DIR", str(tmp_path))
    monkeypatch.setattr(cuda_ipc, "_layout", cuda_ipc._Layout())
    cuda_ipc.take_back()
    yield tmp_path
    cuda_ipc.take_back()


def _file(shm: Path, name: str, counters: dict[int, int]) -> bytes:
    data = bytearray(64 + 8 * 16)
    for off, v in counters.items():
        struct.pack_into("<q", data, 64 + 8 * off, v)
    (shm / name).write_bytes(bytes(data))
    return f"/{name}".encode()


def _read(shm: Path, name: str, off: int) -> int:
    return int(struct.unpack_from("<q", (shm / name).read_bytes(), 64 + 8 * off)[0])


def _fields(handle: bytes, off: int) -> list[object]:
    return [0, b"ipc-handle", 1 << 20, 0, handle, off, b"event", True]


def test_counters_a_dead_receiver_held_are_zeroed_and_counted(shm: Path) -> None:
    handle = _file(shm, "torch_1_2_0", {0: 1})
    cuda_ipc.note(_fields(handle, 0))
    for off in (1, 2, 3):  # torch sets each new counter to 1 as it hands it out
        _file(shm, "torch_1_2_0", {o: 1 for o in range(off + 1)})
        cuda_ipc.note(_fields(handle, off))
    # the receiver let go of two of them (decremented), and died holding the other two
    data = bytearray((shm / "torch_1_2_0").read_bytes())
    struct.pack_into("<q", data, 64 + 8 * 1, 0)
    struct.pack_into("<q", data, 64 + 8 * 3, 0)
    (shm / "torch_1_2_0").write_bytes(bytes(data))
    assert cuda_ipc.status().noted == 4
    assert cuda_ipc.take_back() == 2
    assert [_read(shm, "torch_1_2_0", o) for o in range(4)] == [0, 0, 0, 0]
    assert cuda_ipc.status().noted == 0
    assert cuda_ipc.take_back() == 0  # forgotten once taken back


def test_a_counter_a_receiver_tampered_with_is_zeroed_too(shm: Path) -> None:
    handle = _file(shm, "torch_1_3_0", {0: 1, 1: 1})
    cuda_ipc.note(_fields(handle, 0))
    cuda_ipc.note(_fields(handle, 1))
    data = bytearray((shm / "torch_1_3_0").read_bytes())
    struct.pack_into("<q", data, 64, -7)  # below zero torch never frees it
    struct.pack_into("<q", data, 72, 1 << 40)
    (shm / "torch_1_3_0").write_bytes(bytes(data))
    assert cuda_ipc.take_back() == 2
    assert _read(shm, "torch_1_3_0", 0) == _read(shm, "torch_1_3_0", 1) == 0


def test_an_unknown_layout_notes_nothing_and_says_why(shm: Path) -> None:
    handle = _file(shm, "torch_1_4_0", {})  # the first counter is not where torch's layout puts it
    cuda_ipc.note(_fields(handle, 0))
    st = cuda_ipc.status()
    assert st.layout_ok is False and st.noted == 0
    assert "torch_1_4_0" in st.why
    assert cuda_ipc.take_back() == 0
    assert (shm / "torch_1_4_0").read_bytes() == bytes(64 + 8 * 16)  # nothing written


def test_a_file_gone_or_malformed_fields_change_nothing(shm: Path) -> None:
    handle = _file(shm, "torch_1_5_0", {0: 1})
    cuda_ipc.note(_fields(handle, 0))
    cuda_ipc.note([0, b"x"])  # not a share's fields
    cuda_ipc.note(_fields(handle, "7"))  # type: ignore[arg-type]
    assert cuda_ipc.status().noted == 1
    (shm / "torch_1_5_0").unlink()  # the sender's file went with its last counter
    assert cuda_ipc.take_back() == 0


def test_held_counts_the_shares_a_receiver_still_holds_and_changes_nothing(shm: Path) -> None:
    handle = _file(shm, "torch_1_3_0", {0: 1, 1: 1, 2: 1})
    for off in (0, 1, 2):
        cuda_ipc.note(_fields(handle, off))
    assert cuda_ipc.held() == 3
    data = bytearray((shm / "torch_1_3_0").read_bytes())
    struct.pack_into("<q", data, 64 + 8 * 1, 0)  # the receiver let go of one
    (shm / "torch_1_3_0").write_bytes(bytes(data))
    assert cuda_ipc.held() == 2
    assert [_read(shm, "torch_1_3_0", o) for o in range(3)] == [1, 0, 1]  # read, never changed
    assert cuda_ipc.status().noted == 3


def test_what_one_message_shared_is_held_until_its_receiver_lets_go(shm: Path) -> None:
    # one message's counters, a storage shared twice among them (one counter), and another's
    handle = _file(shm, "torch_1_5_0", {0: 1, 1: 1, 2: 1})
    mine = [c for c in (cuda_ipc.note(_fields(handle, off)) for off in (0, 1, 1)) if c is not None]
    cuda_ipc.note(_fields(handle, 2))
    assert mine == [(handle, 0), (handle, 1), (handle, 1)]
    assert cuda_ipc.held_of(mine) == 2
    data = bytearray((shm / "torch_1_5_0").read_bytes())
    struct.pack_into("<q", data, 64, 0)  # the receiver let go of the first: it decremented it
    (shm / "torch_1_5_0").write_bytes(bytes(data))
    assert cuda_ipc.held_of(mine) == 1
    assert cuda_ipc.held_of([]) == 0
    assert cuda_ipc.held() == 2  # the other message's share is held too, and was not counted above
