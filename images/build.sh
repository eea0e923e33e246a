#!/usr/bin/env bash
# images/build.sh: build sandboxrun's container images without a Docker engine,
# as OCI image-layout tarballs, and import them into containerd.
#
#   build.sh [build] [NAME...] [--import-address SOCK]
#                                 build images (default: sandbox-python
#                                 sandbox-python-data pause base)
#   build.sh all [--import-address SOCK]
#                                 the same four images, optionally imported
#   build.sh app NAME BINARY [--import-address SOCK]
#                                 localhost/sandboxrun/NAME:dev = base + BINARY
#                                 at /usr/local/bin/NAME (its entrypoint)
#   build.sh import --address SOCK [--snapshotter S] [NAME...]
#                                 `ctr images import` into namespace k8s.io
#   build.sh path NAME            print the tarball path of an image
#   build.sh rootfs NAME DIR      unpack the root file system of sandbox-python,
#                                 sandbox-python-data or base into DIR (for the
#                                 local sandbox driver); a no-op when DIR already
#                                 holds that layer
#   build.sh clean                delete the image cache
#
# Images (the names are a contract other scripts rely on):
#   localhost/sandboxrun/sandbox-python:dev  Debian bookworm minbase + python3
#   localhost/sandboxrun/sandbox-python-data:dev
#                                            the same + numpy, pandas, scipy,
#                                            matplotlib (Agg backend by default)
#   localhost/sandboxrun/pause:3.10          a static /pause, for pod sandboxes
#   localhost/sandboxrun/base:dev            Debian bookworm minbase + ca-certificates
#   localhost/sandboxrun/NAME:dev            base + one binary (build.sh app)
#
# Environment:
#   SANDBOXRUN_CACHE  cache root (default ~/.cache/sandboxrun); outputs go to
#                     $SANDBOXRUN_CACHE/images/{oci,layers,debs,logs}
#   DEBIAN_MIRROR     Debian mirror for debootstrap (default: the one apt uses)
#
# Root filesystems come from `debootstrap --variant=minbase`, which needs root
# the first time; their layers are cached under a key hashed from the recipe
# (the rootfs functions below), the package list, the suite and the
# architecture, so later runs only re-assemble the small OCI tarballs.
# See images/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly HERE
readonly REGISTRY=localhost/sandboxrun
readonly SUITE=bookworm
readonly SANDBOX_ID=65532           # uid and gid of the unprivileged `sandbox` user
readonly EPOCH=0                    # mtime of every file in every layer
readonly PYTHON_PACKAGES=python3    # --include for sandbox-python
# --include for sandbox-python-data (Debian's own builds; their Depends come too)
readonly DATA_PACKAGES=python3,python3-numpy,python3-pandas,python3-matplotlib,python3-scipy,fonts-dejavu-core
readonly BASE_PACKAGES=ca-certificates   # --include for base
readonly DEFAULT_IMAGES=(sandbox-python sandbox-python-data pause base)
readonly CACHE=${SANDBOXRUN_CACHE:-$HOME/.cache/sandboxrun}/images

# Debian's own python3 is preferred: the helper only needs the standard library.
if [[ -x /usr/bin/python3 ]]; then PYTHON=/usr/bin/python3; else PYTHON=python3; fi
readonly PYTHON

log() { printf '[images +%ss] %s\n' "$SECONDS" "$*" >&2; }
die() { printf '[images] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# Temporary directories, removed on exit.  debootstrap mounts /proc and /sys
# inside its target; anything still mounted under a temporary directory is
# unmounted first, and rm stays on one file system in any case.
TMP_DIRS=()
cleanup() {
  local dir mnt
  for dir in "${TMP_DIRS[@]}"; do
    [[ -d $dir ]] || continue
    while read -r mnt; do
      umount -l "$mnt" 2>/dev/null || true
    done < <(awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r)
    rm -rf --one-file-system "$dir"
  done
}
trap cleanup EXIT

# make_tmp: sets TMP to a new directory inside the cache (same file system as
# the outputs, so finished files can be renamed into place atomically).
make_tmp() {
  mkdir -p "$CACHE/tmp"
  TMP=$(mktemp -d "$CACHE/tmp/$1.XXXXXX")
  TMP_DIRS+=("$TMP")
}

# Serialise builds that share this cache (two shells, two scripts).
lock_cache() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.lock"
  if ! flock -n 9; then
    log "waiting for another build.sh using $CACHE"
    flock 9
  fi
}

# ---------------------------------------------------------------------------
# Small helpers.

# The OCI architecture of this machine (debootstrap builds for the host's).
oci_arch() {
  local arch
  arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
  case $arch in
    amd64 | x86_64) echo amd64 ;;
    arm64 | aarch64) echo arm64 ;;
    ppc64el | ppc64le) echo ppc64le ;;
    s390x) echo s390x ;;
    *) die "unsupported architecture: $arch" ;;
  esac
}

# The tag of an image: pause follows the upstream pause version, the rest are dev.
tag_of() {
  if [[ $1 == pause ]]; then echo 3.10; else echo dev; fi
}

# The OCI tarball of an image, e.g. $CACHE/oci/sandbox-python_dev.tar.
tarball_of() {
  printf '%s/oci/%s_%s.tar\n' "$CACHE" "$1" "$(tag_of "$1")"
}

# Short hash of everything passed on stdin.
short_hash() {
  sha256sum | cut -c1-16
}

# The Debian mirror: $DEBIAN_MIRROR, else the first enabled `deb` source of
# apt's configuration (one-line .list or deb822 .sources) whose suites include
# $SUITE, else the first http(s)/file `deb` source at all, else deb.debian.org.
detect_mirror() {
  if [[ -n ${DEBIAN_MIRROR:-} ]]; then
    printf '%s\n' "$DEBIAN_MIRROR"
    return
  fi
  local files=() file mirror=""
  [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
  for file in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f $file ]] && files+=("$file")
  done
  # shellcheck disable=SC2016 # an awk program, not a shell string
  local prog='
    function consider(uri, suites,   n, s, i) {
      if (uri !~ /^(https?|file):\/\//) return
      if (first == "") first = uri
      n = split(suites, s, /[ \t]+/)
      for (i = 1; i <= n; i++) if (s[i] == suite && best == "") best = uri
    }
    function flush(   n, u, i) {
      if (types ~ /(^|[ \t])deb([ \t]|$)/ && enabled != "no") {
        n = split(uris, u, /[ \t]+/)
        for (i = 1; i <= n; i++) if (u[i] != "") consider(u[i], suites)
      }
      types = uris = suites = ""; enabled = "yes"
    }
    FNR == 1 { flush(); deb822 = (FILENAME ~ /\.sources$/) }
    deb822 {
      if ($0 ~ /^[ \t]*$/) { flush(); next }
      if ($0 ~ /^[ \t]*#/) next
      key = tolower($0); sub(/:.*/, "", key)
      val = $0; sub(/^[^:]*:[ \t]*/, "", val)
      if (key == "types") types = val
      else if (key == "uris") uris = val
      else if (key == "suites") suites = val
      else if (key == "enabled") enabled = tolower(val)
      next
    }
    $1 == "deb" {
      i = 2
      if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      consider($i, $(i + 1))
    }
    END { flush(); if (best != "") print best; else if (first != "") print first }'
  if ((${#files[@]})); then
    mirror=$(awk -v suite="$SUITE" "$prog" "${files[@]}")
  fi
  printf '%s\n' "${mirror:-http://deb.debian.org/debian}"
}

# ---------------------------------------------------------------------------
# The rootfs recipe.  The text of these functions (via `declare -f`) is part of
# the cache key, so changing any of them rebuilds the root file systems, while
# edits elsewhere in this script (or to comments) do not.

# strip_rootfs DIR: drop what a container never needs (apt lists and caches,
# docs except copyright files, man pages, locales, logs, device nodes, host
# files debootstrap copied in) and stop later dpkg installs from adding docs.
strip_rootfs() {
  local root=${1:?}
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* \
    "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old \
    "$root"/var/cache/ldconfig/aux-cache \
    "$root"/usr/share/man "$root"/usr/share/info "$root"/usr/share/groff \
    "$root"/usr/share/lintian "$root"/usr/share/linda \
    "${root:?}"/dev/* "$root"/run/* "$root"/tmp/* "$root"/var/tmp/*
  find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  find "$root/var/log" -type f -delete
  # Runtimes bind-mount these; the build host's copies must not leak in, and
  # a plain loopback /etc/hosts serves sandboxes that get none mounted.
  rm -f "$root/etc/resolv.conf" "$root/etc/hostname" "$root/etc/hosts" "$root/etc/machine-id"
  : >"$root/etc/resolv.conf"
  : >"$root/etc/hostname"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
  chmod 0644 "$root/etc/resolv.conf" "$root/etc/hostname" "$root/etc/hosts"
  mkdir -p "$root/etc/dpkg/dpkg.cfg.d"
  cat >"$root/etc/dpkg/dpkg.cfg.d/sandboxrun-nodoc" <<'EOF'
# sandboxrun images: no docs, man pages or translations in derived layers.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
}

# add_sandbox_user DIR: the unprivileged user and group `sandbox`, 65532:65532,
# home /tmp (the only writable place in a sandbox Pod), no login shell.
add_sandbox_user() {
  local root=$1 id=$SANDBOX_ID
  if grep -q "^[^:]*:[^:]*:$id:" "$root/etc/passwd" "$root/etc/group"; then
    die "uid/gid $id already taken in $root"
  fi
  printf 'sandbox:x:%d:%d:sandbox:/tmp:/usr/sbin/nologin\n' "$id" "$id" >>"$root/etc/passwd"
  printf 'sandbox:x:%d:\n' "$id" >>"$root/etc/group"
  printf 'sandbox:*:0:0:99999:7:::\n' >>"$root/etc/shadow"
  printf 'sandbox:*::\n' >>"$root/etc/gshadow"
}

# precompile_python DIR: recompile all bytecode as "unchecked-hash" .pyc, which
# Python trusts without comparing source mtimes; the layer's fixed mtimes would
# otherwise make every timestamp-based .pyc stale, and the sandbox (read-only
# root, PYTHONDONTWRITEBYTECODE) would recompile the stdlib on every start.
precompile_python() {
  local root=$1 dirs=() dir
  for dir in "$root"/usr/lib/python3 "$root"/usr/lib/python3.*; do
    [[ -d $dir ]] && dirs+=("${dir#"$root"}")
  done
  ((${#dirs[@]})) || return 0
  chroot "$root" /usr/bin/python3 -m compileall -q -f \
    --invalidation-mode unchecked-hash "${dirs[@]}" >/dev/null
}

# configure_matplotlib DIR: make Agg (no display, no Tk) matplotlib's default
# backend; Debian's /etc/matplotlibrc, which matplotlib reads as its
# mpl-data/matplotlibrc, says TkAgg.  A no-op without matplotlib.  Its font
# cache cannot live in the read-only image: matplotlib builds it on first use
# under $HOME/.cache/matplotlib (HOME is /tmp in a sandbox).
configure_matplotlib() {
  local rc=$1/etc/matplotlibrc
  [[ -f $rc ]] || return 0
  if grep -q '^backend *:' "$rc"; then
    sed -i 's/^backend *:.*/backend: Agg/' "$rc"
  else
    printf 'backend: Agg\n' >>"$rc"
  fi
}

# slim_data_rootfs DIR: sandbox-python-data only.  scipy's Debian package
# depends on python3-pythran, scipy's build-time compiler, which pulls in a
# C/C++ toolchain, headers (Boost's alone are 138 MB), static libraries and
# libpython3.11-dev: about half the image, none of it used at run time (scipy
# ships the modules pythran built; nothing imports pythran).  Deletes the
# files of those build-only packages as dpkg lists them (gcc, g++, cpp and
# their libraries, binutils, every *-dev package, python3-pythran), what is
# left of /usr/include and of static libraries, the symlinks in /usr that this
# leaves dangling (cc, c++, ...), and the test suites, the `tests` directories,
# of numpy, pandas, scipy and matplotlib (the modules they import at run time,
# numpy.testing, pandas._testing and matplotlib.testing, stay); then refreshes
# ld.so.cache.  dpkg's database is kept as it is and still lists the removed
# packages: nobody runs apt or dpkg in a sandbox.
slim_data_rootfs() {
  local root=$1 list pkg pat owner paths owned=() kept=()
  local build_only=(
    gcc 'gcc-[0-9][0-9]' g++ 'g++-[0-9][0-9]' cpp 'cpp-[0-9][0-9]' 'libcc1-*' 'libgcc-*-dev'
    'libasan*' 'libtsan*' 'liblsan*' 'libubsan*' 'libhwasan*' libitm1 libatomic1
    'libisl[0-9]*' libmpc3 libmpfr6 binutils 'binutils-*' libbinutils 'libctf*'
    'libgprofng*' libjansson4 libc-dev-bin rpcsvc-proto '*-dev' python3-pythran
  )
  for list in "$root"/var/lib/dpkg/info/*.list; do
    pkg=${list##*/}
    pkg=${pkg%.list}
    pkg=${pkg%%:*}
    owner=kept
    for pat in "${build_only[@]}"; do
      # shellcheck disable=SC2053 # $pat is a glob on purpose
      if [[ $pkg == $pat ]]; then owner=owned; break; fi
    done
    if [[ $owner == owned ]]; then owned+=("$list"); else kept+=("$list"); fi
  done
  # The paths only they list: their files and symlinks (rm follows none),
  # then their directories with whatever else is in them (the __pycache__ of
  # pythran's modules).  Directory symlinks are kept: the lists name merged
  # /usr's /bin, /lib... (relative links, so paths through them stay in DIR).
  paths=$(LC_ALL=C comm -23 <(LC_ALL=C sort -u "${owned[@]}") <(LC_ALL=C sort -u "${kept[@]}"))
  while IFS= read -r path; do
    [[ -d $root$path ]] || printf '%s\n' "$root$path"
  done <<<"$paths" | xargs -r -d '\n' rm -f --
  while IFS= read -r path; do
    if [[ -d $root$path && ! -L $root$path ]]; then rm -rf "${root:?}$path"; fi
  done <<<"$paths"
  rm -rf "$root/usr/include"
  find "$root/usr/lib" -name '*.a' \( -type f -o -type l \) -delete
  # In the chroot, absolute symlinks resolve inside DIR.
  chroot "$root" /usr/bin/find /usr -xtype l -delete
  find "$root"/usr/lib/python3/dist-packages/{numpy,pandas,scipy,matplotlib} \
    -type d -name tests -prune -exec rm -rf {} +
  chroot "$root" /sbin/ldconfig
}

# tar_layer DIR OUT: a reproducible layer OUT (.tar.gz) of DIR plus OUT.diffid:
# sorted entries, every mtime $EPOCH, numeric owners (root files stay 0:0; the
# few files Debian gives other owners, like /etc/shadow's group, keep theirs),
# no atime/ctime or PID in pax headers, gzip without name or timestamp.
tar_layer() {
  local root=$1 out=$2
  tar --create --file="$out.tmp.tar" --directory="$root" \
    --sort=name --format=pax \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --mtime="@$EPOCH" --numeric-owner --one-file-system .
  printf 'sha256:%s\n' "$(sha256sum "$out.tmp.tar" | cut -d' ' -f1)" >"$out.diffid"
  gzip -n -6 <"$out.tmp.tar" >"$out.tmp.gz"
  rm -f "$out.tmp.tar"
  mv -f "$out.tmp.gz" "$out"
}

# rootfs_layer KIND PACKAGES [STEP...]: sets LAYER to the cached layer of a
# debootstrap minbase $SUITE root with PACKAGES included, building it if
# needed.  Each STEP, a recipe function of this KIND only (slim_data_rootfs),
# runs on the root right after debootstrap; its text is part of KIND's key.
rootfs_layer() {
  local kind=$1 packages=$2 key out mirror step
  local steps=("${@:3}")
  key=$({
    echo "sandboxrun rootfs recipe"
    declare -f rootfs_layer strip_rootfs add_sandbox_user precompile_python \
      configure_matplotlib tar_layer "${steps[@]}"
    echo "$kind $packages $SUITE $(oci_arch) $SANDBOX_ID $EPOCH"
  } | short_hash)
  out=$CACHE/layers/rootfs-$kind-$key.tar.gz
  LAYER=$out
  if [[ -s $out && -s $out.diffid ]]; then
    log "$kind: rootfs cached ($(basename "$out"))"
    return 0
  fi
  ((EUID == 0)) || die "$kind: building a root file system needs root (debootstrap, chroot)"
  command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"

  mirror=$(detect_mirror)
  make_tmp "rootfs-$kind"
  local root=$TMP/root logfile=$CACHE/logs/debootstrap-$kind.log
  mkdir -p "$CACHE/debs" "$CACHE/logs" "$CACHE/layers"
  log "$kind: debootstrap --variant=minbase --include=$packages $SUITE from $mirror (log: $logfile)"
  # --cache-dir keeps the downloaded .debs, shared by every rootfs.
  if ! debootstrap --variant=minbase --include="$packages" --cache-dir="$CACHE/debs" \
    "$SUITE" "$root" "$mirror" >"$logfile" 2>&1; then
    tail -n 25 "$logfile" >&2
    die "$kind: debootstrap failed, see $logfile"
  fi
  for step in "${steps[@]}"; do
    log "$kind: $step"
    "$step" "$root"
  done
  if [[ $packages == *python3* ]]; then
    log "$kind: precompiling Python bytecode (unchecked-hash)"
    precompile_python "$root"
  fi
  configure_matplotlib "$root"
  strip_rootfs "$root"
  add_sandbox_user "$root"
  log "$kind: rootfs is $(du -sh --apparent-size "$root" | cut -f1); writing layer"
  tar_layer "$root" "$out"
  # Drop layers of this kind built from an older recipe.  The key's 16
  # characters are spelled out so that sandbox-python's pattern does not also
  # match sandbox-python-data's layers.
  find "$CACHE/layers" -maxdepth 1 -name "rootfs-$kind-????????????????.*" \
    ! -name "rootfs-$kind-$key.*" -delete
}

# pause_layer: sets LAYER to the cached layer holding /pause, compiled from
# images/pause/pause.c with `gcc -static -Os`.
pause_layer() {
  local src=$HERE/pause/pause.c cflags=(-static -Os -s -Wall -Wextra) key out
  ensure_static_gcc
  key=$({
    echo "sandboxrun pause"
    declare -f pause_layer
    cat "$src"
    gcc --version | head -n 1
    echo "${cflags[*]} $(oci_arch)"
  } | short_hash)
  out=$CACHE/layers/pause-$key.tar.gz
  LAYER=$out
  if [[ -s $out && -s $out.diffid ]]; then
    log "pause: binary cached ($(basename "$out"))"
    return 0
  fi
  make_tmp pause
  gcc "${cflags[@]}" -o "$TMP/pause" "$src"
  "$PYTHON" "$HERE/oci.py" layer --out "$out" "$TMP/pause=pause:0755"
  find "$CACHE/layers" -maxdepth 1 -name 'pause-*' ! -name "pause-$key.*" -delete
}

# ensure_static_gcc: gcc and a static libc (libc6-dev), installed with apt if missing.
ensure_static_gcc() {
  local libc
  if command -v gcc >/dev/null; then
    libc=$(gcc -print-file-name=libc.a)
    [[ $libc == /* && -f $libc ]] && return 0
  fi
  ((EUID == 0)) || die "gcc with a static libc is needed: apt-get install gcc libc6-dev"
  log "installing gcc and libc6-dev for the static pause binary"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc libc6-dev >&2
}

# ---------------------------------------------------------------------------
# Images.  Each writes $CACHE/oci/NAME_TAG.tar; assembling one from cached
# layers takes well under a second (oci.py only hashes and copies).

# assemble NAME CONFIG_JSON LAYER COMMENT [LAYER COMMENT]...
assemble() {
  local name=$1 config=$2 args=()
  shift 2
  while (($#)); do
    args+=(--layer "$1" --comment "$2")
    shift 2
  done
  mkdir -p "$CACHE/oci"
  "$PYTHON" "$HERE/oci.py" image --out "$(tarball_of "$name")" \
    --name "$REGISTRY/$name:$(tag_of "$name")" --arch "$(oci_arch)" \
    --config "$config" "${args[@]}" >&2
}

image_sandbox_python() {
  rootfs_layer sandbox-python "$PYTHON_PACKAGES"
  assemble sandbox-python '{
    "User": "65532:65532",
    "WorkingDir": "/tmp",
    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"],
    "Cmd": ["python3"]
  }' "$LAYER" "debootstrap --variant=minbase --include=$PYTHON_PACKAGES $SUITE"
}

image_sandbox_python_data() {
  rootfs_layer sandbox-python-data "$DATA_PACKAGES" slim_data_rootfs
  assemble sandbox-python-data '{
    "User": "65532:65532",
    "WorkingDir": "/tmp",
    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"],
    "Cmd": ["python3"]
  }' "$LAYER" "debootstrap --variant=minbase --include=$DATA_PACKAGES $SUITE; slim_data_rootfs"
}

image_pause() {
  pause_layer
  # 65535:65535 as in the upstream pause image; /pause needs no privileges.
  assemble pause '{
    "User": "65535:65535",
    "Entrypoint": ["/pause"]
  }' "$LAYER" "gcc -static -Os images/pause/pause.c -o /pause"
}

image_base() {
  rootfs_layer base "$BASE_PACKAGES"
  assemble base '{
    "User": "65532:65532",
    "WorkingDir": "/",
    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
    "Cmd": ["/bin/sh"]
  }' "$LAYER" "debootstrap --variant=minbase --include=$BASE_PACKAGES $SUITE"
}

# image_app NAME BINARY: base's layer plus one layer with BINARY at
# /usr/local/bin/NAME.  The binary layer is rebuilt every time (it is what
# changes); the base layer comes from the cache.
image_app() {
  local name=$1 binary=$2 base_layer
  [[ $name =~ ^[a-z0-9]+([._-][a-z0-9]+)*$ ]] || die "app: bad image name '$name' (lower-case letters, digits, . _ -)"
  [[ -f $binary ]] || die "app: $binary: no such file"
  case $name in sandbox-python | sandbox-python-data | pause | base) die "app: '$name' is a reserved image name" ;; esac
  rootfs_layer base "$BASE_PACKAGES"
  base_layer=$LAYER
  make_tmp "app-$name"
  "$PYTHON" "$HERE/oci.py" layer --out "$TMP/app.tar.gz" "$binary=usr/local/bin/$name:0755"
  assemble "$name" "{
    \"User\": \"65532:65532\",
    \"WorkingDir\": \"/\",
    \"Env\": [\"PATH=/usr/local/bin:/usr/bin:/bin\"],
    \"Entrypoint\": [\"/usr/local/bin/$name\"]
  }" "$base_layer" "debootstrap --variant=minbase --include=$BASE_PACKAGES $SUITE" \
    "$TMP/app.tar.gz" "add $(basename "$binary") as /usr/local/bin/$name"
}

# build_image NAME: one of the standard images.
build_image() {
  case $1 in
    sandbox-python) image_sandbox_python ;;
    sandbox-python-data) image_sandbox_python_data ;;
    pause) image_pause ;;
    base) image_base ;;
    *) die "unknown image '$1' (standard images: ${DEFAULT_IMAGES[*]}; use 'app NAME BINARY' for others)" ;;
  esac
}

# ---------------------------------------------------------------------------
# Import.

# import_images ADDRESS SNAPSHOTTER NAME...: `ctr images import` each tarball
# into namespace k8s.io (where the kubelet's CRI looks), unpacked for the
# snapshotter (containerd's default when empty).  A missing standard image is
# built first.
import_images() {
  local address=$1 snapshotter=$2 name tarball ctr_args=()
  shift 2
  command -v ctr >/dev/null || die "ctr is missing: apt-get install containerd"
  [[ -S $address ]] || die "import: $address is not a socket"
  [[ -n $snapshotter ]] && ctr_args+=(--snapshotter "$snapshotter")
  for name in "$@"; do
    tarball=$(tarball_of "$name")
    if [[ ! -s $tarball ]]; then
      case " ${DEFAULT_IMAGES[*]} " in
        *" $name "*) lock_cache; build_image "$name" ;;
        *) die "import: no tarball for '$name' ($tarball); build it with: build.sh app $name BINARY" ;;
      esac
    fi
    log "importing $REGISTRY/$name:$(tag_of "$name") into $address (namespace k8s.io)"
    ctr --address "$address" --namespace k8s.io images import \
      "${ctr_args[@]}" "$tarball" >&2
  done
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

# ---------------------------------------------------------------------------
# Unpacked root file systems, for sandboxrun's local (embedded) sandbox driver,
# which bind-mounts DIR read-only as the sandbox's / (bubblewrap) or uses it as
# an OCI bundle's root (gVisor).

# The marker in an unpacked root: which image and layer it holds.  Its presence
# also says the unpacking finished (it is written last).
readonly ROOTFS_MARKER=.sandboxrun-rootfs

# unpack_rootfs NAME DIR: DIR becomes the root file system of image NAME,
# unpacked from its cached layer (built first if missing).  Idempotent: when
# DIR's marker names the same layer digest nothing is done.  Otherwise the
# layer is unpacked next to DIR and swapped in with renames, so DIR is never
# seen half-written by a sandbox that starts meanwhile.
unpack_rootfs() {
  local name=$1 dir=$2 kind packages diffid want parent tmp old steps=()
  case $name in
    sandbox-python) kind=sandbox-python packages=$PYTHON_PACKAGES ;;
    sandbox-python-data) kind=sandbox-python-data packages=$DATA_PACKAGES steps=(slim_data_rootfs) ;;
    base) kind=base packages=$BASE_PACKAGES ;;
    *) die "rootfs: no root file system for '$name' (sandbox-python, sandbox-python-data or base)" ;;
  esac
  rootfs_layer "$kind" "$packages" "${steps[@]}"
  diffid=$(<"$LAYER.diffid")
  want="image $REGISTRY/$name:$(tag_of "$name") layer $diffid"
  if [[ -f $dir/$ROOTFS_MARKER && $(<"$dir/$ROOTFS_MARKER") == "$want" ]]; then
    log "rootfs: $dir already holds $name ($diffid)"
    return 0
  fi
  [[ ! -e $dir || -d $dir ]] || die "rootfs: $dir exists and is not a directory"
  if [[ -d $dir && ! -f $dir/$ROOTFS_MARKER ]] && [[ -n $(ls -A "$dir") ]]; then
    die "rootfs: $dir is not empty and holds no $ROOTFS_MARKER: refusing to replace it"
  fi
  parent=$(dirname "$dir")
  mkdir -p "$parent"
  tmp=$(mktemp -d "$parent/.rootfs-$name.XXXXXX")
  TMP_DIRS+=("$tmp")
  log "rootfs: unpacking $(basename "$LAYER") into $dir"
  # As root, keep the layer's owners (root:root, /etc/shadow root:shadow 0640),
  # so the unprivileged sandbox user cannot read what it must not.
  local owner=()
  ((EUID == 0)) && owner=(--same-owner --numeric-owner)
  tar --extract --gzip --file="$LAYER" --directory="$tmp" "${owner[@]}" \
    --same-permissions --no-overwrite-dir
  chmod 0755 "$tmp"
  printf '%s\n' "$want" >"$tmp/$ROOTFS_MARKER"
  chmod 0644 "$tmp/$ROOTFS_MARKER"
  old=""
  if [[ -d $dir ]]; then
    old="$parent/.rootfs-$name.old.$$"
    mv "$dir" "$old"
    TMP_DIRS+=("$old")
  fi
  mv "$tmp" "$dir"
  [[ -n $old ]] && rm -rf --one-file-system "$old"
  log "rootfs: $dir holds $name ($diffid)"
}

# ---------------------------------------------------------------------------
# Command line.

main() {
  local cmd=${1:-build} start=$SECONDS
  (($#)) && shift
  local names=() name address="" snapshotter=""
  case $cmd in
    -h | --help | help)
      usage
      return 0
      ;;
    build | all)
      while (($#)); do
        case $1 in
          --import-address) address=${2:?--import-address needs a socket path}; shift 2 ;;
          --import-address=*) address=${1#*=}; shift ;;
          -*) die "unknown option $1" ;;
          *) names+=("$1"); shift ;;
        esac
      done
      [[ $cmd == all && ${#names[@]} -gt 0 ]] && die "all takes no image names"
      ((${#names[@]})) || names=("${DEFAULT_IMAGES[@]}")
      lock_cache
      for name in "${names[@]}"; do build_image "$name"; done
      if [[ -n $address ]]; then import_images "$address" "" "${names[@]}"; fi
      ;;
    app)
      (($# >= 2)) || die "usage: build.sh app NAME BINARY [--import-address SOCK]"
      local app=$1 binary=$2
      shift 2
      while (($#)); do
        case $1 in
          --import-address) address=${2:?--import-address needs a socket path}; shift 2 ;;
          --import-address=*) address=${1#*=}; shift ;;
          *) die "unknown argument $1" ;;
        esac
      done
      lock_cache
      image_app "$app" "$binary"
      if [[ -n $address ]]; then import_images "$address" "" "$app"; fi
      ;;
    import)
      while (($#)); do
        case $1 in
          --address) address=${2:?--address needs a socket path}; shift 2 ;;
          --address=*) address=${1#*=}; shift ;;
          --snapshotter) snapshotter=${2:?--snapshotter needs a name}; shift 2 ;;
          --snapshotter=*) snapshotter=${1#*=}; shift ;;
          -*) die "unknown option $1" ;;
          *) names+=("$1"); shift ;;
        esac
      done
      [[ -n $address ]] || die "usage: build.sh import --address SOCK [--snapshotter S] [NAME...]"
      ((${#names[@]})) || names=("${DEFAULT_IMAGES[@]}")
      import_images "$address" "$snapshotter" "${names[@]}"
      ;;
    path)
      (($# == 1)) || die "usage: build.sh path NAME"
      tarball_of "$1"
      return 0
      ;;
    rootfs)
      (($# == 2)) || die "usage: build.sh rootfs NAME DIR"
      lock_cache
      unpack_rootfs "$1" "$2"
      return 0
      ;;
    clean)
      lock_cache
      log "removing $CACHE"
      find "$CACHE" -mindepth 1 -maxdepth 1 ! -name .lock -exec rm -rf --one-file-system {} +
      return 0
      ;;
    sandbox-python | sandbox-python-data | pause | base)
      # Shorthand: build.sh pause == build.sh build pause.
      main build "$cmd" "$@"
      return 0
      ;;
    *)
      usage >&2
      die "unknown command '$cmd'"
      ;;
  esac
  log "done in $((SECONDS - start))s; tarballs in $CACHE/oci"
}

main "$@"
