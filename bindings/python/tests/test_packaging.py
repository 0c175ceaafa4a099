"""The package as pip installs it (pyproject.toml, bindings/python/backend):
its metadata, stubs and py.typed, the extension's ABI tag, and what the
extension needs at run time (nothing beyond glibc and the wheel's own
kvx.libs), read from its ELF dynamic section here, with no ldd. Tests of an
installed wheel skip, with the reason, where kvx runs from the build tree."""
import ast
import importlib.metadata
import os
import struct
import sys

import pytest

import kvx

PKG = os.path.dirname(os.path.abspath(kvx.__file__))
EXT = os.path.abspath(kvx._kvx.__file__)
LIBS = os.path.join(os.path.dirname(PKG), "kvx.libs")
CHECKOUT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GLIBC = {"ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
         "libutil.so.1", "libresolv.so.2"}


def installed():
    try:
        return importlib.metadata.distribution("kvx")
    except importlib.metadata.PackageNotFoundError:
        return None


needs_install = pytest.mark.skipif(installed() is None, reason="kvx runs from the build tree (PYTHONPATH), "
                                   "not installed: no metadata to check")


def elf_dynamic(path):
    """(DT_NEEDED names, DT_RUNPATH or DT_RPATH) of an ELF64 little-endian shared object."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not an ELF64 little-endian file"
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
    assert dynamic, "no dynamic section"
    entries = [struct.unpack_from("<qQ", data, dynamic[0] + 16 * i) for i in range(dynamic[1] // 16)]
    strtab_vaddr = next(v for t, v in entries if t == 5)  # DT_STRTAB
    strtab = next(off + strtab_vaddr - va for va, off, n in loads if va <= strtab_vaddr < va + n)

    def string(at):
        return data[strtab + at:data.index(b"\0", strtab + at)].decode()

    needed = [string(v) for t, v in entries if t == 1]  # DT_NEEDED
    paths = [string(v) for t, v in entries if t in (29, 15)]  # DT_RUNPATH, DT_RPATH
    return needed, (paths[0] if paths else None)


def test_version_is_the_c_librarys():
    assert kvx.__version__ == kvx.version() and kvx.__version__.count(".") == 2


@needs_install
def test_installed_metadata():
    d = installed()
    md = d.metadata
    assert d.version == kvx.__version__  # the one version: include/kvx.h's, through the backend
    assert md["Name"] == "kvx" and md["Requires-Python"] == ">=3.10"
    assert md["License"] and md["Summary"]
    assert md["Description-Content-Type"].startswith("text/markdown")
    assert md.get_payload().startswith("# kvx\n")  # README.md as the long description
    assert "Programming Language :: Python :: 3.13" in md.get_all("Classifier")


def test_stubs_and_py_typed_ship_with_the_package():
    for f in ("py.typed", "__init__.pyi", "_kvx.pyi"):
        assert os.path.isfile(os.path.join(PKG, f)), f


def test_stubs_name_every_public_name_of_the_extension():
    """_kvx.pyi has a class, function or constant for each public name of kvx._kvx and no other; each class
    stub names each public attribute of its class."""
    with open(os.path.join(PKG, "_kvx.pyi"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    stubbed, members = set(), {}
    for n in tree.body:
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)):
            stubbed.add(n.name)
            if isinstance(n, ast.ClassDef):
                members[n.name] = {m.name for m in n.body if isinstance(m, ast.FunctionDef)} | {
                    m.target.id for m in n.body if isinstance(m, ast.AnnAssign)}
        elif isinstance(n, ast.AnnAssign):
            stubbed.add(n.target.id)
    public = {n for n in dir(kvx._kvx) if not n.startswith("_")}
    private = {n for n in stubbed if n.startswith("_")}  # the stub's own helper types
    assert stubbed - private == public
    for cls in ("Store", "Batch", "View"):
        attrs = {a for a in dir(getattr(kvx, cls)) if not a.startswith("__")} | {"__enter__", "__exit__"}
        assert attrs <= members[cls], (cls, attrs - members[cls])


def test_extension_abi_tag():
    """One abi3 extension for 3.11 and later (the stable ABI), a cpython-310 one for 3.10."""
    name = os.path.basename(EXT)
    if sys.version_info >= (3, 11):
        assert name == "_kvx.abi3.so"
    else:
        assert name == "_kvx.cpython-%d%d-x86_64-linux-gnu.so" % sys.version_info[:2]


@pytest.mark.skipif(not os.path.isdir(LIBS), reason="no kvx.libs beside the package: kvx runs from the build tree "
                    "or an editable install, whose extension links the system's libraries")
def test_extension_needs_only_glibc_and_its_own_libraries():
    """The wheel's extension: DT_NEEDED names glibc's libraries and kvx.libs' files only, found through its
    RUNPATH $ORIGIN/../kvx.libs, and so does each of those files (their sonames are unique: name-HASH.so)."""
    needed, runpath = elf_dynamic(EXT)
    own = set(os.listdir(LIBS))
    assert set(needed) <= GLIBC | own, set(needed) - GLIBC - own
    assert runpath == "$ORIGIN/../kvx.libs"
    for lib in own:
        assert "-" in lib.split(".so")[0], lib  # renamed: never the system's copy by soname
        sub, _ = elf_dynamic(os.path.join(LIBS, lib))
        assert set(sub) <= GLIBC | own, (lib, set(sub) - GLIBC - own)
    # loaded from there: the process maps kvx.libs' copies (Linux)
    maps = open("/proc/self/maps").read()
    for lib in own:
        if lib in needed:
            assert os.path.join(os.path.realpath(LIBS), lib) in maps, lib


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10 has no tomllib to compare with")
@pytest.mark.skipif(not os.path.isfile(os.path.join(CHECKOUT, "pyproject.toml")),
                    reason="the tests run without the checkout here (no pyproject.toml beside them)")
def test_backend_reads_pyproject_as_tomllib_does():
    """The backend's TOML subset reader (for Python 3.10, which has no tomllib) reads pyproject.toml exactly as
    tomllib does, so the metadata of a cp310 wheel is the abi3 wheel's."""
    sys.path.insert(0, os.path.join(CHECKOUT, "bindings", "python", "backend"))
    try:
        import kvx_build_backend as backend
    finally:
        sys.path.pop(0)
    path = os.path.join(CHECKOUT, "pyproject.toml")
    assert backend.read_pyproject(path, use_tomllib=False) == backend.read_pyproject(path)
