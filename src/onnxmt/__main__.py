"""`python -m onnxmt`, as the `onnxmt` command."""

from .cli import main

main()
