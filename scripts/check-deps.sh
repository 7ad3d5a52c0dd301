#!/bin/sh
# scripts/check-deps.sh [ROOT]: every `#include "..."` under ROOT's gateway/,
# kernels/ and include/ must be an edge that the dependency table in
# ROOT/docs/DESIGN.md allows ("Dependencies": the rows between the
# `check-deps:begin` and `check-deps:end` markers). That table is the one
# source: each row names a folder, the folders it may include, and the
# public headers (include/infergate/) it owns. A folder is a role folder of
# gateway/ (its subfolders belong to it), `main` (gateway/main.c) or
# `kernels` (kernels/ and its backends). An include is resolved beside the
# including file, then under gateway/; one found in neither (a system or
# CUDA header spelled with quotes) is not ours and is skipped. A public
# header no row owns is an error too. Prints each bad edge as
# FILE:LINE: FROM -> TO (HEADER) and exits 1; exits 0 when all are allowed.
set -eu
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
design="$root/docs/DESIGN.md"
[ -f "$design" ] || { echo "check-deps: $design not found" >&2; exit 2; }
cd "$root"
files=$(find gateway kernels include -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \
    -o -name '*.cpp' \) 2>/dev/null | LC_ALL=C sort)
[ -n "$files" ] || { echo "check-deps: no sources under $root" >&2; exit 2; }

# Every file first (FILE lines), then every quoted include (FILE:LINE:TEXT):
# awk resolves each include against the file list, beside the including
# file, then under gateway/, then as a public header.
{
    printf '%s\n' $files
    echo "--"
    # shellcheck disable=SC2086
    grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $files /dev/null || true
} | awk -v design="$design" '
function trim(s) { gsub(/`/, "", s); gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
# A root-relative path without "." and "..".
function norm(path,    n, a, i, k, parts, out) {
    n = split(path, a, "/"); k = 0
    for (i = 1; i <= n; i++) {
        if (a[i] == "." || a[i] == "") continue
        if (a[i] == "..") { if (k > 0) k--; continue }
        parts[++k] = a[i]
    }
    out = parts[1]
    for (i = 2; i <= k; i++) out = out "/" parts[i]
    return out
}
# The folder a normalised path belongs to, "" for none, "?NAME" for a
# public header no row owns.
function folder(path,    k, parts) {
    k = split(path, parts, "/")
    if (parts[1] == "kernels") return "kernels"
    if (parts[1] == "include" && parts[2] == "infergate" && k == 3)
        return (parts[3] in owner) ? owner[parts[3]] : "?" parts[3]
    if (parts[1] == "gateway") return k == 2 ? (parts[2] == "main.c" ? "main" : "") : parts[2]
    return ""
}
BEGIN {
    while ((getline l < design) > 0) {
        if (l ~ /check-deps:begin/) { on = 1; continue }
        if (l ~ /check-deps:end/) { on = 0; continue }
        if (!on || l !~ /^\|/ || l ~ /^\|[ -]*\|/) continue
        n = split(l, c, "|")
        f = trim(c[2]); if (f == "folder") continue
        known[f] = 1; rows++
        m = split(trim(c[3]), may, /[ ,]+/)
        for (i = 1; i <= m; i++) if (may[i] != "" && may[i] != "-") allow[f, may[i]] = 1
        m = split(trim(c[4]), hs, /[ ,]+/)
        for (i = 1; i <= m; i++) if (hs[i] != "" && hs[i] != "-") {
            if (hs[i] in owner) { printf "check-deps: %s owned by %s and %s\n", hs[i], owner[hs[i]], f; bad++ }
            owner[hs[i]] = f
        }
    }
    if (rows == 0) { print "check-deps: no table between check-deps:begin and :end in " design; exit 2 }
}
!listed {
    if ($0 == "--") { listed = 1; next }
    exists[$0] = 1
    if (folder($0) ~ /^\?/) { printf "%s: public header owned by no row of the table\n", $0; bad++ }
    next
}
{
    file = $0; sub(/:.*/, "", file)
    line = substr($0, length(file) + 2); sub(/:.*/, "", line)
    inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
    dir = file; sub(/\/[^\/]*$/, "", dir)
    if (norm(dir "/" inc) in exists) to = folder(norm(dir "/" inc))
    else if (("gateway/" inc) in exists) to = folder(norm("gateway/" inc))
    else if (inc ~ /^infergate\//) to = folder("include/" inc)
    else next # not ours: a system or CUDA header spelled with quotes
    from = folder(file)
    if (from == "") next
    if (from ~ /^\?/) next # said above
    if (!(from in known)) { printf "%s: folder %s is not in the table\n", file, from; bad++; next }
    if (to == "" || to == from) next
    if (to ~ /^\?/) { printf "%s:%s: %s: public header owned by no row of the table\n", file, line, inc; bad++; next }
    if (!((from, to) in allow)) { printf "%s:%s: %s -> %s (%s) is not allowed\n", file, line, from, to, inc; bad++ }
    edges++
}
END {
    if (rows == 0) exit 2
    if (bad) { printf "check-deps: %d include(s) break docs/DESIGN.md, \"Dependencies\"\n", bad; exit 1 }
    printf "check-deps: %d includes across folders, all allowed\n", edges
}'
