"""The interface the restart-generation protocol (:mod:`launcher.cluster.sync`) runs over.

Two stores implement it: :class:`~launcher.cluster.syncdir.SyncDir` (files on a shared file system,
``--sync-dir``) and :class:`~launcher.cluster.etcdstore.EtcdStore` (etcd keys with leased membership,
``--coordinator``).
"""

from typing import Protocol

from launcher.cluster.syncdir import Generation


class Store(Protocol):
    """Where the nodes' records live (``SyncDir``, ``EtcdStore``); ``read`` and ``write`` never block long.

    Attributes:
        index: This server's index; count: how many servers; path: where, for messages.
    """

    index: int
    count: int
    path: str

    def name(self, index: int) -> str:
        """``server 1 (10.0.0.2)``."""

    def gen_path(self, generation: int) -> str:
        """Where generation ``generation``'s records are, for messages."""

    def read(self, generation: int) -> Generation:
        """Every node's records of ``generation``."""

    def write(self, generation: int, name: str, data: dict, exclusive: bool = False) -> bool:
        """Publish ``gen_<g>/<name>``; with ``exclusive``, False when it already exists."""

    def close(self, reason: str) -> None:
        """Mark the incarnation as ended."""

    def shutdown(self) -> None:
        """Release what the store holds (threads, lease)."""
