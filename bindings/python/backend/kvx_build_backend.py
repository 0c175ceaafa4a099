"""kvx_build_backend - the PEP 517 build backend of the kvx Python package
(pyproject.toml at the repository root names it, with backend-path).

Why a backend of its own: it has no build requirements, so `pip install .`
builds the same way online and offline, with any CPython from 3.10 on
(pyenv's 3.12 and 3.13 have no setuptools, and only Debian's packages are
reachable here), and pip never has to fetch setuptools, scikit-build or
cmake from an index. It uses the standard library and the tools the C
library needs anyway: cmake, a C compiler, binutils, and patchelf for the
wheel's vendored libraries (bindings/python/README.md, "Packaging").

What each hook does:

- build_wheel: configures the checkout with CMake for the running
  interpreter (KVX_PYTHON_STANDALONE=ON: libkvx's objects and the static
  liburing, libcrypto and hiredis inside the extension, their symbols
  hidden), builds the target kvx_python, strips its debug info, copies
  every shared library it needs beyond glibc (Debian ships ISA-L, libnuma
  and LMDB only as PIC-less archives or shared objects) into kvx.libs/
  under a unique soname, points the extension's RUNPATH at them
  ($ORIGIN/../kvx.libs), checks with ldd that nothing else is needed, and
  zips the wheel: cp311-abi3 on 3.11 and later (Py_LIMITED_API), cpXY-cpXY
  on 3.10, platform linux_x86_64 (no manylinux claim: no auditwheel here).
- build_editable (PEP 660): the same build in BUILD/editable-<tag> (kept
  between installs), and a wheel holding a .pth and a finder that import
  kvx from the checkout's bindings/python/kvx and its extension from
  that build directory: Python edits apply at once, C edits at the next
  `pip install -e .`.
- build_sdist: the sources the wheel is built from, with PKG-INFO.

Settings (pip --config-settings KEY=VALUE, or the environment):
  build-dir / KVX_BUILD_DIR   where CMake builds (default: a temporary
                              directory; editable: build-py/ in the checkout)
  jobs / KVX_BUILD_JOBS       parallel compile jobs (default: the CPU count)
"""
import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

ROOT = os.path.abspath(os.getcwd())  # PEP 517: hooks run in the source tree's root
PY_DIR = os.path.join(ROOT, "bindings", "python")

# What glibc provides (and every Linux has): the extension may need these
# and nothing else from the system.
GLIBC = {"linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2",
         "librt.so.1", "libutil.so.1", "libresolv.so.2"}

# The sdist: what build_wheel needs (the C library, its CMake files, the
# binding) and the documents the metadata points at.
SDIST_PATHS = ["pyproject.toml", "README.md", "CMakeLists.txt", "kvx.pc.in", "include", "common", "format", "index",
               "engine", "io", "tier", "transfer", "cli", "bindings/python", "bindings/go/transfer/kvxd.cmake",
               "docs/ENGINES.md", "docs/kvx.1", "docs/kvx.bash", "scripts/install-deps.sh"]
SKIP = re.compile(r"(^|/)(__pycache__|\.pytest_cache)(/|$)|\.(pyc|o|so)$")


def log(msg):
    print("kvx_build_backend: " + msg, file=sys.stderr, flush=True)


# ---- metadata ------------------------------------------------------------------------------------------------------

def version():
    """The C library's version (include/kvx.h KVX_VERSION_STRING): the one place it is written."""
    with open(os.path.join(ROOT, "include", "kvx.h"), encoding="utf-8") as f:
        m = re.search(r'^#define KVX_VERSION_STRING "([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("include/kvx.h has no KVX_VERSION_STRING")
    return m.group(1)


def _toml_value(text):
    """One value of the TOML subset pyproject.toml uses: a basic string, an array of them, an inline table of
    them. (Python 3.10 has no tomllib, and a backend without requirements cannot import tomli.)"""
    text = text.strip()
    if text.startswith("{"):
        out = {}
        for m in re.finditer(r'([A-Za-z0-9_-]+)\s*=\s*("(?:[^"\\]|\\.)*")', text):
            out[m.group(1)] = _toml_value(m.group(2))
        return out
    if text.startswith("["):
        return [_toml_value(m.group(0)) for m in re.finditer(r'"(?:[^"\\]|\\.)*"', text)]
    if text.startswith('"'):
        return text[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    raise ValueError("pyproject.toml: a value this backend does not read: " + text)


def read_pyproject(path=None, use_tomllib=True):
    """pyproject.toml as {table name: {key: value}}, with tomllib where there is one, else the subset reader
    (tests/test_packaging.py checks that both read the same)."""
    path = path or os.path.join(ROOT, "pyproject.toml")
    if use_tomllib:
        try:
            import tomllib
        except ModuleNotFoundError:
            pass
        else:
            with open(path, "rb") as f:
                return tomllib.load(f)
    tables, table, pending = {}, None, ""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split(" #")[0].rstrip() if not line.lstrip().startswith("#") else ""
            if pending:
                pending += " " + line
                if pending.count("[") == pending.count("]") and pending.count("{") == pending.count("}"):
                    key, value = pending.split("=", 1)
                    table[key.strip()] = _toml_value(value)
                    pending = ""
                continue
            if not line.strip():
                continue
            m = re.match(r"^\[([A-Za-z0-9_.-]+)\]$", line.strip())
            if m:
                table = tables
                for part in m.group(1).split("."):
                    table = table.setdefault(part, {})
                continue
            key, value = line.split("=", 1)
            if value.count("[") != value.count("]") or value.count("{") != value.count("}"):
                pending = line
                continue
            table[key.strip()] = _toml_value(value)
    return tables


def metadata():
    """Core metadata 2.1 (METADATA, PKG-INFO) from pyproject.toml's [project] and the C library's version."""
    p = read_pyproject()["project"]
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + version(), "Summary: " + p["description"]]
    if "license" in p:
        lines.append("License: " + p["license"]["text"])
    if p.get("keywords"):
        lines.append("Keywords: " + ",".join(p["keywords"]))
    for c in p.get("classifiers", []):
        lines.append("Classifier: " + c)
    for name, url in p.get("urls", {}).items():
        lines.append("Project-URL: %s, %s" % (name, url))
    lines.append("Requires-Python: " + p["requires-python"])
    readme = p.get("readme")
    body = ""
    if readme:
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
        lines.append("Description-Content-Type: text/markdown; charset=UTF-8")
    return "\n".join(lines) + "\n\n" + body


def _dist_info():
    return "kvx-%s.dist-info" % version()


def _write_metadata_dir(metadata_directory):
    d = os.path.join(metadata_directory, _dist_info())
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(metadata())
    return _dist_info()


# ---- hooks without a build -----------------------------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_metadata_dir(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _write_metadata_dir(metadata_directory)


# ---- the build -------------------------------------------------------------------------------------------------------

def _setting(config_settings, key, env):
    v = (config_settings or {}).get(key)
    return v if v not in (None, "") else os.environ.get(env) or None


def wheel_tag():
    if sys.implementation.name != "cpython":
        raise RuntimeError("kvx's extension is for CPython (this is %s)" % sys.implementation.name)
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    if sys.version_info >= (3, 11):
        return "cp311-abi3-" + plat  # Py_LIMITED_API 0x030B0000: every CPython from 3.11 on
    if sys.version_info >= (3, 10):
        v = "cp%d%d" % sys.version_info[:2]
        return "%s-%s-%s" % (v, v, plat)
    raise RuntimeError("kvx needs Python 3.10 or later (this is %d.%d)" % sys.version_info[:2])


def _run(cmd, **kw):
    log("$ " + " ".join(cmd))
    try:
        subprocess.run(cmd, check=True, stdout=sys.stderr, **kw)
    except FileNotFoundError:
        raise RuntimeError("kvx: %s not found: building kvx needs cmake, a C compiler, binutils, patchelf and the C "
                           "library's dependencies (scripts/install-deps.sh installs them on Debian 12)" % cmd[0])


def _cmake_build(build_dir, config_settings):
    jobs = _setting(config_settings, "jobs", "KVX_BUILD_JOBS") or str(os.cpu_count() or 1)
    _run(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DKVX_BUILD_TESTS=OFF",
          "-DKVX_BUILD_BENCH=OFF", "-DKVX_BUILD_FUZZERS=OFF", "-DKVX_SANITIZE=OFF", "-DKVX_WITH_CUDA=OFF",
          "-DKVX_BUILD_PYTHON=ON", "-DKVX_PYTHON_STANDALONE=ON", "-DPython3_EXECUTABLE=" + sys.executable])
    _run(["cmake", "--build", build_dir, "--target", "kvx_python", "-j", jobs])
    ext_dir = os.path.join(build_dir, "python", "kvx")
    exts = [f for f in os.listdir(ext_dir) if f.startswith("_kvx.") and f.endswith(".so")]
    want = ".abi3.so" if sys.version_info >= (3, 11) else sysconfig.get_config_var("EXT_SUFFIX")
    exts = [f for f in exts if f.endswith(want)]
    if len(exts) != 1:
        raise RuntimeError("kvx: the build made no _kvx*%s in %s" % (want, ext_dir))
    return os.path.join(ext_dir, exts[0])


def _needed(path):
    out = subprocess.run(["patchelf", "--print-needed", path], check=True, capture_output=True, text=True).stdout
    return out.split()


def _ldd(path):
    """{soname: resolved path or None} of everything path loads, as ldd says."""
    out = subprocess.run(["ldd", path], check=True, capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(\S+|not found)", line)
        if m:
            found[m.group(1)] = None if m.group(2) == "not found" else m.group(2)
        else:
            m = re.match(r"\s*(\S+)\s+\(0x", line)
            if m:
                found[os.path.basename(m.group(1))] = m.group(1)
    return found


def _vendor(ext, libs_dir):
    """Copies every shared library ext needs beyond glibc into libs_dir under a unique soname (name-HASH.so.N,
    HASH from its bytes, as auditwheel does: never confused with another copy of it in the process), rewrites
    the DT_NEEDED entries and sets RUNPATH; returns {old soname: new file name}."""
    resolved = _ldd(ext)
    renamed, todo = {}, [ext]
    while todo:
        obj = todo.pop()
        for soname in _needed(obj):
            if soname in GLIBC or soname in renamed:
                continue
            src = resolved.get(soname) or _ldd(obj).get(soname)
            if not src:
                raise RuntimeError("kvx: %s needs %s, which is not found" % (obj, soname))
            with open(src, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()[:8]
            real = os.path.basename(os.path.realpath(src))
            stem, _, rest = real.partition(".so")
            new = "%s-%s.so%s" % (stem, digest, rest)
            os.makedirs(libs_dir, exist_ok=True)
            dst = os.path.join(libs_dir, new)
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755)
            _run(["patchelf", "--set-soname", new, dst])
            renamed[soname] = new
            todo.append(dst)
    for obj in [ext] + [os.path.join(libs_dir, n) for n in renamed.values()]:
        for soname in _needed(obj):
            if soname in renamed:
                _run(["patchelf", "--replace-needed", soname, renamed[soname], obj])
        if renamed:
            rpath = "$ORIGIN/../kvx.libs" if obj == ext else "$ORIGIN"
            _run(["patchelf", "--set-rpath", rpath, obj])
    return renamed


def _check_standalone(ext, libs_dir):
    """ldd of the extension in place: every library is glibc's or one of libs_dir's."""
    for soname, path in _ldd(ext).items():
        inside = path and os.path.dirname(os.path.realpath(path)) == os.path.realpath(libs_dir)
        if soname not in GLIBC and not inside:
            raise RuntimeError("kvx: the extension still needs %s (%s) from the system" % (soname, path))


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [arcname, "sha256=" + digest, str(len(data))]


def _write_wheel(wheel_directory, tag, files):
    """files: [(arcname, bytes, mode)]; adds the dist-info and RECORD. Returns the wheel's file name."""
    di = _dist_info()
    wheel_meta = "Wheel-Version: 1.0\nGenerator: kvx_build_backend %s\nRoot-Is-Purelib: false\nTag: %s\n" % (
        version(), tag)
    files = list(files) + [(di + "/METADATA", metadata().encode(), 0o644), (di + "/WHEEL", wheel_meta.encode(), 0o644),
                           (di + "/top_level.txt", b"kvx\n", 0o644)]
    name = "kvx-%s-%s.whl" % (version(), tag)
    path = os.path.join(wheel_directory, name)
    rec = io.StringIO()
    w = csv.writer(rec, lineterminator="\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data, mode in files:
            zi = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
            w.writerow(_record_line(arcname, data))
        w.writerow([di + "/RECORD", "", ""])
        zi = zipfile.ZipInfo(di + "/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        zi.external_attr = 0o100644 << 16
        z.writestr(zi, rec.getvalue())
    return name


def _package_files():
    """The pure-Python package, its stubs and py.typed, from bindings/python/kvx."""
    out = []
    top = os.path.join(PY_DIR, "kvx")
    for d, dirs, names in os.walk(top):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for n in sorted(names):
            if n.endswith((".py", ".pyi")) or n == "py.typed":
                p = os.path.join(d, n)
                with open(p, "rb") as f:
                    out.append(("kvx/" + os.path.relpath(p, top).replace(os.sep, "/"), f.read(), 0o644))
    return out


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    tag = wheel_tag()
    build_dir = _setting(config_settings, "build-dir", "KVX_BUILD_DIR")
    tmp = None
    if not build_dir:
        tmp = build_dir = tempfile.mkdtemp(prefix="kvx-wheel-")
    try:
        ext = _cmake_build(os.path.abspath(build_dir), config_settings)
        stage = tempfile.mkdtemp(prefix="kvx-stage-", dir=build_dir)
        staged = os.path.join(stage, "kvx", os.path.basename(ext))
        os.makedirs(os.path.dirname(staged))
        shutil.copyfile(ext, staged)
        _run(["strip", "--strip-debug", staged])
        libs = os.path.join(stage, "kvx.libs")
        renamed = _vendor(staged, libs)
        _check_standalone(staged, libs)
        log("vendored into kvx.libs: " + (", ".join("%s as %s" % kv for kv in sorted(renamed.items())) or "nothing"))
        files = _package_files()
        for p in [staged] + [os.path.join(libs, n) for n in sorted(renamed.values())]:
            with open(p, "rb") as f:
                files.append((os.path.relpath(p, stage).replace(os.sep, "/"), f.read(), 0o755))
        name = _write_wheel(wheel_directory, tag, files)
        log("built " + name)
        return name
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


FINDER = '''"""kvx, installed editable (pip install -e): the package from the checkout, its extension from the build
directory (kvx_build_backend.build_editable)."""
import importlib.abc
import importlib.util
import sys

SRC = %r
EXT = %r


class KvxEditableFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "kvx":
            return None
        return importlib.util.spec_from_file_location("kvx", SRC + "/__init__.py",
                                                      submodule_search_locations=[SRC, EXT])


def install():
    if not any(isinstance(f, KvxEditableFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, KvxEditableFinder())
'''


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    tag = wheel_tag()
    build_dir = _setting(config_settings, "build-dir", "KVX_BUILD_DIR") or os.path.join(ROOT, "build-py",
                                                                                         "editable-" + tag)
    ext = _cmake_build(os.path.abspath(build_dir), config_settings)
    finder = FINDER % (os.path.join(PY_DIR, "kvx"), os.path.dirname(ext))
    files = [("__editable___kvx_finder.py", finder.encode(), 0o644),
             ("__editable__.kvx-%s.pth" % version(), b"import __editable___kvx_finder; "
              b"__editable___kvx_finder.install()\n", 0o644)]
    name = _write_wheel(wheel_directory, tag, files)
    log("built %s (kvx from %s, its extension from %s)" % (name, os.path.join(PY_DIR, "kvx"), os.path.dirname(ext)))
    return name


def _sdist_files():
    out = []
    for rel in SDIST_PATHS:
        p = os.path.join(ROOT, rel)
        if os.path.isfile(p):
            out.append(rel)
            continue
        if not os.path.isdir(p):
            raise RuntimeError("kvx: the sdist needs %s, which is not in %s" % (rel, ROOT))
        for d, dirs, names in os.walk(p):
            dirs[:] = sorted(dirs)
            for n in sorted(names):
                r = os.path.relpath(os.path.join(d, n), ROOT).replace(os.sep, "/")
                if not SKIP.search(r):
                    out.append(r)
    return out


def build_sdist(sdist_directory, config_settings=None):
    base = "kvx-%s" % version()
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel in _sdist_files():
            t.add(os.path.join(ROOT, rel), arcname=base + "/" + rel, recursive=False)
        data = metadata().encode()
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size, ti.mode = len(data), 0o644
        t.addfile(ti, io.BytesIO(data))
    log("built " + name)
    return name
