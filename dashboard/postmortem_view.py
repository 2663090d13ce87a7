"""What of a stored post-mortem the browser sees: its JSON, and the snapshot file it may fetch.

The post-mortem's missing cause and remedies are filled in by the analysis' diagnosis (as
``vramscope analyze`` does); its snapshot path, which came from a client's record, is served
only when it names a file inside ``hooks.snapshot_dir``. Kept apart from ``queries.py``: this
decides what of a server's files the browser may read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vramscope.agent.records import PostMortem


def postmortem_json(pm_id: int, pm: PostMortem, default_host: str,
                    snapshot_dir: str) -> dict[str, Any]:
    """The post-mortem for the API; a missing cause or remedies are filled in by the analysis'
    diagnosis, as ``vramscope analyze`` would."""
    from vramscope.agent.analysis.diagnosis import complete_postmortem

    out = complete_postmortem(pm).to_json()
    out["id"] = pm_id
    out["host"] = pm.host or default_host
    out["snapshot_available"] = snapshot_file(pm, snapshot_dir) is not None
    out.pop("snapshot_path", None)  # a server path: not the browser's business
    return out


def snapshot_file(pm: PostMortem, snapshot_dir: str) -> Path | None:
    """The kept PyTorch snapshot, only when it is a file inside ``hooks.snapshot_dir``.

    The path comes from a stored record; without this check anyone able to send the agent a
    post-mortem could make the dashboard serve any file it can read.
    """
    if not pm.snapshot_path or not snapshot_dir:
        return None
    root = Path(snapshot_dir).expanduser().resolve()
    path = Path(pm.snapshot_path).expanduser().resolve()
    if root not in path.parents or not path.is_file():
        return None
    return path
