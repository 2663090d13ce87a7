"""The ingest socket's place on disk: a private folder, and no live agent's socket taken over.

The socket lives in a directory of mode 0700 (created if missing; an existing one with another
mode is refused, never chmod-ed, so ``--socket /tmp/x.sock`` cannot open up ``/tmp``); with
``agent.allowed_uids`` its group bits may let those users through. A socket file left by a dead
agent is removed, a live one's is refused. Used by the ingest server's ``bind`` and by the
daemon, which prepares the folder before it binds.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Iterable

from vramscope.agent.errors import VramscopeError


def prepare_socket_folder(socket_path: str, allowed_uids: Iterable[int] = ()) -> None:
    """The folder of ``socket_path``, made private (:func:`prepare_socket_dir`); shared with
    the ``allowed_uids`` other than ours."""
    prepare_socket_dir(os.path.dirname(os.path.abspath(socket_path)),
                       shared=shared_with_others(allowed_uids))


def shared_with_others(allowed_uids: Iterable[int]) -> bool:
    """``agent.allowed_uids`` names a user other than the agent's own."""
    return bool(set(allowed_uids) - {os.getuid()})


def prepare_socket_dir(path: str, shared: bool = False) -> None:
    """Create ``path`` with mode 0700, or accept it only if it already is private and ours.

    ``shared`` (``agent.allowed_uids`` is set): the operator lets those users through with a
    group or an ACL, which shows as group bits: 0710 or 0750 is accepted; write for anyone
    but the owner (who could swap the socket) and any access for others never are."""
    try:
        os.makedirs(path, mode=0o700)
        os.chmod(path, 0o700)  # makedirs applies the umask; be exact
        return
    except FileExistsError:
        pass
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise VramscopeError(f"{path} is not a directory; choose another --socket path")
    mode = stat.S_IMODE(st.st_mode)
    ok = mode & 0o700 == 0o700 and (mode & 0o027 == 0 if shared else mode & 0o077 == 0)
    if not ok or st.st_uid != os.getuid():
        need = ("mode 700, or 710/750 for agent.allowed_uids" if shared else "mode 700")
        raise VramscopeError(
            f"socket directory {path} has mode {mode:o} and owner uid {st.st_uid}; the agent "
            f"needs a private directory ({need}, owned by uid {os.getuid()}): choose another "
            f"path with --socket or agent.socket_path")


def remove_stale_socket(path: str) -> None:
    """Remove a socket left by a dead agent; refuse to steal a live one's."""
    if not os.path.lexists(path):
        return
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise VramscopeError(f"{path} exists and is not a socket; choose another --socket path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise VramscopeError(f"cannot check {path}: {exc.strerror}") from None
        os.unlink(path)
        return
    finally:
        probe.close()
    raise VramscopeError(f"another agent is listening on {path}; stop it or choose another "
                         f"path with --socket")

