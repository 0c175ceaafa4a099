#!/usr/bin/env bash
# A second proof that the wheel stands alone, by hand (it needs a Debian
# mirror; CI runs scripts/test-python.sh's offline chroot instead): a fresh
# Debian 12 made by debootstrap (minbase, python3-venv, python3-pytest and
# what they depend on: none of kvx's build dependencies, which the script
# checks), the abi3 wheel installed there with pip --no-index into a venv of
# Debian's python3, and the Python tests run against it.
#   scripts/test-python-debootstrap.sh WHEEL [MIRROR]
# Root only (debootstrap, chroot). Leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(readlink -f "${1:?usage: $0 kvx-VERSION-cp311-abi3-linux_x86_64.whl [mirror]}")
mirror=${2:-http://deb.debian.org/debian}
root=$(mktemp -d /tmp/kvx-debootstrap.XXXXXX)
trap 'grep -q " $root/" /proc/mounts || rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3-venv,python3-pytest bookworm "$root" "$mirror" >"$root.log" 2>&1 ||
  { tail -20 "$root.log"; exit 1; }
rm -f "$root.log"
echo "debootstrap: $(chroot "$root" dpkg-query -W -f '${Package}\n' | wc -l) packages, none of kvx's build dependencies:"
if chroot "$root" dpkg-query -W -f '${Package}\n' |
    grep -xE '(libisal|liblmdb|libnuma|liburing|libhiredis|libjson-c).*|libssl-dev|gcc|gcc-[0-9]+|clang.*|cmake|patchelf|python3-dev|libpython3.*-dev|python3-numpy'; then
  echo "a build dependency is installed"; exit 1
fi
mkdir -p "$root/src"
cp "$wheel" "$root/src/"
cp -r bindings/python/tests "$root/src/tests"
unshare -m sh -c '
  set -e
  root=$1; whl=$2
  mount --make-rprivate /
  mount -t proc proc "$root/proc"
  mount --bind /dev "$root/dev"
  exec chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 sh -c "
    set -e
    python3 -m venv --system-site-packages /venv
    /venv/bin/pip install -q --no-index /src/$whl
    cd /tmp && PYTHONDONTWRITEBYTECODE=1 KVX_TEST_EXPECT_KVX_UNDER=/venv /venv/bin/python -m pytest -v -rs \
      -p no:cacheprovider --rootdir=/src/tests /src/tests"
' sh "$root" "$(basename "$wheel")"
