"""Time each step of ``make demo`` from a fresh clone: install, model conversion, generate, judge, metrics, report.

    python kernels_bench/time_demo.py                      # cold: fresh clone, every cache empty, idle
    python kernels_bench/time_demo.py --busy 1             # the same while a second process keeps one core busy
    python kernels_bench/time_demo.py --dir DIR --warm     # again in DIR, its .venv and caches kept
    python kernels_bench/time_demo.py --target demo-vllm   # another make target (the vLLM judge)

It runs the real ``make`` target and stamps every line of its output on arrival; a step starts
where make echoes its command (or where the package logs the step's first line) and ends where
the next starts:

- install: ``make``'s pip steps (the venv, CPU torch, the package, the embedded model's GGUF);
- generate: start: ``sysbench-gpu generate`` up to the conversion (its start-up);
- model conversion: the GGUF into safetensors, once (``converting ...``), and the model's load;
- generate: replies: the 25 replies;
- judge start: ``sysbench-gpu judge`` to its first round (the judge engine's start: vLLM's, or the
  hf model's load);
- judging: the rounds;
- metrics and report.

Cold (the default) means a new clone and every cache empty: ``HOME``, ``SYSBENCH_GPU_CACHE``,
``XDG_CACHE_HOME``, ``HF_HOME``, ``PIP_CACHE_DIR``, ``VLLM_CACHE_ROOT``, ``TRITON_CACHE_DIR`` and
``TORCHINDUCTOR_CACHE_DIR`` point into a new empty folder (``--drop-page-cache`` also empties
the kernel's page cache, as root). ``--busy N`` starts N processes that spin on a core each for
the whole run. Prints a table and the total, and with ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_VARIABLES = (
    "SYSBENCH_GPU_CACHE",
    "XDG_CACHE_HOME",
    "HF_HOME",
    "PIP_CACHE_DIR",
    "VLLM_CACHE_ROOT",
    "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
)
# (step, pattern of the line that starts it), in the order they happen.
MARKERS = (
    ("install", re.compile(r"-m venv |pip install")),
    ("generate: start", re.compile(r"sysbench-gpu generate ")),
    ("model conversion", re.compile(r"converting .+ to safetensors")),
    ("generate: replies", re.compile(r"generating \d+ replies")),
    ("judge start", re.compile(r"sysbench-gpu judge ")),
    ("judging", re.compile(r"judge round 1:")),
    ("metrics", re.compile(r"sysbench-gpu metrics ")),
    ("report", re.compile(r"sysbench-gpu report ")),
)


def cold_environment(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(root / "home")
    for name in CACHE_VARIABLES:
        env[name] = str(root / "caches" / name.lower())
    for value in [env["HOME"], *(env[name] for name in CACHE_VARIABLES)]:
        Path(value).mkdir(parents=True, exist_ok=True)
    return env


def spin(cores: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]


def stamped_run(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[int, list[tuple[float, str]]]:
    """Run ``command``, stamping each output line with seconds since its start."""
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert process.stdout is not None
        for line in process.stdout:
            stamp = time.monotonic() - started
            lines.append((stamp, line.rstrip("\n")))
            out.write(f"{stamp:8.1f} {line}")
            out.flush()
        code = process.wait()
    lines.append((time.monotonic() - started, "<end>"))
    return code, lines


def split_steps(lines: list[tuple[float, str]]) -> list[tuple[str, float]]:
    """Each step's seconds: from the first line matching its marker to the next step's start."""
    starts: list[tuple[str, float]] = []
    seen: set[str] = set()
    for stamp, text in lines:
        for step, pattern in MARKERS:
            if step not in seen and pattern.search(text):
                seen.add(step)
                starts.append((step, stamp))
                break
    starts.sort(key=lambda item: item[1])
    end = lines[-1][0]
    ends = [stamp for _, stamp in starts[1:]] + [end]
    return [(step, round(finish - stamp, 1)) for (step, stamp), finish in zip(starts, ends, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--repo", default=str(REPO_ROOT), help="what to clone (default: this repository)")
    parser.add_argument("--dir", help="run in this checkout instead of a new clone")
    parser.add_argument("--warm", action="store_true", help="keep the checkout's .venv and the caches under --dir")
    parser.add_argument("--target", default="demo", help="the make target (default demo)")
    parser.add_argument("--busy", type=int, default=0, metavar="N", help="keep N cores busy meanwhile")
    parser.add_argument("--drop-page-cache", action="store_true", help="empty the kernel's page cache first (root)")
    parser.add_argument("--json", help="write the steps and the total here")
    args = parser.parse_args(argv)

    root = Path(args.dir).resolve().parent if args.dir else Path(tempfile.mkdtemp(prefix="time-demo-"))
    checkout = Path(args.dir).resolve() if args.dir else root / "clone"
    if not args.dir:
        subprocess.run(["git", "clone", "-q", args.repo, str(checkout)], check=True)
    elif not args.warm:
        subprocess.run(["rm", "-rf", str(checkout / ".venv"), str(checkout / "demo-run")], check=True)
    env = cold_environment(root)
    subprocess.run(["make", "-s", "clean-demo"], cwd=checkout, env=env, check=False)
    if args.drop_page_cache:
        subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)
    spinners = spin(args.busy)
    try:
        code, lines = stamped_run(["make", args.target], checkout, env, root / f"make-{args.target}.log")
    finally:
        for spinner in spinners:
            spinner.kill()
    steps = split_steps(lines)
    total = round(lines[-1][0], 1)
    condition = f"{'warm' if args.warm else 'cold'}, {'idle' if not args.busy else f'{args.busy} core(s) busy'}"
    print(f"\nmake {args.target} in {checkout} ({condition}): exit {code}, {total:.1f} s")
    for step, seconds in steps:
        print(f"  {step:<18}{seconds:8.1f} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"target": args.target, "condition": condition, "exit": code, "total_s": total, "steps": dict(steps)},
                indent=2,
            ),
            encoding="utf-8",
        )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
