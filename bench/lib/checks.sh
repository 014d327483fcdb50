# shellcheck shell=bash
# bench/lib/checks.sh: sourced by the bench's scripts, for the checks they
# make before they start. Each failure names the script (CHECKS_NAME, set
# by the sourcing script), says what is missing and exits with status 2.
#
#   needs_tools TOOL...        each TOOL is a command on PATH
#   needs_executables FILE...  each FILE is an executable (a build's bench)

needs_tools() {
	local tool
	for tool in "$@"; do
		command -v "$tool" >/dev/null || {
			echo "$CHECKS_NAME: needs $tool" >&2
			exit 2
		}
	done
}

needs_executables() {
	local file
	for file in "$@"; do
		[ -x "$file" ] || {
			echo "$CHECKS_NAME: $file is not an executable" >&2
			exit 2
		}
	done
}
