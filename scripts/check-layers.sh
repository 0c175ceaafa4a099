#!/usr/bin/env bash
# check-layers.sh [BUILD_DIR] - the layering rules of DESIGN.md
# ("Architecture"), checked mechanically. Prints the graph between the
# library's folders and fails (exit 1) on:
#   - an include or call edge between folders that DESIGN.md does not allow
#     (calls are read from BUILD_DIR's objects with nm, when it is given:
#     a call through kvx.h into another folder is an edge too);
#   - a cycle between folders, or between the library's files (includes;
#     with BUILD_DIR, calls between object files as well);
#   - an include that names no file of the project ("x.h" from another
#     folder must be written "folder/x.h");
#   - an LMDB call (mdb_*) or <lmdb.h> in the library or cli/ outside index/
#     (bench/ and tests/ may use LMDB for references and fault injection);
#   - a library .c file over 900 lines;
#   - with BUILD_DIR, a global symbol of libkvx without the kvx_ prefix.
# cli/ and bindings/ may include only include/kvx.h and their own headers.
# A project header reached as <folder/x.h> counts like "folder/x.h".
# Run by scripts/test.sh; see docs/ARCHITECTURE.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-}

library="common format index engine io tier transfer"
allowed="format:common index:common tier:format tier:common engine:index engine:tier engine:format engine:common
transfer:engine transfer:index transfer:format transfer:common io:format io:common"
max_lines=900
fail=0
problem() { printf 'check-layers: %s\n' "$*" >&2; fail=1; }
is_allowed() { case " $(echo $allowed) " in *" $1:$2 "*) return 0 ;; esac; return 1; }

folders=""
for d in $library; do [ -d "$d" ] && folders="$folders $d"; done

edges=$(mktemp)
file_edges=$(mktemp)
trap 'rm -f "$edges" "$file_edges" "$edges".* "$file_edges".* "${defs:-}" "${uses:-}"' EXIT

# Include edges. A quoted include is "kvx.h" (the public header), a file
# of the including file's own folder, or "folder/file" of the project.
# Project headers reached with <folder/x.h> (the library's private include
# path allows it) count the same.
users=$(for d in $folders cli; do ls "$d"/*.[ch] 2>/dev/null; done; if [ -d bindings ]; then find bindings -name '*.[ch]' | sort; fi)
for src in $users; do
  from=${src%%/*}
  here=$(dirname "$src")
  while IFS= read -r inc; do
    if [ "$inc" = kvx.h ]; then continue; fi
    case $inc in
      */*) target=$inc ;;
      *) target=$here/$inc ;;
    esac
    if [ ! -f "$target" ]; then
      problem "$src includes \"$inc\": no such project file (name another folder's header as \"folder/file.h\")"
      continue
    fi
    to=${target%%/*}
    echo "$src $target" >>"$file_edges"
    [ "$to" = "$from" ] && continue
    if [ "$from" = cli ] || [ "$from" = bindings ]; then
      problem "$src includes \"$inc\": $from/ uses include/kvx.h only"
    elif ! is_allowed "$from" "$to"; then
      problem "$src includes \"$inc\": $from -> $to is not an allowed edge (DESIGN.md, Architecture)"
    fi
    echo "$from $to include" >>"$edges"
  done < <(sed -n -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' \
    -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(\(common\|format\|index\|engine\|io\|tier\|transfer\)\/[^>]*\)>.*/\1/p' "$src")
done

# Call edges, from the objects of BUILD_DIR: which folder defines each
# symbol an object uses.
if [ -n "$build" ]; then
  objdir="$build/CMakeFiles/kvx_objects.dir"
  [ -d "$objdir" ] || { echo "check-layers: $objdir: no objects (build first)" >&2; exit 2; }
  defs=$(mktemp)
  uses=$(mktemp)
  for o in $(find "$objdir" -name '*.o' | sort); do
    rel=${o#"$objdir"/}
    [ -f "${rel%.o}" ] || continue # left over from a file since moved
    folder=${rel%%/*}
    file=${rel%.o}
    nm -g --defined-only "$o" | awk -v f="$folder" -v s="$file" '$2 ~ /^[TDBRCVWiu]$/ {print $3, f, s}' >>"$defs"
    nm -u "$o" | awk -v f="$folder" -v s="$file" '{print $2, f, s}' >>"$uses"
    # an LMDB call the source grep cannot see (a macro, a function pointer)
    if [ "$folder" != index ]; then
      for sym in $(nm -u "$o" | awk '$2 ~ /^mdb_/ {print $2}'); do problem "LMDB outside index/: $file.o calls $sym"; done
    fi
  done
  while read -r sym folder file; do
    case $sym in kvx_*) ;; *) problem "$file.o defines global symbol $sym without the kvx_ prefix" ;; esac
  done <"$defs"
  # symbol user_folder user_file def_folder def_file
  join <(sort -k1,1 "$uses") <(sort -k1,1 "$defs") >"$edges.calls" || true
  while read -r sym from ffile to tfile; do
    echo "$ffile $tfile" >>"$file_edges"
    [ "$from" = "$to" ] && continue
    is_allowed "$from" "$to" || problem "$ffile calls $sym ($tfile): $from -> $to is not an allowed edge"
    echo "$from $to call" >>"$edges"
  done <"$edges.calls"
  rm -f "$defs" "$uses"
fi

# The graph, one line per folder.
echo "layers (include and call edges between the library's folders):"
for d in $folders; do
  outs=$(awk -v d="$d" '$1 == d {print $2}' "$edges" | sort -u | tr '\n' ' ')
  printf '  %-9s -> %s\n' "$d" "${outs:-(nothing)}"
done

# Cycles: tsort reports a loop in its input on stderr.
check_cycles() {
  local what=$1 input=$2 out
  out=$(tsort "$input" 2>&1 >/dev/null | grep -v 'input contains a loop' | sed 's/^tsort: //' | sort -u | tr '\n' ' ') || true
  if [ -n "$out" ]; then problem "a cycle between $what through: $out"; fi
}
awk '{print $1, $2}' "$edges" | sort -u >"$edges.pairs" 2>/dev/null || true
check_cycles folders "$edges.pairs"
rm -f "$edges.pairs"
awk '$1 != $2' "$file_edges" | sort -u >"$file_edges.u"
check_cycles files "$file_edges.u"
rm -f "$file_edges.u"

# LMDB belongs to index/.
for d in $folders cli; do
  [ "$d" = index ] && continue
  for src in "$d"/*.[ch]; do
    [ -f "$src" ] || continue
    { grep -nE '\bmdb_[a-z_]+[[:space:]]*\(|#[[:space:]]*include[[:space:]]*<lmdb\.h>' "$src" || true; } |
      while IFS= read -r hit; do echo "$src:$hit"; done
  done
done >"$edges.mdb"
if [ -s "$edges.mdb" ]; then
  while IFS= read -r hit; do problem "LMDB outside index/: $hit"; done <"$edges.mdb"
fi
rm -f "$edges.mdb"

# File size.
for d in $folders; do
  for src in "$d"/*.c; do
    [ -f "$src" ] || continue
    n=$(wc -l <"$src")
    [ "$n" -le "$max_lines" ] || problem "$src has $n lines (at most $max_lines: cut it by job)"
  done
done

if [ "$fail" = 0 ]; then echo "check-layers: ok"; fi
exit "$fail"
