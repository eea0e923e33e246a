#!/usr/bin/env python3
"""The release's software bill of materials, as an SPDX 2.3 JSON document (e2e/release.sh).

What a release ships and what is in it:
- each shipped binary (sandboxrun-operator, sandboxrun-mcp, kubectl-sandboxrun, sandboxrun-agent)
  and the crates it is built from: the normal (not dev or build) dependencies reachable from its
  package in `cargo metadata` for the release's target, with the version, declared licence and
  the checksum Cargo.lock pins;
- each image and the Debian packages installed in it, read from the dpkg database inside its
  OCI tarball (images/build.sh keeps /var/lib/dpkg/status in every image).

Why a script and not a tool: cargo-cyclonedx covers the crates only (the images' Debian packages
need the dpkg database read anyway) and would be one more program to compile on every fresh CI
machine; `cargo metadata` and dpkg's status file are the sources such tools read too.

Usage: sbom.py --version V --metadata METADATA.json --lock Cargo.lock --out sbom.spdx.json
               [--binary PACKAGE:BINARY ...] [--image NAME=REF=TARBALL ...]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import io
import json
import re
import tarfile
import tomllib
import uuid

NOASSERTION = "NOASSERTION"


def spdx_id(*parts: str) -> str:
    """An SPDX element id: letters, digits, '.' and '-' only."""
    return "SPDXRef-" + re.sub(r"[^A-Za-z0-9.-]", "-", "-".join(parts))


def license_expression(declared: str | None) -> str:
    """Cargo's licence field as an SPDX expression (the old `MIT/Apache-2.0` form is an OR)."""
    if not declared:
        return NOASSERTION
    return re.sub(r"\s*/\s*", " OR ", declared.strip())


def reachable(metadata: dict, root_id: str) -> set[str]:
    """Package ids reachable from root_id over normal dependencies (what ends up in the binary)."""
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    seen, todo = set(), [root_id]
    while todo:
        pid = todo.pop()
        for dep in nodes[pid]["deps"]:
            if any(k["kind"] is None for k in dep["dep_kinds"]) and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    return seen


def dpkg_packages(tarball: str) -> list[dict]:
    """The installed packages of the dpkg database in an OCI image tarball (the last layer that
    has one wins, as in the image's file system)."""
    status = None
    with tarfile.open(tarball) as oci:
        def blob(digest: str) -> bytes:
            algo, hexa = digest.split(":", 1)
            return oci.extractfile(f"blobs/{algo}/{hexa}").read()

        index = json.loads(oci.extractfile("index.json").read())
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        for layer in manifest["layers"]:
            data = blob(layer["digest"])
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            with tarfile.open(fileobj=io.BytesIO(data)) as files:
                for member in files:
                    if member.name.lstrip("./") == "var/lib/dpkg/status" and member.isfile():
                        status = files.extractfile(member).read().decode()
    packages = []
    for stanza in (status or "").split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            packages.append(fields)
    return packages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", required=True)
    ap.add_argument("--metadata", required=True, help="output of cargo metadata --format-version 1")
    ap.add_argument("--lock", required=True, help="Cargo.lock")
    ap.add_argument("--out", required=True)
    ap.add_argument("--binary", action="append", default=[], help="PACKAGE:BINARY shipped")
    ap.add_argument("--image", action="append", default=[], help="NAME=REF=OCI_TARBALL shipped")
    args = ap.parse_args()

    with open(args.metadata) as f:
        metadata = json.load(f)
    with open(args.lock, "rb") as f:
        checksums = {(p["name"], p["version"]): p.get("checksum") for p in tomllib.load(f)["package"]}
    by_id = {p["id"]: p for p in metadata["packages"]}
    by_name = {p["name"]: p for p in metadata["packages"] if p["id"] in metadata["workspace_members"]}

    packages: dict[str, dict] = {}
    relationships = []

    def crate(p: dict) -> str:
        sid = spdx_id("crate", p["name"], p["version"])
        if sid not in packages:
            entry = {
                "SPDXID": sid,
                "name": p["name"],
                "versionInfo": p["version"],
                "downloadLocation": (
                    f"https://crates.io/api/v1/crates/{p['name']}/{p['version']}/download"
                    if (p.get("source") or "").startswith("registry+")
                    else NOASSERTION
                ),
                "licenseConcluded": NOASSERTION,
                "licenseDeclared": license_expression(p.get("license")),
                "copyrightText": NOASSERTION,
                "filesAnalyzed": False,
                "externalRefs": [
                    {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                     "referenceLocator": f"pkg:cargo/{p['name']}@{p['version']}"}
                ],
            }
            checksum = checksums.get((p["name"], p["version"]))
            if checksum:
                entry["checksums"] = [{"algorithm": "SHA256", "checksumValue": checksum}]
            packages[sid] = entry
        return sid

    described = []
    for spec in args.binary:
        package, binary = spec.split(":", 1)
        root = by_name[package]
        sid = spdx_id("binary", binary, args.version)
        packages[sid] = {
            "SPDXID": sid, "name": binary, "versionInfo": args.version,
            "downloadLocation": NOASSERTION, "primaryPackagePurpose": "APPLICATION",
            "licenseConcluded": license_expression(root.get("license")),
            "licenseDeclared": license_expression(root.get("license")),
            "copyrightText": NOASSERTION, "filesAnalyzed": False,
        }
        described.append(sid)
        for pid in sorted(reachable(metadata, root["id"])):
            relationships.append({"spdxElementId": sid, "relationshipType": "DEPENDS_ON",
                                  "relatedSpdxElement": crate(by_id[pid])})

    for spec in args.image:
        name, ref, tarball = spec.split("=", 2)
        sid = spdx_id("image", name, args.version)
        packages[sid] = {
            "SPDXID": sid, "name": name, "versionInfo": args.version,
            "downloadLocation": ref, "primaryPackagePurpose": "CONTAINER",
            "licenseConcluded": NOASSERTION, "licenseDeclared": NOASSERTION,
            "copyrightText": NOASSERTION, "filesAnalyzed": False,
            "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator": f"pkg:oci/{name}@{args.version}"}],
        }
        described.append(sid)
        debs = dpkg_packages(tarball)
        if not debs:
            raise SystemExit(f"sbom.py: no dpkg database in {tarball}")
        for deb in debs:
            dsid = spdx_id("deb", deb["Package"], deb["Version"], deb.get("Architecture", ""))
            packages.setdefault(dsid, {
                "SPDXID": dsid, "name": deb["Package"], "versionInfo": deb["Version"],
                "downloadLocation": NOASSERTION, "licenseConcluded": NOASSERTION,
                "licenseDeclared": NOASSERTION, "copyrightText": NOASSERTION,
                "filesAnalyzed": False,
                "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                  "referenceLocator": f"pkg:deb/debian/{deb['Package']}@{deb['Version']}"
                                                      f"?arch={deb.get('Architecture', 'all')}"}],
            })
            relationships.append({"spdxElementId": sid, "relationshipType": "CONTAINS",
                                  "relatedSpdxElement": dsid})

    for sid in described:
        relationships.insert(0, {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                                 "relatedSpdxElement": sid})
    document = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"sandboxrun-{args.version}",
        "documentNamespace": f"https://github.com/sandboxrun/sandboxrun/releases/{args.version}/sbom-{uuid.uuid4()}",
        "creationInfo": {
            "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "creators": ["Tool: sandboxrun-e2e-release-sbom.py"],
        },
        "packages": list(packages.values()),
        "relationships": relationships,
    }
    with open(args.out, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    crates = sum(1 for s in packages if s.startswith("SPDXRef-crate-"))
    debs = sum(1 for s in packages if s.startswith("SPDXRef-deb-"))
    print(f"sbom.py: {args.out}: {len(described)} shipped artefacts, {crates} crates, {debs} Debian packages")


if __name__ == "__main__":
    main()
