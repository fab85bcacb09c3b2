#!/usr/bin/env python3
"""Checks the operator's OCI archive as a runtime would read it, and unpacks it.

    python3 ci/image_inspect.py ARCHIVE --version V --revision R --unpack DIR --files FILE

Reads index.json, the manifest and the config from the archive itself (not from buildah's
view of what it built), and fails naming what is wrong: the user must be 65532:65532, the
entrypoint the operator in exec form with `run` as its command, the version and source
labels those given, and no shell anywhere in the layers. Then unpacks the layers in order
into DIR (owners kept) and writes FILE: one line a path with its mode, owner, size and
sha256, sorted, so two builds of one commit can be compared with diff. Prints the manifest's
digest, the image's identity: the same for two builds of one commit (the archive's own tar
headers carry the time it was written, so the archive file's hash is not).
"""

import argparse
import hashlib
import io
import json
import sys
import tarfile

SHELLS = {"sh", "bash", "dash", "ash", "zsh", "busybox"}


def fail(message):
    print(f"image: {message}", file=sys.stderr)
    sys.exit(1)


def blob(archive, digest):
    algorithm, value = digest.split(":", 1)
    member = archive.extractfile(f"blobs/{algorithm}/{value}")
    if member is None:
        fail(f"the archive lacks blob {digest}")
    data = member.read()
    if hashlib.new(algorithm, data).hexdigest() != value:
        fail(f"blob {digest} does not match its digest")
    return data


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("archive")
    parser.add_argument("--version", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--unpack", required=True)
    parser.add_argument("--files", required=True)
    args = parser.parse_args()

    with tarfile.open(args.archive) as archive:
        index = json.loads(archive.extractfile("index.json").read())
        manifests = index.get("manifests", [])
        if len(manifests) != 1:
            fail(f"index.json lists {len(manifests)} manifests, expected one")
        manifest = json.loads(blob(archive, manifests[0]["digest"]))
        config = json.loads(blob(archive, manifest["config"]["digest"]))
        run = config.get("config", {})

        expected = {
            "User": "65532:65532",
            "Entrypoint": ["/usr/local/bin/spur-operator"],
            "Cmd": ["run"],
        }
        for key, want in expected.items():
            if run.get(key) != want:
                fail(f"config {key} is {run.get(key)!r}, expected {want!r}")
        labels = run.get("Labels") or {}
        for key, want in {
            "org.opencontainers.image.version": args.version,
            "org.opencontainers.image.revision": args.revision,
            "org.opencontainers.image.licenses": "Apache-2.0",
        }.items():
            if labels.get(key) != want:
                fail(f"label {key} is {labels.get(key)!r}, expected {want!r}")
        ports = sorted(run.get("ExposedPorts") or {})
        if ports != ["6818/tcp", "8080/tcp"]:
            fail(f"exposed ports are {ports}, expected the agent's 6818 and health's 8080")

        lines = []
        for layer in manifest["layers"]:
            data = blob(archive, layer["digest"])
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as files:
                for entry in files.getmembers():
                    path = "/" + entry.name.lstrip("./")
                    if path.rsplit("/", 1)[-1] in SHELLS:
                        fail(f"the image carries a shell: {path}")
                    digest = "-"
                    if entry.isfile():
                        digest = hashlib.sha256(files.extractfile(entry).read()).hexdigest()
                    kind = "d" if entry.isdir() else ("l" if entry.issym() else "f")
                    lines.append(
                        f"{path}\t{kind}{entry.mode:04o}\t{entry.uid}:{entry.gid}\t{entry.size}\t{digest}"
                    )
                files.extractall(args.unpack, numeric_owner=True, filter="fully_trusted")
    if not any(line.startswith("/usr/local/bin/spur-operator\t") for line in lines):
        fail("the layers do not carry /usr/local/bin/spur-operator")
    with open(args.files, "w") as out:
        out.write("\n".join(sorted(lines)) + "\n")
    print(
        f"image: config checked (user 65532:65532, entrypoint, labels {args.version} "
        f"{args.revision}, no shell); {len(lines)} entries in {len(manifest['layers'])} layer(s); "
        f"manifest {manifests[0]['digest']}"
    )


if __name__ == "__main__":
    main()
