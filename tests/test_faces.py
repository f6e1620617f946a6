"""The design card's faces keep the import paths users had before the layered package."""

from __future__ import annotations

import importlib

import pytest

FACES = {
    "sysbench_gpu.batch_infer": "sysbench_gpu.generation",
    "sysbench_gpu.judge": "sysbench_gpu.judging",
    "sysbench_gpu.attn_hooks": "sysbench_gpu.attention",
}


@pytest.mark.parametrize("face", sorted(FACES))
def test_a_face_re_exports_its_stage_objects(face: str) -> None:
    module = importlib.import_module(face)
    assert module.__all__, face
    for name in module.__all__:
        value = getattr(module, name)
        origin = getattr(value, "__module__", None)
        # Functions and classes come from the face's stage (or from core, which it re-exports), never a copy.
        if origin is not None and not isinstance(value, (str, tuple)):
            assert origin.startswith((FACES[face], "sysbench_gpu.modeling", "sysbench_gpu.core")), (face, name, origin)


def test_the_names_users_imported_before_still_import() -> None:
    from sysbench_gpu.attn_hooks import AttentionShareCapture, eager_reference_shares, resolve_layers
    from sysbench_gpu.batch_infer import GenerateSettings, conversation_for_turn, fold_system_message, run_generation
    from sysbench_gpu.judge import JudgeSettings, dry_run_report, judge_run, temperature_for

    assert run_generation.__module__ == "sysbench_gpu.generation.run"
    assert GenerateSettings.__module__ == "sysbench_gpu.generation.settings"
    assert judge_run.__module__ == "sysbench_gpu.judging.stage"
    assert JudgeSettings.__module__ == "sysbench_gpu.judging.rounds"
    assert AttentionShareCapture.__module__ == "sysbench_gpu.attention.capture.hooks"
    assert callable(conversation_for_turn) and callable(fold_system_message) and callable(dry_run_report)
    assert callable(temperature_for) and callable(eager_reference_shares) and callable(resolve_layers)
