#!/usr/bin/env bash
# fuzz.sh runs every fuzz target of the given packages (default ./...) for
# FUZZTIME each (default 60s), one after the other. It stops at the first
# failing target; the failing input is kept under the package's
# testdata/fuzz directory by "go test".
#
# Usage: FUZZTIME=30s scripts/fuzz.sh [PACKAGES...]
set -euo pipefail

GO=${GO:-go}
FUZZTIME=${FUZZTIME:-60s}
[[ $# -gt 0 ]] || set -- ./...

mapfile -t pkgs < <("$GO" list "$@")
found=0
for pkg in "${pkgs[@]}"; do
	# -list prints the matching names followed by an "ok" line.
	list=$("$GO" test -run '^$' -list '^Fuzz' "$pkg")
	mapfile -t targets < <(grep -E '^Fuzz[A-Za-z0-9_]*$' <<<"$list" || true)
	for name in "${targets[@]}"; do
		found=$((found + 1))
		printf '==> %s %s (%s)\n' "$pkg" "$name" "$FUZZTIME"
		"$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg"
	done
done
if ((found == 0)); then
	echo "no fuzz targets found in: $*"
else
	echo "ran $found fuzz target(s)"
fi
