#!/usr/bin/python3
"""The 8 x 8 handwritten digits scikit-learn ships (the UCI optdigits test
set: 1797 images, 17 grey levels), written as a text corpus for tapeformer:
each image is one record of 65 characters, "\\n" then its 64 pixels in raster
order as the letters a (level 0, blank) to q (level 16, ink).

    python3 scripts/digits.py out/digits/digits.txt
    build/cli/tapeformer train --config configs/digits.json --data out/digits/digits.txt --out out/digits/full

The images are shuffled with a fixed seed. configs/digits.json reads one
record per window (data.align 65, block_size 64: the start token predicts
pixel 0) and its data.val_fraction puts the last 180 images in the
validation split. Needs Debian's python3-sklearn (`bash scripts/setup.sh
python3-sklearn`); nothing is downloaded: the data is in the package.
"""
import os
import sys

try:
    import numpy as np
    from sklearn.datasets import load_digits
except ImportError:
    sys.exit("digits.py: scikit-learn is missing (bash scripts/setup.sh python3-sklearn)")

if len(sys.argv) != 2:
    sys.exit("usage: digits.py OUT.txt")
images = load_digits().images.astype(int)  # (1797, 8, 8), levels 0..16
order = np.random.RandomState(0).permutation(len(images))
records = ["\n" + "".join(chr(ord("a") + v) for v in images[i].reshape(-1)) for i in order]
os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
tmp = f"{sys.argv[1]}.tmp.{os.getpid()}"  # whole or absent, also with two writers at once
with open(tmp, "w") as f:
    f.write("".join(records))
os.replace(tmp, sys.argv[1])
print(f"digits.py: {len(records)} images of 8 x 8 written to {sys.argv[1]} ({len(records) * 65} characters)")
