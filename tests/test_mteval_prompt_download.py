"""The official prompt files and documents: fetched once into the cache at the pinned commit, checked, offline in one
line.
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mteval_runs import make_mteval_run, marked

from sysbench_gpu import cli
from sysbench_gpu.benchmarks.mteval.official_prompts import (
    DOCUMENTS_FILE,
    OFFICIAL_COMMIT,
    OFFICIAL_SOURCE,
    PINNED_FILES,
    PROMPT_FILES,
    PROMPTS_ENV,
    download_prompts,
    load_official_prompts,
    prompts_folder,
)
from sysbench_gpu.core.errors import SysbenchError


def _no_network(url: str, timeout: float | None = None) -> None:
    raise urllib.error.URLError(OSError(101, "Network is unreachable"))


@pytest.fixture
def shared_prompts(mteval_data_dir: Path) -> Path:
    return mteval_data_dir.parent / "prompts"


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(PROMPTS_ENV, raising=False)
    monkeypatch.setenv("SYSBENCH_GPU_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "mteval-prompts" / OFFICIAL_COMMIT[:7]


def test_the_cache_folder_is_pinned_to_the_commit(empty_cache: Path) -> None:
    assert prompts_folder() == (empty_cache, True)


def test_offline_is_one_line(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    with pytest.raises(SysbenchError) as caught:
        load_official_prompts()
    message = str(caught.value)
    assert "\n" not in message and "could not download refinement_single_evaluation.txt" in message
    assert "Network is unreachable" in message and "Offline?" in message and PROMPTS_ENV in message
    assert not empty_cache.exists()


def test_judge_offline_says_so_in_one_line(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mteval_data_dir: Path, capsys
) -> None:
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    run = make_mteval_run(tmp_path / "fu", mteval_data_dir / "follow-up_multi.jsonl", [1], marked())
    argv = ["judge", str(run.path), "--judge", "openai", "--judge-model", "m", "--base-url", "http://127.0.0.1:9"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "could not download" in err


def test_download_from_a_local_source_checks_every_sum(
    empty_cache: Path, shared_prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "mirror"
    shutil.copytree(shared_prompts, source)
    written = download_prompts(empty_cache, source=source.as_uri() + "/")
    assert sorted(p.name for p in written) == sorted(f.filename for f in PINNED_FILES)
    assert "documents.jsonl" in {p.name for p in written}
    # Once cached, nothing is fetched again.
    monkeypatch.setattr(urllib.request, "urlopen", _no_network)
    templates = load_official_prompts()
    assert {k: t.sha256 for k, t in templates.items()} == {f.kind: f.sha256 for f in PROMPT_FILES}
    assert len(templates["expansion"].documents) == 100

    # A mirror with one altered file: refused by name, and nothing of it is written.
    elsewhere = tmp_path / "elsewhere"
    (source / "expansion_evaluation.txt").write_text("not the authors' prompt {response}", "utf-8")
    monkeypatch.undo()
    with pytest.raises(SysbenchError, match=r"expansion_evaluation\.txt: sha256 .* is not the pinned"):
        download_prompts(elsewhere, source=source.as_uri() + "/")
    assert not elsewhere.exists()


def test_a_changed_file_in_the_folder_is_refused(shared_prompts: Path, tmp_path: Path) -> None:
    folder = tmp_path / "prompts"
    shutil.copytree(shared_prompts, folder)
    with (folder / "mt-bench_evaluation.txt").open("a", encoding="utf-8") as file:
        file.write(" ")
    with pytest.raises(SysbenchError, match=r"mt-bench_evaluation\.txt: sha256 .* is not the pinned"):
        load_official_prompts(folder)
    (folder / "mt-bench_evaluation.txt").unlink()
    with pytest.raises(SysbenchError, match="no such file"):
        load_official_prompts(folder)


def test_the_documents_come_from_raw_data_beside_prompts(
    empty_cache: Path, shared_prompts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in the repository: ``prompts/`` holds the four prompt files, ``raw_data/`` the documents."""
    assert OFFICIAL_SOURCE.endswith(f"/{OFFICIAL_COMMIT}/prompts/")
    repository = tmp_path / "repository"
    (repository / "prompts").mkdir(parents=True)
    (repository / "raw_data").mkdir()
    for file in PROMPT_FILES:
        shutil.copy(shared_prompts / file.filename, repository / "prompts" / file.filename)
    shutil.copy(shared_prompts / DOCUMENTS_FILE.filename, repository / "raw_data" / DOCUMENTS_FILE.filename)
    fetched: list[str] = []
    real_urlopen = urllib.request.urlopen

    def recording(url: str, timeout: float | None = None):
        fetched.append(url)
        return real_urlopen(url, timeout=timeout)

    monkeypatch.setattr(urllib.request, "urlopen", recording)
    load_official_prompts(source=(repository / "prompts").as_uri() + "/")
    assert fetched[-1] == (repository / "raw_data" / DOCUMENTS_FILE.filename).as_uri()
    assert (empty_cache / DOCUMENTS_FILE.filename).read_bytes() == (
        shared_prompts / DOCUMENTS_FILE.filename
    ).read_bytes()


def test_a_changed_or_missing_documents_file_is_refused(shared_prompts: Path, tmp_path: Path) -> None:
    folder = tmp_path / "prompts"
    shutil.copytree(shared_prompts, folder)
    (folder / DOCUMENTS_FILE.filename).write_bytes((folder / DOCUMENTS_FILE.filename).read_bytes() + b"\n")
    with pytest.raises(SysbenchError, match=r"documents\.jsonl: sha256 .* is not the pinned"):
        load_official_prompts(folder)
    (folder / DOCUMENTS_FILE.filename).unlink()
    with pytest.raises(SysbenchError, match=r"documents\.jsonl: no such file"):
        load_official_prompts(folder)
