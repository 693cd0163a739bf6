"""The store of translated files (serve/downloads.py): bounded in bytes, expired on a timer, removed on close."""

from __future__ import annotations

import asyncio
import base64

import pytest

from onnxmt.serve.downloads import STORED_NAME, Downloads, TooLargeToStore


def test_the_store_is_bounded_in_bytes_the_oldest_going_first() -> None:
    store = Downloads(max_bytes=1000, keep_seconds=3600)
    names = [store.store(f"file {i}.txt", bytes(300)) for i in range(5)]
    assert store.stored_bytes <= 1000
    assert [store.path(n) is not None for n in names] == [False, False, True, True, True]
    assert store.directory is not None
    assert sorted(p.name for p in store.directory.iterdir()) == sorted(names[2:])  # removed from the disk too
    with pytest.raises(TooLargeToStore, match="max_stored_mb"):
        store.store("big.txt", bytes(1001))
    assert store.path(names[-1]) is not None  # a refused file pushes nothing out
    store.close()


def test_names_carry_128_random_bits_and_nothing_else_is_served() -> None:
    store = Downloads(max_bytes=1 << 20, keep_seconds=3600)
    name = store.store("../../etc/pass wd.TXT", b"x")
    token, rest = name.split(".", 1)
    assert STORED_NAME.fullmatch(name) and rest == "pass_wd.txt"
    assert len(base64.urlsafe_b64decode(token + "==")) == 16
    assert store.path(name) is not None
    for other in ("../" + name, name + "x", "onnxmt.json", token):
        assert store.path(other) is None
    store.close()


def test_files_expire_on_a_timer_without_another_upload_and_close_removes_the_folder() -> None:
    async def test() -> None:
        store = Downloads(max_bytes=1 << 20, keep_seconds=0.4)
        store.start()
        name = store.store("a.txt", b"hello")
        assert store.directory is not None
        directory = store.directory
        assert (directory / name).is_file() and store.path(name) is not None
        await asyncio.sleep(1.0)  # the sweeper runs every keep_seconds / 4
        assert not (directory / name).exists() and store.path(name) is None
        store.store("b.txt", b"again")
        store.close()
        assert not directory.exists()

    asyncio.run(test())
