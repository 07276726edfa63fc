"""Can the tiny foundation ViT learn one built-in X-ray silo from scratch?

A plain PyTorch loop (no fedseg engine): Adam at ``--lr`` on the silo's training images, train and validation
accuracy every 10 epochs. ``--raw-input`` switches the ViT's fixed input standardisation off (``input_mean=0,
input_std=1``: the network sees ``[0, 1]`` pixels, as before it had one); ``--flips`` adds the engine's random
horizontal/vertical flips. Generate the silos first, e.g.

    python -c "from fedseg.data.synthetic.xray_builtin import builtin_foundation_silos as b; \
b('/tmp/vit_data', ['site-1', 'site-2', 'site-3'], unseen=1.0, seed=0, profile='default')"
    python benchmarks/fedefm/vit_from_scratch.py --datalist /tmp/vit_data/site-1/datalist.json --lr 3e-4 --epochs 30 --flips
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from fedseg.foundation import build_vit


def load(datalist: Path, split: str):
    """``(images (N, 3, S, S) in [0, 1], labels (N,))`` of one split."""
    data = json.loads(datalist.read_text())
    images = np.stack([np.array(Image.open(datalist.parent / e["image"]).convert("RGB")) for e in data[split]])
    labels = torch.tensor([e["label"] for e in data[split]])
    return torch.tensor(images.astype(np.float32) / 255).permute(0, 3, 1, 2), labels, len(data["label_space"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datalist", type=Path, required=True)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--flips", action="store_true", help="random horizontal and vertical flips")
    parser.add_argument("--raw-input", action="store_true", help="no input standardisation (input_mean 0, input_std 1)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y, n_classes = load(args.datalist, "training")
    xv, yv, _ = load(args.datalist, "validation")
    raw = dict(input_mean=0.0, input_std=1.0) if args.raw_input else {}
    model = build_vit("tiny", in_channels=3, num_classes=n_classes, init_seed=0, **raw)
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        for idx in torch.randperm(len(x)).split(args.batch_size):
            batch = x[idx]
            if args.flips:  # the engine flips each image on its own; per batch is enough here
                for dim in (-1, -2):
                    batch = batch.flip(dim) if torch.rand(1).item() < 0.5 else batch
            loss = F.cross_entropy(model(batch), y[idx])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        if epoch % 10 == 9:
            model.eval()
            with torch.no_grad():
                train_acc = (model(x).argmax(1) == y).float().mean().item()
                val_acc = (model(xv).argmax(1) == yv).float().mean().item()
            model.train()
            print(f"epoch {epoch + 1}: train accuracy {train_acc:.3f}, validation accuracy {val_acc:.3f}", flush=True)


if __name__ == "__main__":
    main()
