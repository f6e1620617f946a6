"""Every reader of a run directory, fed any bytes or JSON: it loads, or raises one clear line.

Readers: ``generations.jsonl`` and ``judgments.jsonl`` (records), ``manifest.json``,
``stats.json``, ``sessions.json``, an attention output (its manifest, a session's
``.npz`` and the turn-share table) and the explorer's loading of a whole run. Inputs are
random bytes, random JSON, and valid records with one field replaced or removed, which
reach the deepest checks. Any exception other than the project's ``SysbenchError`` with
a one-line message fails the test. Hypothesis keeps its example database in
``.hypothesis/`` (ignored by git); each test runs a few dozen examples, about a second.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_engine import FakeEngine

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sysbench_gpu.attention.files import store  # noqa: E402
from sysbench_gpu.attention.files.turn_table import read_turn_table  # noqa: E402
from sysbench_gpu.benchmarks.registry import load_run_sessions  # noqa: E402
from sysbench_gpu.core.errors import SysbenchError  # noqa: E402
from sysbench_gpu.core.records import JudgmentRecord, Verdict  # noqa: E402
from sysbench_gpu.core.run_stats import read_stats  # noqa: E402
from sysbench_gpu.core.rundir import RunDir  # noqa: E402
from sysbench_gpu.engines.base import SamplingSpec  # noqa: E402
from sysbench_gpu.explore.data import load_run_view  # noqa: E402
from sysbench_gpu.generation.run import run_generation  # noqa: E402
from sysbench_gpu.generation.settings import GenerateSettings  # noqa: E402

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _mutations(record: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``record`` with one field replaced by any JSON value, or removed."""
    names = sorted(record)

    def replaced(pair: tuple[str, Any]) -> dict[str, Any]:
        name, value = pair
        changed = dict(record)
        changed[name] = value
        return changed

    def removed(name: str) -> dict[str, Any]:
        return {k: v for k, v in record.items() if k != name}

    return st.tuples(st.sampled_from(names), json_values).map(replaced) | st.sampled_from(names).map(removed)


def _file_contents(valid: Any, lines: bool) -> st.SearchStrategy[bytes]:
    """Bytes for a file whose valid content is ``valid`` (a list of records when ``lines``)."""
    if lines:
        mutated = st.lists(_mutations(valid[0]), min_size=1, max_size=3).map(
            lambda rows: b"".join(_dumps(row) + b"\n" for row in [*valid[1:], *rows])
        )
        random_lines = st.lists(json_values, max_size=3).map(lambda rows: b"".join(_dumps(r) + b"\n" for r in rows))
    else:
        mutated = _mutations(valid).map(_dumps) if isinstance(valid, dict) else json_values.map(_dumps)
        random_lines = json_values.map(_dumps)
    return st.binary(max_size=120) | random_lines | mutated


def _one_line_or_loaded(read: Callable[[], Any]) -> None:
    try:
        read()
    except SysbenchError as error:
        assert "\n" not in str(error).strip(), str(error)


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory, dataset) -> Path:
    """A generated run (fake engine, one session) with a judgment per turn."""
    run = RunDir(tmp_path_factory.mktemp("fuzz") / "run")
    settings_ = GenerateSettings(model="smollm2", engine="hf", sampling=SamplingSpec(max_tokens=10))
    session = dataset.select(limit=1)[0]
    run_generation(FakeEngine(), dataset, [session], run, settings_, progress=False)
    records = [
        JudgmentRecord(
            system_id=session.system_id,
            turn=turn.index,
            verdicts={str(c.id): Verdict(raw="是", value="yes", type=c.type) for c in turn.constraints},
            judge_model="fake-judge",
        )
        for turn in session.turns
    ]
    run.judgments.append(records, existing=set())
    run.update_manifest("judge", status="complete", judge_model="fake-judge")
    return run.path


def _scratch(judged_run: Path, tmp_path_factory) -> Path:
    scratch = tmp_path_factory.mktemp("scratch") / "run"
    shutil.copytree(judged_run, scratch)
    return scratch


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("name", ["generations.jsonl", "judgments.jsonl"])
def test_record_files(judged_run, tmp_path_factory, name):
    scratch = _scratch(judged_run, tmp_path_factory)
    valid = _lines(judged_run / name)
    run = RunDir(scratch)
    reader = run.generations if name.startswith("generations") else run.judgments

    @FUZZ
    @given(_file_contents(valid, lines=True))
    def check(content: bytes) -> None:
        (scratch / name).write_bytes(content)
        _one_line_or_loaded(reader.read)

    check()


def test_manifest(judged_run, tmp_path_factory):
    scratch = _scratch(judged_run, tmp_path_factory)
    valid = json.loads((judged_run / "manifest.json").read_text())

    @FUZZ
    @given(_file_contents(valid, lines=False))
    def check(content: bytes) -> None:
        (scratch / "manifest.json").write_bytes(content)
        _one_line_or_loaded(RunDir(scratch).read_manifest)

    check()


def test_stats(judged_run, tmp_path_factory):
    scratch = _scratch(judged_run, tmp_path_factory)
    valid = json.loads((judged_run / "stats.json").read_text())
    call = valid["calls"][0]
    with_bad_call = _mutations(call).map(lambda c: _dumps({**valid, "calls": [c, *valid["calls"][1:]]}))

    @FUZZ
    @given(_file_contents(valid, lines=False) | with_bad_call)
    def check(content: bytes) -> None:
        (scratch / "stats.json").write_bytes(content)
        _one_line_or_loaded(lambda: read_stats(scratch / "stats.json"))

    check()


def test_sessions_snapshot(judged_run, tmp_path_factory):
    scratch = _scratch(judged_run, tmp_path_factory)
    valid = json.loads((judged_run / "sessions.json").read_text())
    first = valid[0] if isinstance(valid, list) else valid
    mutated = _mutations(first).map(lambda s: _dumps([s]) if isinstance(valid, list) else _dumps(s))

    @FUZZ
    @given(_file_contents(valid, lines=False) | mutated)
    def check(content: bytes) -> None:
        (scratch / "sessions.json").write_bytes(content)
        _one_line_or_loaded(lambda: load_run_sessions(RunDir(scratch)))

    check()


@pytest.mark.parametrize("name", ["generations.jsonl", "judgments.jsonl", "manifest.json", "sessions.json"])
def test_explorer_loading_a_run(judged_run, tmp_path_factory, name):
    scratch = _scratch(judged_run, tmp_path_factory)
    path = judged_run / name
    valid = _lines(path) if name.endswith(".jsonl") else json.loads(path.read_text())
    if name == "sessions.json" and isinstance(valid, list):
        valid = valid[0]

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_file_contents(valid, lines=name.endswith(".jsonl")))
    def check(content: bytes) -> None:
        (scratch / name).write_bytes(content)
        _one_line_or_loaded(lambda: load_run_view(scratch, resamples=5, seed=0))

    check()


def test_attention_output(tmp_path_factory):
    out = tmp_path_factory.mktemp("attention")
    valid_row = {
        "system_id": 1,
        "condition": "system",
        "layer": 15,
        "layer_label": "mid",
        "turn": 1,
        "n_tokens": 100,
        "n_reply_tokens": 10,
        "share": 0.5,
        "share_excl_lead": 0.4,
        "reply_share": 0.3,
        "reply_share_excl_lead": 0.2,
    }
    store.save_npz_atomic(out / "valid.npz", {"shares": np.zeros((3, 2), dtype=np.float32)})
    npz = (out / "valid.npz").read_bytes()
    truncated_npz = st.integers(0, len(npz)).map(lambda n: npz[:n])

    @FUZZ
    @given(
        _file_contents({"model": "m", "layers": [15]}, lines=False),
        _file_contents([valid_row], lines=True),
        st.binary(max_size=200) | truncated_npz,
    )
    def check(manifest: bytes, table: bytes, session: bytes) -> None:
        (out / "manifest.json").write_bytes(manifest)
        (out / "turn_shares.jsonl").write_bytes(table)
        (out / "0001.system.npz").write_bytes(session)
        _one_line_or_loaded(lambda: store.read_manifest(out))
        _one_line_or_loaded(lambda: read_turn_table(out / "turn_shares.jsonl"))
        _one_line_or_loaded(lambda: store.load_session(out / "0001.system.npz"))

    check()
