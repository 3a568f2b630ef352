#!/usr/bin/env bash
# Make the Debian bookworm base image that CI builds the Dockerfile on, when no image registry is
# reachable: debootstrap (variant minbase, plus python3, python3-venv, python-is-python3 and
# ca-certificates) from the Debian mirror that apt on this machine already uses, cleaned of apt
# caches, docs, man pages, locales and glibc's iconv modules, and imported into podman's store.
#
#   bash scripts/container-base.sh            # prints the image name, e.g. localhost/gpu-exporter-base:bookworm
#   CONTAINER_BASE_ARCH=arm64 bash scripts/container-base.sh   # localhost/gpu-exporter-base:bookworm-arm64
#
# Another architecture than the machine's runs debootstrap's second stage under qemu: it needs
# Debian's qemu-user-static and binfmt-support (`update-binfmts --enable qemu-aarch64`).
#
# The image is built once and then reused: it carries a label with a hash of the recipe, and a
# present image with the same hash is kept (podman's store lasts across test runs on one machine).
# Set CONTAINER_BASE_REBUILD=1 to force a new one. Takes about 50 s on 2 cores (debootstrap).
# Needs root, debootstrap and podman (tests/run.sh installs them).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # debootstrap lives in /usr/sbin

native=$(dpkg --print-architecture)
arch=${CONTAINER_BASE_ARCH:-$native}
suite=bookworm
tag=$suite; [ "$arch" = "$native" ] || tag=$suite-$arch
image=${CONTAINER_BASE_IMAGE:-localhost/gpu-exporter-base:$tag}
packages=python3,python3-venv,python-is-python3,ca-certificates
# Bump when the recipe below changes; a present image with another recipe is rebuilt.
recipe=$(echo "$suite $arch $packages minbase clean-2" | sha256sum | cut -c1-16)

if [ "${CONTAINER_BASE_REBUILD:-0}" != 1 ] && podman image exists "$image" \
   && [ "$(podman image inspect --format '{{index .Labels "base.recipe"}}' "$image")" = "$recipe" ]; then
  echo "$image"
  exit 0
fi

# The mirror apt uses here: the first deb URI of a Debian source (deb822 .sources or one-line .list).
mirror=$(
  { cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}';
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '$1 == "deb" {print $2}'; } \
  | grep -v -- '-security' | grep '/debian/\?$' | head -n 1
) || true
if [ -z "$mirror" ]; then
  echo "container-base.sh: no Debian mirror found in /etc/apt/sources.list*" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
debootstrap --variant=minbase --arch="$arch" --include="$packages" \
  "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/* \
       "$work"/rootfs/usr/share/doc/* "$work"/rootfs/usr/share/man/* "$work"/rootfs/usr/share/info/* \
       "$work"/rootfs/usr/share/locale/* "$work"/rootfs/var/log/*.log "$work"/rootfs/var/cache/debconf/*-old \
       "$work"/rootfs/usr/lib/*-linux-gnu/gconv  # glibc's iconv modules (8 MB): Python has its own codecs
tar -C "$work/rootfs" -c . | podman import --quiet --arch "$arch" \
  --change 'CMD ["python3"]' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL base.recipe=$recipe" \
  --change "LABEL org.opencontainers.image.description=Debian $suite minbase with python3 (debootstrap)" \
  - "$image" >/dev/null
echo "container-base.sh: built $image in $(($(date +%s) - start)) s" >&2
echo "$image"
