#!/usr/bin/env bash
# prepare.sh — run HERE (Debian 12, apt and network) before the one device call of tests/gpu/run.sh.
# The GPU machine (see docs/cuda.md "GPU check") has nvcc, CMake, ninja, gcc and python3 with
# PyTorch + transformers, but no Lua, no Debian -dev packages and no network. This script
# `apt-get download`s what keng's CMakeLists.txt and the busted stack need, unpacks each .deb with
# `dpkg -x` into build-gpu-deps/root (no root install: run.sh points CMake, pkg-config,
# LUA_PATH/LUA_CPATH and LD_LIBRARY_PATH at it), drops what the build does not use, packs that
# tree into build-gpu-deps/prefix/prefix.tar.xz (about 13 MB; the tree is over 70 MB, more than
# the device tool carries: at most 64 MiB with the repo; run.sh unpacks it there), and downloads
# the wheels of the PyTorch peer's Stable Diffusion rows (diffusers, not in the image) into
# build-gpu-deps/wheels. All are ignored by git (/build-*/); the device call carries
#   carry ["build-gpu-deps/prefix", "build-gpu-deps/wheels"]
# and this script ends by printing the size that call would send (it fails over 64 MiB).
#
#   bash tests/gpu/prepare.sh          # WHEELS=0 skips the wheels (the SD peer rows then say so)
#
# `provides` below maps every library CMakeLists.txt looks for (find_package, pkg_check_modules,
# find_path, find_library: the name it searches) to the packages that provide it;
# tests/lua/gpu_harness_spec.lua fails when CMakeLists.txt asks for something not listed.
# "(image)" means the device image has it (KINDS.md: nvcc + toolkit, gcc with libgomp, libc).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
deps="$top/build-gpu-deps"

provides=(
  "OpenMP:(image)"
  "PkgConfig:pkgconf pkgconf-bin libpkgconf3"
  "lua5.4:liblua5.4-dev liblua5.4-0 lua5.4"
  "cblas.h:libopenblas-openmp-dev"
  "openblas:libopenblas0-openmp libgfortran5 libquadmath0"
  "readline:libreadline-dev libreadline8 libtinfo6"
  "m:(image)"
  "PNG:libpng-dev libpng16-16"
  "JPEG:libjpeg62-turbo-dev libjpeg62-turbo"
  "ZLIB:zlib1g-dev"
  "ompi-c:libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 libnl-3-200 libnl-route-3-200 libpsm2-2 libpsm-infinipath1 librdmacm1 libudev1"
  "CUDAToolkit:(image)"
  "nccl:(image)"
  "nccl.h:(image)"
  "cudnn:(image)"
  "cudnn.h:(image)"
  "busted:lua-busted lua-cliargs lua-dkjson lua-filesystem lua-luassert lua-mediator lua-penlight lua-say lua-system lua-term lua-inifile lua-yaml libyaml-0-2"
)
# the PyTorch peer's Stable Diffusion rows (scripts/bench/peers/pytorch_gpu.py): diffusers is not
# in the device image; its other requirements are (KINDS.md's package list)
wheels=(diffusers==0.42.1 importlib_metadata==8.7.0)

pkgs=()
for entry in "${provides[@]}"; do
  for p in ${entry#*:}; do [ "$p" = "(image)" ] || pkgs+=("$p"); done
done

rm -rf "$deps/prefix" "$deps/root"
mkdir -p "$deps/debs" "$deps/root"
if ! (cd "$deps/debs" && rm -f ./*.deb && apt-get download "${pkgs[@]}" >../download.log 2>&1); then
  grep -v "^W: Download is performed unsandboxed" "$deps/download.log" | tail -5
  echo "prepare.sh: apt-get download failed (stale package lists? run apt-get update first)"
  exit 1
fi
for f in "$deps"/debs/*.deb; do dpkg -x "$f" "$deps/root"; done

p="$deps/root"
arch=x86_64-linux-gnu
lib="$p/usr/lib/$arch"
# Debian 12 keeps readline, tinfo and zlib in /lib: gather every library in usr/lib/<arch>
if [ -d "$p/lib/$arch" ]; then
  cp -a "$p/lib/$arch/." "$lib/"
  rm -rf "$p/lib"
fi
# -dev symlinks that point at /lib/... (absolute): repoint them inside the prefix
for l in "$lib"/*.so; do
  [ -L "$l" ] || continue
  t=$(readlink "$l")
  case "$t" in /*) ln -sf "$(basename "$t")" "$l" ;; esac
done
# zlib's runtime is the device's own (keng links it through libpng): run.sh passes the system
# libz.so.1 as ZLIB_LIBRARY, so the dangling -dev link goes
rm -f "$lib/libz.so"
# Debian's Lua 5.4 modules are often links into the 5.1 tree: make them plain copies, then drop
# what neither the build nor busted uses: static libraries, LAPACK / reference BLAS, the C++ Lua,
# docs, Lua 5.1-5.3
cp -rL "$p/usr/share/lua/5.4" "$p/usr/share/lua/5.4.copy"
rm -rf "$p/usr/share/lua/5.4" && mv "$p/usr/share/lua/5.4.copy" "$p/usr/share/lua/5.4"
find "$p" \( -name '*.a' -o -name 'liblapack*' -o -name 'libblas*' -o -name 'liblua5.[123]-*' -o -name '*c++*' \
  -o -name '*lapack*.pc' -o -name 'blas-*.pc' \) -exec rm -rf {} +
rm -rf "$p/usr/share/doc" "$p/usr/share/man" "$p/usr/share/info" "$p/usr/share/lintian" \
  "$p"/usr/share/lua/5.[123] "$p"/usr/lib/$arch/lua/5.[123] "$p/etc" "$lib/fortran"
# relocatable pkg-config files: the prefix relative to the .pc file itself
sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../../..|' "$lib"/pkgconfig/*.pc
# luaconf.h includes "lua5.4-deb-multiarch.h", which Debian keeps in the multiarch include dir
cp "$p/usr/include/$arch/lua5.4-deb-multiarch.h" "$p/usr/include/lua5.4/"
# jpeglib.h includes "jconfig.h", also in the multiarch dir (the device has no system copy)
cp "$p/usr/include/$arch/jconfig.h" "$p/usr/include/"
# pkgconf needs its own libpkgconf: a wrapper that finds it and searches the prefix's .pc files
cat >"$p/usr/bin/pkg-config-prefix" <<'EOF'
#!/bin/sh
# pkgconf from the staged prefix (tests/gpu/prepare.sh), searching the prefix's .pc files only
d=$(cd "$(dirname "$0")/.." && pwd)
export PKG_CONFIG_LIBDIR="$d/lib/x86_64-linux-gnu/pkgconfig"
LD_LIBRARY_PATH="$d/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/pkgconf" "$@"
EOF
chmod +x "$p/usr/bin/pkg-config-prefix"
printf '%s\n' "${pkgs[@]}" >"$p/PACKAGES"
(cd "$deps/debs" && ls ./*.deb | sed 's|^\./||') >>"$p/PACKAGES"

if [ "${WHEELS:-1}" != 0 ]; then
  rm -rf "$deps/wheels"
  mkdir -p "$deps/wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$deps/wheels" "${wheels[@]}" || echo "prepare.sh: wheels not downloaded (the SD peer rows will say 'not available')"
fi

# the tree (over 70 MB, OpenBLAS alone 36) is more than the device tool carries: what travels is
# the tree packed (about 13 MB); run.sh unpacks it into build-gpu-deps/root there
mkdir -p "$deps/prefix"
cp "$p/PACKAGES" "$deps/prefix/PACKAGES"
tar -C "$p" --owner=0 --group=0 --numeric-owner -cf - . | xz -T0 -6 >"$deps/prefix/prefix.tar.xz.tmp"
mv "$deps/prefix/prefix.tar.xz.tmp" "$deps/prefix/prefix.tar.xz"
echo "prefix ready: $p ($(du -sh "$p" | cut -f1)), packed $deps/prefix ($(du -sh "$deps/prefix" | cut -f1)); wheels: $(du -sh "$deps/wheels" 2>/dev/null | cut -f1)"

# what the device call would send: the tracked files, the untracked ones git does not ignore, shared/
# and the two carried folders — at most 64 MiB, or the tool refuses the call
cd "$top"
bytes() { xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | bytes)
shared=0
[ -d shared ] && shared=$(find shared -type f -print0 | bytes)
carried=$(find "$deps/prefix" "$deps/wheels" -type f -print0 2>/dev/null | bytes)
total=$((tree + shared + carried))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "the device call sends $(mib $total): tree $(mib $tree), shared/ $(mib $shared), carried $(mib $carried) (limit 64 MiB)"
if [ "$total" -gt $((64 * 1048576)) ]; then
  echo "prepare.sh: that is over the device tool's 64 MiB: the call would be refused (WHEELS=0 drops the wheels)"
  exit 1
fi
echo 'device call: run(command "bash tests/gpu/run.sh", carry ["build-gpu-deps/prefix", "build-gpu-deps/wheels"], timeout_s 540)'
