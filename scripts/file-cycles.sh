#!/bin/sh
# scripts/file-cycles.sh [-v] BUILD_DIR [FOLDER...]: the file-level call graph of igcore, and
# of the CUDA module (infergate_cuda, kernels/cuda/) where the build has it, read
# from the objects a build left (nm), and what is wrong with it. A module's
# names resolve within the module (it links apart from igcore). An arrow
# A -> B means A.c names a function or variable B.c defines (a call through
# a function pointer, a hook the lower file declares, is no arrow: that is
# how a call goes back up, docs/DESIGN.md, "Dependencies"). Prints
#   - every pair of files that call each other, and every larger cycle
#     (a strongly connected component of more than one file);
#   - every arrow running back up: from a folder to one the dependency
#     table in docs/DESIGN.md does not let it include (a call that dodges
#     the include rule with its own prototype).
# With FOLDERs (role folders: serve route api ...) only the files in them
# and the arrows between them count. Exits 1 when there is a cycle or more than MAX_UP (default 2) arrows back
# up, 0 otherwise. With -v it also lists every arrow.
set -eu
verbose=0
[ "${1:-}" = "-v" ] && { verbose=1; shift; }
build="${1:?usage: scripts/file-cycles.sh [-v] BUILD_DIR [FOLDER...]}"
shift
only="$*"
root=$(cd "$(dirname "$0")/.." && pwd)
objdir="$build/CMakeFiles/igcore.dir"
[ -d "$objdir" ] || { echo "file-cycles: $objdir not found (build igcore first)" >&2; exit 2; }
MAX_UP=${MAX_UP:-2}

# One line per symbol: "D FILE TARGET|SYM" where FILE defines it, "U FILE
# TARGET|SYM" where FILE needs it; FILE is the source path under the root
# (gateway/base/error.c is in both targets: one file).
for target in igcore infergate_cuda; do
    dir="$build/CMakeFiles/$target.dir"
    [ -d "$dir" ] || continue
    objs=$(find "$dir" -name '*.o' | LC_ALL=C sort)
    [ -n "$objs" ] || continue
    # One nm of each kind over all the objects (-A: each line names its
    # object, "OBJ:ADDR TYPE SYM" or "OBJ: U SYM"), not two per object.
    # shellcheck disable=SC2086 # the object paths have no spaces
    { nm -A --defined-only -g $objs 2>/dev/null | sed 's/^/D /'
      nm -A -u $objs 2>/dev/null | sed 's/^/U /'; } |
        awk -v d="$dir/" -v t="$target" '{
            i = index($2, ":"); f = substr($2, length(d) + 1, i - length(d) - 1); sub(/[.]o$/, "", f)
            if ($1 == "D" && NF == 4) print "D", f, t "|" $4
            else if ($1 == "U") print "U", f, t "|" $NF
        }'
done | awk -v design="$root/docs/DESIGN.md" -v verbose="$verbose" -v max_up="$MAX_UP" -v only="$only" '
function trim(s) { gsub(/`/, "", s); gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
function folder(path,    k, parts) {
    k = split(path, parts, "/")
    if (parts[1] == "kernels") return "kernels"
    if (parts[1] == "gateway") return k == 2 ? "main" : parts[2]
    return "?"
}
# Tarjan over the file graph (recursion: awk functions keep their locals).
function visit(v,    i, w) {
    index_of[v] = low[v] = ++counter
    stack[++sp] = v; on_stack[v] = 1
    for (i = 1; i <= nout[v]; i++) {
        w = out[v, i]
        if (!(w in index_of)) { visit(w); if (low[w] < low[v]) low[v] = low[w] }
        else if (on_stack[w] && index_of[w] < low[v]) low[v] = index_of[w]
    }
    if (low[v] == index_of[v]) {
        comp = ""; size = 0
        do { w = stack[sp--]; on_stack[w] = 0; comp = comp " " w; size++ } while (w != v)
        if (size > 1) { cycles++; printf "cycle (%d files):%s\n", size, comp }
    }
}
BEGIN {
    n = split(only, o, " ")
    for (i = 1; i <= n; i++) in_scope[o[i]] = 1
    while ((getline l < design) > 0) {
        if (l ~ /check-deps:begin/) { on = 1; continue }
        if (l ~ /check-deps:end/) { on = 0; continue }
        if (!on || l !~ /^\|/ || l ~ /^\|[ -]*\|/) continue
        split(l, c, "|")
        f = trim(c[2]); if (f == "folder") continue
        known[f] = 1
        m = split(trim(c[3]), may, /[ ,]+/)
        for (i = 1; i <= m; i++) if (may[i] != "" && may[i] != "-") allow[f, may[i]] = 1
    }
}
function counted(path) { return only == "" || (folder(path) in in_scope) }
$1 == "D" { def[$3] = $2; if (counted($2)) files[$2] = 1; next }
$1 == "U" { need[++nneed] = $2 SUBSEP $3; if (counted($2)) files[$2] = 1 }
END {
    for (k = 1; k <= nneed; k++) {
        split(need[k], p, SUBSEP)
        if (!(p[2] in def) || def[p[2]] == p[1]) continue
        a = p[1]; b = def[p[2]]
        if (!counted(a) || !counted(b)) continue
        if (!((a, b) in edge)) {
            sym = p[2]; sub(/^[^|]*[|]/, "", sym)
            edge[a, b] = sym; out[a, ++nout[a]] = b; nedges++
            if (verbose) printf "arrow %s -> %s (%s)\n", a, b, sym
        }
    }
    for (e in edge) {
        split(e, p, SUBSEP)
        if (p[1] < p[2] && ((p[2], p[1]) in edge)) {
            pairs++
            printf "pair: %s <-> %s (%s; %s)\n", p[1], p[2], edge[p[1], p[2]], edge[p[2], p[1]]
        }
        fa = folder(p[1]); fb = folder(p[2])
        if (fa != fb && !((fa, fb) in allow)) {
            up++
            printf "back up: %s -> %s (%s; %s may not include %s)\n", p[1], p[2], edge[e], fa, fb
        }
    }
    for (v in files) if (!(v in index_of)) visit(v)
    nfiles = 0; for (v in files) nfiles++
    printf "file-cycles: %d files, %d arrows, %d cycles, %d pairs calling each other, %d arrows back up\n",
        nfiles, nedges, cycles, pairs, up
    exit (cycles > 0 || up > max_up) ? 1 : 0
}'
