"""A directory updated exactly the way the kubelet updates a ConfigMap volume.

The kubelet's atomic writer (``pkg/volume/util/atomic_writer.go``), for every update of the whole
payload:

1. creates a new timestamped directory ``..2026_11_21_06_00_00.123456789`` and writes every key in it;
2. creates the symlink ``..data_tmp -> ..2026_11_21_06_00_00.123456789`` and renames it over ``..data``
   (the one atomic step: readers see either the old or the new generation, never a mix);
3. creates the user-visible symlinks ``<key> -> ..data/<key>`` that do not exist yet, and removes those
   of keys no longer in the payload;
4. removes the previous timestamped directory.

So the path ``<root>/<key>`` never changes, while the inode it resolves to changes on every update.
:meth:`ConfigMapDir.write_in_place` is the other writer the launcher meets (truncate and write, as the
Ascend Operator does for the rank table), for a plain directory.
"""

import os
import random
import shutil
import time
from typing import Dict, Mapping, Optional, Union

DATA = "..data"
DATA_TMP = "..data_tmp"

Content = Union[str, bytes]


def _as_bytes(content: Content) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content


class ConfigMapDir:
    """The mount point ``root`` of a ConfigMap volume (created if missing).

    Args:
        root: The directory.
        initial: Keys to write as the first generation (like the volume at pod start).
    """

    def __init__(self, root: Union[str, os.PathLike], initial: Optional[Mapping[str, Content]] = None):
        self.root = os.fspath(root)
        os.makedirs(self.root, exist_ok=True)
        self.payload: Dict[str, bytes] = {}
        self.generations = 0
        if initial:
            self.update(initial)

    def path(self, name: str) -> str:
        """The user-visible path of key ``name``."""
        return os.path.join(self.root, name)

    def write(self, name: str, content: Content) -> None:
        """Set one key and publish a new generation of the whole payload."""
        self.update({name: content})

    def remove(self, name: str) -> None:
        """Delete one key (its user-visible symlink disappears) in a new generation."""
        payload = dict(self.payload)
        payload.pop(name, None)
        self._publish(payload)

    def update(self, changes: Mapping[str, Content]) -> None:
        """Set several keys in one generation (one ``..data`` swap)."""
        payload = dict(self.payload)
        payload.update({name: _as_bytes(content) for name, content in changes.items()})
        self._publish(payload)

    def write_in_place(self, name: str, content: Content) -> None:
        """Truncate and write ``<root>/<name>`` (a plain file, not a ConfigMap key)."""
        fd = os.open(self.path(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, _as_bytes(content))
        finally:
            os.close(fd)

    def current_dir(self) -> Optional[str]:
        """The timestamped directory ``..data`` points at, or None before the first write."""
        try:
            return os.readlink(os.path.join(self.root, DATA))
        except FileNotFoundError:
            return None

    def _new_timestamped_dir(self) -> str:
        stamp = time.strftime("%Y_%m_%d_%H_%M_%S", time.gmtime())
        while True:
            name = f"..{stamp}.{random.randrange(10 ** 9):09d}"
            try:
                os.mkdir(os.path.join(self.root, name), 0o755)
                return name
            except FileExistsError:
                continue

    def _publish(self, payload: Dict[str, bytes]) -> None:
        old_dir = self.current_dir()
        new_dir = self._new_timestamped_dir()
        for name, content in payload.items():
            with open(os.path.join(self.root, new_dir, name), "wb") as fh:
                fh.write(content)
        tmp_link = os.path.join(self.root, DATA_TMP)
        os.symlink(new_dir, tmp_link)
        os.rename(tmp_link, os.path.join(self.root, DATA))
        for name in payload:
            if not os.path.lexists(self.path(name)):
                os.symlink(os.path.join(DATA, name), self.path(name))
        for name in set(self.payload) - set(payload):
            if os.path.islink(self.path(name)):
                os.unlink(self.path(name))
        if old_dir is not None:
            shutil.rmtree(os.path.join(self.root, old_dir), ignore_errors=True)
        self.payload = payload
        self.generations += 1
