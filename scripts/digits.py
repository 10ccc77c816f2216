#!/usr/bin/python3
"""The 8 x 8 handwritten digits scikit-learn ships (the UCI optdigits test
set: 1797 images, 17 grey levels), written as a text corpus for tapeformer:
each image is one record of 65 characters, "\\n" then its 64 pixels in raster
order as the letters a (level 0, blank) to q (level 16, ink).

    scripts/digits.py out/digits/digits.txt     # Debian's /usr/bin/python3, by its #! line
    build/cli/tapeformer train --config configs/digits.json --data out/digits/digits.txt --out out/digits/full

The images are shuffled with a fixed seed. configs/digits.json reads one
record per window (data.align 65, block_size 64: the start token predicts
pixel 0) and its data.val_fraction puts the last 180 images in the
validation split. Needs scikit-learn in the interpreter that runs it:
Debian's python3-sklearn for /usr/bin/python3 (this file's #! line;
`bash scripts/setup.sh python3-sklearn`), its own pip for another (pyenv's,
a venv); without it the script names that interpreter and what to install.
Nothing is downloaded: the data is in the package.
"""
import os
import sys

from _needs import need

# scikit-learn first: it brings numpy along, from pip and from Debian alike.
load_digits = need("sklearn.datasets", "scikit-learn", "python3-sklearn", "digits.py").load_digits
np = need("numpy", "numpy", "python3-numpy", "digits.py")

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
