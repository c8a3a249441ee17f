# shellcheck shell=bash
# The VM image: the static kpeer tool and the initramfs (sourced by run.sh).
#
# One base initramfs per (kernel, userland, guest sources), cached in
# $KPEER_CACHE/build/<key>/; each VM gets it plus a tiny second cpio archive
# with its /etc/kpeer.conf (the kernel unpacks concatenated archives in order).

# Kernel modules the VM loads, dependencies resolved with modprobe
VM_MODULES="virtio_pci virtio_net crc32_generic rdma_rxe ib_uverbs smc smc_diag"
# rdma-core / perftest programs copied into the VM
VM_VERBS_BINS="ibv_devices ibv_devinfo ibv_rc_pingpong ib_write_bw ib_send_bw ib_send_lat
	ib_write_lat ib_read_bw ib_read_lat"

build_image() {
	local key bdir ird lib libs b m ko base prov l
	key=$( {
		echo "recipe 1 $KVER $(basename "$KDEB")"
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
	prov=$(newest "$UROOT/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so")
	[ -n "$prov" ] || die "$EXIT_INFRA" "rxe provider missing from ibverbs-providers"
	mkdir -p "$ird/etc/libibverbs.d" "$ird/usr/lib/x86_64-linux-gnu/libibverbs"
	cp "$UROOT/etc/libibverbs.d/rxe.driver" "$ird/etc/libibverbs.d/"
	cp -L "$prov" "$ird/usr/lib/x86_64-linux-gnu/libibverbs/"
	libs="$libs $prov"
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
	for m in $VM_MODULES; do
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
