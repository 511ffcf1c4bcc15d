"""`python -m kernelcraft ...` runs the `kernelcraft` command."""
from kernelcraft.cli import main

main()
