#!/usr/bin/env bash
# docs/build.sh: build the book (docs/ is its source) into target/book.
#
#   docs/build.sh            build; any warning or error from mdBook fails
#   docs/build.sh serve      (needs an mdbook with its serve feature) serve it
#
# Installs mdBook from crates.io with `cargo install` when it is missing,
# once per machine (into ~/.cargo/bin), saying so first. The internal links
# and the summary are checked by the test suite (tests/it/book.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.5.4

if ! command -v mdbook >/dev/null 2>&1 || ! mdbook --version | grep -q "v$MDBOOK_VERSION"; then
	echo "docs/build.sh: installing mdBook $MDBOOK_VERSION from crates.io (cargo install --locked mdbook; a few minutes, once per machine)"
	cargo install --locked --version "$MDBOOK_VERSION" --no-default-features --features search mdbook
fi

if [ "${1:-}" = serve ]; then
	exec mdbook serve docs
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! mdbook build docs >"$log" 2>&1; then
	cat "$log"
	echo "docs/build.sh: mdbook build failed" >&2
	exit 1
fi
cat "$log"
if grep -qE '\b(WARN|ERROR)\b' "$log"; then
	echo "docs/build.sh: mdbook warned; warnings are errors here" >&2
	exit 1
fi
echo "docs/build.sh: the book is in target/book/index.html"
