#!/bin/sh
# Product functions longer than a limit (issue 35's target: none over 150 lines), longest first: "LINES FILE:LINE NAME".
# Crude by design: it relies on rustfmt's layout (a function's closing brace is alone on a line at the indentation of
# its `fn`), skips `#[cfg(test)]` items and test, bench, fuzz and example files, and counts every line from `fn` to
# its closing brace (doc comments above it not included). Usage: ci/long-fns.sh [LIMIT] (default 150); the last line
# says how many functions are over the limit and how many were measured.
limit=${1:-150}
cd "$(dirname "$0")/.." || exit 1
find runtime shell ebpf rdma ofi -name '*.rs' -not -path '*/target/*' -not -path '*/tests/*' -not -path '*/benches/*' \
    -not -path '*/examples/*' -not -name 'tests.rs' -not -name '*_tests.rs' -not -name 'build.rs' 2>/dev/null | sort |
    xargs awk -v limit="$limit" '
    FNR == 1 { skip = ""; open = 0 }
    # A #[cfg(test)] item (a test module, a test-only helper): skipped to its closing brace at its indentation.
    skip == "" && /^[ \t]*#\[cfg\(test\)\]/ { match($0, /^[ \t]*/); skip = substr($0, 1, RLENGTH) "}"; pending = 1; next }
    skip != "" {
        if (pending && ($0 ~ /;[ \t]*$/ || $0 ~ /\}[ \t]*$/) && $0 !~ /\{[ \t]*$/) { skip = ""; pending = 0; next }
        if ($0 ~ /\{[ \t]*$/) pending = 0
        if ($0 == skip) skip = ""
        next
    }
    !open && /^[ \t]*(pub(\([a-z]+\))? )?(const )?(async )?(unsafe )?(extern "C" )?fn [A-Za-z_0-9]+/ {
        match($0, /^[ \t]*/); ind = substr($0, 1, RLENGTH)
        name = $0; sub(/^.*fn /, "", name); sub(/[^A-Za-z_0-9].*$/, "", name)
        if ($0 ~ /;[ \t]*$/ || $0 ~ /\}[ \t]*$/) next   # a declaration, or a function on one line
        open = 1; start = FNR; file = FILENAME; next
    }
    open && $0 == ind "}" {
        n = FNR - start + 1; total++
        if (n > limit) { over++; printf "%d %s:%d %s\n", n, file, start, name }
        open = 0
    }
    END { printf "# %d functions over %d lines, of %d measured\n", over, limit, total }
    ' | sort -rn
