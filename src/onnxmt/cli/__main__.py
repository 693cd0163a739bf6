"""`python -m onnxmt.cli`."""

from . import main

main()
