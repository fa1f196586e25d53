"""The tiny checkpoints trained for each method, shipped in `scripts/trained/` (bf16 safetensors, a few MB each).

    python -m scripts.trained_models DIR              # copy them to DIR/{ar,nld,wedlm,jacobi_forcing,raven,asarm}
    python -m scripts.trained_models DIR --retrain    # train them again into DIR (about 90 minutes on 2 CPU cores)

`ar`, `raven` and `asarm` are trained from scratch and the others fine-tuned from `ar` (`scripts.train`); retraining
on the machine and thread count that made the shipped ones reproduces them.
"""

import argparse
import shutil
from pathlib import Path

import torch

from scripts.train import DEFAULT_STEPS, FROM_SCRATCH, OBJECTIVES, Recipe, save, train

SHIPPED = Path(__file__).resolve().parent / "trained"


def copy(outdir: Path) -> dict[str, Path]:
    """The shipped checkpoints copied under `outdir` (left as they are where already there)."""
    paths = {}
    for name in OBJECTIVES:
        paths[name] = target = Path(outdir) / name
        if not (target / "config.json").exists():
            shutil.copytree(SHIPPED / name, target, dirs_exist_ok=True)
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
