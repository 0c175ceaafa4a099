#!/usr/bin/env bash
# Installs everything kvx needs to build, test, fuzz and benchmark on Debian 12.
# Run as root (or with sudo). Safe to run again.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake pkg-config clang libclang-rt-14-dev \
  liburing-dev liblmdb-dev lmdb-utils librocksdb-dev libnuma-dev libcmocka-dev libisal-dev zlib1g-dev libjson-c-dev libssl-dev \
  libhiredis-dev redis-server redis-tools \
  fio golang-go gnuplot-nox ca-certificates \
  python3-dev python3-pytest python3-numpy \
  patchelf python3-build python3-exceptiongroup python3-tomli \
  protobuf-compiler protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev golang-google-protobuf-dev \
  golang-github-golang-protobuf-1-5-dev golang-github-prometheus-client-golang-dev >/dev/null
