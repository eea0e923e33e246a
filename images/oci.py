#!/usr/bin/env python3
"""Deterministic OCI image helpers for images/build.sh (standard library only).

Two sub-commands:

  oci.py layer --out LAYER.tar.gz SRC=DEST[:MODE] ...
      Writes a gzip-compressed layer holding each SRC file at DEST (plus its
      parent directories), owned by 0:0, mtime 0, in sorted order.  Writes
      LAYER.tar.gz.diffid beside it (the sha256 of the uncompressed tar).

  oci.py image --out IMAGE.tar --name REF --arch ARCH --config JSON
               (--layer LAYER.tar.gz [--comment TEXT])...
      Writes an OCI image layout (oci-layout, index.json, blobs/sha256/...)
      as one tar, ready for `ctr images import`.  REF is the full reference
      (localhost/sandboxrun/NAME:TAG); it goes into the index as the
      `io.containerd.image.name` annotation, and the tag as
      `org.opencontainers.image.ref.name`.  JSON is the image config's
      "config" object (User, Env, Cmd, ...).

Everything is byte-for-byte reproducible: same inputs, same digests.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"

# Timestamp written into config/history: the Unix epoch, like the tar mtimes.
CREATED = "1970-01-01T00:00:00Z"
CHUNK = 1 << 20


def canonical_json(obj):
    """Compact JSON with sorted keys: the same object always gives the same bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256_file(path):
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def diff_id(layer_path):
    """sha256 of the uncompressed layer: from the .diffid sidecar, else computed."""
    sidecar = layer_path + ".diffid"
    if os.path.exists(sidecar):
        with open(sidecar) as f:
            value = f.read().split()[0]
        return value if value.startswith("sha256:") else "sha256:" + value
    h = hashlib.sha256()
    with gzip.open(layer_path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def tar_info(name, kind, mode, size=0):
    """A TarInfo with fixed owner, group and mtime."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def atomic_output(path):
    """A temporary file in the target's directory; the caller renames it into place."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    os.close(fd)
    return tmp


def cmd_layer(args):
    """Build a small layer from host files (the pause binary, an app binary)."""
    files = {}
    for spec in args.entries:
        src, sep, rest = spec.partition("=")
        if not sep or not src or not rest:
            sys.exit(f"oci.py layer: bad entry {spec!r}, expected SRC=DEST[:MODE]")
        dest, _, mode = rest.partition(":")
        dest = dest.strip("/")
        if not os.path.isfile(src):
            sys.exit(f"oci.py layer: {src}: not a regular file")
        files[dest] = (src, int(mode, 8) if mode else 0o755)

    dirs = set()
    for dest in files:
        parent = os.path.dirname(dest)
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)

    tmp = atomic_output(args.out)
    digest = hashlib.sha256()

    class Hashing(io.RawIOBase):
        """Feeds the uncompressed tar stream to the diff_id hash and to gzip."""

        def __init__(self, sink):
            self.sink = sink

        def writable(self):
            return True

        def write(self, b):
            digest.update(b)
            self.sink.write(b)
            return len(b)

    try:
        with open(tmp, "wb") as raw:
            # filename="" and mtime=0 keep the gzip header free of host details.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                               compresslevel=6) as gz:
                with tarfile.open(fileobj=Hashing(gz), mode="w|",
                                  format=tarfile.PAX_FORMAT) as tar:
                    for name in sorted(dirs | set(files)):
                        if name in files:
                            src, mode = files[name]
                            size = os.path.getsize(src)
                            with open(src, "rb") as f:
                                tar.addfile(tar_info(name, tarfile.REGTYPE, mode, size), f)
                        else:
                            tar.addfile(tar_info(name, tarfile.DIRTYPE, 0o755))
        os.chmod(tmp, 0o644)
        with open(args.out + ".diffid", "w") as f:
            f.write("sha256:" + digest.hexdigest() + "\n")
        os.replace(tmp, args.out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cmd_image(args):
    """Assemble the OCI layout tar from finished layers and a config."""
    if ":" not in args.name.rsplit("/", 1)[-1]:
        sys.exit(f"oci.py image: {args.name!r} has no tag")
    tag = args.name.rsplit(":", 1)[1]
    comments = args.comment or []
    if comments and len(comments) != len(args.layer):
        sys.exit("oci.py image: give either no --comment or one per --layer")

    layers, diff_ids, history = [], [], []
    for i, path in enumerate(args.layer):
        layers.append({
            "mediaType": MT_LAYER_GZIP,
            "digest": "sha256:" + sha256_file(path),
            "size": os.path.getsize(path),
        })
        diff_ids.append(diff_id(path))
        history.append({
            "created": CREATED,
            "created_by": "sandboxrun images/build.sh: "
            + (comments[i] if comments else os.path.basename(path)),
        })

    config = {
        "architecture": args.arch,
        "os": "linux",
        "created": CREATED,
        "config": json.loads(args.config),
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    }
    if args.variant:
        config["variant"] = args.variant
    config_bytes = canonical_json(config)
    config_desc = {
        "mediaType": MT_CONFIG,
        "digest": "sha256:" + hashlib.sha256(config_bytes).hexdigest(),
        "size": len(config_bytes),
    }
    manifest_bytes = canonical_json({
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": config_desc,
        "layers": layers,
    })
    platform = {"architecture": args.arch, "os": "linux"}
    if args.variant:
        platform["variant"] = args.variant
    manifest_desc = {
        "mediaType": MT_MANIFEST,
        "digest": "sha256:" + hashlib.sha256(manifest_bytes).hexdigest(),
        "size": len(manifest_bytes),
        "platform": platform,
        "annotations": {
            "io.containerd.image.name": args.name,
            "org.opencontainers.image.ref.name": tag,
        },
    }
    index_bytes = canonical_json({
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [manifest_desc],
    })
    layout_bytes = canonical_json({"imageLayoutVersion": "1.0.0"})

    # blob name -> (bytes or file path); written in sorted order.
    blobs = {config_desc["digest"]: config_bytes, manifest_desc["digest"]: manifest_bytes}
    for desc, path in zip(layers, args.layer):
        blobs[desc["digest"]] = path

    tmp = atomic_output(args.out)
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(tar_info("blobs", tarfile.DIRTYPE, 0o755))
            tar.addfile(tar_info("blobs/sha256", tarfile.DIRTYPE, 0o755))
            for digest in sorted(blobs):
                name = "blobs/sha256/" + digest.split(":", 1)[1]
                body = blobs[digest]
                if isinstance(body, bytes):
                    tar.addfile(tar_info(name, tarfile.REGTYPE, 0o644, len(body)),
                                io.BytesIO(body))
                else:
                    with open(body, "rb") as f:
                        tar.addfile(tar_info(name, tarfile.REGTYPE, 0o644,
                                             os.path.getsize(body)), f)
            tar.addfile(tar_info("index.json", tarfile.REGTYPE, 0o644, len(index_bytes)),
                        io.BytesIO(index_bytes))
            tar.addfile(tar_info("oci-layout", tarfile.REGTYPE, 0o644, len(layout_bytes)),
                        io.BytesIO(layout_bytes))
        os.chmod(tmp, 0o644)
        os.replace(tmp, args.out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"{args.name} {manifest_desc['digest']} -> {args.out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("layer", help="build a small layer from host files")
    p.add_argument("--out", required=True)
    p.add_argument("entries", nargs="+", metavar="SRC=DEST[:MODE]")
    p.set_defaults(func=cmd_layer)

    p = sub.add_parser("image", help="assemble an OCI image layout tar")
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True, help="full reference, e.g. localhost/x/y:dev")
    p.add_argument("--arch", required=True, help="OCI architecture, e.g. amd64")
    p.add_argument("--variant", default="", help="OCI platform variant, e.g. v8")
    p.add_argument("--config", required=True, help='image "config" object as JSON')
    p.add_argument("--layer", action="append", required=True, help="layer .tar.gz, bottom first")
    p.add_argument("--comment", action="append", help="history text, one per --layer")
    p.set_defaults(func=cmd_image)

    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
