# shellcheck shell=bash
# clients/typescript/node.sh: which Node.js the client's tests run on.
# Sourced by setup.sh and check.sh (after REPO_ROOT is set).
#
# The tests need Node.js 20.10 or later (kysely 0.28, node --test's
# --test-concurrency); the package itself runs on 18. When the machine's
# node is older (Debian 12 ships 18.19), setup.sh installs the official
# Node.js 20 build from the npm registry (the package node-linux-<arch>)
# into target/clients/node, and both scripts put it first on PATH.

PRIVATE_NODE_VERSION=20.20.2
PRIVATE_NODE_DIR="$REPO_ROOT/target/clients/node"

node_is_recent() {
	command -v node >/dev/null 2>&1 &&
		node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 10) ? 0 : 1)'
}

# The private Node.js's bin directory, for this machine's architecture.
private_node_bin() {
	local arch
	case "$(uname -m)" in
	x86_64) arch=x64 ;;
	aarch64 | arm64) arch=arm64 ;;
	*) arch=$(uname -m) ;;
	esac
	printf '%s/node_modules/node-linux-%s/bin' "$PRIVATE_NODE_DIR" "$arch"
}

# Put the private Node.js first on PATH when it was installed.
use_private_node() {
	local bin
	bin=$(private_node_bin)
	if [ -x "$bin/node" ]; then
		PATH="$bin:$PATH"
		export PATH
	fi
}

# Install the private Node.js with the machine's npm (any version).
install_private_node() {
	local arch
	arch=$(basename "$(dirname "$(private_node_bin)")")
	say "node $(node --version 2>/dev/null || echo missing) is older than 20.10: installing Node.js $PRIVATE_NODE_VERSION ($arch) from the npm registry into $PRIVATE_NODE_DIR"
	mkdir -p "$PRIVATE_NODE_DIR"
	npm install --prefix "$PRIVATE_NODE_DIR" --no-save --no-audit --no-fund --ignore-scripts \
		--loglevel=error "$arch@$PRIVATE_NODE_VERSION"
	use_private_node
}
