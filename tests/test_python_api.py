"""``sysbench_gpu.api``: cheap to import, each function its verb's, and docs/python-api.md's example runs."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sysbench_gpu.api as api
from sysbench_gpu.attention import api as attention_api
from sysbench_gpu.core.errors import SysbenchError
from sysbench_gpu.generation import api as generation_api
from sysbench_gpu.judging import api as judging_api
from sysbench_gpu.plans import api as plans_api
from sysbench_gpu.reporting import api as reporting_api

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "python-api.md"
HEAVY = ("torch", "transformers", "vllm", "openai", "sklearn", "matplotlib")


def test_importing_the_package_and_the_api_loads_no_model_library() -> None:
    code = (
        "import json, sys\n"
        "import sysbench_gpu\n"
        "bare = [m for m in HEAVY if m in sys.modules]\n"
        "import sysbench_gpu.api\n"
        "print(json.dumps([bare, [m for m in HEAVY if m in sys.modules]]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n" + code], capture_output=True, text=True, timeout=120, check=True
    )
    bare, with_api = json.loads(done.stdout)
    assert bare == [] and with_api == []


def test_each_function_lives_in_its_stage_and_is_typed_and_documented() -> None:
    homes = {
        "run_plan": plans_api,
        "generate": generation_api,
        "judge": judging_api,
        "judge_estimate": judging_api,
        "metrics": reporting_api,
        "report": reporting_api,
        "attention": attention_api,
    }
    for name, module in homes.items():
        function = getattr(api, name)
        assert function is getattr(module, name)
        assert function.__doc__ and len(function.__doc__.split()) > 10
        signature = inspect.signature(function)
        assert signature.return_annotation is not inspect.Signature.empty
        for parameter in signature.parameters.values():
            assert parameter.annotation is not inspect.Parameter.empty, (name, parameter.name)


def test_an_option_the_verb_does_not_have_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SysbenchError, match=r"^generate: no option 'batchsize'$"):
        api.generate("demo", model="smollm2", engine="hf", out=tmp_path / "run", options={"batchsize": 8})
    assert not (tmp_path / "run").exists()
    with pytest.raises(SysbenchError, match="--max-tokens must be"):
        api.generate("demo", model="smollm2", engine="hf", out=tmp_path / "run", max_tokens=0)
    with pytest.raises(SysbenchError, match="no such run directory"):
        api.judge(tmp_path / "missing", backend="hf", model="smollm2")
    with pytest.raises(SysbenchError, match="judge needs both --judge"):
        api.judge_estimate(tmp_path, backend="hf")


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert blocks, f"{DOC} has no python block"
    return blocks[0]


@pytest.mark.slow
def test_docs_example_runs(tmp_path: Path, smollm2_path: str) -> None:
    """The first example of docs/python-api.md, run as it is (one demo session, replies of 8 tokens)."""
    script = tmp_path / "example.py"
    script.write_text(_example(), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "5 replies (5 new)"
    assert re.fullmatch(r"judge: 5 requests, ~\d+ prompt tokens", lines[1])
    assert lines[2] == "judged 5 turns with 5 requests"
    assert re.fullmatch(r"CSR \d+\.\d% {2}ISR \d+\.\d% {2}SSR \d+\.\d% \[\d+\.\d%, \d+\.\d%\]", lines[3])
    assert lines[4] == "report: api-demo/report/report.md"
    run = tmp_path / "api-demo" / "smollm2"
    manifest = json.loads((run / "manifest.json").read_text())
    # What the verb would have written: the same stages, the sampling as given, no plan.
    assert manifest["stages"]["generate"]["sampling"] == {"max_tokens": 8}
    assert manifest["stages"]["judge"]["status"] == "complete" and "plan" not in manifest
    assert (tmp_path / "api-demo" / "report" / "report.json").is_file()
