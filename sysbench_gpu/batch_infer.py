"""The design card's face of the generation stage: turn-synchronous batched generation.

``run_generation(engine, run_dir, settings, dataset)`` answers every session turn by turn
in one engine call per turn; the stage lives in ``sysbench_gpu.generation``.
"""

from sysbench_gpu.core.messages import (
    SYSTEM_FOLD_SEPARATOR,
    conversation_for_turn,
    drop_oldest_turns,
    fold_system_message,
)
from sysbench_gpu.generation.plan import (
    GenerationPlan,
    missing_references,
    select_for_reference_history,
)
from sysbench_gpu.generation.run import run_generation
from sysbench_gpu.generation.settings import OVERFLOW_POLICIES, STAGE, GenerateSettings, check_compatible

__all__ = [
    "OVERFLOW_POLICIES",
    "STAGE",
    "SYSTEM_FOLD_SEPARATOR",
    "GenerateSettings",
    "GenerationPlan",
    "check_compatible",
    "conversation_for_turn",
    "drop_oldest_turns",
    "fold_system_message",
    "missing_references",
    "run_generation",
    "select_for_reference_history",
]
