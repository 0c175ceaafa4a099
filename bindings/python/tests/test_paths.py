"""Store paths: NUL bytes, bytes and os.PathLike paths, a file, a FIFO or a
missing directory where a store belongs, and FIFOs planted inside a store."""
import os
import subprocess

import pytest

import kvx
from conftest import GEOM, run_child


# PROMISE: PY-10
def test_paths(tmp_path):
    with pytest.raises(ValueError, match="null"):
        kvx.Store.create(str(tmp_path / "a\x00b"), **GEOM)
    with pytest.raises(ValueError, match="null"):
        kvx.Store.open(b"/tmp/a\x00b")
    with pytest.raises(TypeError):
        kvx.Store.open(123)
    st = kvx.Store.create(os.fsencode(str(tmp_path / "bytes")), **GEOM, nosync=True)
    st.close()
    kvx.Store.open(tmp_path / "bytes").close()  # os.PathLike
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(kvx.Error) as e:
        kvx.Store.open(str(tmp_path / "file"))
    assert e.value.name == "ENOTDIR"
    with pytest.raises(kvx.Error) as e:
        kvx.Store.create(str(tmp_path / "file"), **GEOM)
    assert e.value.name == "EEXIST"
    os.mkfifo(str(tmp_path / "fifo"))
    with pytest.raises(kvx.Error) as e:
        kvx.Store.open(str(tmp_path / "fifo"))
    assert e.value.name == "ENOTDIR"
    with pytest.raises(kvx.Error):
        kvx.Store.open(str(tmp_path / "missing"))
    with pytest.raises(kvx.Error):
        kvx.Store.create(str(tmp_path / "bytes"), **GEOM)  # exists already


# PROMISE: RECOVER-16, PY-10
@pytest.mark.parametrize("name", ["STORE", "TIER"])
def test_fifo_in_store_dir_does_not_hang(tmp_path, name):
    # A FIFO planted as DIR/STORE hung Store.open for good (a blocking
    # open, GIL released, not interruptible). Now: STORE refuses with
    # EPATH; a TIER that is not a regular file is no tier for the handle,
    # never a failed open (docs/TIER.md). C: tests/engine/recover.c
    # test_fifo_where_store_files_belong.
    d = str(tmp_path / "s")
    kvx.Store.create(d, **GEOM, nosync=True).close()
    if os.path.exists(os.path.join(d, name)):
        os.rename(os.path.join(d, name), os.path.join(d, name + ".old"))
    os.mkfifo(os.path.join(d, name))
    try:
        rc, out = run_child(f"import kvx\ntry:\n    kvx.Store.open({d!r}, readonly=True).close()\n    print('OPEN')\n"
                            f"except kvx.Error as e:\n    print('ERR', e.name)\n", timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"Store.open hangs on a FIFO named {name}")
    assert rc == 0, out
    assert ("ERR KVX_EPATH" if name == "STORE" else "OPEN") in out, out
