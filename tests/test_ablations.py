"""SysBench ablations: the exact conversations of single-turn and distractor runs, and their determinism."""

from __future__ import annotations

import pytest

from sysbench_gpu.benchmarks.sysbench.ablations import (
    ablation_conversation,
    choose_distractors,
    distractor_pool,
    insert_distractors,
    single_turn_conversation,
)
from sysbench_gpu.core.ablation_files import Exchange, ablation_settings, check_ablation_compatible
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.sessions import Constraint, Session, Turn


def _session(system_id: int, references: list[str | None]) -> Session:
    constraint = (Constraint(id=1, content="c", type="content", type_raw="内容约束"),)
    turns = tuple(
        Turn(index=i, user=f"s{system_id}u{i}", reference=ref, alignment="aligned", constraints=constraint)
        for i, ref in enumerate(references, start=1)
    )
    return Session(
        system_id=system_id, system_prompt=f"system {system_id}", turns=turns, dependent=True, domain=None, scene=None
    )


# Like the shared file: references for turns 1-2 only (turn 3 null); session 4 has none at all.
SESSIONS = [
    _session(1, ["s1r1", "s1r2", None]),
    _session(2, ["s2r1", "s2r2", None]),
    _session(3, ["s3r1", "  ", None]),
    _session(4, [None, None, None]),
]


def _m(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def test_single_turn_sees_system_and_its_own_user_message_only() -> None:
    session = SESSIONS[0]
    assert single_turn_conversation(session, 3) == [_m("system", "system 1"), _m("user", "s1u3")]
    assert ablation_conversation(session, 2, {1: "ignored"}, single_turn=True) == [
        _m("system", "system 1"),
        _m("user", "s1u2"),
    ]


def test_pool_keeps_only_turns_with_a_reference() -> None:
    pool = distractor_pool(SESSIONS)
    assert sorted(pool) == [1, 2, 3]  # session 4 has no reference at all
    assert [(e.system_id, e.turn) for e in pool[3]] == [(3, 1)]  # a blank reference does not count
    assert all(e.reply is not None and e.reply.strip() for exchanges in pool.values() for e in exchanges)


def test_two_distractors_go_between_system_message_and_turn_one() -> None:
    pool = distractor_pool(SESSIONS)
    chosen = choose_distractors(pool, system_id=1, count=2, seed=0)
    # Pinned: the draw for (seed 0, session 1, K 2); a change of the seeding scheme must be deliberate.
    assert [(e.system_id, e.turn) for e in chosen] == [(3, 1), (2, 2)]  # two other sessions, never its own
    assert ablation_conversation(SESSIONS[0], 1, {}, distractors=chosen) == [
        _m("system", "system 1"),
        _m("user", "s3u1"),
        _m("assistant", "s3r1"),
        _m("user", "s2u2"),
        _m("assistant", "s2r2"),
        _m("user", "s1u1"),
    ]
    # With history, the session's own turns follow the distractors.
    assert ablation_conversation(SESSIONS[0], 2, {1: "model reply"}, distractors=chosen) == [
        _m("system", "system 1"),
        _m("user", "s3u1"),
        _m("assistant", "s3r1"),
        _m("user", "s2u2"),
        _m("assistant", "s2r2"),
        _m("user", "s1u1"),
        _m("assistant", "model reply"),
        _m("user", "s1u2"),
    ]
    # Every turn of a session gets the same exchanges.
    assert choose_distractors(pool, system_id=1, count=2, seed=0) == chosen


def test_draw_is_deterministic_and_depends_on_seed_session_and_count() -> None:
    pool = {sid: [Exchange(sid, t, f"u{sid}.{t}", f"r{sid}.{t}") for t in (1, 2)] for sid in range(1, 41)}
    draw = choose_distractors(pool, 7, 3, seed=5)
    assert draw == choose_distractors(pool, 7, 3, seed=5)
    assert len({e.system_id for e in draw}) == 3 and 7 not in {e.system_id for e in draw}
    others = {choose_distractors(pool, 7, 3, seed=s) for s in range(6, 12)}
    others |= {choose_distractors(pool, sid, 3, seed=5) for sid in (8, 9, 10)}
    assert len(others - {draw}) >= 8  # other seeds and sessions draw other exchanges
    # the pool is the whole data file: selecting fewer sessions does not change a session's draw
    assert choose_distractors(dict(pool), 7, 3, seed=5) == draw


def test_distractor_errors_and_zero() -> None:
    pool = distractor_pool(SESSIONS)
    assert choose_distractors(pool, 1, 0) == ()
    with pytest.raises(SysbenchError, match="needs 3 other sessions with a reference reply; the data has 2"):
        choose_distractors(pool, 1, 3)
    with pytest.raises(SysbenchError, match="0 or more"):
        choose_distractors(pool, 1, -1)


def test_insert_without_a_system_message() -> None:
    exchange = Exchange(2, 1, "q", "a")
    assert insert_distractors([_m("user", "x")], [exchange]) == [_m("user", "q"), _m("assistant", "a"), _m("user", "x")]


def test_shared_data_distractors_come_from_reference_turns(dataset) -> None:
    pool = distractor_pool(dataset.sessions)
    first = dataset.sessions[0]
    chosen = choose_distractors(pool, first.system_id, 2, seed=0)
    by_id = dataset.by_id()
    for exchange in chosen:
        source = by_id[exchange.system_id].turn(exchange.turn)
        assert exchange.system_id != first.system_id
        assert (exchange.user, exchange.reply) == (source.user, source.reference)
        assert source.reference is not None
    messages = ablation_conversation(first, 1, {}, distractors=chosen)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == first.system_prompt and messages[-1]["content"] == first.turn(1).user


def test_manifest_settings_refuse_mixing() -> None:
    stored = ablation_settings("model", 2, 0)
    assert stored == {"history": "model", "distractor_turns": 2, "distractor_seed": 0}
    check_ablation_compatible(stored, ablation_settings("model", 2, 0), "run/manifest.json")
    with pytest.raises(SysbenchError, match="field 'distractor_turns' was 2 in this run, this command asks for 0"):
        check_ablation_compatible(stored, ablation_settings("model"), "run/manifest.json")
    with pytest.raises(SysbenchError, match="field 'history' was 'model'.*'single-turn'"):
        check_ablation_compatible({"history": "model"}, ablation_settings("single-turn"), "run/manifest.json")
    # an older run without the fields had no distractors
    check_ablation_compatible({"history": "reference"}, ablation_settings("reference"), "run/manifest.json")
    with pytest.raises(SysbenchError, match="0 or more"):
        ablation_settings("model", -2)


def test_distractors_file_round_trip_and_errors(tmp_path) -> None:
    from sysbench_gpu.core.ablation_files import read_distractors, write_distractors

    pool = distractor_pool(SESSIONS)
    chosen = {sid: choose_distractors(pool, sid, 2, seed=0) for sid in (1, 2)}
    path = tmp_path / "distractors.json"
    write_distractors(path, chosen, 2, 0)
    assert read_distractors(path) == (2, chosen)
    raw = path.read_text(encoding="utf-8").replace('"turn": 1', '"turn": "1"', 1)
    path.write_text(raw, encoding="utf-8")
    with pytest.raises(SysbenchError, match=r"field 'sessions\.\d\[\d\]' should be an object with system_id"):
        read_distractors(path)
    with pytest.raises(SysbenchError, match="missing; the run's manifest says it has distractor turns"):
        read_distractors(tmp_path / "absent.json")
