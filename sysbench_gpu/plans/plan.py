"""A plan file read and checked: what runs, under which names, with which settings (docs/plans.md).

``load_plan(path)`` reads the TOML, checks every table (``plans.schema``), merges each
model's ``sampling`` and ``judge`` over the shared ones, names one run per model and
ablation, and asks the data's benchmark whether it supports each ablation
(``Benchmark.check_generation``: shared code never asks a benchmark's name). Every problem
is one line naming the file, the table and the key, before any model loads.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sysbench_gpu.benchmarks.registry import (
    benchmark_names,
    dataset_benchmark,
    generation_presets,
    judge_options,
    load_dataset,
    one_benchmark,
)
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.core.sessions import parse_session_ids
from sysbench_gpu.generation.flags import ENGINE_FLAGS
from sysbench_gpu.generation.plan import HISTORY_MODES
from sysbench_gpu.generation.settings import OVERFLOW_POLICIES
from sysbench_gpu.judging.stage import JUDGE_BACKENDS
from sysbench_gpu.plans import schema
from sysbench_gpu.plans.schema import PlanError, check_name, check_table, check_value, key, where
from sysbench_gpu.plans.verbs import flag_of, flag_types

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

RUNS_DIR, ATTENTION_DIR, REPORT_DIR, ARENA_DIR, EXPLORE_DIR = "runs", "attention", "report", "arena", "explore"
OUTPUT_KINDS = ("report", "arena", "explore")
# A model's engine options are generate's engine flags; the sampling seed is [sampling]'s.
_NOT_ENGINE_OPTIONS = {"seed"}


@dataclass(frozen=True)
class RunSpec:
    """One run directory: a model under one ablation (``ablation`` None: the plain run)."""

    name: str
    model: str  # the plan's model name
    ablation: str | None
    table: str  # where the plan says so, for errors
    history: str = "model"
    distractor_turns: int = 0
    distractor_seed: int | None = None
    skip_missing_reference: bool = False
    data: str | None = None  # another data file for this run (MT-Eval's *_single files); None: [data]'s


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model: str
    engine: str
    table: str
    options: Mapping[str, Any] = field(default_factory=dict)
    sampling: Mapping[str, Any] = field(default_factory=dict)
    judge: Mapping[str, Any] = field(default_factory=dict)
    on_overflow: str | None = None
    attention: Mapping[str, Any] | None = None  # None: no attention for this model
    env: Mapping[str, str] = field(default_factory=dict)
    runs: tuple[RunSpec, ...] = ()


@dataclass(frozen=True)
class Plan:
    path: Path
    sha256: str
    name: str
    out: Path
    data: Mapping[str, Any]
    models: tuple[ModelSpec, ...]
    metrics: bool = True
    report: Mapping[str, Any] | None = None
    arena: Mapping[str, Any] | None = None
    explore: Mapping[str, Any] | None = None

    @property
    def runs(self) -> tuple[RunSpec, ...]:
        return tuple(run for model in self.models for run in model.runs)

    def model(self, name: str) -> ModelSpec:
        return next(m for m in self.models if m.name == name)

    def run_dir(self, run: RunSpec) -> Path:
        return self.out / RUNS_DIR / run.name

    def attention_dir(self, run: RunSpec) -> Path:
        return self.out / ATTENTION_DIR / run.name

    def output_dir(self, kind: str) -> Path:
        return self.out / {"report": REPORT_DIR, "arena": ARENA_DIR, "explore": EXPLORE_DIR}[kind]


def plan_digest(path: Path) -> tuple[bytes, str]:
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise SysbenchError(f"{path}: cannot read the plan ({error.strerror or error})") from None
    return raw, hashlib.sha256(raw).hexdigest()


def load_plan(path: str | Path, out: str | Path | None = None) -> Plan:
    """Read and check a plan file; ``out`` overrides its output root (``run --out``)."""
    path = Path(path)
    raw, sha256 = plan_digest(path)
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise PlanError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except tomllib.TOMLDecodeError as error:
        raise PlanError(f"{path}: not valid TOML ({' '.join(str(error).split())})") from None
    top = check_table(path, "", document, schema.TOP)
    name = check_name(path, "", "name", top.get("name", path.stem))
    data = _data(path, top["data"])
    sampling = _sampling(path, "sampling", top.get("sampling", {}))
    judge = _judge(path, "judge", top.get("judge", {}))
    outputs = check_table(path, "outputs", top.get("outputs", {}), schema.OUTPUTS)
    attention_shared = _attention(path, "outputs.attention", outputs.get("attention", False))
    models = _models(path, top["models"], sampling, judge, attention_shared)
    plan = Plan(
        path=path,
        sha256=sha256,
        name=name,
        out=Path(out) if out is not None else Path(top.get("out", f"runs/{name}")),
        data=data,
        models=models,
        metrics=outputs.get("metrics", True),
        report=_output(path, "report", outputs, schema.REPORT),
        arena=_output(path, "arena", outputs, schema.ARENA),
        explore=_output(path, "explore", outputs, schema.EXPLORE),
    )
    _check_outputs(plan)
    _check_benchmark(plan)
    return plan


# ------------------------------------------------------------------ tables


def _data(path: Path, value: Any) -> dict[str, Any]:
    data = check_table(path, "data", value, schema.DATA)
    if "benchmark" in data:
        check_value(path, "data", "benchmark", key(str, choices=benchmark_names()), data["benchmark"])
    _session_ids(path, "data", data.get("sessions"))
    return data


def _session_ids(path: Path, table: str, text: str | None) -> None:
    try:
        parse_session_ids(text)
    except SysbenchError as error:
        raise PlanError(f"{where(path, table, 'sessions')}: {error}") from None


def _sampling(path: Path, table: str, value: Any) -> dict[str, Any]:
    sampling = check_table(path, table, value, schema.SAMPLING)
    if "preset" in sampling:
        check_value(path, table, "preset", key(str, choices=sorted(generation_presets())), sampling["preset"])
    return sampling


def _judge(path: Path, table: str, value: Any) -> dict[str, Any]:
    spec = dict(schema.JUDGE)
    # The benchmarks' own judge options (MT-Eval's judge_prompts, rules), as `judge` adds their flags.
    for option, (choices, _) in judge_options().items():
        spec[option] = key(str, choices=choices)
    judge = check_table(path, table, value, spec)
    if "backend" in judge:
        check_value(path, table, "backend", key(str, choices=JUDGE_BACKENDS), judge["backend"])
    for kind, file in judge.get("mteval_templates", {}).items():
        check_value(path, f"{table}.mteval_templates", kind, key(str), file)
    return judge


def _attention(path: Path, table: str, value: Any) -> dict[str, Any] | None:
    if value is False:
        return None
    if value is True:
        return {}
    attention = check_table(path, table, value, schema.ATTENTION)
    _session_ids(path, table, attention.get("sessions"))
    return attention


def _output(path: Path, kind: str, outputs: Mapping[str, Any], spec: Mapping[str, schema.Key]) -> dict | None:
    value = outputs.get(kind, False)
    if value is False:
        return None
    return {} if value is True else check_table(path, f"outputs.{kind}", value, spec)


def _models(
    path: Path,
    value: list[Any],
    sampling: Mapping[str, Any],
    judge: Mapping[str, Any],
    attention: Mapping[str, Any] | None,
) -> tuple[ModelSpec, ...]:
    if not value:
        raise PlanError(f"{where(path, '', 'models')}: no model; add one [[models]] table")
    models: list[ModelSpec] = []
    seen: dict[str, str] = {}
    run_names: dict[str, str] = {}
    for index, item in enumerate(value, 1):
        table = f"models.{index}"
        entry = check_table(path, table, item, schema.MODEL)
        name = check_name(path, table, "name", entry["name"])
        table = f"models.{index} ({name})"
        if name in seen:
            raise PlanError(f"{where(path, table, 'name')}: model {name!r} is listed twice ({seen[name]} and {table})")
        seen[name] = table
        engine = check_value(path, table, "engine", key(str, choices=tuple(ENGINE_FLAGS)), entry["engine"])
        model_attention = _model_attention(path, table, entry, attention, engine)
        spec = ModelSpec(
            name=name,
            model=entry["model"],
            engine=engine,
            table=table,
            options=_engine_options(path, f"{table}.options", engine, entry.get("options", {})),
            sampling={**sampling, **_sampling(path, f"{table}.sampling", entry.get("sampling", {}))},
            judge=_merged_judge(judge, _judge(path, f"{table}.judge", entry.get("judge", {}))),
            on_overflow=check_value(
                path, table, "on_overflow", key(str, choices=OVERFLOW_POLICIES), entry["on_overflow"]
            )
            if "on_overflow" in entry
            else None,
            attention=model_attention,
            env={k: check_value(path, f"{table}.env", k, key(str), v) for k, v in entry.get("env", {}).items()},
        )
        _check_judge_pair(path, table, spec.judge, entry.get("judge", {}))
        runs = _runs(path, table, spec, entry)
        for run in runs:
            if run.name in run_names:
                raise PlanError(
                    f"{where(path, run.table, 'name')}: run {run.name!r} is named twice "
                    f"({run_names[run.name]} and {run.table}); give the ablation another name"
                )
            run_names[run.name] = run.table
        models.append(replace(spec, runs=runs))
    return tuple(models)


def _check_judge_pair(path: Path, table: str, merged: Mapping[str, Any], own: Mapping[str, Any]) -> None:
    """A judge is a backend and a model, or neither (a benchmark whose turns rules score), as ``judge`` asks."""
    if bool(merged.get("backend")) == bool(merged.get("model")):
        return
    missing = "model" if merged.get("backend") else "backend"
    named = f"{table}.judge" if "backend" in own or "model" in own else "judge"
    raise PlanError(
        f"{where(path, named, missing)}: missing (give backend and model, or neither for a benchmark whose turns "
        "rules score)"
    )


def _merged_judge(shared: Mapping[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    merged = {**shared, **own}
    if "options" in shared or "options" in own:
        merged["options"] = {**shared.get("options", {}), **own.get("options", {})}
    return merged


def _model_attention(
    path: Path, table: str, entry: Mapping[str, Any], shared: Mapping[str, Any] | None, engine: str
) -> dict[str, Any] | None:
    own = entry.get("attention")
    if own is False or (own is None and shared is None):
        return None
    merged = dict(shared or {})
    if own is not None:
        merged.update(_attention(path, f"{table}.attention", own) or {})
    if engine == "openai":
        raise PlanError(
            f"{where(path, table, 'attention')}: the attention stage loads the model's weights, and an openai-engine "
            "model has none here; set attention = false for this model"
        )
    return merged


def _engine_options(path: Path, table: str, engine: str, value: Mapping[str, Any]) -> dict[str, Any]:
    """generate's engine flags for ``engine`` (``ENGINE_FLAGS``), each typed as its flag parses."""
    allowed = [dest for dest in ENGINE_FLAGS[engine] if dest not in _NOT_ENGINE_OPTIONS]
    options: dict[str, Any] = {}
    for name, item in value.items():
        action = flag_of("generate", name) if name in allowed else None
        if action is None:
            hint = " (the sampling seed goes in [sampling])" if name in _NOT_ENGINE_OPTIONS else ""
            raise PlanError(
                f"{where(path, table, name)}: not an option of the {engine} engine{hint} "
                f"(known: {', '.join(sorted(allowed))})"
            )
        options[name] = check_value(path, table, name, key(*flag_types(action)), item)
    return options


def _runs(path: Path, table: str, spec: ModelSpec, entry: Mapping[str, Any]) -> tuple[RunSpec, ...]:
    runs: list[RunSpec] = []
    if entry.get("plain", True):
        runs.append(RunSpec(name=spec.name, model=spec.name, ablation=None, table=table))
    for index, item in enumerate(entry.get("ablations", []), 1):
        where_ = f"{table}.ablations.{index}"
        ablation = check_table(path, where_, item, schema.ABLATION)
        if "history" in ablation:
            check_value(path, where_, "history", key(str, choices=HISTORY_MODES), ablation["history"])
        if "distractor_seed" in ablation and not ablation.get("distractor_turns"):
            raise PlanError(f"{where(path, where_, 'distractor_seed')}: needs distractor_turns")
        label = ablation.get("name") or _ablation_label(ablation)
        if not label:
            raise PlanError(f"{where(path, where_)}: an ablation changes history, distractor_turns or data")
        check_name(path, where_, "name", label)
        runs.append(
            RunSpec(
                name=f"{spec.name}-{label}",
                model=spec.name,
                ablation=label,
                table=where_,
                history=ablation.get("history", "model"),
                distractor_turns=ablation.get("distractor_turns", 0),
                distractor_seed=ablation.get("distractor_seed"),
                skip_missing_reference=ablation.get("skip_missing_reference", False),
                data=ablation.get("data"),
            )
        )
    if not runs:
        raise PlanError(f"{where(path, table, 'plain')}: plain = false and no ablation: the model has no run")
    return tuple(runs)


def _ablation_label(ablation: Mapping[str, Any]) -> str:
    parts = []
    if ablation.get("history", "model") != "model":
        parts.append(str(ablation["history"]))
    if ablation.get("distractor_turns"):
        parts.append(f"distractors{ablation['distractor_turns']}")
    if ablation.get("data"):
        parts.append(Path(ablation["data"]).stem)
    return "-".join(parts)


def _check_outputs(plan: Plan) -> None:
    names = {run.name for run in plan.runs}
    arena = plan.arena or {}
    if arena.get("baseline") is not None and arena["baseline"] not in names:
        raise PlanError(
            f"{where(plan.path, 'outputs.arena', 'baseline')}: {arena['baseline']!r} is not a run of this plan "
            f"(runs: {', '.join(sorted(names))})"
        )
    if arena.get("by") == "judge" and not all(m.judge.get("backend") for m in plan.models):
        raise PlanError(f"{where(plan.path, 'outputs.arena', 'by')}: judged battles need [judge] backend and model")


def _check_benchmark(plan: Plan) -> None:
    """Each data file's benchmark supports each run's ablation; the runs are of one benchmark (one report)."""
    datasets: dict[str | None, Any] = {}
    labelled = []
    for model in plan.models:
        for run in model.runs:
            source = run.data
            if source not in datasets:
                table, name = (run.table, "data") if source is not None else ("data", "path")
                try:
                    datasets[source] = load_dataset(
                        source if source is not None else plan.data["path"],
                        system_message=plan.data.get("system_message"),
                        task=plan.data.get("task"),
                        benchmark=plan.data.get("benchmark"),
                    )
                except SysbenchError as error:
                    raise PlanError(f"{where(plan.path, table, name)}: {error}") from None
            dataset = datasets[source]
            benchmark = dataset_benchmark(dataset)
            labelled.append((f"{run.table} ({dataset.path})", benchmark))
            try:
                benchmark.check_generation(run.history, run.distractor_turns)
            except SysbenchError as error:
                name = "distractor_turns" if run.distractor_turns and run.history in benchmark.history_modes else None
                raise PlanError(f"{where(plan.path, run.table, name or 'history')}: {error}") from None
    try:
        one_benchmark(labelled, "report")
    except SysbenchError as error:
        raise PlanError(f"{plan.path}: {error}") from None
