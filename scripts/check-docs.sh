#!/bin/sh
# scripts/check-docs.sh [ROOT]: docs are reference, not a diary (STYLE.md 14).
# Fails (exit 1) when
#   - a Markdown table row in README.md, bench/README.md, tests/README.md or
#     docs/*.md is longer than 600 characters (a figures row is one figure,
#     its date, machine and result file; the history is in bench/results/
#     and git);
#   - bench/README.md or docs/ holds a "Before:" chain (earlier runs told
#     one after another);
#   - more than 3 lines of product code (gateway/, kernels/, include/) carry
#     a date (YYYY-MM-DD): a code comment says why, not when.
# Prints each offence as FILE:LINE: what; exits 0 when there are none.
set -eu
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$root"
max_row=600
max_dated=3
bad=0

docs=$(find docs -type f -name '*.md' 2>/dev/null | LC_ALL=C sort)
[ -n "$docs" ] || { echo "check-docs: no docs/*.md under $root" >&2; exit 2; }
tables="$docs"
for f in README.md bench/README.md tests/README.md; do
    [ -f "$f" ] && tables="$tables $f"
done

# Table rows: characters, not bytes (UTF-8 continuation bytes are dropped
# before awk counts, so line numbers stay).
for f in $tables; do
    rows=$(LC_ALL=C tr -d '\200-\277' <"$f" | awk -v f="$f" -v max="$max_row" '
        /^[ \t]*\|/ && length($0) > max {
            printf "%s:%d: table row of %d characters (at most %d)\n", f, NR, length($0), max
        }')
    [ -z "$rows" ] || { echo "$rows"; bad=1; }
done

# "Before:" chains.
# shellcheck disable=SC2086
chains=$(grep -Hn 'Before:' bench/README.md $docs 2>/dev/null || true)
if [ -n "$chains" ]; then
    echo "$chains" | cut -c1-160 | sed 's/$/  <- a "Before:" chain: keep the current figure, the rest is in git/'
    bad=1
fi

# Dated lines in product code.
date_re='(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])'
dated=$(grep -rnE "$date_re" gateway kernels include 2>/dev/null || true)
n=0
[ -z "$dated" ] || n=$(printf '%s\n' "$dated" | wc -l)
if [ "$n" -gt "$max_dated" ]; then
    printf '%s\n' "$dated" | cut -c1-160
    echo "check-docs: $n dated lines in gateway/ kernels/ include/ (at most $max_dated)"
    bad=1
else
    echo "check-docs: $n dated lines in gateway/ kernels/ include/ (at most $max_dated)"
fi

if [ "$bad" -ne 0 ]; then
    echo "check-docs: FAILED" >&2
    exit 1
fi
echo "check-docs: ok"
