"""vLLM engine smoke run with the embedded model; run by tests/test_engine_vllm.py in a subprocess.

vLLM spawns worker processes, so it needs the ``__main__`` guard and a process of its
own. Usage: ``python tests/vllm_smoke.py OUT.json``. Every observation goes into
OUT.json; the test asserts on it. Memory is left to the engine's own plan (sized from
what the NUMA node has free), so the smoke run also checks that plan.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# A system message long enough to fill several KV blocks (16 tokens each), so a
# repeated conversation has a prefix the cache can serve.
SYSTEM = (
    "You are a museum guide in Lisbon. Answer every visitor in at most two sentences, "
    "mention one exhibit by name, and never discuss ticket prices. " * 6
).strip()

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "1": {"type": "string", "enum": ["yes", "no"]},
        "2": {"type": "string", "enum": ["yes", "no"]},
    },
    "required": ["1", "2"],
    "additionalProperties": False,
}


def conversation(question: str, system: str | None = SYSTEM) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": question}]


def main(out_path: str) -> None:
    from sysbench_gpu.engines import get_engine
    from sysbench_gpu.engines.base import SamplingSpec
    from sysbench_gpu.engines.vllm_engine import DEFAULT_MAX_TOKENS

    report: dict[str, Any] = {}
    started = time.perf_counter()
    engine = get_engine("vllm", model="smollm2", max_model_len=2048, seed=0, enforce_eager=True)
    report["load_s"] = time.perf_counter() - started
    try:
        report["describe"] = engine.describe()
        report["context_length"] = engine.context_length()
        report["supports_system_role"] = engine.supports_system_role()
        report["is_primary"] = engine.is_primary
        startup_log = report["describe"].get("startup_log")
        report["startup_log_has_vllm_output"] = bool(
            startup_log
            and os.path.isfile(startup_log)
            and "EngineCore" in Path(startup_log).read_text(encoding="utf-8")
        )

        # 1. A small batch, in order, with token counts; the prompt count matches the engine's own.
        batch = [
            conversation("Where is the tile museum?"),
            conversation("What is 2 + 2?", system=None),
            conversation("Name one painting."),
        ]
        clock = time.perf_counter()
        completions = engine.chat(batch, SamplingSpec(max_tokens=8, temperature=0.0))
        report["batch_s"] = time.perf_counter() - clock
        report["batch"] = [
            {
                "text": c.text,
                "prompt_tokens": c.prompt_tokens,
                "counted_prompt_tokens": engine.count_prompt_tokens(conv),
                "output_tokens": c.output_tokens,
                "cached_prompt_tokens": c.cached_prompt_tokens,
                "finish_reason": c.finish_reason,
            }
            for conv, c in zip(batch, completions, strict=False)
        ]

        # 2. The same system prompt again, next turn appended: the history comes from the prefix cache.
        follow_up = batch[0] + [
            {"role": "assistant", "content": completions[0].text},
            {"role": "user", "content": "And the nearest tram stop?"},
        ]
        again = engine.chat([follow_up], SamplingSpec(max_tokens=4, temperature=0.0))[0]
        report["follow_up"] = {"prompt_tokens": again.prompt_tokens, "cached_prompt_tokens": again.cached_prompt_tokens}

        # 3. A JSON-schema constrained request (what a local judge sends).
        judged = engine.chat(
            [conversation('Judge the answer. Reply with JSON like {"1": "yes", "2": "no"}.', system=None)],
            SamplingSpec(max_tokens=40, temperature=0.0, json_schema=VERDICT_SCHEMA),
        )[0]
        report["json"] = {"text": judged.text, "finish_reason": judged.finish_reason}

        # 4. A per-request seed and batch company: on this CPU build the reply did not change;
        #    vLLM guarantees that only with VLLM_BATCH_INVARIANT=1 (GPUs), see docs/engines.md.
        seeded = SamplingSpec(max_tokens=8, temperature=1.0, seed=1234)
        alone = engine.chat([batch[2]], seeded)[0].text
        in_company = engine.chat([batch[0], batch[2]], seeded)[1].text
        report["seeded"] = {"alone": alone, "in_company": in_company}

        # 5. Defaults: nothing set means the model's generation config, else our documented max_tokens.
        local = engine._local  # the in-process backend; inspect the SamplingParams it would send
        default_params = local.sampling_params(SamplingSpec())
        explicit_params = local.sampling_params(SamplingSpec(max_tokens=5, temperature=0.2, top_k=3))
        report["defaults"] = {
            "default_max_tokens": default_params.max_tokens,
            "expected_default_max_tokens": local.model_defaults.get("max_tokens", DEFAULT_MAX_TOKENS),
            "explicit": [explicit_params.max_tokens, explicit_params.temperature, explicit_params.top_k],
        }
    finally:
        engine.close()
    report["total_s"] = time.perf_counter() - started
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, ensure_ascii=False, indent=2)


if __name__ == "__main__":
    main(sys.argv[1])
