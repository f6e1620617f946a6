"""The SysBench judge shows the history the model saw: none for a single-turn run (manifest stages.generate)."""

from __future__ import annotations

from test_judge_support import good_reply, make_run, marker

from sysbench_gpu.benchmarks.sysbench.judge_plan import generated_history_mode
from sysbench_gpu.benchmarks.sysbench.judge_prompt import load_template
from sysbench_gpu.engines.base import Completion
from sysbench_gpu.judging.rounds import JudgeSettings
from sysbench_gpu.judging.stage import judge_run


class PromptRecorder:
    name = "fake"
    is_primary = True

    def __init__(self, dataset) -> None:
        self.sessions = dataset.by_id()
        self.prompts: dict[tuple[int, int], str] = {}

    def chat(self, conversations, sampling):
        out = []
        for conversation in conversations:
            _, sid, turn = marker(conversation[-1]["content"])
            self.prompts[(sid, turn)] = conversation[-1]["content"]
            out.append(Completion(good_reply(self.sessions[sid], turn), 10, 5))
        return out

    def count_prompt_tokens(self, conversation):
        return 10

    def context_length(self):
        return None

    def describe(self):
        return {}

    def close(self):
        pass


def _judge(run, dataset) -> PromptRecorder:
    engine = PromptRecorder(dataset)
    settings = JudgeSettings(backend="hf", model="j", template=load_template("en"), cache_dir=None)
    judge_run(run, settings, lambda: engine, show_progress=False)
    return engine


def test_single_turn_runs_are_judged_without_earlier_turns(tmp_path, dataset):
    plain = make_run(tmp_path / "plain", dataset, [1])
    single = make_run(tmp_path / "single", dataset, [1])
    single.update_manifest(stage="generate", history="single-turn", distractor_turns=0, benchmark="sysbench")
    assert generated_history_mode(single.read_manifest()) == "single-turn"
    assert generated_history_mode(plain.read_manifest()) is None  # older runs: the records say
    with_history, without = _judge(plain, dataset).prompts, _judge(single, dataset).prompts
    earlier = "ANSWER good s1 t1"
    assert earlier in with_history[(1, 3)] and earlier not in without[(1, 3)]
    assert "(none: this is the first round)" in without[(1, 5)]
    assert with_history[(1, 1)] == without[(1, 1)]  # turn 1 has no history either way
