"""The benchmarks' results documents: what their stamp names, where they land, and the
index page that gathers them."""

import datetime
import doctest
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import publish, report  # noqa: E402
from benchmarks.report import RunStamp, write_results  # noqa: E402


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c",
                           "user.email=t@t", *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_stamp_names_command_date_machine_versions_and_commit():
    stamp = RunStamp.now(["benchmarks/fuzz.py", "--n", "10"])
    assert stamp.command.endswith("benchmarks/fuzz.py --n 10")
    assert "python" in stamp.command.split()[0]
    written = datetime.datetime.strptime(stamp.date, report.DATE_FORMAT)
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    assert abs((now - written).total_seconds()) < 60
    assert report.cpu_model() in stamp.machine
    assert f"{torch.get_num_threads()} torch thread" in stamp.machine
    assert " cores" in stamp.machine
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = "not installed"
    assert stamp.software == (f"python {platform.python_version()}, torch "
                              f"{torch.__version__}, triton {triton}")
    assert stamp.commit.startswith(_git(report.ROOT, "rev-parse", "--short=12", "HEAD"))
    assert stamp.commit.endswith(("(clean tree)", "(dirty tree)"))


def test_the_stamp_names_the_gpu_of_a_cuda_run(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H200")
    assert report.machine("cuda").startswith("NVIDIA H200 GPU; host ")
    assert "GPU" not in report.machine("cpu")


def test_the_commit_says_whether_the_tree_was_dirty(tmp_path, monkeypatch):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "a")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    head = _git(tmp_path, "rev-parse", "--short=12", "HEAD")
    (tmp_path / "untracked.md").write_text("results\n")
    assert report.commit() == f"{head} (clean tree)"
    (tmp_path / "a.py").write_text("x = 2\n")
    assert report.commit() == f"{head} (dirty tree)"
    monkeypatch.setattr(report, "ROOT", tmp_path / "missing")
    assert report.commit().startswith("unknown")


def test_a_written_document_holds_title_stamp_body_and_plot_links(tmp_path, capsys):
    plot = tmp_path / "plots" / "speed.svg"
    path = write_results("demo", "A demo", "| a |\n|---|\n| 1 |", out=tmp_path / "demo.md",
                         plots=[plot], argv=["benchmarks/demo.py", "--x", "1"])
    assert path == tmp_path / "demo.md"
    assert f"written to {path}" in capsys.readouterr().out
    text = path.read_text()
    assert text.startswith("# A demo\n\n- command: `")
    stamp = RunStamp.from_markdown(text)
    assert stamp is not None and stamp.command.endswith("benchmarks/demo.py --x 1")
    assert "\n| a |\n|---|\n| 1 |\n" in text
    assert text.endswith("![speed](plots/speed.svg)\n")


def test_a_document_lands_in_the_results_folder_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    path = write_results("stability/formulas", "Formulas", "body")
    assert path == tmp_path / "stability" / "formulas.md"
    assert RunStamp.from_markdown(path.read_text()) is not None


def test_the_index_gathers_every_document_newest_first(tmp_path, monkeypatch):
    older = RunStamp("python a.py", "2026-01-01 00:00:00 UTC", "cpu", "python", "abc")
    newer = RunStamp("python b.py", "2026-02-01 00:00:00 UTC", "cpu", "python", "abc")
    (tmp_path / "stability").mkdir()
    (tmp_path / "a.md").write_text(f"# Older\n\n{older.markdown()}\n\n| t |\n")
    (tmp_path / "stability" / "b.md").write_text(f"# Newer\n\n{newer.markdown()}\n")
    (tmp_path / "by_hand.md").write_text("| no stamp |\n")
    path = publish.main([str(tmp_path)])
    assert path == tmp_path / "index.md"
    text = path.read_text()
    assert RunStamp.from_markdown(text).command.endswith(f"publish.py {tmp_path}")
    body = text[text.index("## "):]
    assert body.index("[Newer](stability/b.md)") < body.index("[Older](a.md)") \
        < body.index("[by_hand](by_hand.md)")
    assert newer.markdown() in body and older.markdown() in body
    assert "- not stamped" in body
    publish.main([str(tmp_path)])  # again: the index does not list itself
    assert "index.md)" not in path.read_text()


@pytest.mark.parametrize("module", [report, publish])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0
