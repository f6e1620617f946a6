"""The hf engine's JSON-schema-constrained decoding (xgrammar): random-weight models, a real tokenizer.

A random model writes whatever its weights say; only the grammar can make its replies
JSON that fits the schema, so every reply parsing is the grammar's doing. The last test
judges a tiny demo run with the real SmolLM2 through the CLI (slow).
"""

from __future__ import annotations

import json
import sys

import pytest
from test_judge_support import make_run

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.registry import load_dataset
from sysbench_gpu.benchmarks.sysbench.judge_prompt import load_template, verdict_schema
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.rundir import RunDir
from sysbench_gpu.engines.base import SamplingSpec
from sysbench_gpu.engines.grammar import SchemaGrammars
from sysbench_gpu.judging.rounds import JudgeSettings
from sysbench_gpu.judging.stage import judge_run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("xgrammar")

EXTRA_LOGITS = 64  # the tiny model's logits are wider than the tokenizer's vocabulary
REASON_CHARS = 40
PICK = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["A", "B", "tie"]},
        "note": {"type": "string", "maxLength": 12},
        "score": {"type": "integer", "enum": list(range(1, 11))},
    },
    "required": ["label", "note", "score"],
    "additionalProperties": False,
}
PROMPTS = (
    "Say hi.",
    "Judge the answer below and reply with a JSON object.\nAnswer: the capital of France is Paris.",
    "You are a careful judge. " * 12 + "Reply with one JSON object, nothing else, about whether 2 + 2 = 4.",
    "Write a poem about the sea, then grade it from 1 to 10 in JSON.",
)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread: on a shared 2-core box two spinning threads are several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return transformers.AutoTokenizer.from_pretrained(smollm2_path)


def _tiny_model(tokenizer, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer) + EXTRA_LOGITS,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


@pytest.fixture(scope="module")
def engine(tokenizer, one_thread):
    from sysbench_gpu.engines.hf import HFEngine

    return HFEngine.from_model(_tiny_model(tokenizer), tokenizer, name="tiny-llama", batch_size=8)


def _conversations():
    return [[{"role": "user", "content": text}] for text in PROMPTS]


def _check_verdicts(text: str, numbers: list[int]) -> None:
    reply = json.loads(text)
    assert list(reply) == ["reasoning", "verdicts"]
    assert isinstance(reply["reasoning"], str) and len(reply["reasoning"]) <= REASON_CHARS
    assert list(reply["verdicts"]) == [str(n) for n in numbers]
    assert all(value in ("yes", "no") for value in reply["verdicts"].values())


def _check_pick(text: str) -> None:
    reply = json.loads(text)
    assert list(reply) == ["label", "note", "score"]
    assert reply["label"] in ("A", "B", "tie")
    assert isinstance(reply["note"], str) and len(reply["note"]) <= 12
    assert type(reply["score"]) is int and 1 <= reply["score"] <= 10


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_reply_of_a_batch_fits_the_schema(engine, temperature):
    conversations = _conversations()
    lengths = [engine.count_prompt_tokens(c) for c in conversations]
    assert len(set(lengths)) == len(lengths)  # different lengths: left padding differs per row
    schema = verdict_schema([1, 2, 3], "en", REASON_CHARS)
    spec = SamplingSpec(max_tokens=160, temperature=temperature, seed=7, json_schema=schema)
    replies = engine.chat(conversations, spec)
    assert len(replies) == len(conversations)
    for reply in replies:
        assert reply.finish_reason == "stop", reply.text
        _check_verdicts(reply.text, [1, 2, 3])

    picks = engine.chat(conversations, SamplingSpec(max_tokens=80, temperature=temperature, seed=7, json_schema=PICK))
    for reply in picks:
        assert reply.finish_reason == "stop", reply.text
        _check_pick(reply.text)


def test_rows_that_finish_early_leave_the_others_valid(engine):
    """In one generate call some rows stop while others decode on; each row ends as it would alone."""
    spec = SamplingSpec(max_tokens=160, temperature=0, json_schema=verdict_schema([1, 2, 3], "en", REASON_CHARS))
    batched = engine.chat(_conversations(), spec)  # batch_size 8: the four prompts share one call
    lengths = [reply.output_tokens for reply in batched]
    assert min(lengths) < max(lengths)  # the early rows were fed pad while the others went on
    alone = [engine.chat([conversation], spec)[0] for conversation in _conversations()]
    assert [reply.text for reply in batched] == [reply.text for reply in alone]
    for reply in batched:
        _check_verdicts(reply.text, [1, 2, 3])
    # A reasoning cap of 2 characters ends rows within a few tokens of each other: still whole JSON.
    tight = engine.chat(
        _conversations(), SamplingSpec(max_tokens=60, temperature=0, json_schema=verdict_schema([1], "en", 2))
    )
    for reply in tight:
        reading = json.loads(reply.text)
        assert len(reading["reasoning"]) <= 2 and list(reading["verdicts"]) == ["1"]


def test_processor_finished_rows_get_only_stop_and_pad(tokenizer):
    """Row 0 closes its JSON and stops; transformers then feeds it pad while row 1 goes on."""
    eos, pad = tokenizer.eos_token_id, 0  # a pad distinct from eos (<|endoftext|>)
    assert eos != pad
    width = len(tokenizer) + EXTRA_LOGITS
    grammars = SchemaGrammars(tokenizer, len(tokenizer), [eos], pad)  # the logits are wider than this
    processor = grammars.processor(PICK)
    short = tokenizer.encode('{"label": "A", "note": "", "score": 3}', add_special_tokens=False)
    long = tokenizer.encode('{"label": "tie", "note": "long enough!", "score": 10}', add_special_tokens=False)
    fed = [short + [eos] + [pad] * 2, long]
    assert len(long) > len(fed[0])
    rows = [[5, 6, 7], [8, 9, 10]]  # the prompts (the first call's last token is the prompt's)
    for step in range(len(fed[0]) + 1):
        scores = processor(torch.tensor(rows), torch.randn(2, width))
        allowed = [torch.isfinite(scores[row]).nonzero().flatten().tolist() for row in range(2)]
        # Row 1 always may take its next token, and never an id past the tokenizer's vocabulary.
        assert long[step] in allowed[1] and max(allowed[1]) < len(tokenizer)
        if step < len(short):
            assert short[step] in allowed[0] and eos not in allowed[0]
        elif step == len(short):  # the JSON is complete: only the stop token
            assert allowed[0] == [eos]
        else:  # finished (then fed pad): stop and pad only, finite so that sampling works
            assert allowed[0] == sorted({eos, pad})
        if step < len(fed[0]):
            rows[0].append(fed[0][step])
            rows[1].append(long[step])
    assert processor.finished == [True, False] and processor.rejected == 0
    assert processor.matchers[0].is_terminated() and not processor.matchers[1].is_terminated()


def test_bounded_strings_never_take_a_raw_control_character(tokenizer):
    """xgrammar's maxLength string admits raw U+0000-U+001F (mlc-ai/xgrammar#800); JSON does not."""
    eos = tokenizer.eos_token_id
    processor = SchemaGrammars(tokenizer, len(tokenizer), [eos]).processor(PICK)
    start = tokenizer.encode('{"label": "B", "note": "', add_special_tokens=False)
    prompt = [5, 6]
    processor(torch.tensor([prompt]), torch.zeros(1, len(tokenizer)))
    scores = processor(torch.tensor([prompt + start]), torch.zeros(1, len(tokenizer)))
    allowed = torch.isfinite(scores[0]).nonzero().flatten().tolist()
    assert len(allowed) > 1000  # inside the string: nearly any text
    tab = tokenizer.convert_tokens_to_ids("ĉ")  # byte-level "\t"
    assert tokenizer.decode([tab]) == "\t" and tab not in allowed
    assert not any(ord(ch) < 0x20 for token in allowed for ch in tokenizer.decode([token]))
    assert not set(allowed) & set(tokenizer.all_special_ids)


def test_without_a_schema_generation_is_unchanged(engine, monkeypatch):
    """json_schema=None: generate gets no processor and gives what plain greedy generate gives."""
    conversations = _conversations()
    seen = []
    original = engine.hf_model.generate

    def recording(*args, **kwargs):
        seen.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.hf_model, "generate", recording)
    spec = SamplingSpec(max_tokens=12, temperature=0)
    before = [reply.text for reply in engine.chat(conversations, spec)]
    engine.chat(conversations[:2], SamplingSpec(max_tokens=12, temperature=0, json_schema=PICK))
    after = [reply.text for reply in engine.chat(conversations, spec)]
    assert before == after
    assert [("logits_processor" in kwargs) for kwargs in seen] == [False, True, False]

    # The same left-padded batch through plain greedy generate, no engine in between.
    prompts = [engine.prompt_ids(c) for c in conversations]
    widest = max(len(p) for p in prompts)
    pad = engine.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (widest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (widest - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = original(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=pad)
    plain = []
    for row in out[:, widest:].tolist():
        cut = next((i for i, t in enumerate(row) if t in engine.eos_ids), len(row))
        plain.append(engine.tokenizer.decode(row[:cut], skip_special_tokens=True))
    assert before == plain


def test_grammars_are_cached_per_engine_and_recorded(engine, tokenizer):
    schema = verdict_schema([1, 2], "en", 30)
    assert engine.grammars.compiled(schema) is engine.grammars.compiled(schema)
    other = SchemaGrammars(tokenizer, len(tokenizer), engine.eos_ids, tokenizer.pad_token_id)
    assert other.compiled(schema) is not engine.grammars.compiled(schema)  # no module-wide cache
    assert engine.describe()["structured_output"].startswith("xgrammar ")


def test_schema_and_ignore_eos_refuse_to_combine(engine):
    with pytest.raises(SysbenchError, match="ignore_eos"):
        engine.chat(_conversations()[:1], SamplingSpec(max_tokens=8, json_schema=PICK, ignore_eos=True))


def test_missing_xgrammar_is_one_line(tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now raises ImportError
    grammars = SchemaGrammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    with pytest.raises(SysbenchError, match="pip install xgrammar") as error:
        grammars.compiled(PICK)
    assert "\n" not in str(error.value)


def test_hf_judge_of_a_random_model_parses_every_turn(tmp_path, engine):
    """The judge stage with backend hf sends the schema; a random model then never fails to parse."""
    demo = load_dataset("demo")
    run = make_run(tmp_path / "run", demo, [1])
    settings = JudgeSettings(
        backend="hf",
        model="tiny-llama",
        template=load_template("en"),
        max_retries=1,
        max_tokens=200,
        max_reasoning_chars=60,
        cache_dir=None,
    )
    summary = judge_run(run, settings, lambda: engine, show_progress=False)
    records = run.judgments.read()
    assert (summary.judged, summary.unparsed) == (5, 0)
    assert all(r.parse_status == "ok" and r.attempts == 1 for r in records.values())
    stage = run.read_manifest()["stages"]["judge"]
    assert stage["guided_decoding"] is True and stage["max_reasoning_chars"] == 60
    assert stage["engine"]["structured_output"].startswith("xgrammar ")


@pytest.mark.slow
def test_cli_hf_judge_with_smollm2_has_no_unparsed(tmp_path, smollm2_path, one_thread, capsys):
    demo = load_dataset("demo")
    run = make_run(tmp_path / "run", demo, [1])
    argv = [
        "judge", str(run.path), "--judge", "hf", "--judge-model", "smollm2", "--template", "en",
        "--max-tokens", "160", "--max-reasoning-chars", "100", "--max-retries", "1", "--seed", "0",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    assert "unparsed 0" in capsys.readouterr().out
    records = RunDir(run.path).judgments.read()
    assert len(records) == 5 and all(r.parse_status == "ok" for r in records.values())
    stage = RunDir(run.path).read_manifest()["stages"]["judge"]
    assert stage["guided_decoding"] is True and stage["judgments_by_status"] == {"ok": 5}
