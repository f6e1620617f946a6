"""SysBench sessions in upstream's schema: the run directory's sessions.json for SysBench runs."""

from __future__ import annotations

from typing import Any

from sysbench_gpu.benchmarks.sysbench.data import CONSTRAINT_TYPES
from sysbench_gpu.core.sessions import Session

_TYPE_TO_RAW = {english: chinese for chinese, english in CONSTRAINT_TYPES.items()}


def session_to_upstream(session: Session) -> dict[str, Any]:
    """Inverse of the loader: a Session back in upstream's JSON schema."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": session.system_prompt}]
    prompt_infos: dict[str, Any] = {}
    for turn in session.turns:
        messages.append({"role": "user", "content": turn.user})
        messages.append({"role": "assistant", "content": turn.reference})
        prompt_infos[turn.user] = {
            "alignment": "align" if turn.alignment == "aligned" else "misalign",
            "criteria": {
                str(c.id): {
                    "criteria_id": c.id,
                    "criteria_content": c.content,
                    "criteria_type": c.type_raw or _TYPE_TO_RAW[c.type],
                }
                for c in turn.constraints
            },
        }
    return {
        "system_id": session.system_id,
        "system_prompt": session.system_prompt,
        "messages": messages,
        "prompt_infos": prompt_infos,
        "rounds_related": session.dependent,
        "领域": session.domain,
        "场景": session.scene,
    }
