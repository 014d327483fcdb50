# shellcheck shell=bash
# deploy/lib/build-tools.sh: what building the relay needs besides Rust.
# Sourced after scratch-pg.sh (say, have, can_apt, apt_install).
#
#   ensure_build_tools   installs Debian's make, pkg-config and libssl-dev
#                        when one is missing and the script runs as root;
#                        otherwise says what to install
#
# The kafka kind's librdkafka is compiled from the rdkafka crate's bundled
# source: its configure script and make, and OpenSSL's headers for TLS and
# SCRAM. A C compiler comes with Rust's own needs (the linker).

openssl_headers() {
	[ -f /usr/include/openssl/ssl.h ] || { have pkg-config && pkg-config --exists openssl; }
}

ensure_build_tools() {
	local missing=()
	have make || missing+=(make)
	have pkg-config || missing+=(pkg-config)
	openssl_headers || missing+=(libssl-dev)
	[ "${#missing[@]}" -eq 0 ] && return 0
	if can_apt; then
		say "building librdkafka (the kafka kind) needs ${missing[*]}; installing Debian's packages"
		apt_install "${missing[@]}" || die "could not install ${missing[*]}"
	else
		die "building librdkafka (the kafka kind) needs ${missing[*]}: apt-get install ${missing[*]}"
	fi
}
