# shellcheck shell=bash
# Host tools and the Debian packages the VMs are built from (sourced by run.sh).
#
# Host tools are installed with apt-get (scripts/setup.sh installs them too).
# Packages only the VM needs (kernel, busybox, rdma-core/perftest) are never
# installed: `apt-get download` puts them into $KPEER_CACHE/debs and they are
# unpacked below $KPEER_CACHE.

# command -> Debian package that provides it on the host
HOST_TOOLS="qemu-system-x86_64:qemu-system-x86 nsenter:util-linux ip:iproute2
	tcpdump:tcpdump tshark:tshark gcc:gcc cpio:cpio gzip:gzip depmod:kmod
	modprobe:kmod dpkg-deb:dpkg python3:python3 ss:iproute2 flock:util-linux
	sha256sum:coreutils setsid:util-linux xz:xz-utils zstd:zstd"

# Packages unpacked for the VM (besides the kernel)
VM_DEBS="busybox-static ibverbs-utils perftest libibverbs1 ibverbs-providers
	librdmacm1 libibumad3 libpci3 libnl-3-200 libnl-route-3-200 rdmacm-utils"

# newest GLOB: the last match in version order, or nothing
newest() {
	local f
	f=$(compgen -G "$1" | sort -V | tail -n1) || true
	printf '%s' "$f"
}

apt_env() {
	DEBIAN_FRONTEND=noninteractive "$@"
}

ensure_host_tools() {
	local need="" t cmd pkg
	for t in $HOST_TOOLS; do
		cmd=${t%%:*}
		pkg=${t#*:}
		[ "$cmd" = tcpdump ] && [ "$CAPTURE" = 0 ] && continue
		[ "$cmd" = tshark ] && [ "$DECODE" = 0 ] && continue
		command -v "$cmd" >/dev/null 2>&1 && continue
		[ "$cmd" = depmod ] && [ -x /usr/sbin/depmod ] && continue
		case " $need " in *" $pkg "*) ;; *) need="$need $pkg" ;; esac
	done
	# gcc -static needs the static C library and the kernel UAPI headers
	[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need="$need libc6-dev"
	[ -e /usr/include/linux/smc_diag.h ] || need="$need linux-libc-dev"
	[ -n "$need" ] || return 0
	[ "$NO_INSTALL" = 1 ] && cannot_run "missing host packages:$need (NO_INSTALL=1)"
	log "installing host packages:$need"
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
	# shellcheck disable=SC2086
	if ! apt_env apt-get install -y -q --no-install-recommends $need >"$OUT/apt.log" 2>&1; then
		apt_env apt-get update -q >>"$OUT/apt.log" 2>&1 || true
		# shellcheck disable=SC2086
		apt_env apt-get install -y -q --no-install-recommends $need >>"$OUT/apt.log" 2>&1 ||
			cannot_run "apt-get install$need failed (see $OUT/apt.log)"
	fi
}

# download_debs PKG...: make sure $KPEER_CACHE/debs has a .deb of each
download_debs() {
	local want="" p
	mkdir -p "$KPEER_CACHE/debs"
	for p in "$@"; do
		[ -n "$(newest "$KPEER_CACHE/debs/${p}_*.deb")" ] || want="$want $p"
	done
	[ -n "$want" ] || return 0
	log "downloading$want"
	# shellcheck disable=SC2086
	if ! (cd "$KPEER_CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root $want) \
		>"$OUT/apt-download.log" 2>&1; then
		apt_env apt-get update -q >>"$OUT/apt-download.log" 2>&1 || true
		# shellcheck disable=SC2086
		(cd "$KPEER_CACHE/debs" && apt-get download -q -o APT::Sandbox::User=root $want) \
			>>"$OUT/apt-download.log" 2>&1 ||
			cannot_run "apt-get download$want failed (no network for apt? see $OUT/apt-download.log)"
	fi
}

# The kernel: KPKG, else the newest linux-image-6.12.*-amd64 already cached,
# else what the linux-image-6.12-amd64 metapackage points to. The Debian 6.1
# default kernel cannot run SMC-R over rxe (README, "Kernel facts").
resolve_kernel() {
	local cached
	if [ -z "$KPKG" ]; then
		cached=$(find "$KPEER_CACHE/debs" -maxdepth 1 -name 'linux-image-6.12.*.deb' 2>/dev/null |
			grep -E '/linux-image-6\.12\.[0-9]+\+deb[0-9]+-amd64_' | sort -V | tail -n1) || true
		if [ -n "$cached" ]; then
			KPKG=$(basename "$cached")
			KPKG=${KPKG%%_*}
		else
			KPKG=$(apt-cache depends linux-image-6.12-amd64 2>/dev/null |
				awk '/Depends: linux-image-6\.12/ { print $2; exit }') || true
			if [ -z "$KPKG" ]; then
				apt_env apt-get update -q >"$OUT/apt-update.log" 2>&1 || true
				KPKG=$(apt-cache depends linux-image-6.12-amd64 2>/dev/null |
					awk '/Depends: linux-image-6\.12/ { print $2; exit }') || true
			fi
			[ -n "$KPKG" ] || cannot_run "apt knows no linux-image-6.12-amd64 (bookworm-security / backports not in sources?)"
		fi
	fi
	case "$KPKG" in
	*cloud-amd64*) die "$EXIT_USAGE" "KPKG=$KPKG: the cloud flavour has no rdma_rxe" ;;
	esac
	download_debs "$KPKG"
	KDEB=$(newest "$KPEER_CACHE/debs/${KPKG}_*.deb")
	KROOT=$KPEER_CACHE/unpacked/$(basename "$KDEB" .deb)
	if [ ! -e "$KROOT/.complete" ]; then
		log "unpacking $(basename "$KDEB")"
		rm -rf "$KROOT"
		mkdir -p "$KROOT"
		dpkg-deb -x "$KDEB" "$KROOT" || die "$EXIT_INFRA" "dpkg-deb -x $KDEB failed"
		KVER=$(ls "$KROOT/lib/modules")
		depmod -b "$KROOT" "$KVER" || die "$EXIT_INFRA" "depmod for $KVER failed"
		touch "$KROOT/.complete"
	fi
	KVER=$(ls "$KROOT/lib/modules")
	VMLINUZ=$KROOT/boot/vmlinuz-$KVER
	[ -f "$VMLINUZ" ] || die "$EXIT_INFRA" "no vmlinuz in $KDEB"
	KDEBVER=$(dpkg-deb -f "$KDEB" Version)
}

# Unpack the VM userland packages into one tree.
resolve_userland() {
	local d key
	# shellcheck disable=SC2086
	download_debs $VM_DEBS
	UDEBS=""
	for d in $VM_DEBS; do
		UDEBS="$UDEBS $(newest "$KPEER_CACHE/debs/${d}_*.deb")"
	done
	# shellcheck disable=SC2086
	key=$(basename -a $UDEBS | sha256sum | cut -c1-16)
	UROOT=$KPEER_CACHE/unpacked/userland-$key
	if [ ! -e "$UROOT/.complete" ]; then
		log "unpacking VM userland (busybox, rdma-core, perftest)"
		rm -rf "$UROOT"
		mkdir -p "$UROOT"
		for d in $UDEBS; do
			dpkg-deb -x "$d" "$UROOT" || die "$EXIT_INFRA" "dpkg-deb -x $d failed"
		done
		touch "$UROOT/.complete"
	fi
}

# RDMA_DEV=siw: Debian's kernels do not build siw (CONFIG_RDMA_SIW is not set), so
# image.sh compiles siw.ko from the matching linux-source package against the matching
# linux-headers. Both are host packages (scripts/setup.sh installs linux-source-6.12).
ensure_siw_build_deps() {
	local src hdr need="" p
	src=linux-source-$(echo "$KVER" | cut -d. -f1-2)
	hdr=linux-headers-$KVER
	for p in "$src" "$hdr" make gcc; do
		dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
	done
	SIW_SRC_TAR=/usr/src/$src.tar.xz
	SIW_KBUILD=/usr/src/linux-headers-$KVER
	[ -n "$need" ] || return 0
	[ "$NO_INSTALL" = 1 ] && cannot_run "siw needs host packages:$need (NO_INSTALL=1)"
	log "installing host packages for the siw build:$need"
	# shellcheck disable=SC2086
	if ! apt_env apt-get install -y -q --no-install-recommends $need >"$OUT/apt-siw.log" 2>&1; then
		apt_env apt-get update -q >>"$OUT/apt-siw.log" 2>&1 || true
		# shellcheck disable=SC2086
		apt_env apt-get install -y -q --no-install-recommends $need >>"$OUT/apt-siw.log" 2>&1 ||
			cannot_run "apt-get install$need failed (see $OUT/apt-siw.log)"
	fi
}
