#!/usr/bin/env bash
# Pack Ray (for bench/peers.py's ray_tune side) into .ray/ray-site.tar.xz for a GPU
# session: the GPU image has no Ray, and Ray's wheel (about 79 MB) alone passes what the
# device tool carries (64 MiB with the working tree and .whl/).  Packed here: the wheel
# of the Ray installed on this machine, unpacked, less what a Tune run on one machine
# never loads (Ray's Java jars, the dashboard's web client, RLlib, Serve, the LLM
# library), with the dependencies the image lacks (jsonschema and its own), compressed
# with xz.  tools/gpu_session.sh unpacks it into /tmp/site beside the .whl/ wheels.
#
#   bash tools/gpu_ray.sh            # then: run(..., carry=[".whl", ".ray"])
set -euo pipefail

cd "$(git rev-parse --show-toplevel)"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qxF '/.ray/' "$exclude" 2>/dev/null || echo '/.ray/' >>"$exclude"

version=$(python3 -c 'import ray; print(ray.__version__)')
deps="jsonschema jsonschema-specifications referencing rpds-py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pins=("ray==$version")
for d in $deps; do
    pins+=("$d==$(python3 -c "from importlib.metadata import version; print(version('$d'))")")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$work/wheels" "${pins[@]}"
mkdir -p "$work/site"
for w in "$work"/wheels/*.whl; do
    unzip -q -o "$w" -d "$work/site"  # keeps the executables' modes
done
rm -rf "$work"/site/ray/jars "$work"/site/ray/dashboard/client/build "$work"/site/ray/rllib \
    "$work"/site/ray/serve "$work"/site/ray/llm
mkdir -p .ray
XZ_OPT="-6 -T0" tar -C "$work/site" -cJf .ray/ray-site.tar.xz .
echo ".ray/ray-site.tar.xz: ray $version + $deps, $(du -m .ray/ray-site.tar.xz | cut -f1) MiB"
