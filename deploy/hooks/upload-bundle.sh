#!/bin/sh
# upload-bundle.sh DEST BUNDLE: ship one wedgewatch evidence bundle off the machine.
#
# Made to be wedgewatch's `on_bundle` hook, which appends the bundle directory:
#   on_bundle = ["/opt/wedgewatch/deploy/hooks/upload-bundle.sh", "s3://my-bucket/wedgewatch"]
# DEST decides the tool, which must be on the hook's PATH:
#   s3://BUCKET/PREFIX   aws s3 cp --recursive          (the AWS CLI)
#   gs://BUCKET/PREFIX   gsutil -m cp -r                (Google Cloud SDK)
#   REMOTE:PATH          rclone copy                    (any rclone remote: S3, GCS, Azure, ...)
#   /ABSOLUTE/DIR        cp -R, then rename             (a shared or persistent volume)
# The bundle lands at DEST/BUNDLE_NAME (bundle names are unique: time, target, engine,
# family). The hook runs with wedgewatch's minimal environment (PATH, HOME, LANG, ...; no
# secrets), so credentials come from files under HOME (~/.aws, ~/.config/rclone, gcloud's)
# or the machine's identity (instance profile, workload identity); variables a tool needs
# can be set in on_bundle itself: ["/usr/bin/env", "AWS_ROLE_ARN=...", "AWS_WEB_IDENTITY_
# TOKEN_FILE=...", "/opt/.../upload-bundle.sh", "s3://..."]. See docs/evidence.md.
# Exit status 0: uploaded; anything else is logged by wedgewatch as a failed hook run.
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: upload-bundle.sh DEST BUNDLE_DIR (DEST: s3://..., gs://..., REMOTE:PATH or /DIR)" >&2
    exit 2
fi
dest=${1%/}
bundle=${2%/}
if [ ! -d "$bundle" ] || [ ! -f "$bundle/summary.json" ]; then
    echo "upload-bundle.sh: $bundle is not a wedgewatch bundle (no summary.json)" >&2
    exit 2
fi
name=$(basename "$bundle")

need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "upload-bundle.sh: $1 not found on PATH ($PATH); it is needed for $dest" >&2
        exit 127
    fi
}

case "$dest" in
    s3://*)
        need aws
        exec aws s3 cp --recursive --only-show-errors "$bundle" "$dest/$name"
        ;;
    gs://*)
        need gsutil
        exec gsutil -q -m cp -r "$bundle" "$dest/"
        ;;
    /*)
        mkdir -p "$dest"
        rm -rf "$dest/.$name.partial"
        cp -R "$bundle" "$dest/.$name.partial"
        mv "$dest/.$name.partial" "$dest/$name"  # readers never see half a bundle
        ;;
    *:*)
        need rclone
        exec rclone copy "$bundle" "$dest/$name"
        ;;
    *)
        echo "upload-bundle.sh: unknown destination $dest (s3://..., gs://..., REMOTE:PATH or /DIR)" >&2
        exit 2
        ;;
esac
