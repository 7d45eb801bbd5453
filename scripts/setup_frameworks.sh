#!/usr/bin/env bash
# Installs into .venv, idempotently, the frameworks whose hooks the tests attach to: vLLM, verl
# and Megatron-Core, each at the version the hooks were checked against, with exactly the
# packages that importing the hooked modules needs. Everything goes in with --no-deps: the
# frameworks' own requirements pin other torch builds and GPU-only packages, and pip would
# replace the environment's torch; the script checks torch is the same before and after.
# Megatron-Core is 0.16.1: its later releases need Python 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup_frameworks: $*"; }
VPY=.venv/bin/python

PINS=(
    # the frameworks
    vllm==0.33.0 verl==0.9.1 megatron-core==0.16.1
    # vllm.v1.worker.gpu_worker's imports
    pydantic==2.14.4 pydantic_core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
    regex==2026.11.19 cbor2==6.3.0 psutil==7.2.2 pyzmq==27.3.0 transformers==5.24.0
    huggingface_hub==2.4.0 tqdm==4.70.1 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
    PyYAML==6.0.4 safetensors==0.8.0 tokenizers==0.23.3 typer==0.29.2 click==8.5.1
    shellingham==1.5.4 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 requests==2.34.2
    urllib3==2.8.0 idna==3.20 certifi==2026.10.19.post1 charset-normalizer==3.5.3
    msgspec==0.23.0 cloudpickle==3.1.3 blake3==1.0.11 cachetools==8.0.2 einops==0.8.2
    prometheus_client==0.26.0 pybase64==1.5.1 py-cpuinfo==9.0.0 setproctitle==1.3.8
    sniffio==1.3.1 anyio==4.16.0 h11==0.16.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1
    propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 attrs==26.1.0
    openai-harmony==0.0.8 openai==3.57.0 pillow==13.0.0 uvloop==0.23.0 xgrammar==0.2.9
    apache-tvm-ffi==0.1.15.post2 fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7
    opentelemetry-api==1.45.2 partial-json-parser==0.2.1.1.post7 llguidance==1.9.1
    protobuf==7.36.2
    # verl.trainer.ppo.ray_trainer's imports
    ray==2.60.0 tensordict==0.15.3 torchdata==0.11.0 omegaconf==2.4.0 codetiming==1.4.0
    pyvers==0.2.3 orjson==3.13.0 msgpack==1.2.4 jsonschema==4.26.0 referencing==0.37.0
    rpds-py==2026.9.1 jsonschema-specifications==2025.9.1 datasets==5.2.0 multiprocess==0.70.19
    pyarrow==26.0.1 dill==0.4.1 xxhash==4.1.0 peft==0.21.2 accelerate==1.15.0 uvicorn==0.54.0
    pandas==3.1.1 python-dateutil==4.0.0 tzdata==2026.6
)

if [ ! -x "$VPY" ]; then
    say "no .venv (run scripts/setup.sh)" >&2
    exit 1
fi

# The pins not installed at their version (distribution names compared normalized).
mapfile -t missing < <("$VPY" - "${PINS[@]}" <<'PY'
import importlib.metadata as md
import re
import sys

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

installed = {norm(d.metadata["Name"]): d.version for d in md.distributions()}
for pin in sys.argv[1:]:
    name, _, version = pin.partition("==")
    if installed.get(norm(name)) != version:
        print(pin)
PY
)
if [ ${#missing[@]} -eq 0 ]; then
    say "vllm, verl and megatron-core are installed"
    exit 0
fi

torch_before=$("$VPY" -c "import torch; print(torch.__version__)")
say "installing ${#missing[@]} packages with --no-deps (vllm's wheel is about 340 MB)"
"$VPY" -m pip install --quiet --disable-pip-version-check --no-deps "${missing[@]}"
torch_after=$("$VPY" -c "import torch; print(torch.__version__)")
if [ "$torch_before" != "$torch_after" ]; then
    say "torch changed from $torch_before to $torch_after while installing frameworks" >&2
    exit 1
fi
say "installed; torch is still $torch_after"
