"""What a phase-1 foundation classifier gets right on the built-in X-ray silos: the whole class, the scanner
part, the device part.

The built-in label space is ``xray/<scanner>/<device>``; a model can be right about the scanner and wrong about
the device. For each checkpoint (``FL_global_model.pt`` of a ``fedseg bench`` run) this scores the test split of
every silo in ``--site-datalists`` and prints accuracy, scanner accuracy, device accuracy and the device
confusion matrix (rows = true device, columns = predicted), pooled over the silos. E.g.

    python benchmarks/fedefm/foundation_confusion.py --site-datalists /tmp/fedseg_bench/fedefm_unseen1/site_datalists.json \\
        --checkpoints /tmp/fedseg_bench/fedefm_unseen1/workspaces/*-seed0/server/simulate_job/app_server/FL_global_model.pt
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from fedseg.data.classification_transforms import classification_transforms
from fedseg.data.synthetic.xray import DEVICES
from fedseg.foundation import build_vit
from fedseg.inference import load_state_dict


def test_split(site_datalists: Path, image_size: int):
    """``(images (N, 3, S, S), labels (N,), label_space)`` of every silo's test split."""
    transform = classification_transforms(image_size, in_channels=3, train=False)
    images, labels, space = [], [], None
    for datalist in json.loads(site_datalists.read_text()).values():
        data = json.loads(Path(datalist).read_text())
        space = data["label_space"]
        for entry in data["test"]:
            item = transform({"image": str(Path(datalist).parent / entry["image"]), "label": entry["label"]})
            images.append(item["image"])
            labels.append(entry["label"])
    return torch.stack(images), np.array(labels), space


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site-datalists", type=Path, required=True)
    parser.add_argument("--checkpoints", type=Path, nargs="+", required=True)
    parser.add_argument("--image-size", type=int, default=96)
    args = parser.parse_args()
    x, y, space = test_split(args.site_datalists, args.image_size)
    scanner = np.array([c.split("/")[1] for c in space])
    device = np.array([DEVICES.index(c.split("/")[2]) for c in space])
    for path in args.checkpoints:
        model = build_vit("tiny", in_channels=3, num_classes=len(space), img_size=args.image_size)
        model.load_state_dict(load_state_dict(path))
        with torch.no_grad():
            pred = model.eval()(x).argmax(1).numpy()
        confusion = np.zeros((len(DEVICES), len(DEVICES)), dtype=int)
        np.add.at(confusion, (device[y], device[pred]), 1)
        print(f"{path}\n  {len(y)} test images: accuracy {np.mean(pred == y):.3f}, "
              f"scanner {np.mean(scanner[pred] == scanner[y]):.3f} (chance {1 / len(set(scanner)):.3f}), "
              f"device {np.mean(device[pred] == device[y]):.3f} (chance {1 / len(DEVICES):.3f})")
        print("  device confusion (rows true, columns predicted; " + ", ".join(DEVICES) + "):")
        for name, row in zip(DEVICES, confusion):
            print(f"    {name:>9}: " + " ".join(f"{v:4d}" for v in row))


if __name__ == "__main__":
    main()
