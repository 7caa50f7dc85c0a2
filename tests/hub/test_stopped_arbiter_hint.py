"""What a client says when the arbiter does not answer: a hub user cannot start the node's
arbiter (root's, the hub's krex-arbiter service), so the hint names who can; on one's own
machine it still says how to start one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from krex_lab.client import status
from krex_lab.errors import ArbiterUnavailable


def test_a_hub_users_node_arbiter_is_the_administrators(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"ipc://{tmp_path}/node/arbiter.sock"
    (tmp_path / "node").mkdir()
    monkeypatch.setenv("KREX_NODE_ENDPOINT", endpoint)  # what the generated hub config gives each server
    with pytest.raises(ArbiterUnavailable) as exc:
        status(endpoint, timeout=1.0)
    text = str(exc.value)
    assert "the node's arbiter, run by the administrator" in text and "krex-arbiter" in text, text
    assert "make lab" not in text


def test_a_lab_kernels_node_arbiter_is_the_administrators(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel (and its dashboard) of a lab that joined the node's arbiter, which then went away."""
    endpoint = f"ipc://{tmp_path}/arbiter.sock"  # a directory of this user's: only the lab's word says "node"
    monkeypatch.delenv("KREX_NODE_ENDPOINT", raising=False)
    monkeypatch.setenv("KREX_ENDPOINT", endpoint)  # what the lab exports to its kernels
    monkeypatch.setenv("KREX_ARBITER_KIND", "node")
    with pytest.raises(ArbiterUnavailable) as exc:
        status(endpoint, timeout=1.0)
    text = str(exc.value)
    assert "run by the administrator" in text and "restarts it within seconds" in text, text
    assert "make lab" not in text


def test_another_users_directory_is_a_node_arbiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KREX_NODE_ENDPOINT", raising=False)
    node = tmp_path / "node"
    node.mkdir()
    if os.geteuid() == 0:
        os.chown(node, 65534, 65534)  # as /run/krex is root's for a hub user: someone else's
        endpoint = f"ipc://{node}/arbiter.sock"
    else:
        endpoint = "ipc:///arbiter-of-root.sock"  # "/" is root's
    with pytest.raises(ArbiterUnavailable) as exc:
        status(endpoint, timeout=1.0)
    assert "run by the administrator" in str(exc.value), exc.value


def test_ones_own_arbiter_says_how_to_start_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KREX_NODE_ENDPOINT", raising=False)
    with pytest.raises(ArbiterUnavailable) as exc:
        status(f"ipc://{tmp_path}/arbiter.sock", timeout=1.0)
    assert "Start one with `krex arbiter`" in str(exc.value), exc.value
