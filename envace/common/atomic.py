"""Write a file whole or not at all: the package's one atomic-write helper and its bytes/text/JSON forms.

Every writer of a file another step reads (result files, manifests, reports, training data, done-files,
metrics, caches) goes through :func:`atomic_write`, so a killed process never leaves a partial file that
looks complete.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once at import: os.umask can only be read by setting it


def atomic_write(path: str | Path, write: Callable[[str], None], *, parents: bool = False) -> Path:
    """Write ``path`` whole or not at all; the one atomic-write helper of the package (the others below,
    :func:`envace.common.results.write_results` and :func:`envace.report.context.write_output` go through it).

    ``write`` is called with the path of a new, empty temporary file in the same folder
    (``.{name}.XXXXXXXX.tmp``) and must write the whole content there. The file is then given the
    permissions ``open()`` would give a new file (``0o666`` less the umask read at import, ``_UMASK``) and
    renamed over ``path`` with ``os.replace``. Every kind of file gets the umask's permissions: report
    outputs too are readable by others only when the umask allows it (no hard ``0644``; the same under
    the usual umask 022). On any error or interrupt the temporary file is removed and ``path`` is left as it
    was. No fsync: a crash of the machine (not of the process) can still lose the new content.
    ``parents``: create missing parent folders first. Returns ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # as open() would create it (mkstemp makes 0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes, *, parents: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data), parents=parents)


def atomic_write_text(path: str | Path, text: str, *, parents: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write`)."""
    return atomic_write_bytes(path, text.encode("utf-8"), parents=parents)


def atomic_write_json(
    path: str | Path,
    obj: Any,
    *,
    indent: int | None = None,
    sort_keys: bool = False,
    ensure_ascii: bool = True,
    end: str = "\n",
    parents: bool = False,
) -> Path:
    """Write ``json.dumps(obj, indent=..., sort_keys=..., ensure_ascii=...) + end`` to ``path`` atomically
    (:func:`atomic_write`); ``end=""`` for files written without a final newline."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=ensure_ascii) + end
    return atomic_write_text(path, text, parents=parents)
