"""The one way to create files and directories where someone else may have planted something.

A run dir read by root but owned by a user, the base dir under ``/tmp`` or ``$XDG_RUNTIME_DIR``: the
other user may have left a symlink where the launcher is about to write. ``open(path, "w")`` follows
it and overwrites whatever it points at with root's rights (issue #27: ``launcher report`` run as root
replaced a root-owned 0600 file through a planted ``timeline.html``). So:

* :func:`write_file` never opens the target by name: it creates a fresh temporary file with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to the directory's descriptor (``openat``), then renames
  it over the target. A symlink at the target is replaced, never followed; one planted at the
  temporary name makes the create fail, and another name is tried.
* :func:`private_dir` creates a directory 0700 (or finds it) and opens it with ``O_NOFOLLOW``, then
  checks what it opened, as ssh and tmux check theirs: owned by this user, not writable by others. A
  symlink, another owner or a mode open to writes is refused with one line.
"""

import errno
import os
import stat

from launcher.common.errors import UsageError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TRIES = 5  # temporary names taken by someone else before giving up


def write_file(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with a new file holding ``data``, never following a symlink at ``path``.

    The directory part of ``path`` is resolved as given (the user chose it); its last component is
    only ever created afresh and renamed into place, relative to one directory descriptor.

    Raises:
        OSError: the directory cannot be opened or written, or ``path`` is a directory.
    """
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = os.open(directory, _DIR_FLAGS)
    try:
        tmp, fd = _create_temporary(dir_fd, name, mode)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            _unlink(tmp, dir_fd)
            raise
    finally:
        os.close(dir_fd)


def _create_temporary(dir_fd: int, name: str, mode: int):
    """``(name, fd)`` of a new file beside ``name``, created exclusively (no symlink followed)."""
    for attempt in range(_TRIES):
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"  # unguessable: not planted in advance
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                                dir_fd=dir_fd)
        except FileExistsError:
            if attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def private_dir(path: str, what: str, create: bool = True) -> bool:
    """Make sure ``path`` is a directory of this user that nobody else can write (created 0700).

    Args:
        path: The directory (its own name is never followed if it is a symlink).
        what: What it is, for messages (``base dir``).
        create: Create it with mode 0700 when missing.

    Returns:
        False when it is missing and not ``create``; True once it is checked.

    Raises:
        UsageError: a symlink, not a directory, another owner, or open to others (one line).
    """
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise UsageError(f"cannot create {what} {path}: {exc.strerror}") from None
    try:
        fd = os.open(path, _DIR_FLAGS | os.O_NOFOLLOW)
    except FileNotFoundError:
        if create:
            raise UsageError(f"{what} {path} vanished while it was created") from None
        return False
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symlink" if os.path.islink(path) else "not a directory"
            raise UsageError(f"{what} {path} is {kind}: refused (someone else may have planted it; remove it)"
                             ) from None
        raise UsageError(f"{what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid():
        raise UsageError(f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): "
                         f"refused (remove it)")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise UsageError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: refused, others could swap "
                         f"what is in it (chmod 700 {path})")
    return True
