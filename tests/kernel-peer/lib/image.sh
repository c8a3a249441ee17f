# shellcheck shell=bash
# The VM image: the static kpeer tool and the initramfs (sourced by run.sh).
#
# One base initramfs per (kernel, userland, guest sources), cached in
# $KPEER_CACHE/build/<key>/; each VM gets it plus a tiny second cpio archive
# with its /etc/kpeer.conf (the kernel unpacks concatenated archives in order).

# Kernel modules the VM loads, dependencies resolved with modprobe
VM_MODULES="virtio_pci virtio_net crc32_generic rdma_rxe ib_uverbs smc smc_diag"
# ... and with RDMA_DEV=siw: siw.ko (built here) and the iWARP connection managers
VM_SIW_MODULES="libcrc32c iw_cm rdma_cm rdma_ucm"
# rdma-core / perftest programs copied into the VM (rping: rdmacm-utils)
VM_VERBS_BINS="ibv_devices ibv_devinfo ibv_rc_pingpong ib_write_bw ib_send_bw ib_send_lat
	ib_write_lat ib_read_bw ib_read_lat rping"

# siw_variant: the name of the siw build variant (SIW_P2P, SIW_MPA_REV, SIW_CRC)
siw_variant() {
	printf 'p2p%s-rev%s-crc%s' "$SIW_P2P" "$SIW_MPA_REV" "$SIW_CRC"
}

# build_siw: $KPEER_CACHE/siw/<kver>-<variant>/siw.ko from the kernel's own source, with
# Linux 6.12's compiled-in MPA choices changed for the variant (drivers/infiniband/sw/siw/
# siw_main.c: peer_to_peer, mpa_version, mpa_crc_required). Sets SIW_KO.
build_siw() {
	local d sd
	d=$KPEER_CACHE/siw/$KVER-$(siw_variant)
	SIW_KO=$d/siw.ko
	[ -e "$d/.complete" ] && return 0
	ensure_siw_build_deps
	[ -f "$SIW_SRC_TAR" ] || die "$EXIT_INFRA" "no $SIW_SRC_TAR"
	log "building siw.ko ($(siw_variant)) from $(basename "$SIW_SRC_TAR")"
	rm -rf "$d"
	sd=$d/src
	mkdir -p "$sd"
	tar -xJf "$SIW_SRC_TAR" -C "$sd" --strip-components=5 --wildcards '*/drivers/infiniband/sw/siw/*' ||
		die "$EXIT_INFRA" "siw sources missing from $SIW_SRC_TAR"
	grep -q '^const bool peer_to_peer;' "$sd/siw_main.c" &&
		grep -q '^u_char mpa_version = MPA_REVISION_2;' "$sd/siw_main.c" &&
		grep -q '^const bool mpa_crc_required;' "$sd/siw_main.c" ||
		die "$EXIT_INFRA" "siw_main.c does not declare the MPA parameters the variants change"
	[ "$SIW_P2P" = 1 ] && sed -i 's/^const bool peer_to_peer;/const bool peer_to_peer = true;/' "$sd/siw_main.c"
	[ "$SIW_MPA_REV" = 1 ] && sed -i 's/^u_char mpa_version = MPA_REVISION_2;/u_char mpa_version = MPA_REVISION_1;/' "$sd/siw_main.c"
	[ "$SIW_CRC" = 1 ] && sed -i 's/^const bool mpa_crc_required;/const bool mpa_crc_required = true;/' "$sd/siw_main.c"
	make -s -C "$SIW_KBUILD" M="$sd" CONFIG_RDMA_SIW=m modules >"$d/build.log" 2>&1 ||
		die "$EXIT_INFRA" "siw build failed: $(tail -n 5 "$d/build.log")"
	cp "$sd/siw.ko" "$SIW_KO"
	touch "$d/.complete"
}

build_image() {
	local key bdir ird lib libs b m ko base prov l mods
	key=$( {
		echo "recipe 2 $KVER $(basename "$KDEB") $RDMA_DEV"
		[ "$RDMA_DEV" = siw ] && echo "siw $(siw_variant)"
		# shellcheck disable=SC2086
		basename -a $UDEBS
		cat "$KPEER_DIR/guest/kpeer.c" "$KPEER_DIR/guest/init" "$KPEER_DIR/lib/image.sh"
	} | sha256sum | cut -c1-16)
	bdir=$KPEER_CACHE/build/$key
	BASE_INITRD=$bdir/base.cpio.gz
	KPEER_BIN=$bdir/kpeer
	# images nobody used for two days go (a parallel run may still use a
	# recent one, so younger ones stay)
	find "$KPEER_CACHE/build" -mindepth 1 -maxdepth 1 -type d -mmin +2880 -exec rm -rf {} + 2>/dev/null || true
	if [ -e "$bdir/.complete" ]; then
		touch "$bdir"
		return 0
	fi
	log "building the VM image ($key)"
	rm -rf "$bdir"
	mkdir -p "$bdir"
	gcc -static -O2 -Wall -Werror -o "$KPEER_BIN" "$KPEER_DIR/guest/kpeer.c" 2>"$bdir/gcc.log" ||
		die "$EXIT_INFRA" "building guest/kpeer.c failed: $(cat "$bdir/gcc.log")"

	ird=$bdir/root
	mkdir -p "$ird"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,lib64}
	mkdir -p "$ird/lib/x86_64-linux-gnu" "$ird/usr/lib/x86_64-linux-gnu"
	install -m 0755 "$KPEER_DIR/guest/init" "$ird/init"
	install -m 0755 "$UROOT/bin/busybox" "$ird/bin/busybox"
	install -m 0755 "$KPEER_BIN" "$ird/bin/kpeer"

	# verbs tools + their libraries, resolved against the unpacked packages
	# first and the host's (same Debian release) libc etc. second
	lib="$UROOT/usr/lib/x86_64-linux-gnu:$UROOT/lib/x86_64-linux-gnu"
	libs=""
	for b in $VM_VERBS_BINS; do
		[ -x "$UROOT/usr/bin/$b" ] || die "$EXIT_INFRA" "$b missing from the unpacked packages"
		install -m 0755 "$UROOT/usr/bin/$b" "$ird/usr/bin/$b"
		libs="$libs $UROOT/usr/bin/$b"
	done
	mkdir -p "$ird/etc/libibverbs.d" "$ird/usr/lib/x86_64-linux-gnu/libibverbs"
	for b in rxe siw; do
		prov=$(newest "$UROOT/usr/lib/x86_64-linux-gnu/libibverbs/lib$b-rdmav*.so")
		[ -n "$prov" ] || die "$EXIT_INFRA" "$b provider missing from ibverbs-providers"
		cp "$UROOT/etc/libibverbs.d/$b.driver" "$ird/etc/libibverbs.d/"
		cp -L "$prov" "$ird/usr/lib/x86_64-linux-gnu/libibverbs/"
		libs="$libs $prov"
	done
	# glibc dlopen()s libgcc_s for pthread_exit/cancellation (rping's threads)
	for l in /lib/x86_64-linux-gnu/libgcc_s.so.1 /usr/lib/x86_64-linux-gnu/libgcc_s.so.1; do
		[ -e "$l" ] && { mkdir -p "$ird$(dirname "$l")" && cp -L "$l" "$ird$l"; break; }
	done
	# shellcheck disable=SC2086
	LD_LIBRARY_PATH=$lib ldd $libs >"$bdir/ldd.txt" 2>&1 || true
	if grep -q 'not found' "$bdir/ldd.txt"; then
		die "$EXIT_INFRA" "unresolved libraries for the verbs tools: $(grep 'not found' "$bdir/ldd.txt" | sort -u | tr '\n' ' ')"
	fi
	for l in $(awk '/=> \// { print $3 } /^[ \t]*\/lib64\// { print $1 }' "$bdir/ldd.txt" | sort -u); do
		case "$l" in
		"$UROOT"/*) cp -L "$l" "$ird/usr/lib/x86_64-linux-gnu/" ;;
		*) mkdir -p "$ird$(dirname "$l")" && cp -L "$l" "$ird$l" ;;
		esac
	done

	# modules in load order (dependencies first), uncompressed for insmod
	mkdir -p "$ird/lib/modules/$KVER"
	: >"$ird/lib/modules/$KVER/load.order"
	mods=$VM_MODULES
	[ "$RDMA_DEV" = siw ] && mods="$mods $VM_SIW_MODULES"
	for m in $mods; do
		modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>>"$bdir/modprobe.log" ||
			die "$EXIT_INFRA" "module $m not found in $KPKG"
	done | awk '$1 == "insmod" { print $2 }' | awk '!seen[$0]++' >"$bdir/modules.txt"
	while read -r ko; do
		base=$(basename "$ko")
		base=${base%.xz}
		base=${base%.zst}
		base=${base%.gz}
		case "$ko" in
		*.xz) xz -dc "$ko" >"$ird/lib/modules/$KVER/$base" ;;
		*.zst) zstd -qdc "$ko" >"$ird/lib/modules/$KVER/$base" ;;
		*.gz) gzip -dc "$ko" >"$ird/lib/modules/$KVER/$base" ;;
		*) cp "$ko" "$ird/lib/modules/$KVER/$base" ;;
		esac || die "$EXIT_INFRA" "cannot decompress $ko"
		echo "$base" >>"$ird/lib/modules/$KVER/load.order"
	done <"$bdir/modules.txt"
	for m in rdma_rxe.ko smc.ko smc_diag.ko; do
		grep -qx "$m" "$ird/lib/modules/$KVER/load.order" || die "$EXIT_INFRA" "$m missing from $KPKG"
	done
	if [ "$RDMA_DEV" = siw ]; then
		build_siw
		cp "$SIW_KO" "$ird/lib/modules/$KVER/siw.ko"
		echo siw.ko >>"$ird/lib/modules/$KVER/load.order"
	fi

	(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$BASE_INITRD" ||
		die "$EXIT_INFRA" "cpio of the initramfs failed"
	touch "$bdir/.complete"
	log "VM image: $(du -h "$BASE_INITRD" | cut -f1) initramfs, modules: $(tr '\n' ' ' <"$ird/lib/modules/$KVER/load.order")"
}

# vm_initrd VMDIR: VMDIR/kpeer.conf must exist; writes VMDIR/initrd
vm_initrd() {
	local d=$1
	mkdir -p "$d/layer/etc"
	cp "$d/kpeer.conf" "$d/layer/etc/kpeer.conf"
	(cd "$d/layer" && find . | cpio -o -H newc --quiet | gzip -1) >"$d/layer.cpio.gz"
	cat "$BASE_INITRD" "$d/layer.cpio.gz" >"$d/initrd"
}
