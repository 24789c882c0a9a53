"""Every adapter file is verified before use: `export` refuses a damaged checkpoint naming the
file, an eval cell on one fails in one line naming it, `--out` inside the folder it copies is
refused, and a target that cannot be written is one line, not a traceback."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from gridrun.cellrun import run_cell
from gridrun.export import ExportError, export
from gridrun.seam.rundir import RunDir
from tests.conftest import make_cell

pytestmark = pytest.mark.usefixtures("toy_world")
TRAIN = {"total_steps": 2, "val_every": 1, "save_every": 1, "batch_problems": 2, "ppo_mini_batch": 2, "val_problems": 4}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cell = make_cell(tmp_path_factory.mktemp("adapters"), "sa_rl-toy-arith-s0", cell={"kind": "sa_rl"},
                     workflow={"name": "single"}, train=TRAIN)
    assert run_cell(cell) == 0
    return cell


@pytest.fixture
def cell(trained: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "runs" / trained.name
    shutil.copytree(trained, copy)
    return copy


def _weights(cell: Path) -> Path:
    (path,) = (cell / "checkpoints" / "step_000002" / "adapters").glob("*/adapter_model.safetensors")
    return path


def test_export_refuses_a_truncated_adapter_naming_it(cell: Path, tmp_path: Path) -> None:
    weights = _weights(cell)
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ExportError) as refused:
        export(RunDir(cell), "last", tmp_path / "out")
    assert "\n" not in str(refused.value) and str(weights) in str(refused.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.tmp").exists()


@pytest.mark.parametrize("damage", [b"", b"\x08\x00\x00\x00\x00\x00\x00\x00{notjson", b"\xff" * 8])
def test_export_refuses_a_garbled_header(cell: Path, tmp_path: Path, damage: bytes) -> None:
    weights = _weights(cell)
    weights.write_bytes(damage)
    with pytest.raises(ExportError, match="is damaged"):
        export(RunDir(cell), "last", tmp_path / "out")


def test_an_eval_cell_on_a_corrupt_adapter_fails_in_one_line_naming_it(cell: Path) -> None:
    weights = _weights(cell)
    weights.write_bytes(weights.read_bytes()[:1000])
    ev = make_cell(cell.parent, "eval-corrupt", cell={"kind": "eval"}, workflow={"name": "single"},
                   policy={"name": "transfer", "adapters": {"generator": f"{cell.name}@last"}})
    assert run_cell(ev) == 1
    error = RunDir(ev).read_state().to_json()["error"]
    assert "\n" not in error and str(weights) in error


def test_export_out_inside_the_adapter_folder_is_refused(cell: Path) -> None:
    inside = _weights(cell).parent / "copy"
    with pytest.raises(ExportError, match="inside"):
        export(RunDir(cell), "last", inside)
    assert not inside.exists()


def test_a_target_that_cannot_be_written_is_one_line(cell: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ExportError) as refused:
        export(RunDir(cell), "last", Path("/proc/gridrun-export"))
    assert "\n" not in str(refused.value) and "/proc" in str(refused.value)

    def full(src: object, dst: object, **kw: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(shutil, "copytree", full)
    with pytest.raises(ExportError, match="No space left on device") as refused:
        export(RunDir(cell), "last", tmp_path / "out")
    assert "\n" not in str(refused.value) and "free space" in str(refused.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.tmp").exists()
