#!/usr/bin/env bash
# prepare.sh — run HERE (a Debian/Ubuntu machine with apt) before tests/gpu/run.sh: fetches the
# build dependencies that the GPU machine lacks (Lua 5.4, OpenBLAS (OpenMP), readline, pkgconf
# and their runtime libraries) as .deb files with `apt-get download` and unpacks them with
# `dpkg -x` into build-gpu-deps/prefix (ignored by git: pass it in `carry`). Static libraries,
# LAPACK and docs are dropped to keep the carried tree small (about 40 MB, mostly OpenBLAS).
#
#   tests/gpu/prepare.sh            # then: run tests/gpu/run.sh with carry ["build-gpu-deps/prefix"]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
deps="$top/build-gpu-deps"
pkgs=(liblua5.4-dev liblua5.4-0 libopenblas0-openmp libopenblas-openmp-dev libreadline-dev libreadline8
      libtinfo6 libgfortran5 libquadmath0 pkgconf pkgconf-bin libpkgconf3)

rm -rf "$deps/debs" "$deps/prefix"
mkdir -p "$deps/debs" "$deps/prefix"
(cd "$deps/debs" && apt-get download "${pkgs[@]}")
for f in "$deps"/debs/*.deb; do dpkg -x "$f" "$deps/prefix"; done

p="$deps/prefix"
# drop what the build does not use
find "$p" \( -name '*.a' -o -name 'liblapack*' -o -name 'libblas*' -o -name '*c++*' \) -exec rm -rf {} +
rm -rf "$p/usr/share/doc" "$p/usr/share/man" "$p/usr/share/info" "$p/usr/share/lintian"
# relocatable pkg-config file: prefix relative to the .pc file itself
sed -i 's|^prefix=/usr$|prefix=${pcfiledir}/../../..|' "$p/usr/lib/x86_64-linux-gnu/pkgconfig/lua5.4.pc"
# luaconf.h includes "lua5.4-deb-multiarch.h", which Debian keeps in the multiarch include dir
cp "$p/usr/include/x86_64-linux-gnu/lua5.4-deb-multiarch.h" "$p/usr/include/lua5.4/"
# readline and tinfo live in /lib on Debian: gather every runtime library in one dir
libdir="$p/usr/lib/x86_64-linux-gnu"
if [ -d "$p/lib/x86_64-linux-gnu" ]; then
  cp -a "$p"/lib/x86_64-linux-gnu/* "$libdir"/
  rm -rf "$p/lib"
fi
# the -dev symlinks point at /lib/...: repoint them inside the prefix
for l in "$libdir"/libreadline.so "$libdir"/libhistory.so "$libdir"/libtinfo.so; do
  [ -L "$l" ] || continue
  ln -sf "$(basename "$(readlink "$l")")" "$l"
done
echo "prefix ready: $p ($(du -sh "$p" | cut -f1))"
ls "$libdir" "$libdir/openblas-openmp" | head -50
