"""Write the wheel that pip built and installed for flashattn2 back out of the installed files.

    python3 .ci/wheel_from_install.py DEST_DIR      # prints the wheel's path

`pip install .` builds a wheel in a temporary directory, installs it and deletes it. CI then
needs that same wheel for the other torch versions, and building it again would compile every
kernel a second time (an isolated build starts from an empty CMake tree). The installed
distribution's RECORD lists each file of the wheel with its hash: this packs those files, less
what pip added at install time (INSTALLER, REQUESTED, direct_url.json, __pycache__), after
checking that each one still has the hash it had in the wheel.
"""
import base64
import hashlib
import importlib.metadata
import pathlib
import sys
import zipfile

ADDED_BY_INSTALLER = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def main(dest_dir):
    dist = importlib.metadata.distribution("flashattn2")
    wheel_info = dist.read_text("WHEEL")
    tags = [line.split(":", 1)[1].strip() for line in wheel_info.splitlines()
            if line.startswith("Tag:")]
    if len(tags) != 1:
        sys.exit(f"expected one Tag in the installed WHEEL file, found {tags}")
    name = f"flashattn2-{dist.version}-{tags[0]}.whl"

    dist_info = next(e.parts[0] for e in dist.files if e.parts[0].endswith(".dist-info"))
    record = []
    dest = pathlib.Path(dest_dir) / name
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as wheel:
        for entry in dist.files:
            path = entry.as_posix()
            if "__pycache__" in entry.parts or (
                    entry.parts[0].endswith(".dist-info") and entry.name in ADDED_BY_INSTALLER):
                continue
            if path.startswith("../"):
                sys.exit(f"{path}: outside site-packages (a script or data file), not packed")
            data = entry.read_binary()
            if entry.hash is None or f"{entry.hash.mode}={entry.hash.value}" != record_hash(data):
                sys.exit(f"{path}: changed since pip installed it (RECORD hash differs)")
            wheel.writestr(path, data)
            record.append(f"{path},{record_hash(data)},{len(data)}")
        record_path = f"{dist_info}/RECORD"
        record.append(f"{record_path},,")
        wheel.writestr(record_path, "\n".join(record) + "\n")
    print(dest)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
