"""What ``metrics``, ``compare`` and ``report`` read from a run directory (never written here)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from sysbench_gpu.data import Session
from sysbench_gpu.errors import SysbenchError
from sysbench_gpu.runstore import JudgmentRecord, RunDir

Key = tuple[int, int]


@dataclass(frozen=True)
class LoadedRun:
    path: Path
    label: str
    model: str | None
    sessions: list[Session]
    judgments: dict[Key, JudgmentRecord]
    expected: set[Key]
    unfinished_stages: tuple[str, ...] = ()
    manifest: Mapping[str, Any] = field(default_factory=dict)

    @property
    def benchmark(self) -> str:
        """``mteval`` for MT-Eval dialogues, else ``sysbench`` (older runs record nothing)."""
        return self.sessions[0].benchmark if self.sessions else "sysbench"


def load_run(run_dir: str | Path) -> LoadedRun:
    """Read what metrics need from a run directory; never writes."""
    run = RunDir(run_dir).require()
    manifest = run.read_manifest()
    sessions = run.load_sessions()
    if not run.generations.path.exists():
        raise SysbenchError(f"{run.path}: no {run.generations.path.name} (run generate or import-upstream first)")
    generations = run.generations.read()
    known = {(s.system_id, t.index) for s in sessions for t in s.turns}
    expected = set(generations) & known
    if not expected:
        raise SysbenchError(f"{run.path}: no generation record matches a turn of sessions.json")
    judgments = run.judgments.read()
    label, model = _label_and_model(manifest, generations.values(), run.path)
    unfinished = tuple(
        stage for stage, section in manifest.get("stages", {}).items() if section.get("status") == "running"
    )
    return LoadedRun(run.path, label, model, sessions, judgments, expected, unfinished, manifest)


def _label_and_model(manifest: Mapping[str, Any], generations: Any, path: Path) -> tuple[str, str | None]:
    stages = manifest.get("stages", {}) if isinstance(manifest.get("stages"), dict) else {}

    def find(key: str) -> Any:
        if manifest.get(key):
            return manifest[key]
        for section in stages.values():
            if isinstance(section, dict) and section.get(key):
                return section[key]
        return None

    model = find("model")
    if model is None:
        seen = Counter(g.model for g in generations if g.model)
        model = seen.most_common(1)[0][0] if seen else None
    label = find("label") or path.resolve().name
    return str(label), (str(model) if model is not None else None)


