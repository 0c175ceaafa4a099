#!/usr/bin/env bash
# .ci/test-inventory.sh - every registered test and the assertion calls in
# its body, one line each: "lang name count", sorted.
#
# Run it before and after moving tests between files (diff the two
# outputs): a test lost, or an assertion dropped from a test's body, shows
# as a changed line. Keyed by test name, not by file, so a move or a file
# rename changes nothing. What it counts:
#   c       a test registered with cmocka_unit_test*() in tests/**/*.c;
#           in its body: assert_*(), fail(), fail_msg(), check_expected*(),
#           and the tests' own checking macros (EXPECT_*(), FAULT_CHECK())
#   go      func Test*/Fuzz* in bindings/go/**/*_test.go (not vendor/);
#           in its body: <x>.Error(..)/Errorf/Fatal/Fatalf/Fail/FailNow,
#           require.*/assert.*
#   python  def test_* in bindings/python/tests/**/*.py; in its body:
#           assert statements and pytest.raises
# Only the test's own body is counted, not the helpers it calls.
# Usage: .ci/test-inventory.sh [ROOT]   (ROOT: a checkout; default: this one)
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
exec python3 - "$root" <<'PY'
import os, re, sys

root = sys.argv[1]
out = []

def strip_c(src):
    """src with comments, string and char literals blanked (same length)."""
    res, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("/*", i):
            j = src.find("*/", i + 2); j = n if j < 0 else j + 2
            res.append(re.sub(r"[^\n]", " ", src[i:j])); i = j
        elif src.startswith("//", i):
            j = src.find("\n", i); j = n if j < 0 else j
            res.append(" " * (j - i)); i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            res.append(c + " " * (min(j, n) - i - 1) + (c if j < n else "")); i = j + 1
        else:
            res.append(c); i += 1
    return "".join(res)

def body_at(code, start):
    """code[start:] from its first '{' to the matching '}'."""
    i = code.find("{", start)
    depth = 0
    for j in range(i, len(code)):
        if code[j] == "{": depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0: return code[i:j + 1]
    return code[i:]

def walk(top, keep, skip=()):
    for d, dirs, files in os.walk(top):
        dirs[:] = sorted(x for x in dirs if x not in skip and not x.startswith("."))
        for f in sorted(files):
            if keep(f): yield os.path.join(d, f)

C_REG = re.compile(r"\bcmocka_unit_test(?:_setup_teardown|_setup|_teardown|_prestate_setup_teardown|_prestate)?\s*\(\s*([A-Za-z_]\w*)")
C_ASSERT = re.compile(r"\b(assert_\w+|fail|fail_msg|check_expected\w*|EXPECT_[A-Z0-9_]+|FAULT_CHECK)\s*\(")
for path in walk(os.path.join(root, "tests"), lambda f: f.endswith(".c")):
    code = strip_c(open(path, encoding="utf-8", errors="replace").read())
    for name in C_REG.findall(code):
        m = re.search(r"^(?:static\s+)?(?:void|int)\s+" + name + r"\s*\([^;{]*\)\s*\{", code, re.M)
        n = len(C_ASSERT.findall(body_at(code, m.start()))) if m else -1
        out.append(("c", name, n))

GO_FN = re.compile(r"^func ((?:Test|Fuzz)[A-Za-z0-9_]*)\s*\(\s*\w+\s+\*testing\.[TF]\s*\)", re.M)
GO_ASSERT = re.compile(r"\b\w+\.(?:Errorf|Fatalf|Fatal|FailNow|Fail)\s*\(|\b\w+\.Error\s*\((?!\s*\))|\b(?:require|assert)\.\w+\s*\(")
for path in walk(os.path.join(root, "bindings", "go"), lambda f: f.endswith("_test.go"), skip=("vendor",)):
    code = strip_c(open(path, encoding="utf-8", errors="replace").read())
    for m in GO_FN.finditer(code):
        out.append(("go", m.group(1), len(GO_ASSERT.findall(body_at(code, m.end() - 1)))))

PY_ASSERT = re.compile(r"^\s*assert\b|\bpytest\.raises\b", re.M)
pyroot = os.path.join(root, "bindings", "python", "tests")
for path in walk(pyroot, lambda f: f.endswith(".py")):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(?:async\s+)?def (test_\w+)\s*\(", line)
        if not m: continue
        ind, body = len(m.group(1)), []
        for nxt in lines[i + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= ind: break
            body.append(re.sub(r"#.*", "", nxt))
        out.append(("python", m.group(2), len(PY_ASSERT.findall("\n".join(body)))))

for lang, name, n in sorted(out):
    print(lang, name, n)
PY
