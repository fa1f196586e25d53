"""The tiny checkpoints trained for each method, shipped in `scripts/trained/` (bf16 safetensors, a few MB each).

    python -m scripts.trained_models DIR              # copy them to DIR/{ar,nld,wedlm,jacobi_forcing,raven,asarm}
    python -m scripts.trained_models DIR --retrain    # train them again into DIR (about 90 minutes on 2 CPU cores)

`ar`, `raven` and `asarm` are trained from scratch and the others fine-tuned from `ar` (`scripts.train`); retraining
on the machine and thread count that made the shipped ones reproduces them.
"""

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

import torch

from scripts.train import DEFAULT_STEPS, FROM_SCRATCH, OBJECTIVES, Recipe, save, train

SHIPPED = Path(__file__).resolve().parent / "trained"
# Written beside each copy: the digest of the shipped checkpoint it was copied from.
COPIED_FROM = ".shipped-digest"


def digest(checkpoint: Path) -> str:
    """SHA-256 over a checkpoint's files (names and contents, the copy marker left out)."""
    sha = hashlib.sha256()
    for path in sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != COPIED_FROM):
        sha.update(path.relative_to(checkpoint).as_posix().encode() + b"\0" + path.read_bytes())
    return sha.hexdigest()


def copy(outdir: Path) -> dict[str, Path]:
    """The shipped checkpoints copied under `outdir`. A copy made earlier from other shipped weights (an older
    checkout) is replaced; a checkpoint that is not such a copy (`--retrain`'s, a user's own) is left as it is."""
    paths = {}
    for name in OBJECTIVES:
        paths[name] = target = Path(outdir) / name
        marker, shipped = target / COPIED_FROM, digest(SHIPPED / name)
        if (target / "config.json").exists() and not marker.exists():
            if digest(target) != shipped:
                print(f"note: {target} is not the shipped {name} checkpoint; left as it is (remove it to use the "
                      "shipped one)", file=sys.stderr)
            continue
        if marker.exists() and marker.read_text() == shipped:
            continue
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(SHIPPED / name, target)
        marker.write_text(shipped)
    return paths


def retrain(outdir: Path, device: str = "cpu") -> dict[str, Path]:
    """Every objective trained into `outdir`, `ar` first (the fine-tuned ones start from it)."""
    paths = {}
    for name in OBJECTIVES:
        recipe = Recipe(steps=DEFAULT_STEPS[name])
        init = None if name in FROM_SCRATCH else paths["ar"]
        model, adapter = train(name, recipe, init, device)
        paths[name] = save(model, adapter, Path(outdir) / name, name, recipe)
        print(f"{name}: {paths[name]}", flush=True)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m scripts.trained_models", description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--retrain", action="store_true", help="train them again instead of copying")
    args = parser.parse_args()
    if args.retrain:
        torch.set_num_threads(min(torch.get_num_threads(), 2))
        retrain(args.outdir)
    else:
        for name, path in copy(args.outdir).items():
            print(f"{name}: {path}")


if __name__ == "__main__":
    main()
