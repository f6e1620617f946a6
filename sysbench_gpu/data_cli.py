"""The `data` command: download the official SysBench file (or MT-Eval's task files), validate and describe data files.

The data model, loader and statistics live in ``data.py``; this module only adds the network
fetch (sha256 checked before anything is written) and the command line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from sysbench_gpu.data import (
    OFFICIAL_COMMIT,
    OFFICIAL_FILENAME,
    OFFICIAL_PATH,
    OFFICIAL_REPO,
    OFFICIAL_SHA256,
    OFFICIAL_URL,
    dataset_stats,
    format_stats,
    load_dataset,
)
from sysbench_gpu.errors import SysbenchError

# ---------------------------------------------------------------- download


def download_official(dest: Path, url: str = OFFICIAL_URL, timeout: float = 60.0) -> Path:
    """Fetch the official file at the pinned commit and verify its sha256 before keeping it."""
    import urllib.error
    import urllib.request

    dest = Path(dest)
    target = dest / OFFICIAL_FILENAME if dest.is_dir() or not dest.suffix else dest
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (fixed https URL)
            payload = response.read()
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise SysbenchError(
            f"could not download {url}: {reason}. Offline? Copy {OFFICIAL_PATH} from {OFFICIAL_REPO} "
            f"at commit {OFFICIAL_COMMIT} and pass its path with --data."
        ) from None
    digest = hashlib.sha256(payload).hexdigest()
    if digest != OFFICIAL_SHA256:
        raise SysbenchError(f"downloaded {url} but its sha256 is {digest}, expected {OFFICIAL_SHA256}; nothing written")
    partial = target.with_suffix(target.suffix + ".part")
    partial.write_bytes(payload)
    partial.replace(target)
    return target


# ---------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="download, validate and describe SysBench or MT-Eval data")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION")

    download = data_sub.add_parser(
        "download", help="fetch the official SysBench file (sha256 checked) or MT-Eval's task files (Hugging Face hub)"
    )
    download.add_argument("--benchmark", choices=("sysbench", "mteval"), default="sysbench")
    download.add_argument("--out", default="data", help="directory or file path (default: ./data)")
    download.add_argument("--url", default=OFFICIAL_URL, help="SysBench: mirror URL; the checksum is still enforced")
    download.add_argument("--tasks", help="MT-Eval: comma-separated configs, e.g. refinement_multi (default: all)")
    download.add_argument("--revision", help="MT-Eval: dataset revision on the hub (default: main)")
    download.set_defaults(func=_cmd_download)

    stats = data_sub.add_parser("stats", help="print statistics of a data file (SysBench Table 1, or MT-Eval counts)")
    stats.add_argument("file", help="data file or directory")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.add_argument("--task", help="MT-Eval: the task, when the file name does not say (e.g. refinement_multi)")
    stats.set_defaults(func=_cmd_stats)

    validate = data_sub.add_parser("validate", help="validate a data file and say whether it is the official one")
    validate.add_argument("file", help="data file or directory")
    validate.set_defaults(func=_cmd_validate)
    data.set_defaults(func=lambda args: data.print_help() or 2)


def _cmd_download(args: argparse.Namespace) -> int:
    if args.benchmark == "mteval":
        from sysbench_gpu.mteval.data import HF_CONFIGS, HF_DATASET, download_mteval

        configs = [c.strip() for c in args.tasks.split(",") if c.strip()] if args.tasks else list(HF_CONFIGS)
        for target in download_mteval(Path(args.out), configs, revision=args.revision):
            print(f"wrote {target} (Hugging Face dataset {HF_DATASET})")
        return 0
    target = download_official(Path(args.out), url=args.url)
    print(f"wrote {target} (sha256 {OFFICIAL_SHA256}, official)")
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
    dataset = load_dataset(args.file, task=args.task)
    if dataset.benchmark == "mteval":
        from sysbench_gpu.mteval.data import format_mteval_stats, mteval_stats

        stats = mteval_stats(dataset.sessions)
        if args.json:
            json.dump({**stats, "sha256": dataset.sha256}, sys.stdout, ensure_ascii=False, indent=2)
            print()
        else:
            print(format_mteval_stats(stats, dataset.path, dataset.sha256))
        return 0
    stats = dataset_stats(dataset.sessions)
    if args.json:
        stats = {**stats, "sha256": dataset.sha256, "is_official": dataset.is_official}
        json.dump(stats, sys.stdout, ensure_ascii=False, indent=2)
        print()
    else:
        print(format_stats(stats, dataset))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    dataset = load_dataset(args.file)
    if dataset.benchmark == "mteval":
        tasks = ", ".join(sorted({s.task or "?" for s in dataset.sessions}))
        print(f"{dataset.path}: {len(dataset.sessions)} MT-Eval dialogues ({tasks}), valid (sha256 {dataset.sha256})")
        return 0
    status = "the official file" if dataset.is_official else "valid, but not the official file"
    print(f"{dataset.path}: {len(dataset.sessions)} sessions, {status} (sha256 {dataset.sha256})")
    return 0
