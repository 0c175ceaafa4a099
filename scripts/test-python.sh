#!/usr/bin/env bash
# The Python package as inference engines install it (issue 35), under every
# interpreter kvx supports, each named by path:
#   Debian's /usr/bin/python3 (3.11, in a venv with its system packages:
#   python3-numpy, python3-pytest) and pyenv's 3.10.13, 3.11.7, 3.12.1 and
#   3.13.0 (plain venvs; Debian's pure-Python pytest put on PYTHONPATH).
#
#  1. dist: the sdist (python3-build, no isolation: the backend needs
#     nothing), the cp311-abi3 wheel built with 3.13's headers
#     (`pip wheel .`, build isolation, offline), the cp310 wheel built from
#     the sdist;
#  2. per interpreter: a fresh venv, `pip install .` (the documented
#     command: offline, no flags), `import kvx, kvx.integrations.sglang,
#     kvx.integrations.lmcache`; then the wheel for that interpreter
#     installed over it (one abi3 wheel for every 3.11+), ldd of the
#     installed extension (glibc and kvx.libs only), and the Python tests
#     from bindings/python/tests against the installed package (pytest -v:
#     each test's outcome; -rs: each skip's reason);
#  3. `pip install -e .`: kvx imported from the checkout, its extension
#     from build-py/;
#  4. the wheels stand alone: installed into venvs in a chroot that holds
#     glibc, the interpreters and the libraries their own modules need,
#     and none of the build dependencies (no ISA-L, LMDB, libnuma,
#     liburing, OpenSSL, hiredis, compiler, cmake or headers: checked),
#     and the Python tests run there;
#  5. a table: interpreter, version, tests passed/skipped/failed.
# A missing interpreter fails the run by name. KVX_PY_INTERPRETERS (a list
# of paths) replaces the list; KVX_PY_KEEP=1 keeps the work directory.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
tests=$src/bindings/python/tests
pyenv=/root/.pyenv/versions
interpreters=(${KVX_PY_INTERPRETERS:-/usr/bin/python3 $pyenv/3.10.13/bin/python3 $pyenv/3.11.7/bin/python3
  $pyenv/3.12.1/bin/python3 $pyenv/3.13.0/bin/python3})
debian=/usr/bin/python3
export KVX_BUILD_JOBS=${KVX_BUILD_JOBS:-$(nproc)} PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
start=$SECONDS
step() { printf '\n==> python: %s (%d s)\n' "$*" $((SECONDS - start)); }
fail() { echo "test-python: FAIL: $*" >&2; exit 1; }

# ---- 0. what the run needs -------------------------------------------------------------------------
missing=()
for py in "${interpreters[@]}"; do
  [ -x "$py" ] || missing+=("$py")
done
[ ${#missing[@]} -eq 0 ] || fail "interpreter(s) missing: ${missing[*]} (CI's machine has them under $pyenv)"
for tool in cmake patchelf ldd strip; do
  command -v $tool >/dev/null || fail "$tool missing (scripts/install-deps.sh)"
done
work=$(mktemp -d /tmp/kvx-test-python.XXXXXX)
cleanup() {
  if [ "${KVX_PY_KEEP:-0}" = 1 ]; then
    echo "test-python: work directory kept: $work"
  elif grep -q " $work/" /proc/mounts; then  # never: the chroot's mounts live in their own namespace
    echo "test-python: something is mounted under $work: not removed" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
# Debian's pytest is pure Python: its packages (and 3.10's backports) on
# PYTHONPATH serve the pyenv interpreters, without Debian's numpy.
shim=$work/pytest-path
mkdir -p "$shim"
for m in _pytest pytest pluggy iniconfig packaging attr attrs py.py exceptiongroup tomli; do
  [ -e /usr/lib/python3/dist-packages/$m ] ||
    fail "/usr/lib/python3/dist-packages/$m missing (apt-get install python3-pytest python3-exceptiongroup python3-tomli)"
  ln -s /usr/lib/python3/dist-packages/$m "$shim/$m"
done
version=$(sed -n 's/^#define KVX_VERSION_STRING "\(.*\)"$/\1/p' include/kvx.h)
dist=$work/dist
mkdir -p "$dist" "$work/run"

# ---- 1. dist ------------------------------------------------------------------------------------------
step "sdist (python3 -m build --sdist --no-isolation)"
$debian -m build --sdist --no-isolation --outdir "$dist" . >"$work/sdist.log" 2>&1 || { cat "$work/sdist.log"; fail "sdist"; }
sdist=$dist/kvx-$version.tar.gz
[ -f "$sdist" ] || fail "no $sdist"
step "the abi3 wheel: pip wheel . with $pyenv/3.13.0 (3.13's headers, Py_LIMITED_API 3.11)"
$pyenv/3.13.0/bin/python3 -m pip wheel -q --no-deps -w "$dist" . || fail "pip wheel . (3.13)"
step "the cp310 wheel: pip wheel of the sdist with $pyenv/3.10.13"
$pyenv/3.10.13/bin/python3 -m pip wheel -q --no-deps -w "$dist" "$sdist" || fail "pip wheel sdist (3.10)"
abi3=$dist/kvx-$version-cp311-abi3-linux_x86_64.whl
cp310=$dist/kvx-$version-cp310-cp310-linux_x86_64.whl
[ -f "$abi3" ] && [ -f "$cp310" ] || { ls -l "$dist"; fail "the wheels are not named as expected"; }
ls -l "$dist"

wheel_for() { # the wheel an interpreter gets
  if "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then echo "$abi3"; else echo "$cp310"; fi
}

check_ldd() { # the installed extension needs glibc and kvx.libs' files only
  local ext=$1 libs line bad=0
  libs=$(cd "$(dirname "$ext")/../kvx.libs" && pwd -P)
  echo "ldd $ext:"
  while IFS= read -r line; do
    echo "  $line"
    case "$line" in
      *linux-vdso.so.1*|*/ld-linux-x86-64.so.2*|*"=> $libs/"*|*"=> $(dirname "$ext")/../kvx.libs/"*) ;;
      *libc.so.6\ =\>\ /*|*libm.so.6\ =\>\ /*|*libpthread.so.0\ =\>\ /*|*libdl.so.2\ =\>\ /*|*librt.so.1\ =\>\ /*) ;;
      *) bad=1 ;;
    esac
  done < <(ldd "$ext")
  [ $bad = 0 ] || fail "$ext needs a library outside glibc and kvx.libs"
}

declare -A result where
pytest_summary() { # pytest's last line, "146 passed, 28 skipped in 8.41s", or "no summary"
  local line
  line=$(grep -E '^=+ .*(passed|failed|error).* in [0-9.]+s' "$1" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//') || true
  echo "${line:-no summary}"
}
# Debian's pytest 7.2 uses ast names deprecated in 3.12: its own warnings
# are filtered (-W ...:_pytest.assertion.rewrite), the tests' are not.
run_tests() { # label python [env...]: the suite against the installed kvx, from an empty directory
  local label=$1 py=$2 log=$work/pytest-$1.log summary
  shift 2
  (cd "$work/run" && env "$@" PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -v -rs -p no:cacheprovider \
     -W "ignore::DeprecationWarning:_pytest.assertion.rewrite" --rootdir="$tests" "$tests") 2>&1 | tee "$log" |
    grep -E '^(kvx |numpy: |platform |.*::.* (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)|SKIPPED \[|FAILED |=+ .* =+$)' ||
    true
  summary=$(pytest_summary "$log")
  result[$label]=$summary
  grep -qE '(failed|error)' <<<"$summary" && { tail -40 "$log"; fail "$label: $summary"; }
  grep -qE 'passed' <<<"$summary" || { tail -40 "$log"; fail "$label: no test passed"; }
}

# ---- 2. every interpreter --------------------------------------------------------------------------
order=()
for py in "${interpreters[@]}"; do
  ver=$("$py" -c 'import platform; print(platform.python_version())')
  label=$ver
  [ "$py" = "$debian" ] && label="$ver-debian"
  order+=("$label")
  where[$label]=$py
  step "$py ($ver): venv, pip install ."
  venv=$work/venv-$label
  if [ "$py" = "$debian" ]; then
    "$py" -m venv --system-site-packages "$venv"   # Debian's numpy and pytest
    extra=()
  else
    "$py" -m venv "$venv"
    extra=(PYTHONPATH="$shim")
  fi
  "$venv/bin/pip" install -q . || fail "$py: pip install ."
  (cd "$work/run" && "$venv/bin/python" -c 'import kvx, kvx.integrations.sglang, kvx.integrations.lmcache
print("imported kvx", kvx.__version__, "from", kvx.__file__)') || fail "$py: import kvx after pip install ."
  whl=$(wheel_for "$py")
  step "$py ($ver): the wheel ${whl##*/} installed over it; the tests"
  "$venv/bin/pip" install -q --no-deps --force-reinstall "$whl" || fail "$py: pip install ${whl##*/}"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
  check_ldd "$(ls "$site"/kvx/_kvx*.so)"
  run_tests "$label" "$venv/bin/python" KVX_TEST_EXPECT_KVX_UNDER="$site" "${extra[@]}"
done

# ---- 3. editable -------------------------------------------------------------------------------------
step "pip install -e . ($pyenv/3.12.1)"
"$pyenv/3.12.1/bin/python3" -m venv "$work/venv-editable"
"$work/venv-editable/bin/pip" install -q -e . || fail "pip install -e ."
(cd "$work/run" && "$work/venv-editable/bin/python" - "$src" <<'EOF') || fail "the editable install"
import os, sys, tempfile
import kvx, kvx.integrations.lmcache
src = sys.argv[1]
assert kvx.__file__ == os.path.join(src, "bindings/python/kvx/__init__.py"), kvx.__file__
assert kvx._kvx.__file__.startswith(os.path.join(src, "build-py") + os.sep), kvx._kvx.__file__
with tempfile.TemporaryDirectory() as d, kvx.Store.create(d + "/s", page_bytes=4096, nosync=True) as st:
    st.keyed_put(["k"], [b"x" * 4096]); st.flush()
    assert bytes(st.keyed_get(["k"])[0]) == b"x" * 4096
print("editable: kvx from", kvx.__file__, "and its extension from", kvx._kvx.__file__)
EOF

# ---- 4. the wheels stand alone ---------------------------------------------------------------------
step "standalone: the wheels in a chroot without the build dependencies"
[ "$(id -u)" = 0 ] || fail "the standalone check needs root (chroot, mount namespace)"
root=$work/chroot
mkdir -p "$root"/{usr/lib/x86_64-linux-gnu,usr/lib64,usr/bin,etc,tmp,dev,proc,dist,src,opt/pytest}
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
ln -s usr/bin "$root/bin"
chmod 1777 "$root/tmp"
alone=("$pyenv/3.10.13" "$pyenv/3.12.1")
# glibc (all of Debian's libc6: what every Linux has) and what the
# interpreters' own modules load (zlib, libffi, ...; not _tkinter's X11),
# minus the build dependencies: _ssl and _hashlib cannot load there.
blocked='lib(isal|lmdb|numa|uring|crypto|ssl|hiredis|json-c)[.-]'
for p in "${alone[@]}"; do
  mkdir -p "$root$p"
  dpkg -L libc6 | grep -E '^/(usr/)?lib/x86_64-linux-gnu/[^/]+\.so[.0-9]*$' || true
  for f in "$p"/bin/python3 "$p"/lib/libpython3*.so* "$p"/lib/python3*/lib-dynload/*.so; do
    case "$f" in *_tkinter*) continue ;; esac
    ldd "$f" 2>/dev/null | grep -oE '/[^ ]+\.so[^ ]*' || true
  done
done | sort -u | grep -vE "$blocked" | while read -r lib; do
  case "$lib" in $pyenv/*) continue ;; esac
  real=$(readlink -f "$lib")
  dst=$root/usr/lib/x86_64-linux-gnu/$(basename "$lib")
  [ "$lib" = /lib64/ld-linux-x86-64.so.2 ] && dst=$root/usr/lib64/ld-linux-x86-64.so.2
  cp -n "$real" "$dst"
done
cp "$abi3" "$cp310" "$root/dist/"
cp -r "$tests" "$root/src/tests"
rm -rf "$root/src/tests/__pycache__"
for m in _pytest pytest pluggy iniconfig packaging attr attrs py.py exceptiongroup tomli; do
  cp -rL /usr/lib/python3/dist-packages/$m "$root/opt/pytest/"
done
# The driver runs inside on the chroot's own interpreter: no shell, no
# coreutils in there either.
cat >"$root/run.py" <<'EOF'
"""Inside the chroot: show that no build dependency is here, then for each interpreter a venv, the wheel
installed with pip --no-index, and the Python tests from /src/tests against it."""
import os, re, shutil, subprocess, sys
blocked = re.compile(sys.argv[1])
libs = sorted(os.path.join(d, f) for top in ("/usr", "/root", "/opt") for d, _, fs in os.walk(top) for f in fs
              if ".so" in f and not f.endswith(".py"))
print("inside the chroot: the system's shared libraries (a build dependency would be listed here):")
for lib in libs:
    if lib.startswith("/usr/"):
        print("  " + lib)
bad = [lib for lib in libs if blocked.search("/" + os.path.basename(lib)) and "/kvx.libs/" not in lib]
tools = [t for t in ("sh", "cc", "gcc", "cmake", "patchelf", "ldd", "pkg-config") if shutil.which(t)]
if bad or tools or os.path.exists("/usr/include"):
    sys.exit("a build dependency is in the chroot: %s %s" % (bad, tools))
print("none of ISA-L, LMDB, libnuma, liburing, OpenSSL, hiredis, json-c, a shell, a compiler, cmake or headers here")
for py, wheel in zip(sys.argv[2::2], sys.argv[3::2]):
    v = py.split("/")[-3]
    venv = "/venv-" + v
    print("== %s: venv %s, pip install --no-index %s" % (py, venv, wheel), flush=True)
    subprocess.run([py, "-m", "venv", venv], check=True)
    subprocess.run([venv + "/bin/pip", "install", "-q", "--no-index", wheel], check=True)
    env = dict(os.environ, PYTHONPATH="/opt/pytest", KVX_TEST_EXPECT_KVX_UNDER=venv, PYTHONDONTWRITEBYTECODE="1")
    with open("/pytest-%s.log" % v, "w") as log:
        subprocess.run([venv + "/bin/python", "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "-W",
                        "ignore::DeprecationWarning:_pytest.assertion.rewrite", "--rootdir=/src/tests", "/src/tests"], cwd="/tmp",
                       env=env, stdout=log, stderr=subprocess.STDOUT)
    with open("/pytest-%s.log" % v) as log:
        for line in log:
            if re.match(r"(kvx |platform |.*::.* (PASSED|FAILED|SKIPPED|ERROR)|SKIPPED \[|FAILED |=+ .* =+$)", line):
                print(line, end="")
EOF
args=()
for p in "${alone[@]}"; do
  args+=("$p/bin/python3" "/dist/$(basename "$(wheel_for "$p/bin/python3")")")
done
unshare -m sh -c '
  set -e
  root=$1; blocked=$2; chroot=$3; shift 3
  mount --make-rprivate /
  for p in "$@"; do
    case "$p" in /dist/*) continue ;; esac
    d=${p%/bin/python3}
    mount --bind "$d" "$root$d"
    mount -o remount,bind,ro "$root$d"
  done
  mount --bind /dev "$root/dev"
  mount -t proc proc "$root/proc"
  mount -t tmpfs tmpfs "$root/tmp"
  exec env -i PATH=/usr/bin HOME=/tmp LANG=C.UTF-8 "$chroot" "$root" "$1" /run.py "$blocked" "$@"
' sh "$root" "$blocked" "$(PATH=$PATH:/usr/sbin:/sbin command -v chroot)" "${args[@]}" 2>&1 | tee "$work/chroot.log" || fail "the chroot run"
grep -q "none of ISA-L" "$work/chroot.log" || fail "the chroot holds a build dependency"
for p in "${alone[@]}"; do
  v=${p##*/}
  label="$v-chroot"
  order+=("$label")
  where[$label]="$p/bin/python3, in the chroot"
  summary=$(pytest_summary "$root/pytest-$v.log")
  result[$label]=$summary
  grep -qE '(failed|error)' <<<"$summary" && { tail -40 "$root/pytest-$v.log"; fail "chroot $v: $summary"; }
  grep -qE 'passed' <<<"$summary" || { tail -40 "$root/pytest-$v.log"; fail "chroot $v: no test passed"; }
done

# ---- 5. the table -------------------------------------------------------------------------------------
step "summary"
printf '%-16s %-42s %s\n' "version" "interpreter" "tests (from the installed package)"
for label in "${order[@]}"; do
  printf '%-16s %-42s %s\n' "$label" "${where[$label]}" "${result[$label]}"
done
echo "python packaging and tests passed in $((SECONDS - start)) s"
