"""`image-builder` command line: build, keygen, verify, plan.

Exit codes: 0 ok, 1 refused or failed, 2 usage error (argparse)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="image-builder", description="Build rigbase's TPM-measured USB boot media.")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the USB image, its UKI and the signed manifest")
    b.add_argument("--bundle", required=True, type=Path, help="region enrollment bundle (provision region bundle)")
    b.add_argument("--output", required=True, type=Path, help="directory for the image, UKI and manifest")
    b.add_argument("--cache", type=Path, default=None, help="cache directory (default $RIGBASE_HOME/cache/image-builder)")
    b.add_argument("--key", type=Path, default=None, help="Ed25519 signing key (default from `image-builder keygen`)")
    b.add_argument("--with-nvidia", action="store_true", help="add Debian's non-free NVIDIA driver stack")
    b.add_argument("--mirror", default=None, help="Debian mirror (default: the one apt uses on this host)")
    b.add_argument("--plan", action="store_true", help="print the build plan as JSON and stop")
    b.add_argument("--json", action="store_true", help="print the manifest summary as JSON")
    k = sub.add_parser("keygen", help="make the builder's Ed25519 signing key")
    k.add_argument("--key", type=Path, default=None, help="where to write the private key (.pub beside it)")
    k.add_argument("--force", action="store_true", help="replace an existing key")
    v = sub.add_parser("verify", help="check a manifest's signature with a builder public key")
    v.add_argument("manifest", type=Path)
    v.add_argument("--public-key", required=True, type=Path)
    r = sub.add_parser("resolve-nvidia", help="check that the NVIDIA package set resolves (apt --simulate)")
    r.add_argument("--cache", type=Path, default=None)
    return p


def _repo() -> Path:
    """The rigbase checkout whose wheel goes on the image (this package lives in REPO/image-builder/)."""
    return Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    from image_builder import manifest
    from image_builder.errors import BuildError

    try:
        if args.command == "keygen":
            priv, pub = manifest.keygen(args.key or manifest.default_key_path(), force=args.force)
            print(f"signing key: {priv}\npublic key:  {pub}  (give it to `provision image trust-key`)")
        elif args.command == "verify":
            doc = manifest.verify(args.manifest.read_bytes(),
                                  args.manifest.with_name(args.manifest.name + manifest.SIGNATURE_SUFFIX).read_bytes(),
                                  args.public_key.read_bytes())
            print(f"ok: {args.manifest} signed by {doc['builder']['key_sha256'][:16]}…, image sha256 {doc['image']['sha256']}")
        elif args.command == "resolve-nvidia":
            from image_builder import rootfs
            cache = args.cache or manifest.default_cache_dir()
            base = rootfs.base_tree(cache, rootfs.inputs_for(False), print)
            plan = rootfs.simulate_install(base, rootfs.NVIDIA_PACKAGES, rootfs.apt_mirror())
            print("\n".join(l for l in plan.splitlines() if l.startswith("Inst ")))
        else:
            from image_builder import build
            from image_builder.plan import BuildConfig
            repo = _repo()
            cfg = BuildConfig(bundle=args.bundle, output=args.output, cache=args.cache or manifest.default_cache_dir(),
                              key=args.key or manifest.default_key_path(), with_nvidia=args.with_nvidia,
                              source_date_epoch=build.default_epoch(repo), repo=repo, mirror=args.mirror)
            if args.plan:
                print(json.dumps(cfg.as_plan(), indent=2))
                return
            doc = build.build(cfg, log=(lambda m: print(m, file=sys.stderr)))
            summary = {"output": str(args.output), "image_sha256": doc["image"]["sha256"],
                       "uki_sha256": doc["uki"]["sha256"], "root_hash": doc["verity"]["root_hash"],
                       "pcr11": doc["pcr11"][-1]["sha256"], "timings_s": doc["_timings"]}
            if args.json:
                print(json.dumps(summary, indent=2))
            else:
                print(f"image:    {args.output / doc['image']['file']} (sha256 {doc['image']['sha256']})")
                print(f"manifest: {args.output / 'manifest.json'} (+ .sig)")
                print(f"PCR 11 (ready): {summary['pcr11']}")
    except (BuildError, manifest.ManifestError) as exc:
        print(f"image-builder: {exc}", file=sys.stderr)
        sys.exit(1)
    except OSError as exc:
        print(f"image-builder: {exc.filename or ''}: {exc.strerror}; check the path and try again.", file=sys.stderr)
        sys.exit(1)
