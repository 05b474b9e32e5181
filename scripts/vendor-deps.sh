#!/usr/bin/env bash
# Copies build dependencies that a bare CUDA machine lacks into .deps/, a git-ignored folder that
# travels with the tree:
#   .deps/googletest     GoogleTest sources (Debian's libgtest-dev); tests/ builds them.
#   .deps/nlohmann_json  nlohmann-json headers and CMake package (nlohmann-json3-dev).
#   .deps/httplib        Debian's compiled cpp-httplib (libcpp-httplib-dev), the headers its
#                        httplib.h includes (OpenSSL, zlib, brotli), the brotli libraries it needs
#                        at run time, and a CMake package defining httplib::httplib.
# src/server finds the last two without pkg-config (they are also found through
# -DCMAKE_PREFIX_PATH="$PWD/.deps/httplib;$PWD/.deps/nlohmann_json"). The libraries carry
# RUNPATH $ORIGIN, so libcpp-httplib finds its brotli siblings wherever the folder goes; libssl.so.3,
# libcrypto.so.3 and libz.so.1 come from the target machine.
# Files come from the installed Debian packages, or from `apt-get download` of those not installed.
# Also .whl/openai: wheels of the openai client and its dependencies for the GPU machine's Python
# (DEVICE_PYTHON, default 3.12; manylinux x86_64) for bench/server and tests/python without a
# registry: pip install --no-index --no-deps --target DIR .whl/openai/*.whl, then PYTHONPATH=DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
deps=$PWD/.deps
multiarch=$(gcc -print-multiarch)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Root of a Debian package's files: / if installed, else the package downloaded and unpacked.
pkg_root() {
  if [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; then
    echo /
  else
    (cd "$tmp" && apt-get download "$1" >&2) || { echo "error: cannot get Debian package $1; install it or allow apt-get download." >&2; exit 1; }
    mkdir -p "$tmp/$1"
    dpkg-deb -x "$tmp/$1"_*.deb "$tmp/$1"
    echo "$tmp/$1"
  fi
}

if [ ! -f .deps/googletest/CMakeLists.txt ]; then
  [ -d /usr/src/googletest ] || { echo "error: /usr/src/googletest is missing; install libgtest-dev." >&2; exit 1; }
  rm -rf .deps/googletest
  cp -r /usr/src/googletest .deps/googletest
fi

if [ ! -f .deps/nlohmann_json/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake ]; then
  r=$(pkg_root nlohmann-json3-dev)
  rm -rf .deps/nlohmann_json
  mkdir -p .deps/nlohmann_json/include .deps/nlohmann_json/share/cmake
  cp -r "$r/usr/include/nlohmann" .deps/nlohmann_json/include/
  # The package's targets file locates the headers relative to itself (three folders up).
  cp -r "$r/usr/share/cmake/nlohmann_json" .deps/nlohmann_json/share/cmake/
fi

if [ ! -f .deps/httplib/lib/cmake/httplib/httplibConfig.cmake ]; then
  dev=$(pkg_root libcpp-httplib-dev)
  so=$(readlink "$dev/usr/lib/$multiarch/libcpp-httplib.so")  # e.g. libcpp-httplib.so.0.11
  soname_pkg=$(dpkg-query -S "/usr/lib/$multiarch/$so" 2>/dev/null | cut -d: -f1 || true)
  lib=$(pkg_root "${soname_pkg:-libcpp-httplib${so#libcpp-httplib.so.}}")
  brotli=$(pkg_root libbrotli1)
  ssl=$(pkg_root libssl-dev)
  zlib=$(pkg_root zlib1g-dev)
  brotli_dev=$(pkg_root libbrotli-dev)
  patchelf=$(command -v patchelf || echo "$(pkg_root patchelf)/usr/bin/patchelf")

  h=.deps/httplib
  rm -rf $h
  mkdir -p $h/include $h/lib/cmake/httplib
  cp "$dev/usr/include/httplib.h" $h/include/
  # httplib.h includes these when built with OpenSSL, zlib and brotli support; a machine with only
  # the run-time libraries lacks them.
  cp -r "$ssl/usr/include/openssl" $h/include/
  cp "$ssl/usr/include/$multiarch/openssl/"*.h $h/include/openssl/
  cp "$zlib/usr/include/zlib.h" "$zlib/usr/include/zconf.h" $h/include/
  cp -r "$brotli_dev/usr/include/brotli" $h/include/
  # Real files under their sonames (the names the dynamic loader looks for).
  cp -L "$lib/usr/lib/$multiarch/$so" $h/lib/
  for b in brotlicommon brotlidec brotlienc; do cp -L "$brotli/usr/lib/$multiarch/lib$b.so.1" $h/lib/; done
  for f in $h/lib/*.so.*; do "$patchelf" --set-rpath '$ORIGIN' "$f"; done

  # The library's ABI depends on its feature macros (CPPHTTPLIB_OPENSSL_SUPPORT changes struct
  # layouts), so the package's own compile flags are copied into the imported target.
  defs=$(grep '^Cflags:' "$dev/usr/lib/$multiarch/pkgconfig/cpp-httplib.pc" | grep -o -- '-D[A-Za-z0-9_=]*' | sed 's/^-D//' | paste -sd';')
  version=$(sed -n 's/^#define CPPHTTPLIB_VERSION "\(.*\)"/\1/p' $h/include/httplib.h)
  cat >$h/lib/cmake/httplib/httplibConfig.cmake <<EOF
# cpp-httplib $version as Debian builds it (libcpp-httplib.so), copied by scripts/vendor-deps.sh.
get_filename_component(_httplib_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(httplib_VERSION $version)
if(NOT TARGET httplib::httplib)
  add_library(httplib::httplib SHARED IMPORTED)
  set_target_properties(httplib::httplib PROPERTIES
    IMPORTED_LOCATION "\${_httplib_prefix}/lib/$so"
    IMPORTED_SONAME "$so"
    INTERFACE_INCLUDE_DIRECTORIES "\${_httplib_prefix}/include"
    INTERFACE_COMPILE_DEFINITIONS "$defs"
    # The linker checks libcpp-httplib's own dependencies; the brotli ones sit beside it.
    INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,\${_httplib_prefix}/lib")
endif()
unset(_httplib_prefix)
EOF
  cat >$h/lib/cmake/httplib/httplibConfigVersion.cmake <<EOF
set(PACKAGE_VERSION $version)
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
EOF
fi
py=${DEVICE_PYTHON:-3.12}
if ! ls .whl/openai/openai-*.whl >/dev/null 2>&1; then
  mkdir -p .whl/openai
  python3 -m pip download -q -d .whl/openai "openai>=1.40" --only-binary=:all: --implementation cp \
    --python-version "$py" --abi "cp${py/./}" --abi abi3 --abi none \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64
fi
echo ".whl/openai ready: $(du -sh .whl/openai | cut -f1), $(ls .whl/openai | wc -l) wheels"
echo ".deps ready: $(du -sh .deps | cut -f1) ($(cd .deps && du -sh -- * | tr '\t' ' ' | paste -sd, | sed 's/,/, /g'))"
