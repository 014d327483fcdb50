#!/usr/bin/env bash
# clients/typescript/setup.sh: the TypeScript client's private environment.
#
#   clients/typescript/setup.sh
#
# Installs the client's development tools from the npm registry with
# `npm ci`, exactly the versions of package-lock.json, into
# clients/typescript/node_modules (never globally): typescript, prettier,
# @types/node, pg and @types/pg, knex, kysely, @opentelemetry/api,
# @opentelemetry/sdk-trace-base and @opentelemetry/context-async-hooks (the
# tests' peers), and what they depend on. Node.js 20.10 or later runs the
# tests: Debian's nodejs and npm are installed when node is missing and the
# script runs as root, and an older node gets a private Node.js 20 from the
# npm registry (node.sh). Idempotent and cheap when current: node_modules carries a
# copy of the lock it was installed from, and nothing runs when it matches.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HERE/../.." && pwd)
LOG_PREFIX=clients/typescript/setup.sh
# shellcheck source=deploy/lib/scratch-pg.sh
. "$REPO_ROOT/deploy/lib/scratch-pg.sh" # say, die, have, can_apt, apt_install
cd "$HERE"

STAMP=node_modules/.outbox-relay-lock

# shellcheck source=clients/typescript/node.sh
. "$HERE/node.sh"
use_private_node
if [ -f "$STAMP" ] && cmp -s package-lock.json "$STAMP" && node_is_recent; then
	say "current: $HERE/node_modules matches package-lock.json"
	exit 0
fi

if { ! have node || ! have npm; } && can_apt; then
	say "node or npm is missing; installing Debian's nodejs and npm"
	apt_install nodejs npm || true
fi
{ have node && have npm; } || die "Node.js 18+ and npm are needed (apt-get install nodejs npm)"
node_is_recent || install_private_node
node_is_recent || die "the tests need Node.js 20.10 or later; this is $(node --version)"

# shellcheck disable=SC2016 # JavaScript, not shell
pinned=$(node -e '
	const lock = require("./package-lock.json");
	const dev = Object.keys(require("./package.json").devDependencies);
	console.log(dev.map((n) => `${n}@${lock.packages["node_modules/" + n].version}`).join(" "));')
say "installing with npm ci (package-lock.json) into $HERE/node_modules: $pinned, and their dependencies"
rm -f "$STAMP"
npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
cp package-lock.json "$STAMP"
say "ready: $HERE/node_modules ($(node --version))"
